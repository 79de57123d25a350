"""The machine line printed beside every benchmark figure: the CPU model and the flags that decide its kernels.

bf16 is native only with AVX-512 BF16 or AMX (elsewhere it is emulated and far slower than fp32), so a timing
means little without them (benchmarks/README.md). The same line is logged with every pipeline run
(``orchestry.numerics``).
"""

from __future__ import annotations

from orchestry.numerics import FLAGS, cpu_line

__all__ = ["FLAGS", "cpu_line"]
