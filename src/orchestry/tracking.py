"""MLflow tracking: one run per stage execution, in a sqlite store at the repository root.

The store is ``sqlite:///<root>/mlflow.db`` and artifacts go to ``<root>/mlartifacts``, where ``<root>`` is
``DVC_ROOT`` when DVC sets it (``dvc exp run --temp/--queue`` runs in a copy; results must land in the real
repository) and the current directory otherwise. View with ``mlflow ui --backend-store-uri sqlite:///mlflow.db``.

A stage run ends FINISHED, FAILED (an exception) or KILLED (SIGTERM, e.g. from ``dvc exp`` or a job scheduler,
or Ctrl-C): it never stays RUNNING after its process is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("orchestry.tracking")


class StageTerminated(SystemExit):
    """SIGTERM arrived during :func:`stage_run`; the process exits with code 128 + SIGTERM (143)."""


def repo_root() -> Path:
    """``DVC_ROOT`` if set, else the current working directory."""
    return Path(os.environ.get("DVC_ROOT") or os.getcwd()).resolve()


def tracking_uri(override: str | None = None) -> str:
    if override:
        return override
    return f"sqlite:///{repo_root() / 'mlflow.db'}"


def git_revision(cwd: str | Path | None = None) -> str:
    """Current git commit (``+dirty`` suffix when the work tree has changes), or ``"unknown"``."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return (rev or "unknown") + ("+dirty" if dirty and rev else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


@contextlib.contextmanager
def stage_run(
    stage: str, params: Mapping[str, Any], experiment: str = "orchestry", uri: str | None = None
) -> Iterator:
    """Open an MLflow run for one stage execution; log params, tags and wall seconds.

    Tags: ``stage``, ``git_revision``, ``dvc_experiment`` (``DVC_EXP_NAME`` when set). The metric
    ``cost/wall_seconds`` is logged when the block ends. The run ends FINISHED, FAILED on an exception, or
    KILLED on Ctrl-C or SIGTERM: inside the block (main thread only) a SIGTERM handler ends the run KILLED at
    once, then raises :class:`StageTerminated` so the stage unwinds (sandboxes, files closed) and the process
    exits 143; the previous handler is restored when the block ends.

    Yields:
        the active ``mlflow.ActiveRun``.
    """
    import mlflow

    mlflow.set_tracking_uri(tracking_uri(uri))
    artifact_root = (repo_root() / "mlartifacts").as_uri()
    if mlflow.get_experiment_by_name(experiment) is None:
        mlflow.create_experiment(experiment, artifact_location=artifact_root)
    mlflow.set_experiment(experiment)
    tags = {"stage": stage, "git_revision": git_revision(repo_root())}
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc_experiment"] = os.environ["DVC_EXP_NAME"]
    t0 = time.time()
    run = mlflow.start_run(run_name=stage, tags=tags)
    run_id = run.info.run_id

    def finish(status: str) -> None:
        """Log the wall seconds and end the run with ``status``, unless it has ended already."""
        active = mlflow.active_run()
        if active is None or active.info.run_id != run_id:
            return
        try:
            mlflow.log_metric("cost/wall_seconds", time.time() - t0)
        finally:
            mlflow.end_run(status=status)

    def on_sigterm(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the clean-up
        log.warning("%s: SIGTERM, ending MLflow run %s as KILLED", stage, run_id)
        try:
            finish("KILLED")
        except Exception as e:  # interrupted inside an MLflow call: ended again below, after unwinding
            log.warning("could not end the MLflow run in the signal handler (%s); retrying on exit", e)
        raise StageTerminated(128 + signum)

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    status = "FAILED"
    try:
        flat = {k: (str(v)[:500] if v is not None else "None") for k, v in _flatten(params).items()}
        if flat:
            mlflow.log_params(flat)
        yield run
        status = "FINISHED"
    except (StageTerminated, KeyboardInterrupt):
        status = "KILLED"
        raise
    except SystemExit as e:
        status = "FINISHED" if e.code in (0, None) else "FAILED"
        raise
    finally:
        try:
            finish(status)
        finally:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def metric_name(key: str) -> str:
    """MLflow-safe metric name: ``pass@k`` becomes ``pass_at_k`` (MLflow rejects ``@``)."""
    return key.replace("@", "_at_")


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log numeric metrics (non-finite and non-numeric values are skipped; names via :func:`metric_name`)."""
    import math

    import mlflow

    clean = {
        metric_name(k): float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }
    if clean:
        mlflow.log_metrics(clean, step=step)
