"""Seconds of one supervised warm-start epoch (both agents, every train problem under both prompt forms) with the
code on ``PYTHONPATH``, so that two revisions can be timed side by side on the same machine.

Run at the repository root after ``dvc repro prepare``, one process per measurement, alternating the revisions
(``git worktree add /tmp/old <rev>`` gives the other one)::

    for i in 1 2 3; do
      for src in src /tmp/old/src; do PYTHONPATH=$src python benchmarks/warm_start_speed.py --update fp32; done
    done

``--update bf16`` runs under bf16 autocast (what ``bf16_update: auto`` picks on CPUs with AVX-512 BF16 or AMX),
``fp32`` in fp32 (what it picks elsewhere); prefix ``ATEN_CPU_CAPABILITY=avx2`` to run torch's AVX2 kernels on an
AVX-512 machine. Prints the seconds, each agent's mean token loss, a checksum of the LoRA weights, the padded
positions the epoch's forward passes computed, the CPU model, its flags and torch's kernel level.
"""

from __future__ import annotations

import argparse
import time
import types

import torch

from orchestry.numerics import cpu_flags, cpu_model
from orchestry.problems import read_problems
from orchestry.runtime import build_policy, start_stage
from orchestry.training import warm_start as ws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--update", choices=["bf16", "fp32"], default="fp32")
    args = ap.parse_args()
    params = start_stage("bench")
    cfg = params.train_magrpo
    model, tok = build_policy(params, ("helper", "main"))
    problems = read_problems("data/problems/train.jsonl")
    tr = types.SimpleNamespace(
        model=model, tokenizer=tok, cfg=cfg, problems=problems, agents=("helper", "main")
    )
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
    flags = cpu_flags()
    print(
        f"update={args.update} seconds={seconds:.2f} positions={positions[0]} "
        f"loss_helper={out['loss/helper/last']:.6f} loss_main={out['loss/main/last']:.6f} "
        f"lora_checksum={checksum:.10f} cpu={cpu_model()!r} avx512_bf16={flags.get('avx512_bf16')} "
        f"amx_bf16={flags.get('amx_bf16')} kernels={torch.backends.cpu.get_cpu_capability()} "
        f"threads={torch.get_num_threads()}"
    )


if __name__ == "__main__":
    main()
