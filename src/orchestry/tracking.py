"""MLflow tracking: one parent run per pipeline execution, one nested run per stage execution, in a sqlite store
at the repository root.

The store is ``sqlite:///<root>/mlflow.db`` and artifacts go to ``<root>/mlartifacts``, where ``<root>`` is
``DVC_ROOT`` when DVC sets it (``dvc exp run --temp/--queue`` runs in a copy; results must land in the real
repository) and the current directory otherwise. View with ``mlflow ui --backend-store-uri sqlite:///mlflow.db``.

A pipeline execution is identified by the DVC experiment name (``DVC_EXP_NAME``, set by ``dvc exp run``; absent
for a plain ``dvc repro``), the git revision it runs from (``DVC_EXP_BASELINE_REV`` in ``dvc exp run``, else
``HEAD``) and the SHA-256 of ``params.yaml``. Every stage of one execution finds (or, the first, creates) the
parent run with those tags, under a file lock in ``<root>/.orchestry`` so parallel stages (``--run-all -j 2``)
share one parent. The parent holds the flattened ``params.yaml`` so the MLflow UI compares whole experiments;
stage runs are its children (tag ``mlflow.parentRunId``) and record system metrics (CPU, memory, disk, network;
GPU when ``pynvml`` is installed) every :data:`SYSTEM_METRICS_INTERVAL_S` seconds (or
``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` when set).

A stage run ends FINISHED, FAILED (an exception) or KILLED (SIGTERM, e.g. from ``dvc exp`` or a job scheduler,
or Ctrl-C): it never stays RUNNING after its process is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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

#: Seconds between two system-metrics samples of a stage run (MLflow's ``system/*`` metrics).
SYSTEM_METRICS_INTERVAL_S = 10.0


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


def params_hash(params_file: str | Path = "params.yaml") -> str:
    """SHA-256 (hex) of the bytes of ``params_file`` (the workspace's params; ``dvc exp run -S`` edits it), or of
    the empty string when it does not exist."""
    path = Path(params_file)
    return hashlib.sha256(path.read_bytes() if path.is_file() else b"").hexdigest()


def pipeline_execution() -> dict[str, str]:
    """The tags that identify this process's pipeline execution (module docstring): ``git_revision`` (a commit
    hash, or ``unknown``), ``params_hash`` and, inside ``dvc exp run``, ``dvc_experiment``."""
    rev = os.environ.get("DVC_EXP_BASELINE_REV") or git_revision(repo_root()).removesuffix("+dirty")
    tags = {"git_revision": rev, "params_hash": params_hash()}
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc_experiment"] = os.environ["DVC_EXP_NAME"]
    return tags


def _pipeline_params() -> dict[str, str]:
    """``params.yaml`` of the working directory, flattened to MLflow params (``{}`` when absent)."""
    import yaml

    path = Path("params.yaml")
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    flat = _flatten(data) if isinstance(data, Mapping) else {}
    return {k: (str(v)[:500] if v is not None else "None") for k, v in flat.items()}


def parent_run_id(experiment_id: str, execution: Mapping[str, str]) -> str:
    """Id of the parent run of ``execution`` (:func:`pipeline_execution`) in ``experiment_id``; created (tagged,
    with the flattened ``params.yaml`` as params) when it does not exist yet. A file lock in
    ``<root>/.orchestry`` makes find-or-create atomic across the processes of parallel stages."""
    from filelock import FileLock
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    key = hashlib.sha256(json.dumps(dict(execution), sort_keys=True).encode()).hexdigest()[:16]
    lock_dir = repo_root() / ".orchestry"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_dir / "mlflow_parent.lock"), timeout=120):
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.pipeline_execution = '{key}'", max_results=1
        )
        if found:
            return found[0].info.run_id
        exp_name = execution.get("dvc_experiment")
        name = exp_name or f"pipeline {execution['git_revision'][:8]} {execution['params_hash'][:8]}"
        run = client.create_run(experiment_id, run_name=name, tags={**execution, "pipeline_execution": key})
        params = [Param(k, v) for k, v in _pipeline_params().items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(run.info.run_id, params=params[i : i + 100])
        return run.info.run_id


@contextlib.contextmanager
def stage_run(
    stage: str, params: Mapping[str, Any], experiment: str = "orchestry", uri: str | None = None
) -> Iterator:
    """Open an MLflow run for one stage execution, nested under its pipeline execution's parent run
    (:func:`parent_run_id`); log params, tags, system metrics and wall seconds.

    Tags (parent and stage run): ``git_revision``, ``params_hash``, ``dvc_experiment`` (``DVC_EXP_NAME`` when
    set); the stage run also ``stage``. The parent is marked RUNNING while a stage runs and ends with the status
    of the stage that ended last. The metric ``cost/wall_seconds`` is logged when the block ends. The run ends FINISHED, FAILED on an exception, or
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
    execution = pipeline_execution()
    client = mlflow.MlflowClient()
    parent_id = parent_run_id(mlflow.get_experiment_by_name(experiment).experiment_id, execution)
    client.update_run(parent_id, status="RUNNING")
    tags = {**execution, "stage": stage, "mlflow.parentRunId": parent_id}
    t0 = time.time()
    if not os.environ.get("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"):  # MLflow's own setting wins
        mlflow.set_system_metrics_sampling_interval(SYSTEM_METRICS_INTERVAL_S)
    run = mlflow.start_run(run_name=stage, tags=tags, log_system_metrics=True)
    run_id = run.info.run_id

    def finish(status: str) -> None:
        """Log the wall seconds and end the run with ``status``, unless it has ended already."""
        active = mlflow.active_run()
        if active is None or active.info.run_id != run_id:
            return
        try:
            mlflow.log_metric("cost/wall_seconds", time.time() - t0)
        finally:
            try:
                mlflow.end_run(status=status)
            finally:
                client.set_terminated(parent_id, status=status)

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
