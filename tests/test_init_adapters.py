"""train_magrpo.init_adapters: MAGRPO starts from saved adapters (a shared warm start) instead of training one."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.loading import attach_adapters
from orchestry.problems import load_problems
from orchestry.rewards.code import LevelReward
from orchestry.training.magrpo import AGENTS, checkpoints
from orchestry.training.magrpo.trainer import MAGRPOTrainer

SAMPLING = SamplingParams(max_completion_length=6, temperature=1.0, top_p=1.0)


class _LengthReward:
    def __call__(self, problems, helpers, mains):
        return [
            LevelReward(structure=min(1.0, (len(h) + len(m)) / 200.0))
            for h, m in zip(helpers, mains, strict=True)
        ]


def _trainer(tiny_llama, tok, ckpt, cfg, r=4) -> MAGRPOTrainer:
    model = attach_adapters(tiny_llama(len(tok), seed=5), AGENTS, r=r, alpha=2 * r, seed=2)
    return MAGRPOTrainer(
        model, tok, load_problems()[:3], None, cfg, SAMPLING, ckpt, reward_fn=_LengthReward()
    )


def _saved(tmp_path, tiny_llama, tok) -> MAGRPOTrainer:
    """A trainer whose LoRA B matrices are random (so its adapters differ from a fresh attach), saved."""
    src = _trainer(tiny_llama, tok, tmp_path / "ck_src", TrainMagrpoParams(bf16_update=False))
    torch.manual_seed(11)
    with torch.no_grad():
        for n, p in src.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.5)
    src.save_adapters(tmp_path / "saved")
    return src


def _same_files(a, b) -> bool:
    x, y = load_file(str(a)), load_file(str(b))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_init_adapters_start_from_the_saved_weights_and_skip_the_warm_start(tmp_path, embedded_tokenizer,
                                                                            tiny_llama, one_thread):  # fmt: skip
    tok = embedded_tokenizer
    _saved(tmp_path, tiny_llama, tok)
    saved = tmp_path / "saved"
    cfg = TrainMagrpoParams(num_steps=1, problems_per_step=1, num_generations=2, bf16_update=False,
                            init_adapters=str(saved))  # fmt: skip
    tr = _trainer(tiny_llama, tok, tmp_path / "ck", cfg)
    tr.train(progress=False)
    assert tr.warm_start["init_adapters"] == str(saved)
    assert len(tr.warm_start["init_adapters_sha256"]) == 12
    assert "epochs" not in tr.warm_start  # no supervised warm start ran
    assert len(tr.history) == 1
    for agent in AGENTS:  # the pair MAGRPO started from is the saved one, kept where a warm start's would be
        f = "adapter_model.safetensors"
        assert _same_files(tr.warm_start_dir / agent / f, saved / agent / f)
    fresh = _trainer(tiny_llama, tok, tmp_path / "ck2", TrainMagrpoParams(bf16_update=False))
    fresh.save_adapters(tmp_path / "fresh")
    assert not _same_files(tmp_path / "fresh/helper/adapter_model.safetensors", saved / "helper" / f)


def test_init_adapters_that_do_not_fit_fail_clearly(tmp_path, embedded_tokenizer, tiny_llama, one_thread):
    tok = embedded_tokenizer
    _saved(tmp_path, tiny_llama, tok)  # r 4
    tr = _trainer(tiny_llama, tok, tmp_path / "ck", TrainMagrpoParams(bf16_update=False), r=8)
    with pytest.raises(ValueError, match="does not fit agent helper.*other shapes .*saved .*4.*this run .*8"):
        checkpoints.load_init_adapters(tr, tmp_path / "saved")
    with pytest.raises(FileNotFoundError, match="helper"):
        checkpoints.load_init_adapters(tr, tmp_path / "missing")


def test_init_adapters_with_explicit_warm_start_epochs_is_refused():
    with pytest.raises(ValueError, match="init_adapters replaces the warm start"):
        TrainMagrpoParams(init_adapters="somewhere", warm_start_epochs=2)
    assert TrainMagrpoParams(init_adapters="somewhere", warm_start_epochs="auto").init_adapters == "somewhere"
