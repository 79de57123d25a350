"""One warm-start epoch with one cast of each frozen weight for the block (``--casts once``, the default code) or
the casts made at every pass (``--casts per-pass``, what ran before ``orchestry.llm.frozen.cast_once``).

Run at the repository root after ``dvc repro prepare``, one process per measurement, alternating the two::

    for i in 1 2; do for c in once per-pass; do python benchmarks/warm_start_casts.py --casts $c; done; done

Prints one line per run: the seconds, each agent's mean token loss, a checksum of the LoRA weights (equal lines
mean the same adapters), the CPU model and whether it has AVX-512 BF16. Uses ``params.yaml``'s model and
``train_magrpo`` settings with bf16 autocast (the update's dtype where the CPU runs bf16 natively).
"""

from __future__ import annotations

import argparse
import contextlib
import time
import types

from orchestry.numerics import cpu_flags, cpu_model
from orchestry.problems import read_problems
from orchestry.runtime import build_policy, start_stage
from orchestry.training import warm_start as ws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--casts", choices=["once", "per-pass"], default="once")
    ap.add_argument(
        "--problems", type=int, default=48, help="the first N train problems (both prompt forms each)"
    )
    args = ap.parse_args()
    params = start_stage("bench")
    cfg = params.train_magrpo.model_copy(update={"warm_start_problems": args.problems})
    model, tok = build_policy(params, ("helper", "main"))
    problems = read_problems("data/problems/train.jsonl")
    tr = types.SimpleNamespace(
        model=model, tokenizer=tok, cfg=cfg, problems=problems, agents=("helper", "main")
    )
    if args.casts == "per-pass":
        ws.cast_once = lambda m, d: contextlib.nullcontext()
    t0 = time.time()
    out = ws.warm_start(tr, True, 1)
    seconds = time.time() - t0
    checksum = sum(float(p.double().sum()) for n, p in model.named_parameters() if "lora_" in n)
    flags = cpu_flags()
    print(
        f"casts={args.casts} seconds={seconds:.2f} loss_helper={out['loss/helper/last']:.6f} "
        f"loss_main={out['loss/main/last']:.6f} lora_checksum={checksum:.10f} cpu={cpu_model()!r} "
        f"avx512_bf16={flags.get('avx512_bf16')} amx_bf16={flags.get('amx_bf16')}"
    )


if __name__ == "__main__":
    main()
