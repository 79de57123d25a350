"""The GPU presets (``configs/gpu/*.yaml``) pass the overrides checker, and ``benchmarks/gpu_check.py`` runs on a CPU
with every shape shrunk (``--tiny``): each shape's JSON line says the loss is finite and both adapters moved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestry.reporting.experiments import preset_overrides

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "configs" / "gpu").glob("*.yaml"))
SHAPES = ("0.5b", "1.5b", "7b", "135m")


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_gpu_preset_passes_the_overrides_checker(path: Path) -> None:
    overrides = preset_overrides(path, ROOT / "params.yaml")
    keys = {o.split("=", 1)[0] for o in overrides}
    assert {"model.path", "model.dtype", "model.load_in_4bit", "prepare.source"} <= keys
    assert "model.dtype=bfloat16" in overrides and "prepare.source=humaneval" in overrides
    assert "train_magrpo.warm_start_epochs=0" in overrides
    assert all(" " not in o for o in overrides), "a value with a space breaks `$(... overrides ...)`"


def test_presets_exist_for_each_qwen_shape() -> None:
    assert {p.stem for p in PRESETS} >= {f"qwen2.5-coder-{s}" for s in ("0.5b", "1.5b", "7b")}


def test_gpu_check_tiny_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.jsonl"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = ["nice", "-n", "10", sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu",
           "--tiny", "--steps", "2", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [json.loads(line) for line in out.read_text().splitlines()] == lines[:-1]
    records = {r["shape"]: r for r in lines if "shape" in r}
    assert set(SHAPES) <= set(records)
    for shape in SHAPES:
        rec = records[shape]
        assert rec["ok"] is True and rec["tiny"] is True and rec["device"] == "cpu", rec
        assert rec["loss_finite"] is True
        assert rec["adapters_moved"] == {"helper": True, "main": True}
        assert len(rec["steps"]) == 2
        assert rec["rollout_s"] > 0 and rec["update_s"] > 0 and rec["rollout_tokens_per_s"] > 0
        assert rec["peak_gpu_memory_gib"] is None  # no GPU
    assert records["7b"]["vocab"] == 152064 and records["135m"]["vocab"] == 49152
    quant = [r for r in lines if r.get("shape", "").endswith("-4bit")]
    assert len(quant) == 1 and quant[0]["ok"] in (True, None), quant  # None: skipped, with its reason
    assert lines[-1]["ok"] is True


def test_the_nucleus_sampler_builds_every_tensor_on_the_logits_device() -> None:
    """No tensor of the top-p path is made on the CPU beside logits on another device (on CUDA that was a
    device-mismatch crash at the default top_p 0.95). The meta device stands in for CUDA: the path runs until
    ``nonzero``, which meta cannot compute; before the fix it failed earlier, mixing a CPU ``arange`` in."""
    import torch

    from orchestry.llm.local import NucleusSampler

    logits = torch.randn(4, 4096, device="meta")
    with pytest.raises(NotImplementedError, match="nonzero"):
        NucleusSampler(temperature=0.8, top_p=0.95).probabilities(logits)
