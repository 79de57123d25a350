"""Bit fingerprints of the embedded model's floating point on this machine, to compare CPU kinds.

    python benchmarks/numerics_fingerprint.py --numerics portable          # prints one JSON line
    python benchmarks/numerics_fingerprint.py --numerics native --out benchmarks/results/numerics_fingerprint.jsonl

Three sha-256 prefixes, each from work the pipeline does (docs/reproducibility.md):

* ``logits``: the fp32 logits of one forward pass of ``models/base`` over 8 fixed chat prompts (left-padded batch);
* ``adapters``: the LoRA weights (r 16 on q/k/v/o, ``attach_adapters`` seed 0) after two AdamW steps (lr 1e-3) on
  the 8 prompts' next-token loss, in fp32;
* ``tokens``: 16 rows x 48 tokens sampled by ``orchestry.llm.local.generate`` (T 0.8, top-p 0.95, seed 0).

``loss_after`` is the loss of the second step's forward pass (before its update). Two machines whose lines agree on
all three compute the same bits in these paths under that ``numerics``, so the pipeline's results are expected to
match on both (docs/reproducibility.md; not yet checked across CPU kinds). ``--numerics`` is applied before
torch computes anything (``orchestry.numerics.apply_numerics``), so run one setting per process. The line also
names the CPU, its flags, torch's kernel set, MKL's branch, the threads and the decoding seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = [
    "Write a Python function `total(xs)` that returns the sum of the numbers in xs.",
    "Write a Python function `shout(s)` that returns s in uppercase.",
    "Write a Python function `evens(xs)` that keeps only the even numbers of xs.",
    "Write a Python function `vowels(s)` that counts the vowels in s.",
    "Write a Python function `biggest(xs)` that returns the largest number in xs, or 0 if xs is empty.",
    "Write a Python function `words(s)` that splits s into words at the spaces.",
    "Write a Python function `squares(xs)` that squares every number of xs.",
    "Write a Python function `backwards(s)` that returns s reversed.",
]


def sha(t) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()[:12]


def main() -> None:
    ap = argparse.ArgumentParser(
        description="Bit fingerprints of this machine's floating point (one JSON line)."
    )
    ap.add_argument("--numerics", choices=["native", "portable"], default="native")
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "base")
    ap.add_argument("--out", type=Path, help="append the line to this JSONL file as well")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT / "src"))
    from orchestry.numerics import apply_numerics

    apply_numerics(args.numerics)  # before torch computes anything
    import torch

    from orchestry.llm.local import attach_adapters, chat_prompt, generate, load_model
    from orchestry.numerics import machine_info

    if not (args.model / "config.json").exists():
        ap.error(f"--model {args.model}: no model there (run `dvc repro prepare` first)")
    model, tok = load_model(args.model, dtype="float32")
    prompts = [chat_prompt(tok, t) for t in TASKS]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        logits = model(**enc).logits.float()

    t0 = time.perf_counter()
    out = generate(model, tok, prompts * 2, max_new_tokens=48, temperature=0.8, top_p=0.95, seed=0,
                   stop_at_code_end=False)  # fmt: skip
    decode_s = time.perf_counter() - t0

    peft_model = attach_adapters(model, ["helper"], seed=0)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    for _ in range(2):
        loss = peft_model(**enc, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    lora = torch.cat([p.detach().flatten() for p in params])

    line = {
        "machine": machine_info(),
        "numerics": args.numerics,
        "logits": sha(logits),
        "adapters": sha(lora),
        "tokens": sha(out.sequences),
        "loss_after": round(float(loss.detach()), 6),
        "decode_seconds": round(decode_s, 2),
        "date": time.strftime("%Y-%m-%d"),
    }
    text = json.dumps(line)
    print(text)
    if args.out:
        with args.out.open("a") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
