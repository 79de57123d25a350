"""Benchmark: how the cost of one MAGRPO step grows with problems per step, G, completion length and model size.

Each point runs our trainer (``orchestry.training.magrpo.trainer.MAGRPOTrainer``, as shipped: decoding kernels, LoRA
r = 16 on q/k/v/o, one AdamW step per agent, fp32 update on a CPU without native bf16) in its own subprocess, so
its peak resident memory is its own, for ``--steps`` optimizer steps on the first HumanEval train problems, and
reports the mean seconds per step (generation, reward, update), completion tokens per step and peak memory.

The axes, one at a time around the default step of ``params.yaml`` (2 problems, G = 4, 128 new tokens):

* problems per step 1, 2, 4; G 2, 4, 8; at most 64, 128, 256 new tokens (the embedded SmolLM2-135M-Instruct,
  real samples: they stop when their code block closes, so tokens per step are printed beside the seconds);
* model size (``--sizes``): randomly initialised models built from a config with the shapes of SmolLM2-135M,
  Qwen2.5-0.5B and Qwen2.5-1.5B (Llama architecture with attention biases, the Qwen vocabulary of 151,936 and
  tied embeddings; the embedded tokenizer's 49,152 ids are a subset of it), at 1 problem, G = 2 and a fixed
  number of new tokens: a random model never stops early, so every row decodes the whole length and the
  figures compare like with like. No weights are downloaded (none could be here).

The reward is ``magrpo_vs_comlrl.bench_reward`` (the level reward in the sandbox, paper levels) plus a seeded jitter
below 0.001 per sample, so every group has a non-zero advantage and every step runs the full update (its cost
does not depend on the advantage's size; a flat group would skip it and the step would time generation only).

Usage::

    python benchmarks/magrpo_scaling.py                      # the three axes on the embedded model (~15 min)
    python benchmarks/magrpo_scaling.py --sizes              # + the 135M / 0.5B / 1.5B random-model shapes
    python benchmarks/magrpo_scaling.py --out benchmarks/results   # also writes scaling.{json,md,png} there

Prints the CPU line (model, AVX-512 BF16 / AMX flags) beside the figures: they hold for this CPU only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from magrpo_vs_comlrl import _problems, _sandbox, bench_reward

from orchestry.numerics import cpu_line

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "base"
TAG = "SCALING_RESULT "
BASE = {"problems": 2, "G": 4, "length": 128}  # params.yaml train_magrpo / sampling defaults
AXES = {"problems": [1, 2, 4], "G": [2, 4, 8], "length": [64, 128, 256]}
# config-built shapes (hidden, layers, heads, kv heads, head dim, MLP width, vocabulary)
SHAPES = {
    "135M (SmolLM2 shape)": (576, 30, 9, 3, 64, 1536, 49152),
    "0.5B (Qwen2.5-0.5B shape)": (896, 24, 14, 2, 64, 4864, 151936),
    "1.5B (Qwen2.5-1.5B shape)": (1536, 28, 12, 2, 128, 8960, 151936),
}
SIZE_POINT = {"problems": 1, "G": 2, "length": 48}
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


# ------------------------------------------------------------------------------------------ worker
def _random_model(shape: tuple):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from orchestry.llm.decoding import use_decode_kernels

    hidden, layers, heads, kv, head_dim, mlp, vocab = shape
    cfg = LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        intermediate_size=mlp,
        vocab_size=vocab,
        attention_bias=True,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    use_decode_kernels(model)  # as load_model does on the CPU
    return model


def run_point(point: dict, steps: int, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    random.seed(0)
    from orchestry.config import SamplingParams, TrainMagrpoParams
    from orchestry.llm.loading import attach_adapters, load_model, load_tokenizer
    from orchestry.training.magrpo import AGENTS
    from orchestry.training.magrpo.trainer import MAGRPOTrainer

    shape = point.get("shape")
    model = _random_model(SHAPES[shape]) if shape else load_model(MODEL)[0]
    n_params = sum(p.numel() for p in model.parameters())
    tok = load_tokenizer(MODEL)
    model = attach_adapters(model, AGENTS, r=16, alpha=32, seed=0)
    problems = _problems(point["problems"] * steps)
    cfg = TrainMagrpoParams(
        num_steps=steps,
        problems_per_step=point["problems"],
        num_generations=point["G"],
        checkpoint_every=10**6,
        warm_start_epochs=0,
        seed=0,
    )
    sampling = SamplingParams(max_completion_length=point["length"], temperature=0.8, top_p=0.95)
    jitter = random.Random(0)

    def reward(probs, helpers, mains):
        out = bench_reward(probs, helpers, mains, sb)
        for r in out:  # a non-zero advantage on every row: each step runs the whole update
            r.cooperation += jitter.uniform(0.0, 1e-3)
        return out

    with _sandbox() as sb, tempfile.TemporaryDirectory() as tmp:
        trainer = MAGRPOTrainer(model, tok, problems, sb, cfg, sampling, Path(tmp) / "ckpt", reward_fn=reward)
        hist = trainer.train(progress=False)
    result = {
        **point,
        "params": n_params,
        "steps": len(hist),
        "s_per_step": [h["seconds"] for h in hist],
        "gen_s": [h["seconds/generate"] for h in hist],
        "reward_s": [h["seconds/reward"] for h in hist],
        "update_s": [h["seconds/update"] for h in hist],
        "completion_tokens": [h["tokens/completion"] for h in hist],
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    print(TAG + json.dumps(result), flush=True)


# ------------------------------------------------------------------------------------------ driver
def _run(point: dict, steps: int, threads: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(point)]
    cmd += ["--steps", str(steps), "--threads", str(threads)]
    print(f"  {point} (load average {os.getloadavg()[0]:.2f}) ...", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **ENV}, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(TAG)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"point {point} failed (exit {proc.returncode})")
    return json.loads(lines[-1][len(TAG) :])


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def table(results: list[dict]) -> str:
    """A markdown table: one row per point, means over its steps."""
    head = (
        "| model | problems/step | G | max new tokens | s/step | generate | reward | update | completion tokens"
        "/step | step s per 1k completion tokens | peak memory GiB |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for r in results:
        s, toks = _mean(r["s_per_step"]), _mean(r["completion_tokens"])
        name = r.get("shape") or "embedded 135M"
        rows.append(
            f"| {name} | {r['problems']} | {r['G']} | {r['length']} | {s:.1f} | {_mean(r['gen_s']):.1f} | "
            f"{_mean(r['reward_s']):.1f} | {_mean(r['update_s']):.1f} | {toks:.0f} | "
            f"{1000 * s / max(toks, 1):.1f} | {r['peak_rss_bytes'] / (1 << 30):.2f} |"
        )
    return "\n".join(rows)


def plot(results: list[dict], path: Path, cpu: str) -> None:
    """One panel per axis (seconds per step, generation and update stacked) and one for model size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_pts = {k: [r for r in results if r.get("axis") == k] for k in AXES}
    sizes = [r for r in results if r.get("shape")]
    panels = [(k, v) for k, v in axes_pts.items() if v] + ([("model", sizes)] if sizes else [])
    fig, axs = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    labels = {"problems": "problems per step", "G": "G (samples per agent and problem)",
              "length": "max new tokens", "model": "model shape (random weights)"}  # fmt: skip
    for ax, (axis, pts) in zip(axs[0], panels, strict=True):
        xs = [r["shape"].split(" ")[0] if axis == "model" else str(r[axis]) for r in pts]
        gen = [_mean(r["gen_s"]) for r in pts]
        rew = [_mean(r["reward_s"]) for r in pts]
        upd = [_mean(r["update_s"]) for r in pts]
        ax.bar(xs, gen, label="generate")
        ax.bar(xs, rew, bottom=gen, label="reward")
        ax.bar(xs, upd, bottom=[g + w for g, w in zip(gen, rew, strict=True)], label="update")
        for x, r in zip(xs, pts, strict=True):
            ax.annotate(f"{r['peak_rss_bytes'] / (1 << 30):.1f} GiB", (x, _mean(r["s_per_step"])),
                        ha="center", va="bottom", fontsize=8)  # fmt: skip
        ax.set_xlabel(labels[axis])
        ax.set_ylabel("seconds per MAGRPO step")
        if axis == "model":
            ax.set_title(f"1 problem, G={SIZE_POINT['G']}, {SIZE_POINT['length']} tokens", fontsize=9)
    axs[0][0].legend(fontsize=8)
    fig.suptitle(f"MAGRPO step cost on {cpu}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps per point (mean reported)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--sizes", action="store_true", help="also the 135M / 0.5B / 1.5B random-model shapes")
    ap.add_argument("--only-sizes", action="store_true", help="the model shapes only")
    ap.add_argument("--out", type=Path, help="write scaling.json, scaling.md and scaling.png to this folder")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return run_point(json.loads(args.worker), args.steps, args.threads)
    if not (MODEL / "config.json").exists():
        raise SystemExit(f"no model at {MODEL}: run `dvc repro prepare` first")
    cpu = cpu_line()
    print(f"cpu: {cpu}; {args.threads} threads", flush=True)
    results, done = [], {}
    if not args.only_sizes:
        for axis, values in AXES.items():
            for v in values:
                point = {**BASE, axis: v}
                key = json.dumps(point, sort_keys=True)
                if key not in done:  # the base point is on every axis: measured once
                    done[key] = _run(point, args.steps, args.threads)
                results.append({**done[key], "axis": axis})
    if args.sizes or args.only_sizes:
        for shape in SHAPES:
            results.append(_run({**SIZE_POINT, "shape": shape}, args.steps, args.threads))
    md = table(results)
    print(f"\ncpu: {cpu}; {args.threads} threads; means over {args.steps} steps per point\n")
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d")
        (args.out / "scaling.json").write_text(json.dumps({"cpu": cpu, "threads": args.threads,
                                                           "date": stamp, "results": results}, indent=2))  # fmt: skip
        (args.out / "scaling.md").write_text(
            f"MAGRPO step cost, {stamp}, cpu: {cpu}; {args.threads} threads; means over {args.steps} steps per "
            f"point (`python benchmarks/magrpo_scaling.py`).\n\n{md}\n"
        )
        plot(results, args.out / "scaling.png", cpu)
        print(f"wrote {args.out}/scaling.{{json,md,png}}")


if __name__ == "__main__":
    main()
