"""Bit fingerprints of the embedded model's floating point on this machine, to compare CPU kinds.

    python benchmarks/numerics_fingerprint.py --numerics portable          # prints one JSON line
    python benchmarks/numerics_fingerprint.py --numerics native --out benchmarks/results/numerics_fingerprint.jsonl

Three sha-256 prefixes, each from work the pipeline does (docs/reproducibility.md):

* ``logits``: the fp32 logits of one forward pass of ``models/base`` over 8 fixed chat prompts (left-padded batch);
* ``adapters``: the LoRA weights (r 16 on q/k/v/o, ``attach_adapters`` seed 0) after two AdamW steps (lr 1e-3) on
  the 8 prompts' next-token loss, in fp32;
* ``tokens``: 16 rows x 48 tokens sampled by ``orchestry.llm.local.generate`` (T 0.8, top-p 0.95, seed 0).

``loss_after`` is the loss of the second step's forward pass (before its update). The work is
``orchestry.doctor.fingerprint`` (what ``orchestry doctor`` runs and compares with the committed lines). Two machines whose lines agree on
all three compute the same bits in these paths under that ``numerics``, so the pipeline's results are expected to
match on both (docs/reproducibility.md; not yet checked across CPU kinds). ``--numerics`` is applied before
torch computes anything (``orchestry.numerics.apply_numerics``), so run one setting per process. The line also
names the CPU, its flags, torch's kernel set, MKL's branch, the threads and the decoding seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(
        description="Bit fingerprints of this machine's floating point (one JSON line)."
    )
    ap.add_argument("--numerics", choices=["native", "portable"], default="native")
    ap.add_argument("--update", choices=["fp32", "auto"], default="fp32",
                    help="the training step's dtype: fp32 (comparable across machines) or bf16_update auto")  # fmt: skip
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "base")
    ap.add_argument("--out", type=Path, help="append the line to this JSONL file as well")
    ap.add_argument(
        "--trace", type=Path, help="write the first training step's hashes per module to this JSON file"
    )
    ap.add_argument(
        "--compare", type=Path, help="with --trace: print where this machine's trace parts from this one"
    )
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT / "src"))
    from orchestry.numerics import apply_numerics

    apply_numerics(args.numerics)  # before torch computes anything
    from orchestry.doctor import fingerprint, first_difference, gradient_trace
    from orchestry.runtime import machine_info

    if not (args.model / "config.json").exists():
        ap.error(f"--model {args.model}: no model there (run `dvc repro prepare` first)")
    if args.trace:  # where the training step parts between two machines (docs/reproducibility.md)
        trace = {"machine": machine_info(), **gradient_trace(args.model)}
        args.trace.write_text(json.dumps(trace, indent=0) + "\n")
        if args.compare:
            print(json.dumps(first_difference(trace, json.loads(args.compare.read_text()))))
        return
    line = fingerprint(args.model, "auto" if args.update == "auto" else False)
    text = json.dumps(line)
    print(text)
    if args.out:
        with args.out.open("a") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
