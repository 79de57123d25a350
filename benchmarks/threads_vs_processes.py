"""Two independent ``generate`` calls: one process with 2 threads vs two processes with 1 thread each.

The work is the ``evaluate`` stage's base pair on the generated test split: ``--problems`` problems x 2 samples,
helper prompts then main prompts, decoded by :func:`orchestry.llm.sampling.sample_texts` in batches of
``--batch`` rows (64 rows = 32 problems x 2 samples: two calls, helpers at seed S, mains at seed S + 64), the
params' sampling settings. ``--part all`` decodes both calls in this process; ``--part 0`` / ``--part 1`` only the
first / second call with its own seed, so two processes running ``0`` and ``1`` side by side do the same calls.
Each writes the completions (and tokens) as JSON lines to ``--out``; compare the files to see whether the
thread count changed any token. Timing is from outside, with farm-bench::

    farm-bench -n 3 --timeout 3600 -- sh -c 'OMP_NUM_THREADS=2 python benchmarks/threads_vs_processes.py --part all --out /tmp/tvp_a.jsonl' \\
      --vs "sh -c 'OMP_NUM_THREADS=1 python benchmarks/threads_vs_processes.py --part 0 --out /tmp/tvp_b0.jsonl & OMP_NUM_THREADS=1 python benchmarks/threads_vs_processes.py --part 1 --out /tmp/tvp_b1.jsonl; wait'"

(run at the repository root after ``dvc repro prepare``; prints the CPU line first).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("all", "0", "1"), default="all")
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import torch

    from orchestry.llm.loading import load_model
    from orchestry.llm.local import chat_prompt
    from orchestry.llm.sampling import sample_texts
    from orchestry.numerics import cpu_line
    from orchestry.params_file import load_params
    from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, read_problems

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    print(f"{cpu_line()}; threads {torch.get_num_threads()}; part {args.part}", flush=True)
    params = load_params(ROOT / "params.yaml")
    model, tok = load_model(str(ROOT / params.model.path), params.model.dtype)
    problems = read_problems(ROOT / "data/problems/test.jsonl")[: args.problems]
    jobs = [p for p in problems for _ in range(2)]
    prompts = [chat_prompt(tok, p.helper_prompt(), HELPER_SYSTEM) for p in jobs]
    prompts += [chat_prompt(tok, p.main_prompt(), MAIN_SYSTEM) for p in jobs]
    starts = list(range(0, len(prompts), args.batch))
    chosen = starts if args.part == "all" else [starts[int(args.part)]]
    t0, rows = time.time(), []
    for start in chosen:
        chunk = prompts[start : start + args.batch]
        gens = sample_texts(model, tok, chunk, None, params.sampling, args.seed + start, args.batch)
        rows += [
            {"row": start + i, "text": g.text, "tokens": g.completion_tokens} for i, g in enumerate(gens)
        ]
    seconds = time.time() - t0
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} completions, {sum(r['tokens'] for r in rows)} tokens in {seconds:.1f} s", flush=True)


if __name__ == "__main__":
    main()
