"""MAGRPO checkpoints and reproducibility: a longer checkpoint never stands in for a shorter run, a checkpoint
survives a kill at any point of its writing, and the trained adapters do not depend on the machine's memory."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil

import pytest
import torch

from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.loading import attach_adapters
from orchestry.problems import load_problems
from orchestry.rewards.code import LevelReward
from orchestry.training.magrpo import AGENTS
from orchestry.training.magrpo.trainer import MAGRPOTrainer

SAMPLING = SamplingParams(max_completion_length=6, temperature=1.0, top_p=1.0)


class _LengthReward:
    """Longer completions score higher: a real learning signal without the sandbox."""

    def __call__(self, problems, helpers, mains):
        return [
            LevelReward(structure=min(1.0, (len(h) + len(m)) / 200.0))
            for h, m in zip(helpers, mains, strict=True)
        ]


def _lora(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def _digest(model) -> str:
    h = hashlib.sha256()
    for n, t in sorted(_lora(model).items()):
        h.update(n.encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def _trainer(tiny_llama, ckpt, cfg, tok=None, vocab=64, **kw) -> MAGRPOTrainer:
    model = attach_adapters(
        tiny_llama(len(tok) if tok is not None else vocab, seed=5), AGENTS, r=4, alpha=8, seed=2
    )
    return MAGRPOTrainer(
        model, tok, load_problems()[:3], None, cfg, SAMPLING, ckpt, reward_fn=_LengthReward(), **kw
    )


# ---- issue: a checkpoint with more steps than asked was returned as the shorter run ------------------------------
def test_longer_checkpoint_is_never_returned_as_a_shorter_run(tmp_path, embedded_tokenizer, tiny_llama, one_thread,
                                                             caplog):  # fmt: skip
    tok, ckpt = embedded_tokenizer, tmp_path / "ckpt"
    cfg = TrainMagrpoParams(num_steps=2, problems_per_step=1, num_generations=2, learning_rate=5e-2,
                            checkpoint_every=1, bf16_update=False)  # fmt: skip
    two = _trainer(tiny_llama, ckpt, cfg, tok)
    two.train(progress=False)
    two_steps = _lora(two.model)
    longer = _trainer(tiny_llama, ckpt, cfg.model_copy(update={"num_steps": 3}), tok)
    assert [h["step"] for h in longer.train(progress=False)] == [0, 1, 2]  # resumed at 2, trained step 2
    assert json.loads((ckpt / "trainer.json").read_text())["next_step"] == 3

    # `dvc exp run -S train_magrpo.num_steps=2` after the 3-step run: a fresh 2-step run, not the 3-step one
    shorter = _trainer(tiny_llama, ckpt, cfg, tok)
    with caplog.at_level(logging.INFO, logger="orchestry.magrpo"):
        hist = shorter.train(progress=False)
    assert [h["step"] for h in hist] == [0, 1]
    assert len({s["step"] for s in shorter.samples}) == 2
    assert "starting from scratch" in caplog.text and "num_steps" in caplog.text
    now = _lora(shorter.model)
    for n, t in two_steps.items():
        assert torch.equal(now[n], t), n
    assert json.loads((ckpt / "trainer.json").read_text())["next_step"] == 2


# ---- issue: checkpoints were not atomic -----------------------------------------------------------------------------
class _Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not an Exception, so no handler swallows it)."""


def _kill_at(monkeypatch, k: int) -> list[str]:
    """Make the k-th (1-based) rename/replace/rmtree of the save 'kill the process' (a removal stops half way,
    leaving one file of the directory); returns the log of operations seen."""
    ops: list[str] = []
    real_rename, real_replace, real_rmtree = os.rename, os.replace, shutil.rmtree

    def step(name: str) -> bool:
        ops.append(name)
        return len(ops) == k

    def rename(src, dst, *a, **kw):
        if step(f"rename {os.path.basename(src)} -> {os.path.basename(dst)}"):
            raise _Killed
        return real_rename(src, dst, *a, **kw)

    def replace(src, dst, *a, **kw):
        if step(f"replace {os.path.basename(src)} -> {os.path.basename(dst)}"):
            raise _Killed
        return real_replace(src, dst, *a, **kw)

    def rmtree(path, *a, **kw):
        if step(f"rmtree {os.path.basename(path)}"):
            files = sorted(p for p in os.listdir(path) if os.path.isfile(os.path.join(path, p))) if os.path.isdir(
                path) else []  # fmt: skip
            for name in files[:-1]:  # half-way through the removal
                os.unlink(os.path.join(path, name))
            raise _Killed
        return real_rmtree(path, *a, **kw)

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    return ops


def _perturb(trainer: MAGRPOTrainer, step: int) -> dict[str, torch.Tensor]:
    """Stand-in for a training step: move every LoRA weight and log the step; returns the new weights."""
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if "lora_" in n:
                p.add_(0.01 * (step + 1))
    trainer.history.append({"step": step})
    trainer.samples.append({"step": step, "total": float(step)})
    return _lora(trainer.model)


CFG = TrainMagrpoParams(num_steps=8, num_generations=2, bf16_update=False)


def test_a_kill_at_any_point_of_a_save_leaves_the_last_complete_checkpoint(tmp_path, tiny_llama, monkeypatch,
                                                                           caplog):  # fmt: skip
    completed_without_kill = False
    k = 0
    while not completed_without_kill:
        k += 1
        ckpt = tmp_path / f"k{k}" / "magrpo"
        t = _trainer(tiny_llama, ckpt, CFG)
        saved = {1: _perturb(t, 0)}
        t.save_checkpoint(1)
        saved[2] = _perturb(t, 1)
        with monkeypatch.context() as m:
            ops = _kill_at(m, k)
            try:
                t.save_checkpoint(2)
                completed_without_kill = True
            except _Killed:
                pass
        assert k < 20, ops
        fresh = _trainer(tiny_llama, ckpt, CFG)
        with caplog.at_level(logging.INFO, logger="orchestry.magrpo"):
            start = fresh.load_checkpoint()  # never a crash
        assert start in (1, 2), (k, ops, start, caplog.text)
        if completed_without_kill:
            assert start == 2
        now = _lora(fresh.model)
        for n, w in saved[start].items():
            assert torch.equal(now[n], w), (k, ops, n)
        assert [h["step"] for h in fresh.history] == list(range(start))
        assert [s["step"] for s in fresh.samples] == list(range(start))
        # the run goes on from there: the next save cleans up and is the one resumed
        _perturb(fresh, start)
        fresh.save_checkpoint(start + 1)
        again = _trainer(tiny_llama, ckpt, CFG)
        assert again.load_checkpoint() == start + 1
        assert sorted(p.name for p in ckpt.parent.iterdir()) == ["magrpo"], ops
    assert k > 2  # the save has several steps, each of them was interrupted once


def test_a_kill_while_writing_the_files_keeps_the_previous_checkpoint(tmp_path, tiny_llama, monkeypatch):
    ckpt = tmp_path / "magrpo"
    t = _trainer(tiny_llama, ckpt, CFG)
    first = _perturb(t, 0)
    t.save_checkpoint(1)
    _perturb(t, 1)
    real_save = torch.save

    def dies_half_way(obj, f, *a, **kw):
        real_save({"partial": True}, f)
        raise _Killed

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(_Killed):
        t.save_checkpoint(2)
    monkeypatch.setattr(torch, "save", real_save)
    fresh = _trainer(tiny_llama, ckpt, CFG)
    assert fresh.load_checkpoint() == 1
    assert all(torch.equal(p, first[n]) for n, p in _lora(fresh.model).items())


def test_an_incomplete_checkpoint_is_ignored_with_a_log_line_not_a_crash(tmp_path, tiny_llama, caplog):
    ckpt = tmp_path / "magrpo"
    t = _trainer(tiny_llama, ckpt, CFG)
    _perturb(t, 0)
    t.save_checkpoint(1)
    (ckpt / "state.pt").unlink()  # what a kill during the old removal left: trainer.json without state.pt
    fresh = _trainer(tiny_llama, ckpt, CFG)
    before = _lora(fresh.model)
    with caplog.at_level(logging.INFO, logger="orchestry.magrpo"):
        assert fresh.load_checkpoint() == 0
    assert "incomplete" in caplog.text and str(ckpt) in caplog.text
    assert fresh.history == [] and fresh.samples == []
    assert all(torch.equal(p, before[n]) for n, p in _lora(fresh.model).items())

    # a truncated state file (manifest present) is as incomplete as a missing one
    _perturb(t, 1)
    t.save_checkpoint(2)
    data = (ckpt / "state.pt").read_bytes()
    (ckpt / "state.pt").write_bytes(data[: len(data) // 2])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="orchestry.magrpo"):
        assert _trainer(tiny_llama, ckpt, CFG).load_checkpoint() == 0
    assert "incomplete" in caplog.text


def test_resume_falls_back_to_the_previous_checkpoint_when_the_swap_was_cut(tmp_path, tiny_llama):
    """The half-states of the swap built on disk: `magrpo` renamed away, the new one not yet in place."""
    ckpt = tmp_path / "magrpo"
    t = _trainer(tiny_llama, ckpt, CFG)
    first = _perturb(t, 0)
    t.save_checkpoint(1)
    os.rename(ckpt, tmp_path / "magrpo.old")  # killed right after moving the old checkpoint aside
    fresh = _trainer(tiny_llama, ckpt, CFG)
    assert fresh.load_checkpoint() == 1
    assert all(torch.equal(p, first[n]) for n, p in _lora(fresh.model).items())


# ---- issue: the micro-batch size (and so the adapters) depended on the machine's free memory -------------------------
def test_training_is_bit_identical_whatever_the_free_memory(tmp_path, embedded_tokenizer, tiny_llama, one_thread,
                                                           monkeypatch):  # fmt: skip
    tok = embedded_tokenizer
    cfg = TrainMagrpoParams(num_steps=2, problems_per_step=2, num_generations=2, learning_rate=5e-2,
                            bf16_update=False)  # fmt: skip
    real_sysconf = os.sysconf
    reads = []
    digests = []
    for free_bytes in (64 << 30, 16 << 20):  # a quiet machine, then one busy with other jobs
        pages = free_bytes // real_sysconf("SC_PAGE_SIZE")

        def sysconf(name, pages=pages):
            if name == "SC_AVPHYS_PAGES":
                reads.append(name)
                return pages
            return real_sysconf(name)

        monkeypatch.setattr(os, "sysconf", sysconf)
        t = _trainer(tiny_llama, tmp_path / f"ckpt{free_bytes}", cfg, tok)
        t.train(progress=False)
        digests.append(_digest(t.model))
    monkeypatch.setattr(os, "sysconf", real_sysconf)
    assert digests[0] == digests[1]
    assert reads == []  # the free memory is never read


def test_micro_batch_budget_is_the_parameter(tiny_llama):
    from orchestry.params_file import parse_params

    cfg = TrainMagrpoParams(num_generations=2, micro_batch_tokens=300)
    assert _trainer(tiny_llama, "/nonexistent", cfg).micro_batch_tokens() == 300
    assert (
        _trainer(tiny_llama, "/nonexistent", CFG).micro_batch_tokens()
        == TrainMagrpoParams().micro_batch_tokens
    )
    assert parse_params({"train_magrpo": {"micro_batch_tokens": 512}}).train_magrpo.micro_batch_tokens == 512


def test_saved_adapter_config_lists_modules_in_sorted_order(saved_agents):
    """peft writes target_modules in the process's string-hash order; the saved folder must not depend on it."""
    import json

    _, _, _, adapters = saved_agents
    for agent in ("helper", "main"):
        config = json.loads((adapters / agent / "adapter_config.json").read_text())
        modules = config["target_modules"]
        assert len(modules) > 1 and modules == sorted(modules)
