"""Where a MAGRPO rollout's time goes on this CPU: the parts of ``generate``, and a decoding step at 1-32 rows.

Part 1 (``--calls``): ``orchestry.llm.local.generate`` on the work of one optimizer update of
``benchmarks/magrpo_vs_comlrl.py`` (the first 4 HumanEval train problems x 2 agents x G = 4 samples, plain prompts,
at most 128 new tokens, T = 0.8, top-p 0.95, seed 1; ``magrpo_levers._setup``), called several times in one
process. For each call: seconds in all, the prefill of the distinct prompts (with their real and padded
positions), the decoding steps (:class:`orchestry.llm.decoding.LlamaDecoder`), the sampler, building the decoder.
The first call of a process also pays first-use costs.

Part 2 (``--rows``): one decoding step at each row count, on random caches (the rows' prompts: one per 4 rows, 200
positions each; 41 own positions), against the same step's projections alone (oneDNN products and the rows' LoRA,
the LM head included): the rest is attention, norms, rotary embeddings and small operations. Median of 8.

Usage::

    python benchmarks/rollout_breakdown.py                     # both parts (about 2 minutes on 2 cores)
    python benchmarks/rollout_breakdown.py --calls 0 --rows 4,32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _timed(obj, name: str, totals: dict, key: str) -> None:
    """Wrap ``obj.name`` so that its seconds and calls add up in ``totals[key]``."""
    fn = getattr(obj, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] = totals.get(key, 0.0) + time.perf_counter() - t0
            totals[f"{key} calls"] = totals.get(f"{key} calls", 0) + 1

    setattr(obj, name, wrapper)


def generate_parts(model, tok, prompts, adapters, calls: int, dtypes=("float32",)) -> None:
    import orchestry.llm.decoding as D
    import orchestry.llm.local as L

    totals: dict = {}
    _timed(L, "_prefill_groups", totals, "prefill")
    _timed(D.LlamaDecoder, "__init__", totals, "decoder")
    _timed(D.LlamaDecoder, "step", totals, "steps")
    _timed(L.NucleusSampler, "draw", totals, "sampler")
    enc = tok(prompts, padding=True, add_special_tokens=False, return_tensors="pt")
    first, _ = L.prompt_groups(enc["input_ids"], enc["attention_mask"], adapters)
    lengths = enc["attention_mask"][first, :-1].sum(dim=1).tolist()
    padded = sum(len(b) * max(lengths[j] for j in b) for b in L._prefill_buckets(lengths))
    print(
        f"{len(prompts)} rows, {len(lengths)} distinct prompts: {sum(lengths)} prompt positions, {padded} padded"
    )
    for call in range(calls * len(dtypes)):
        dtype = dtypes[call % len(dtypes)]
        D.use_products("onednn", dtype)
        totals.clear()
        t0 = time.perf_counter()
        batch = L.generate(
            model, tok, prompts, adapters, max_new_tokens=128, temperature=0.8, top_p=0.95, seed=1
        )
        total = time.perf_counter() - t0
        tokens = sum(it.completion_tokens for it in batch.items)
        steps = totals.get("steps calls", 0)
        print(
            f"call {call // len(dtypes)} ({dtype}): {total:.2f} s, {tokens} tokens ({tokens / total:.0f}/s); prefill {totals['prefill']:.2f} s;"
            f" {steps} steps {totals['steps']:.2f} s ({1e3 * totals['steps'] / max(steps, 1):.0f} ms each);"
            f" sampler {totals.get('sampler', 0):.2f} s; decoder built in {totals.get('decoder', 0):.2f} s"
        )


def step_vs_rows(model, adapters, rows: list[int], dtypes=("float32",)) -> None:
    import torch

    import orchestry.llm.decoding as D
    import orchestry.llm.local as L

    cfg = model.get_base_model().config
    stacked = L._stacked_lora(model, adapters)
    torch.manual_seed(0)
    decoders = {}
    for dtype in dtypes:
        D.use_products("onednn", dtype)
        with stacked.hooks():
            decoders[dtype] = D.LlamaDecoder(model, stacked)
    dec = decoders[dtypes[0]]
    layers, width, own, t = len(dec.layers), 200, 128, 40
    print("rows  dtype     step ms  projections ms  rest ms")
    for M, dtype in [(M, d) for M in rows for d in dtypes]:
        dec = decoders[dtype]
        n = max(1, M // 4)
        keys = [torch.randn(n, dec.kv_heads, width, dec.head_dim) for _ in range(layers)]
        values = [torch.randn(n, dec.kv_heads, width, dec.head_dim) for _ in range(layers)]
        prefix = D.SharedPrefix(
            keys, values, torch.ones(n, width, dtype=torch.bool), (torch.arange(M) // 4).clamp(max=n - 1)
        )
        dec.row_mask = stacked.row_mask([adapters[i % len(adapters)] for i in range(M)])
        K = [torch.randn(M, dec.kv_heads, own, dec.head_dim) for _ in range(layers)]
        V = [torch.randn(M, dec.kv_heads, own, dec.head_dim) for _ in range(layers)]
        attend = torch.zeros(M, own, dtype=torch.bool)
        attend[:, : t + 1] = True
        tokens, positions = torch.randint(0, dec.embed.shape[0], (M,)), torch.full((M,), width + t)
        x, inner = torch.randn(M, dec.embed.shape[1]), torch.randn(M, cfg.intermediate_size)

        def projections(x=x, inner=inner, dec=dec):
            dec.projections(x, inner)

        step_s, proj_s = [], []
        for _ in range(8):
            t0 = time.perf_counter()
            dec.step(tokens, positions, K, V, t, attend, prefix)
            step_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            projections()
            proj_s.append(time.perf_counter() - t0)
        s, p = 1e3 * statistics.median(step_s), 1e3 * statistics.median(proj_s)
        print(f"{M:4d}  {dtype:8s}  {s:7.1f}  {p:14.1f}  {s - p:7.1f} ({(s - p) / s:.0%})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3, help="generate calls in part 1 (0: skip it)")
    ap.add_argument("--rows", default="1,2,4,8,16,32", help="row counts of part 2 (empty: skip it)")
    ap.add_argument(
        "--stack",
        type=int,
        default=1,
        help="1: q|k|v and gate|up as stacked products (the default); 0: one product per projection",
    )
    ap.add_argument(
        "--decode-dtype",
        default="float32",
        help="model.decode_dtype values to compare, comma-separated (e.g. float32,bfloat16: alternated)",
    )
    args = ap.parse_args()
    dtypes = tuple(args.decode_dtype.split(","))
    import torch

    import orchestry.llm.decoding as D
    from orchestry.numerics import cpu_line

    D.STACK = bool(args.stack)
    print(f"{cpu_line()}; torch {torch.__version__}, {torch.get_num_threads()} threads; stack={D.STACK}")
    import magrpo_levers

    base, tok, _, prompts, adapters, attach = magrpo_levers._setup()
    model = attach(base, ("helper", "main"), seed=0)
    if args.calls > 0:
        generate_parts(model, tok, prompts, adapters, args.calls, dtypes)
    if args.rows:
        step_vs_rows(model, adapters, [int(r) for r in args.rows.split(",")], dtypes)


if __name__ == "__main__":
    main()
