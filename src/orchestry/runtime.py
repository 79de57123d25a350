"""Shared start-up for stage scripts: logging, validated params, seeding, threads, JSON helpers."""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NoReturn

import yaml

from orchestry import numerics
from orchestry.config import Params, TrainMagrpoParams
from orchestry.fingerprint import update_with_head_and_tail
from orchestry.numerics import apply_numerics
from orchestry.params_file import ParamsError, load_params
from orchestry.sandbox import Sandbox


def start_stage(name: str, params_path: str = "params.yaml") -> Params:
    """Configure logging, validate ``params.yaml`` (exit 2 with the message on error), put ``model.numerics`` into
    effect (:func:`orchestry.numerics.apply_numerics`), ``model.decode_products`` and ``model.decode_dtype``
    (:func:`orchestry.llm.decoding.use_products`: also for models that backends load), and seed RNGs."""
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {name} %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    for noisy in ("httpx", "alembic", "urllib3", "mlflow.store", "mlflow.tracking"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        params = load_params(params_path)
    except ParamsError as e:  # exit code 2 (bad input), like the CLI; the message names each bad key
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None

    apply_numerics(params.model.numerics)  # before torch computes anything: it pins the kernel paths
    from orchestry.llm.decoding import use_products

    try:  # a dtype this CPU cannot run (decode_dtype bfloat16 without native bf16): bad params, exit 2 as above
        use_products(params.model.decode_products, params.model.decode_dtype)
    except ParamsError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    import torch

    torch.manual_seed(0)
    random.seed(0)
    return params


def run_stage(main: Callable[[], None]) -> NoReturn:
    """Run a stage script's ``main`` and end the process as soon as it returns: the exit handlers run (``atexit``:
    MLflow's, logging's flush, multiprocessing's join of its children, ...), the standard streams are flushed, and
    the process exits with code 0 without the interpreter's teardown of its modules, which takes 1-2 s once torch,
    transformers and MLflow are imported (one baseline's process: 1.9 s from its last line to the process's end, 0.14
    s this way) and is paid once per stage of every ``dvc repro``.

    ``main`` must have closed what it wrote (the stage scripts write with ``with`` blocks and end their MLflow run
    and sandbox in context managers). An exception or ``SystemExit`` from ``main`` (bad params: exit 2, a failed
    stage: its traceback and exit 1) leaves as usual, through the normal teardown; so does a process inside an
    ``accelerate launch`` (``WORLD_SIZE`` set), whose launcher waits for every rank, and one run under a profiler
    or tracer (``python -m cProfile``, ``python -m trace``, a debugger), which writes its results after the script.
    Ctrl-C (SIGINT) ends the process with one ``error:`` line and exit code 130 instead of a traceback
    (``ORCHESTRY_DEBUG=1`` shows it).
    """
    try:
        main()
    except (
        KeyboardInterrupt
    ):  # Ctrl-C: one line and 128 + SIGINT, like a shell; the traceback with ORCHESTRY_DEBUG=1
        if os.environ.get("ORCHESTRY_DEBUG"):
            raise
        print(
            "error: interrupted (SIGINT); what the stage finished is kept, and an open MLflow run is marked KILLED",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
    if "WORLD_SIZE" in os.environ or sys.getprofile() is not None or sys.gettrace() is not None:
        raise SystemExit(0)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def accelerate_command(num_processes: int, script: str | Path, args: Iterable[str] = ()) -> list[str]:
    """The ``accelerate launch`` command that runs ``script`` in ``num_processes`` data-parallel processes on this
    machine, with this interpreter (``python -m accelerate.commands.launch``: no reliance on ``PATH``).

    Every setting is on the command line, so no accelerate config file is read: accelerate's multi-process
    launcher (``--multi_gpu``, i.e. ``torch.distributed.run``; ``configs/accelerate/cpu_2proc.yaml`` says the
    same), which starts one process per GPU, or CPU processes that the trainer joins with gloo when no GPU is
    visible (``--cpu --num_processes 2`` would start ONE process: accelerate's multi-CPU mode needs ``mpirun``).
    The rendezvous port is a free one, so two launches on one machine (queued experiments) do not collide.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
            "--num_processes", str(num_processes), "--num_machines", "1", "--machine_rank", "0",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
            str(script), *args]  # fmt: skip


def relaunch_under_accelerate(num_processes: int, script: str | Path) -> int:
    """Run ``script`` (with this process's arguments) in ``num_processes`` processes under ``accelerate launch``
    (:func:`accelerate_command`) and return the launcher's exit code (128 + N when a signal N ended it or was
    passed on to it).

    A stage calls it when asked for several processes and not already inside a launch (no ``WORLD_SIZE``), so
    ``dvc repro`` stays the one command. SIGTERM and SIGINT received here are passed on to the launcher, which
    passes them on to its processes (the main one ends its MLflow run KILLED, :func:`orchestry.tracking.runs.stage_run`).
    """
    cmd = accelerate_command(num_processes, script, sys.argv[1:])
    logging.getLogger(__name__).info("relaunching in %d processes: %s", num_processes, " ".join(cmd))
    child = subprocess.Popen(cmd)
    received: list[int] = []

    def forward(signum, frame) -> None:
        received.append(signum)
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code and received:  # the launcher exits 1 when a signal stopped it: report the signal, as a stage does
        return 128 + received[0]
    return 128 - code if code < 0 else code


class OutputNotWritable(ValueError):
    """An output folder cannot be written (found before any work); the one-line message names it."""


def check_writable(folder: str | Path, what: str = "") -> None:
    """Create ``folder`` (and parents) and write, flush and remove a small probe file in it, so that an output
    that cannot be written is found before the work (sampling, paid requests) instead of after it.

    Raises:
        OutputNotWritable: naming the folder (and ``what`` writes there) and the reason.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-") as f:
            f.write(b"x" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        label = f" ({what})" if what else ""
        raise OutputNotWritable(f"cannot write to {folder}{label}: {e.strerror or e}") from None


def write_json(path: str | Path, obj) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def open_sandbox(params: Params):
    s = params.sandbox
    return Sandbox(
        timeout_s=s.timeout_s, memory_mb=s.memory_mb, max_workers=s.workers, max_timeouts=s.max_timeouts
    )


def cpu_threads() -> int:
    """Threads for torch on the CPU: ``OMP_NUM_THREADS`` when set (a positive integer), else the cores this
    process may run on (``os.sched_getaffinity``: a ``taskset`` or container CPU set is respected).

    Two processes sharing cores with one thread each run far faster than two that each spread over every core
    (their threads wait on each other at every operation), so a user running stages side by side sets
    ``OMP_NUM_THREADS=1``. The thread count can change float reductions, hence sampled tokens: the thread count
    is part of what a run's numbers depend on.
    """
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def machine_info() -> dict:
    """What a run's numbers and seconds depend on: ``cpu``, ``cpu_flags`` (the :data:`orchestry.numerics.FLAGS`
    present), ``threads`` (torch's), ``torch`` (version), ``kernels`` (torch's CPU capability), ``mkl_cbwr`` (MKL's
    branch setting, ``AUTO`` when unset), ``numerics`` (:func:`orchestry.numerics.numerics_mode`), ``decode_dtype``
    (decoding's resolved operand dtype, ``model.decode_dtype``) and ``gpu`` (CUDA device name or ``none``). Logged
    as MLflow tags ``machine.<key>`` of every stage run and written into the stage reports."""
    import torch

    from orchestry.llm import decoding  # its model.decode_dtype, resolved by use_products

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {
        "cpu": numerics.cpu_model(),
        "cpu_flags": " ".join(f for f, v in numerics.cpu_flags().items() if v) or "none",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "mkl_cbwr": os.environ.get("MKL_CBWR", "AUTO"),
        "numerics": numerics.numerics_mode(),
        "decode_dtype": decoding.decode_numerics()[1],
        "gpu": gpu,
    }


def load_policy(
    params: Params, with_adapters: str | None = None, agents: tuple[str, ...] = ("helper", "main")
):
    """Load the base model (``params.model``) and optionally the trained adapters from a folder.

    Args:
        with_adapters: folder holding one peft adapter folder per agent (``train_magrpo``'s output).
        agents: the adapters to load (``helper``, ``main``; the workflow's ``writer``, ``tester``, ``fixer``).

    Returns:
        ``(model, tokenizer)``; with adapters, a PeftModel with adapters named ``helper`` and ``main``.
    """
    import torch

    from orchestry.llm.loading import load_model

    torch.set_num_threads(cpu_threads())
    from orchestry.llm.decoding import use_products

    use_products(params.model.decode_products, params.model.decode_dtype)
    model, tok = load_model(params.model.path, params.model.dtype, params.model.load_in_4bit)
    if with_adapters:
        from peft import PeftModel

        root = Path(with_adapters)
        model = PeftModel.from_pretrained(model, str(root / agents[0]), adapter_name=agents[0])
        for agent in agents[1:]:
            model.load_adapter(str(root / agent), adapter_name=agent)
    model.eval()
    return model, tok


def build_policy(params: Params, agents: Sequence[str], cfg: TrainMagrpoParams | None = None):
    """The policy ``train_magrpo`` trains: the base model (:func:`load_policy`) with a fresh LoRA adapter per agent.

    Args:
        agents: adapter names (``helper``, ``main``; the workflow's ``writer``, ``tester``, ``fixer``).
        cfg: the LoRA settings and seed (``lora_r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``,
            ``seed``); default ``params.train_magrpo``.

    Returns:
        ``(model, tokenizer)``: a PeftModel whose adapters are initialised from ``cfg.seed``
        (:func:`orchestry.llm.loading.attach_adapters`; 4-bit base when ``model.load_in_4bit``).
    """
    from orchestry.llm.loading import attach_adapters

    cfg = cfg or params.train_magrpo
    model, tok = load_policy(params)
    model = attach_adapters(
        model,
        agents,
        r=cfg.lora_r,
        alpha=cfg.lora_alpha,
        dropout=cfg.lora_dropout,
        target_modules=cfg.target_modules,
        seed=cfg.seed,
        quantized=params.model.load_in_4bit,
    )
    return model, tok


def stage_inputs(stage: str, dvc_file: str | Path = "dvc.yaml") -> tuple[list[str], list[str]]:
    """``(deps, params)`` of a DVC stage as declared in ``dvc_file`` (params: section or ``section.key`` names).

    ``tests/test_dvc_deps.py`` keeps each stage's deps complete (every source file it runs, every other
    stage's output it reads) and its params complete, so this is everything the stage reads.

    Raises:
        KeyError: ``stage`` is not in ``dvc_file``.
        ValueError: ``stage`` is a ``matrix``/``foreach`` stage or its deps use ``${...}`` templating (not
            expanded here).
    """
    spec = yaml.safe_load(Path(dvc_file).read_text())["stages"][stage]
    deps = list(spec.get("deps", []))
    if "matrix" in spec or "foreach" in spec or any("${" in str(d) for d in deps):
        raise ValueError(f"stage {stage}: templated stages are not supported here")
    params = [p if isinstance(p, str) else next(iter(p)) for p in spec.get("params", [])]
    return deps, params


def inputs_key(stage: str, params: Params, dvc_file: str | Path = "dvc.yaml") -> str | None:
    """:func:`stage_inputs_key` of ``stage``, or None where ``dvc_file`` does not declare it (a stage script run
    outside the project, e.g. in a test's folder)."""
    if not Path(dvc_file).is_file():
        return None
    try:
        return stage_inputs_key(stage, params, dvc_file)
    except KeyError:
        return None


def stage_inputs_key(
    stage: str, params: Params, dvc_file: str | Path = "dvc.yaml", exclude: Iterable[str] = ()
) -> str:
    """SHA-256 of what a DVC stage reads (:func:`stage_inputs`): its ``deps`` in ``dvc_file`` and its
    ``params`` except ``exclude`` (e.g. the section a trainer compares itself).

    Files up to 16 MiB are hashed whole; larger ones by size and their first and last MiB (model weights:
    deterministic outputs of ``prepare``, 0.5 GB). Used as a checkpoint's resume key: a stage re-run because a
    dependency changed must not resume the previous run's checkpoint.

    Raises:
        KeyError: ``stage`` is not in ``dvc_file``.
    """
    deps, declared = stage_inputs(stage, dvc_file)
    h = hashlib.sha256()
    skip = set(exclude)
    sections = [s for s in declared if s not in skip]
    dumped = params.model_dump(mode="json")
    for name in sorted(sections):
        value = dumped
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        h.update(json.dumps([name, value], sort_keys=True).encode())
    for dep in sorted(deps):
        root = Path(dep)
        files = sorted(f for f in root.rglob("*") if f.is_file()) if root.is_dir() else [root]
        for f in files:
            h.update(str(f).encode())
            if not f.exists():
                h.update(b"<missing>")
                continue
            size = f.stat().st_size
            h.update(str(size).encode())
            if size <= 16 << 20:
                h.update(f.read_bytes())
            else:
                update_with_head_and_tail(h, f, size)
    return h.hexdigest()
