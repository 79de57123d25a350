"""Seconds of one supervised warm-start epoch (both agents, every train problem under both prompt forms) with the
code on ``PYTHONPATH``, so that two revisions, or two settings, can be timed side by side on the same machine.

Run at the repository root after ``dvc repro prepare``, one process per measurement, alternating the revisions
(``git worktree add /tmp/old <rev>`` gives the other one)::

    for i in 1 2 3; do
      for src in src /tmp/old/src; do PYTHONPATH=$src python benchmarks/warm_start_speed.py --update fp32; done
    done

``--update bf16`` runs under bf16 autocast (what ``bf16_update: auto`` picks on CPUs with AVX-512 BF16 or AMX),
``fp32`` in fp32 (what it picks elsewhere); prefix ``ATEN_CPU_CAPABILITY=avx2`` to run torch's AVX2 kernels on an
AVX-512 machine. ``--casts per-pass`` makes the bf16 casts of the frozen weights at every pass, what ran before
``orchestry.llm.frozen.cast_once`` (``--casts once``, the code's way: one cast per weight for the block)::

    for i in 1 2; do for c in once per-pass; do
      python benchmarks/warm_start_speed.py --update bf16 --casts $c
    done; done

Prints one line per run: the seconds, the padded positions the epoch's forward passes computed, each agent's mean
token loss, a checksum of the LoRA weights (equal lines mean the same adapters) and the machine
(:func:`orchestry.runtime.machine_info`: CPU model, flags, torch's kernel level, threads).
"""

from __future__ import annotations

import argparse
import contextlib
import time
import types

from orchestry.problems import read_problems
from orchestry.runtime import build_policy, machine_info, start_stage
from orchestry.training.magrpo import warm_start as ws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--update", choices=["bf16", "fp32"], default="fp32")
    ap.add_argument("--casts", choices=["once", "per-pass"], default="once")
    ap.add_argument("--problems", type=int, default=0, help="the first N train problems only (0: all)")
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
    positions = [0]
    decoder = model.get_base_model().get_decoder()
    decoder.register_forward_pre_hook(
        lambda _m, args, kw: positions.__setitem__(
            0, positions[0] + (kw.get("input_ids") if "input_ids" in kw else args[0]).numel()
        ),
        with_kwargs=True,
    )
    t0 = time.time()
    out = ws.warm_start(tr, args.update == "bf16", 1)
    seconds = time.time() - t0
    checksum = sum(float(p.double().sum()) for n, p in model.named_parameters() if "lora_" in n)
    m = machine_info()
    print(
        f"update={args.update} casts={args.casts} seconds={seconds:.2f} positions={positions[0]} "
        f"loss_helper={out['loss/helper/last']:.6f} loss_main={out['loss/main/last']:.6f} "
        f"lora_checksum={checksum:.10f} cpu={m['cpu']!r} flags={m['cpu_flags']!r} kernels={m['kernels']} "
        f"threads={m['threads']}"
    )


if __name__ == "__main__":
    main()
