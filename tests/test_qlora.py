"""The 4-bit (QLoRA) path on CPU: an NF4 base loaded by bitsandbytes through ``load_model(..., load_in_4bit=True)``,
one LoRA adapter per agent (``attach_adapters(..., quantized=True)``), one MAGRPO update.

bitsandbytes 0.50 runs NF4 on CPU (docs/scaling.md, "4-bit base"); the model is a tiny random Llama saved to a
temporary folder, so the test needs no real weights. It may log that an optimised CPU kernel could not be
fetched (a Hub download): harmless, it falls back.
"""

import pytest
import torch

pytest.importorskip("bitsandbytes")

from orchestry.config import SamplingParams, TrainMagrpoParams  # noqa: E402
from orchestry.llm.loading import attach_adapters, load_model
from orchestry.llm.local import Generation, GenerationBatch  # noqa: E402
from orchestry.problems import load_problems  # noqa: E402
from orchestry.rewards.code import LevelReward  # noqa: E402
from orchestry.training.magrpo import AGENTS, Rollout  # noqa: E402
from orchestry.training.magrpo.trainer import MAGRPOTrainer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _rollout(vocab: int, problems, G: int, rewards: torch.Tensor) -> Rollout:
    g = torch.Generator().manual_seed(0)
    B = len(problems) * len(AGENTS) * G
    seqs = torch.randint(3, vocab, (B, 10), generator=g)
    mask = torch.ones(B, 10, dtype=torch.long)
    mask[0, :2] = 0
    batch = GenerationBatch(seqs, mask, 6, [Generation("", 6, 4, i) for i in range(B)], 0.0)
    return Rollout(
        list(problems), batch, rewards, [LevelReward().to_dict() for _ in range(rewards.numel())], G
    )


def test_magrpo_update_on_4bit_base_changes_only_the_adapters(
    tmp_path, tiny_llama, embedded_tokenizer, only_adapters_changed
):
    folder = tmp_path / "tiny"
    tiny_llama(len(embedded_tokenizer), seed=0).save_pretrained(folder)
    embedded_tokenizer.save_pretrained(folder)

    model, tok = load_model(folder, load_in_4bit=True)
    quantized = [n for n, m in model.named_modules() if type(m).__name__ == "Linear4bit"]
    assert quantized, "no layer was quantised to 4 bits"
    model = attach_adapters(model, AGENTS, r=4, alpha=8, seed=0, quantized=True)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    lora_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)

    problems = load_problems()[:2]
    cfg = TrainMagrpoParams(
        num_generations=2, problems_per_step=2, learning_rate=1e-2
    )  # bf16 autocast update
    trainer = MAGRPOTrainer(
        model, tok, problems, None, cfg, SamplingParams(), checkpoint_dir=tmp_path / "ckpt"
    )
    out = trainer.update(_rollout(len(tok), problems, 2, torch.tensor([[1.0, 0.0], [0.5, 2.0]])))

    assert out["loss/helper"] != 0.0 and out["loss/main"] != 0.0
    only_adapters_changed(model, base_before, lora_before, AGENTS)
