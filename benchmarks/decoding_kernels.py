"""The decoding kernels of ``orchestry.llm.decoding``, before -> after, on the embedded model.

One process, the variants run alternately (the VM's speed drifts by +-20 % from one minute to the next), each
``--repeats`` times after one warm-up; the table holds the medians. Work: the helper/main pair's rows as one
MAGRPO rollout makes them (``--rows`` rows: G = 4 samples per agent and train problem, random LoRA B so that the
two adapters differ), ``--tokens`` new tokens for every row (no early stop: each variant decodes the same
number of steps), temperature 0.8, top-p 0.95, the same seed for every variant.

Variants:
  peft         peft's mixed-adapter batch (``adapter_names``), transformers' SDPA attention, ``nn.Linear``
  stacked      + :class:`orchestry.llm.decoding.StackedLoRA` (two products per LoRA layer)
  kernels      + ``decode_attention`` and ``DecodeLinear`` (what ``load_model`` sets on CPU), each step through
               ``model.generate``
  decoder-mkl  + :class:`orchestry.llm.decoding.LlamaDecoder` for each step, MKL products (transformers' bits)
  decoder      + LlamaDecoder with oneDNN products on weights reordered once per call (shipped)

The last column counts the rows whose completion equals the ``peft`` variant's (sampling under the same seed).
With ``--stop`` each row decodes at most ``--tokens`` tokens as shipped (it stops at EOS or a closed code block
and leaves the batch between rounds) instead of exactly ``--tokens``; tokens/s then count the tokens decoded.

Usage::

    python benchmarks/decoding_kernels.py --rows 16 --tokens 64     # a MAGRPO rollout (2 problems x 2 agents x 4)
    python benchmarks/decoding_kernels.py --rows 64 --tokens 96     # an evaluation batch (evaluate.batch_size)
    python benchmarks/decoding_kernels.py --only kernels            # one variant, once (whole-process timing)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from orchestry.numerics import cpu_line

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ["peft", "stacked", "kernels", "decoder-mkl", "decoder"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=str(ROOT / "models" / "base"))
    ap.add_argument("--problems", default=str(ROOT / "data" / "problems" / "train.jsonl"))
    ap.add_argument("--only", choices=VARIANTS, help="run this variant once (no warm-up): "
                    "for timing whole processes against each other")  # fmt: skip
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=VARIANTS)
    ap.add_argument("--stop", action="store_true", help="stop rows at EOS / a closed code block, as shipped")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from orchestry.llm import decoding
    from orchestry.llm.loading import attach_adapters, load_model
    from orchestry.llm.local import chat_prompt, generate
    from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, load_problems

    model, tok = load_model(args.model)  # on CPU: the kernels are on
    pm = attach_adapters(model, ["helper", "main"])
    torch.manual_seed(0)
    for n, p in pm.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.02)
    base = pm.get_base_model()
    linears = [m for m in base.modules() if type(m) is decoding.DecodeLinear]

    prompts, adapters = [], []
    for p in load_problems(args.problems):
        for agent, prompt in (
            ("helper", chat_prompt(tok, p.helper_prompt(), HELPER_SYSTEM)),
            ("main", chat_prompt(tok, p.main_prompt(), MAIN_SYSTEM)),
        ):
            prompts += [prompt] * 4
            adapters += [agent] * 4
        if len(prompts) >= args.rows:
            break
    prompts, adapters = prompts[: args.rows], adapters[: args.rows]

    tokens: dict[str, int] = {}

    def run(variant: str) -> tuple[float, list[str]]:
        kernels = variant not in ("peft", "stacked")
        decoding.use_products("mkl" if variant == "decoder-mkl" else "onednn")
        base.set_attn_implementation(decoding.ATTENTION if kernels else "sdpa")
        for m in linears:
            m.__class__ = decoding.DecodeLinear if kernels else torch.nn.Linear
        t0 = time.perf_counter()
        out = generate(pm, tok, prompts, adapters, max_new_tokens=args.tokens, temperature=0.8, top_p=0.95,
                       seed=3, stop_at_code_end=args.stop, stacked_lora=variant != "peft",
                       fast_decoding=variant.startswith("decoder"))  # fmt: skip
        tokens[variant] = sum(g.completion_tokens for g in out.items)
        return time.perf_counter() - t0, [g.text for g in out.items]

    if args.only:
        s, _ = run(args.only)
        print(f"{args.only}: {args.rows} rows x {args.tokens} new tokens in {s:.2f} s ({cpu_line()})")
        return
    variants = args.variants
    for v in variants:
        run(v)  # warm-up
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    texts: dict[str, list[str]] = {}
    for r in range(args.repeats):
        for v in variants:
            s, texts[v] = run(v)
            seconds[v].append(s)
            print(f"run {r + 1}/{args.repeats} {v}: {s:.2f} s", flush=True)
    print(f"cpu: {cpu_line()}; torch threads {args.threads}; torch {torch.__version__}")
    print(f"{args.rows} rows x {args.tokens} new tokens{' at most (rows stop as shipped)' if args.stop else ''}, "
          f"medians of {args.repeats} alternating runs")  # fmt: skip
    print(
        f"{'variant':12s} {'seconds':>8s} {'tokens/s':>9s} {'speed-up':>9s} {'same completions as first':>26s}"
    )
    ref = statistics.median(seconds[variants[0]])
    for v in variants:
        s = statistics.median(seconds[v])
        same = sum(a == b for a, b in zip(texts[v], texts[variants[0]], strict=True))
        print(f"{v:12s} {s:8.2f} {tokens[v] / s:9.1f} {ref / s:8.2f}x {same:>20d}/{args.rows}")


if __name__ == "__main__":
    main()
