"""Which CPU kernels a run's floating point goes through, and the portable setting (``model.numerics``),
and whether the training update runs in bf16 (:func:`resolve_bf16`).

A run's numbers depend on the machine in two ways:

* **kernel paths.** torch picks its vectorised CPU kernels by the CPU's instruction set (``AVX2``,
  ``AVX512``, ...; ``torch.backends.cpu.get_cpu_capability()``), and Intel MKL, torch's CPU matrix library,
  picks a code branch by the CPU as well. Different paths sum in different orders, so the low bits of every
  logit and gradient differ between CPU kinds. Sampled tokens rarely notice (the same prompts, baselines and
  first MAGRPO steps came out identical on an Intel AVX-512 machine and on this AMD AVX2 one), but training
  feeds the bits back into the weights, and once one sampled token flips the runs part.
* **the update's dtype.** ``train_magrpo.bf16_update: auto`` trains in bf16 where the CPU runs it natively
  (AVX-512 BF16 / AMX) and in fp32 elsewhere: on purpose, different numbers on different CPUs.

Measured on the AMD EPYC (AVX2) build machine with the embedded model (fp32 forward logits of a fixed batch,
two LoRA AdamW steps, 16 rows x 48 sampled tokens; ``docs/reproducibility.md``): 1 or 2 threads give the same
bits; forcing torch's scalar kernels (``ATEN_CPU_CAPABILITY=default``) or MKL's ``COMPATIBLE`` branch changes the
logits' and the adapters' bits (not the 48 sampled tokens); ``MKL_CBWR=AVX2``/``AUTO`` and
``ONEDNN_MAX_CPU_ISA=AVX2`` change nothing on that CPU.

``model.numerics: portable`` therefore pins the paths that can be pinned on every x86-64 CPU with AVX2: torch's
AVX2 kernels (``ATEN_CPU_CAPABILITY=avx2``), MKL's ``COMPATIBLE`` branch (Intel documents it as the one branch
that gives the same results on Intel and non-Intel CPUs; ``MKL_CBWR``), oneDNN's AVX2 code
(``ONEDNN_MAX_CPU_ISA``) and an fp32 update. It costs speed (decoding ~1.7x slower on the build machine) and is
not the default. That two CPU kinds then agree bit for bit is what the settings are documented to give; it was
not measured here (one CPU kind on hand).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import platform
from pathlib import Path

log = logging.getLogger(__name__)

#: The CPU flags that decide the kernels (bf16 is native only with AVX-512 BF16 or AMX).
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")

#: The environment of ``model.numerics: portable`` (read by torch and MKL when they first compute).
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}

#: Set by :func:`apply_numerics` so that later code (``resolve_bf16``) and child processes see the setting.
NUMERICS_ENV = "ORCHESTRY_NUMERICS"


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name (the first ``model name`` line of /proc/cpuinfo; else ``platform.processor()``)."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> dict[str, bool]:
    """``{flag: present}`` for :data:`FLAGS`, from the first ``flags`` line of ``cpuinfo`` (all False when there
    is none: not Linux, or not x86)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        text = ""
    found = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    return {f: f in found for f in FLAGS}


def cpu_line(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """``"<model name>; avx2=yes, avx512f=no, avx512_bf16=no, amx_bf16=no"``: printed beside every timing."""
    shown = ", ".join(f"{f}={'yes' if v else 'no'}" for f, v in cpu_flags(cpuinfo).items())
    return f"{cpu_model(cpuinfo)}; {shown}"


def numerics_mode() -> str:
    """``portable`` when :func:`apply_numerics` set it in this process (or a parent), else ``native``."""
    return "portable" if os.environ.get(NUMERICS_ENV) == "portable" else "native"


def apply_numerics(mode: str, cpuinfo: str | Path = "/proc/cpuinfo") -> None:
    """Put ``model.numerics`` into effect; call before torch computes anything (``runtime.start_stage`` does).

    ``native``: nothing is pinned (a user's own ``ATEN_CPU_CAPABILITY``/``MKL_CBWR`` stay as they are).
    ``portable``: sets :data:`PORTABLE_ENV` (overriding other values, with a warning) and ``ORCHESTRY_NUMERICS``;
    on a CPU without AVX2 (or not x86) a warning says the run cannot match the AVX2 machines.

    Raises:
        ValueError: ``mode`` is neither ``native`` nor ``portable``.
        RuntimeError: torch already chose its kernels (something computed before this call), so the setting
            could not take effect.
    """
    if mode not in ("native", "portable"):
        raise ValueError(f"model.numerics must be native or portable, got {mode!r}")
    if mode == "native":
        os.environ.pop(NUMERICS_ENV, None)
        return
    for key, value in PORTABLE_ENV.items():
        if os.environ.get(key, value) != value:
            log.warning("model.numerics portable: %s=%s replaced by %s", key, os.environ[key], value)
        os.environ[key] = value
    os.environ[NUMERICS_ENV] = "portable"
    if not cpu_flags(cpuinfo)["avx2"]:
        log.warning("model.numerics portable: this CPU has no AVX2 (%s): its results cannot match AVX2 machines",
                    cpu_model(cpuinfo))  # fmt: skip
        return
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    if cap != "AVX2":
        raise RuntimeError(
            f"model.numerics portable: torch already uses its {cap} kernels (something computed before the "
            "setting was applied); start the process with ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE"
        )


def machine_info() -> dict:
    """What a run's numbers and seconds depend on: ``cpu``, ``cpu_flags`` (the :data:`FLAGS` present),
    ``threads`` (torch's), ``torch`` (version), ``kernels`` (torch's CPU capability), ``mkl_cbwr`` (MKL's
    branch setting, ``AUTO`` when unset), ``numerics`` (:func:`numerics_mode`), ``decode_dtype`` (decoding's
    resolved operand dtype, ``model.decode_dtype``) and ``gpu`` (CUDA device name or ``none``). Logged as MLflow tags ``machine.<key>`` of every stage run and written into the stage reports."""
    import torch

    from orchestry.llm import decoding  # its model.decode_dtype, resolved by use_products

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {
        "cpu": cpu_model(),
        "cpu_flags": " ".join(f for f, v in cpu_flags().items() if v) or "none",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "mkl_cbwr": os.environ.get("MKL_CBWR", "AUTO"),
        "numerics": numerics_mode(),
        "decode_dtype": decoding.decode_numerics()[1],
        "gpu": gpu,
    }


@functools.cache
def cpu_bf16_supported() -> bool:
    """True when this CPU runs bf16 matmuls natively (oneDNN: AVX-512 BF16 / AMX class CPUs).

    Elsewhere bf16 is emulated and far slower than fp32 (figures for an AVX2-only CPU in benchmarks/README.md,
    "bf16 on a CPU without AVX-512 BF16").
    """
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def cuda_bf16_supported() -> bool:
    """True when the current CUDA device runs bf16 natively (Ampere or later; emulation does not count)."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch < 2.4 has no including_emulation and reports native support only
        return bool(torch.cuda.is_bf16_supported())


def resolve_bf16(setting: str | bool, device) -> bool:
    """Whether the training forward/backward runs under bf16 autocast, from ``train_magrpo.bf16_update``.

    Args:
        setting: ``"auto"``: bf16 only where ``device`` runs it natively (CPU: :func:`cpu_bf16_supported`,
            i.e. oneDNN bf16 on AVX-512 BF16 / AMX CPUs; CUDA: :func:`cuda_bf16_supported`), fp32 elsewhere.
            Under ``model.numerics: portable`` (:func:`numerics_mode`) ``"auto"`` is fp32.
            ``True``: bf16 even where it is emulated (a one-line warning says so, it is slow there).
            ``False``: fp32.
        device: the model's device (``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device``).

    Returns:
        True for bf16 autocast, False for fp32; pass it to :func:`bf16_autocast`.
    """
    import torch

    if setting is False:
        return False
    if setting == "auto" and numerics_mode() == "portable":  # model.numerics: portable trains in fp32
        return False
    kind = torch.device(device).type
    native = (kind == "cpu" and cpu_bf16_supported()) or (kind == "cuda" and cuda_bf16_supported())
    if setting == "auto":
        return native
    if setting is True:
        if not native:
            log.warning(
                "bf16_update: true on %s, which has no native bf16 (%s): bf16 is emulated and much slower "
                "than fp32 here; bf16_update: auto would use fp32",
                kind,
                "no AVX-512 BF16 / AMX" if kind == "cpu" else "not reported as native",
            )
        return True
    raise ValueError(f"bf16 setting must be 'auto', True or False, got {setting!r}")


def bf16_autocast(model, enabled: bool):
    """bf16 autocast on the model's device when ``enabled`` (from :func:`resolve_bf16`); else a no-op (fp32)."""
    import torch

    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16)


def resolve_decode_bf16(setting: str, products: str = "onednn") -> bool:
    """Whether decoding's projections (:class:`orchestry.llm.decoding.LlamaDecoder`) take bf16 operands, from
    ``model.decode_dtype``.

    bf16 operands round each weight and input to 8 significant bits (the products are summed in fp32): on the
    embedded model the next-token distributions move by 0.5 % in total variation on average and the greedy token
    changes at 0.4-0.6 % of positions (benchmarks/README.md), so seeded samples differ from fp32 decoding's.

    Args:
        setting: ``"float32"``; ``"bfloat16"`` (needs a CPU with native bf16: oneDNN has no bf16 inner product
            elsewhere); ``"auto"``: bf16 only where the CPU runs it natively (:func:`cpu_bf16_supported`) and not under
            ``model.numerics: portable`` (:func:`numerics_mode`).
        products: ``model.decode_products``; bf16 needs ``"onednn"`` (``"auto"`` resolves to fp32 with ``"mkl"``).

    Raises:
        ValueError: an unknown setting. :class:`orchestry.params_file.ParamsError` (a ValueError): ``"bfloat16"``
            with ``"mkl"`` products or on a CPU without native bf16, params this machine cannot run (a stage and
            the CLI report it as bad params: one ``error:`` line, exit code 2).
    """
    from orchestry.params_file import ParamsError

    if setting == "float32":
        return False
    if setting not in ("bfloat16", "auto"):
        raise ValueError(f"decode dtype must be 'float32', 'bfloat16' or 'auto', got {setting!r}")
    if products != "onednn":
        if setting == "bfloat16":
            raise ParamsError("model.decode_dtype bfloat16 needs model.decode_products onednn")
        return False
    if setting == "auto":
        return numerics_mode() != "portable" and cpu_bf16_supported()
    if not cpu_bf16_supported():
        raise ParamsError(
            f"model.decode_dtype bfloat16 needs a CPU with native bf16 (AVX-512 BF16 or AMX; this one: {cpu_line()}); "
            "use auto (bfloat16 only where native) or float32"
        )
    return True
