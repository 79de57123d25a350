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
two LoRA AdamW steps, 16 rows x 48 sampled tokens; ``docs/reproducibility.md``): 1 or 2 threads gave the same
bits there (not on an Intel Xeon with AVX-512 under MKL's plain ``AUTO``: hence :data:`NATIVE_MKL_CBWR`); forcing torch's scalar kernels (``ATEN_CPU_CAPABILITY=default``) or MKL's ``COMPATIBLE`` branch changes the
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
import datetime
import fcntl
import functools
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path

log = logging.getLogger(__name__)

#: The CPU flags that decide the kernels (bf16 is native only with AVX-512 BF16 or AMX).
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")

#: The environment of ``model.numerics: portable`` (read by torch and MKL when they first compute).
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}

#: The MKL setting of ``model.numerics: native`` when the user set none: MKL's own branch for the CPU (``AUTO``)
#: in its strict reproducibility mode, where a matrix product's bits do not depend on the thread count (without
#: ``STRICT``, MKL splits some products' sums over the threads: an fp32 ``[8, 576] x [576, 576]`` product on an
#: Intel Xeon with AVX-512 gave other bits at 1 thread than at 2, and so did the LoRA weights after two fp32 AdamW
#: steps; with it, the same bits). ``STRICT`` left the 2-thread bits of the default run's decoding and bf16 training
#: unchanged on that machine (docs/reproducibility.md, "Threads").
NATIVE_MKL_CBWR = "AUTO,STRICT"

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

    ``native``: the CPU's own kernels; only MKL's strict mode is set (``MKL_CBWR``:
    :data:`NATIVE_MKL_CBWR`), so that fp32 products give the same bits at any thread count. A user's own
    ``ATEN_CPU_CAPABILITY``/``MKL_CBWR`` stay as they are.
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
        os.environ.setdefault("MKL_CBWR", NATIVE_MKL_CBWR)
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


#: Where the measured update dtype is recorded (:func:`recorded_update_dtype`): ``$ORCHESTRY_CACHE_DIR``, else
#: ``$XDG_CACHE_HOME/orchestry``, else ``~/.cache/orchestry``.
CACHE_DIR_ENV = "ORCHESTRY_CACHE_DIR"

#: bf16 is chosen only when its measured step takes at most this fraction of fp32's (a margin against noise).
BF16_MARGIN = 0.9


def cache_dir() -> Path:
    """The folder of this machine's recorded measurements (:data:`CACHE_DIR_ENV`)."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "orchestry"


def machine_key() -> str:
    """What a dtype measurement holds for: the CPU model, its :data:`FLAGS`, torch's version and threads."""
    import torch

    flags = " ".join(f for f, v in cpu_flags().items() if v) or "none"
    return f"{cpu_model()} | {flags} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def measure_update_dtype(tokens: int = 1024, layers: int = 4, repeats: int = 5) -> dict:
    """Milliseconds of one LoRA training step's matrix work in fp32 and under bf16 autocast, on this CPU.

    The work is the shape of the embedded model's MLP (hidden 576, intermediate 1536): ``layers`` frozen
    ``576 -> 1536 -> 576`` blocks with a rank-16 LoRA pair each, forward and backward over ``tokens`` rows, which is
    what dominates a warm-start or MAGRPO update (``benchmarks/warm_start_speed.py`` times the real one). Each dtype
    runs once to warm up, then ``repeats`` times alternately; the median is kept. Under bf16 the frozen weights are
    cast once beforehand (the trainer's ``orchestry.llm.frozen.cast_once``) and the LoRA pairs stay fp32 under
    autocast.

    Returns:
        ``{"fp32_ms": float, "bf16_ms": float}``.
    """
    import torch

    g = torch.Generator().manual_seed(0)
    hidden, inter, rank = 576, 1536, 16
    frozen = [(torch.randn(inter, hidden, generator=g) * 0.02, torch.randn(hidden, inter, generator=g) * 0.02)
              for _ in range(layers)]  # fmt: skip
    # bf16 steps use copies of the frozen weights cast once, as the trainer does (orchestry.llm.frozen.cast_once)
    frozen_bf16 = [(w_up.bfloat16(), w_down.bfloat16()) for w_up, w_down in frozen]
    lora = [(torch.randn(rank, hidden, generator=g) * 0.02, torch.zeros(inter, rank)) for _ in range(layers)]
    lora = [(a.requires_grad_(), b.requires_grad_()) for a, b in lora]
    x0 = torch.randn(tokens, hidden, generator=g)

    def step(bf16: bool) -> float:
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        t0 = time.perf_counter()
        with ctx:
            x = x0
            for (w_up, w_down), (a, b) in zip(frozen_bf16 if bf16 else frozen, lora, strict=True):
                h = torch.nn.functional.linear(x, w_up) + torch.nn.functional.linear(
                    torch.nn.functional.linear(x, a), b
                )
                x = x + torch.nn.functional.linear(torch.nn.functional.silu(h), w_down)
            loss = x.float().pow(2).mean()
        loss.backward()
        for a, b in lora:
            a.grad = b.grad = None
        return (time.perf_counter() - t0) * 1000

    step(False), step(True)
    runs: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for bf16 in (False, True):
            runs[bf16].append(step(bf16))
    return {
        "fp32_ms": round(statistics.median(runs[False]), 2),
        "bf16_ms": round(statistics.median(runs[True]), 2),
    }


def recorded_update_dtype(measure=measure_update_dtype) -> dict:
    """This machine's measured update dtype: read from ``update_dtype.json`` in :func:`cache_dir` (one entry per
    :func:`machine_key`), or measured once with ``measure`` and recorded there, so that every later run on this
    machine makes the same choice (never a timing race inside a run). Concurrent processes (a multi-process stage)
    take a file lock, so only the first measures and all read the same entry.

    Returns:
        ``{"key", "fp32_ms", "bf16_ms", "choice": "bf16" | "fp32", "date", "recorded": path}``; ``choice`` is bf16
        when ``bf16_ms <= BF16_MARGIN * fp32_ms``.
    """
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "update_dtype.json"
    key = machine_key()
    with open(folder / "update_dtype.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            table = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
            if not isinstance(table, dict):
                raise ValueError("not a JSON object")
        except (ValueError, OSError) as e:
            log.warning("%s unreadable (%s): measuring the update dtype again", path, e)
            table = {}
        entry = table.get(key)
        if not (isinstance(entry, dict) and entry.get("choice") in ("bf16", "fp32")):
            entry = dict(measure())
            entry["choice"] = "bf16" if entry["bf16_ms"] <= BF16_MARGIN * entry["fp32_ms"] else "fp32"
            entry["date"] = datetime.date.today().isoformat()
            table[key] = entry
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, path)
            log.info("update dtype measured on %s: fp32 %.1f ms, bf16 %.1f ms -> %s (recorded in %s)",
                     key, entry["fp32_ms"], entry["bf16_ms"], entry["choice"], path)  # fmt: skip
    return {"key": key, **entry, "recorded": str(path)}


def resolve_bf16(setting: str | bool, device) -> bool:
    """Whether the training forward/backward runs under bf16 autocast: :func:`update_dtype_decision`'s answer as a
    bool, for :func:`bf16_autocast`."""
    return update_dtype_decision(setting, device)["update_dtype"] == "bf16"


def update_dtype_decision(setting: str | bool, device) -> dict:
    """Whether the training forward/backward runs under bf16 autocast, from ``train_magrpo.bf16_update``, and why.

    Args:
        setting: ``"auto"``: on a CPU, bf16 only where it is native (:func:`cpu_bf16_supported`: AVX-512 BF16 /
            AMX) **and** measured faster than fp32 on this machine (:func:`recorded_update_dtype`: measured once,
            recorded, the same choice on every later run here): the instruction set does not say how fast a dtype
            runs (an Intel Xeon with AVX-512 BF16 but no AMX ran a bf16 warm start 3-7x slower than fp32). On CUDA,
            bf16 where the device runs it natively. Under ``model.numerics: portable`` (:func:`numerics_mode`)
            ``"auto"`` is fp32.
            ``True``: bf16 even where it is emulated (a one-line warning says so, it is slow there).
            ``False``: fp32.
        device: the model's device (``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device``).

    Returns:
        ``{"update_dtype": "bf16" | "fp32", "reason": str}``, plus ``fp32_ms`` and ``bf16_ms`` when the recorded
        measurement decided: the trainer logs it beside its result, ``orchestry doctor`` prints it.

    Raises:
        ValueError: any other setting.
    """
    import torch

    def decided(bf16: bool, reason: str, **measured) -> dict:
        return {"update_dtype": "bf16" if bf16 else "fp32", "reason": reason, **measured}

    if setting is False:
        return decided(False, "bf16_update false")
    if setting == "auto" and numerics_mode() == "portable":  # model.numerics: portable trains in fp32
        return decided(False, "model.numerics portable")
    kind = torch.device(device).type
    native = (kind == "cpu" and cpu_bf16_supported()) or (kind == "cuda" and cuda_bf16_supported())
    if setting == "auto":
        if not native:
            return decided(False, f"auto: no native bf16 on {kind}")
        if kind != "cpu":
            return decided(True, f"auto: native bf16 on {kind}")
        m = recorded_update_dtype()
        return decided(
            m["choice"] == "bf16",
            f"auto: measured on this CPU, fp32 {m['fp32_ms']} ms vs bf16 {m['bf16_ms']} ms ({m['recorded']})",
            fp32_ms=m["fp32_ms"],
            bf16_ms=m["bf16_ms"],
        )
    if setting is True:
        if not native:
            log.warning(
                "bf16_update: true on %s, which has no native bf16 (%s): bf16 is emulated and much slower "
                "than fp32 here; bf16_update: auto would use fp32",
                kind,
                "no AVX-512 BF16 / AMX" if kind == "cpu" else "not reported as native",
            )
        return decided(True, "bf16_update true")
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
