"""Prefill in length buckets vs one forward left-padded to the longest prompt, on the baselines' real prompt sets.

The test split's concat prompts (helper and main, 64 rows) and the discussion baseline's revision prompts (built
from the committed concat drafts, ``reports/baselines/concat.jsonl``; they carry both drafts, so their lengths
vary most). Each set is decoded once per variant per repeat, the variants alternating (the VM drifts), 128 new
tokens, T = 0.8, top-p 0.95, seed 0, the bare model; the table holds medians and counts the completions equal
between the variants.

Variants: ``one forward`` (``PREFILL_TOKENS`` large: every distinct prompt in one forward, as wide as the
longest) and ``buckets`` (the shipped ``PREFILL_TOKENS``).

Usage::

    python benchmarks/prefill_buckets.py [--repeats 1] [--budget 2048]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from orchestry.numerics import cpu_line

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--budget", type=int, default=None, help="bucket budget (default: the shipped PREFILL_TOKENS)"
    )
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import orchestry.llm.loading as LD
    import orchestry.llm.local as L
    from orchestry.evaluation.baselines import _revise_helper_prompt, _revise_main_prompt
    from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, load_problems
    from orchestry.rewards.code import extract_code

    model, tok = LD.load_model(ROOT / "models" / "base")
    ps = load_problems(ROOT / "data" / "problems" / "test.jsonl")
    with open(ROOT / "reports" / "baselines" / "concat.jsonl") as f:
        drafts = {r["task_id"]: r for r in map(json.loads, f)}
    concat = [L.chat_prompt(tok, p.helper_prompt(), HELPER_SYSTEM) for p in ps]
    concat += [L.chat_prompt(tok, p.main_prompt(), MAIN_SYSTEM) for p in ps]
    code = [
        (extract_code(drafts[p.task_id]["helper"])[0], extract_code(drafts[p.task_id]["main"])[0]) for p in ps
    ]
    revision = [
        L.chat_prompt(tok, _revise_helper_prompt(p, h, m), HELPER_SYSTEM)
        for p, (h, m) in zip(ps, code, strict=True)
    ]
    revision += [
        L.chat_prompt(tok, _revise_main_prompt(p, m, h), MAIN_SYSTEM)
        for p, (h, m) in zip(ps, code, strict=True)
    ]
    budgets = {"one forward": 10**9, "buckets": args.budget or L.PREFILL_TOKENS}
    L.generate(model, tok, concat[:4], None, 8, 0.8, 0.95, seed=0)  # warm-up
    print(f"cpu: {cpu_line()}; torch threads {args.threads}; torch {torch.__version__}")
    print(
        f"{'prompt set':12s} {'tokens mean/max':>16s} {'one forward s':>14s} {'buckets s':>10s} {'same':>7s}"
    )
    for name, prompts in (("concat", concat), ("revision", revision)):
        seconds: dict[str, list[float]] = {v: [] for v in budgets}
        texts: dict[str, list[str]] = {}
        for _ in range(args.repeats):
            for v, budget in budgets.items():
                L.PREFILL_TOKENS = budget
                t0 = time.perf_counter()
                out = L.generate(model, tok, prompts, None, 128, 0.8, 0.95, seed=0)
                seconds[v].append(time.perf_counter() - t0)
                texts[v] = [g.text for g in out.items]
        lens = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
        same = sum(a == b for a, b in zip(texts["one forward"], texts["buckets"], strict=True))
        one, buck = statistics.median(seconds["one forward"]), statistics.median(seconds["buckets"])
        print(
            f"{name:12s} {sum(lens) / len(lens):9.0f} / {max(lens):3d} {one:14.1f} {buck:10.1f} {same:4d}/{len(prompts)}"
        )


if __name__ == "__main__":
    main()
