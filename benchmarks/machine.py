"""The machine line printed beside every benchmark figure: the CPU model and the flags that decide its kernels.

bf16 is native only with AVX-512 BF16 or AMX (elsewhere it is emulated and far slower than fp32), so a timing
means little without them (benchmarks/README.md).
"""

from __future__ import annotations

from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_line(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """``"<model name>; avx2=yes, avx512f=no, avx512_bf16=no, amx_bf16=no"`` from ``cpuinfo``."""
    from orchestry.calibration import cpu_model

    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        text = ""
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []
    )
    shown = ", ".join(f"{f}={'yes' if f in flags else 'no'}" for f in FLAGS)
    return f"{cpu_model(cpuinfo)}; {shown}"
