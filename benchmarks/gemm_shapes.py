"""fp32 products of the embedded model's decoding shapes on this CPU: torch's two orientations, MKL's packed GEMM
and oneDNN with prepacked weights.

Each shape is a linear layer ``[rows, in] -> [rows, out]`` of SmolLM2-135M (attention 576 -> 576 and 576 -> 192,
MLP 576 -> 1536 and 1536 -> 576, LM head 576 -> 49152). Every call takes the next of several distinct weight
copies (30 for the layer shapes, 2 for the LM head), so that the weights come from memory as in a decoding step
that reads all 30 layers. Prints microseconds per call, GFLOP/s and GB/s of weights read for ``x @ W.T`` and for
``(W @ x.T).T`` (what ``orchestry.llm.decoding.DecodeLinear`` computes), the speed-up of each packed variant over
the latter and its largest difference from ``F.linear``.

Usage::

    python benchmarks/gemm_shapes.py [--rows 16 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from orchestry.numerics import cpu_line

SHAPES = ((576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152))


def _time(f, n: int) -> float:
    for _ in range(5):
        f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n


def _shape(rows: int, k: int, n: int, calls: int) -> str:
    """One line of the table: the four variants on ``[rows, k] -> [rows, n]``."""
    ws = [torch.randn(n, k) for _ in range(30 if n * k < 10**7 else 2)]
    x = torch.randn(rows, k)
    mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, rows) for w in ws]
    dnn = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in ws]
    i = [0]

    def nxt() -> int:
        i[0] = (i[0] + 1) % len(ws)
        return i[0]

    def mkl_packed():
        j = nxt()
        return torch.ops.mkl._mkl_linear(x, mkl[j], ws[j], None, rows)

    def onednn_packed(j=None):
        return torch.ops.mkldnn._linear_pointwise(x, dnn[nxt() if j is None else j], None, "none", [], "")

    plain = _time(lambda: x @ ws[nxt()].t(), calls)
    flipped = _time(lambda: (ws[nxt()] @ x.t()).t(), calls)
    packed, onednn = _time(mkl_packed, calls), _time(onednn_packed, calls)
    diff = float((onednn_packed(0) - torch.nn.functional.linear(x, ws[0])).abs().max())
    return (f"{rows:4d} {k:5d}x{n:<5d} {plain * 1e6:9.0f} {2 * rows * k * n / plain / 1e9:8.1f} "
            f"{flipped * 1e6:13.0f} {n * k * 4 / flipped / 1e9:6.1f} {flipped / packed:10.2f}x "
            f"{flipped / onednn:13.2f}x {diff:16.1e}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=60)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"cpu: {cpu_line()}; torch threads {args.threads}; torch {torch.__version__}")
    print(f"{'rows':>4s} {'in x out':>11s} {'x@W.T us':>9s} {'GFLOP/s':>8s} {'(W@x.T).T us':>13s} {'GB/s':>6s} "
          f"{'mkl packed':>11s} {'onednn packed':>14s} {'onednn max diff':>16s}")  # fmt: skip
    for rows in args.rows:
        for k, n in SHAPES:
            print(_shape(rows, k, n, args.calls), flush=True)


if __name__ == "__main__":
    main()
