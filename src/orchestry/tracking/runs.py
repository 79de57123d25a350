"""MLflow tracking: one parent run per pipeline execution, one nested run per stage execution, in a sqlite store
at the repository root.

The store is ``sqlite:///<root>/mlflow.db`` and artifacts go to ``<root>/mlartifacts`` unless params
``mlflow.tracking_uri`` or ``MLFLOW_TRACKING_URI`` name another store (:func:`tracking_uri`), where ``<root>`` is
``DVC_ROOT`` when DVC sets it (``dvc exp run --temp/--queue`` runs in a copy; results must land in the real
repository) and the current directory otherwise. View with ``mlflow ui --backend-store-uri sqlite:///mlflow.db``.

A pipeline execution is identified by the DVC experiment name (``DVC_EXP_NAME``, set by ``dvc exp run``; absent
for a plain ``dvc repro``), the git revision it runs from (``DVC_EXP_BASELINE_REV`` in ``dvc exp run``, else
``HEAD``) and the SHA-256 of ``params.yaml``. Every stage of one execution finds (or, the first, creates) the
parent run with those tags, under a file lock in ``<root>/.orchestry`` so parallel stages (``--run-all -j 2``)
share one parent (:mod:`orchestry.tracking.execution`). The parent holds the flattened ``params.yaml`` so the
MLflow UI compares whole experiments; stage runs are its children (tag ``mlflow.parentRunId``) and record system
metrics (CPU, memory, disk, network; GPU when ``pynvml`` is installed) every :data:`SYSTEM_METRICS_INTERVAL_S`
seconds (or ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` when set).

A stage run ends FINISHED, FAILED (an exception) or KILLED (SIGTERM, e.g. from ``dvc exp`` or a job scheduler,
or Ctrl-C). A process that cannot end its run (SIGKILL, the OOM killer, a power cut) leaves it RUNNING; the next
stage that starts ends it KILLED once its process is certainly gone (:mod:`orchestry.tracking.stale`).

What a user sees (``orchestry ui``, :mod:`orchestry.tracking.ui`): every run carries the tags ``stage`` (stage
runs), ``pipeline_execution`` (the 16-hex key of its execution), ``dvc_experiment``, ``git_revision`` and
``params_hash``; the ``plot`` stage copies the execution's key metrics onto the parent run, so a collapsed runs
table already compares executions; each run has a description (:mod:`orchestry.tracking.descriptions`).

Stages DVC did not run (``dvc exp run -S plot.dpi=100`` runs only ``plot``) have no run in the execution; a
FINISHED stage run links them to the runs that made their outputs (:mod:`orchestry.tracking.stage_cache`).

This module opens the stage runs (:func:`stage_run`) and logs their metrics (:func:`log_metrics`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from orchestry.paths import repo_root
from orchestry.tracking.descriptions import describe_parent_run, describe_stage_run
from orchestry.tracking.execution import _flatten, execution_key, parent_run_id, pipeline_execution
from orchestry.tracking.metric_names import VOCABULARY_TAG, VOCABULARY_VERSION, metric_name
from orchestry.tracking.stage_cache import link_cached_stages
from orchestry.tracking.stale import process_tags
from orchestry.tracking.ui import set_runs_view

log = logging.getLogger("orchestry.tracking.runs")  # one logger for every part of the MLflow tracking

#: Seconds between two system-metrics samples of a stage run (MLflow's ``system/*`` metrics).
SYSTEM_METRICS_INTERVAL_S = 10.0


class StageTerminated(SystemExit):
    """SIGTERM arrived during :func:`stage_run`; the process exits with code 128 + SIGTERM (143)."""


def tracking_uri(override: str | None = None) -> str:
    """The MLflow store: ``override`` (params ``mlflow.tracking_uri``, a ``--tracking-uri`` option) if given, else
    the ``MLFLOW_TRACKING_URI`` environment variable (a team's shared server), else ``sqlite:///<root>/mlflow.db``."""
    if override:
        return override
    env = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if env:
        return env
    return f"sqlite:///{repo_root() / 'mlflow.db'}"


def _server_store(uri: str) -> bool:
    """A tracking server (http/https/databricks) chooses where a new experiment's artifacts go."""
    return uri.startswith(("http://", "https://", "databricks"))


@contextlib.contextmanager
def stage_run(
    stage: str, params: Mapping[str, Any], experiment: str = "orchestry", uri: str | None = None
) -> Iterator:
    """Open an MLflow run for one stage execution, nested under its pipeline execution's parent run
    (:func:`parent_run_id`); log params, tags, system metrics and wall seconds.

    Tags (parent and stage run): ``git_revision``, ``params_hash``, ``pipeline_execution`` (:func:`execution_key`),
    ``dvc_experiment`` (``DVC_EXP_NAME`` when set); the stage run also ``stage``, ``machine.<key>``
    (:func:`orchestry.runtime.machine_info`: CPU, flags, threads, kernels, numerics) and ``metric_vocabulary``
    (:data:`orchestry.tracking.metric_names.VOCABULARY_TAG`: its metric names are those of ``docs/metrics.md``). The experiment gets the runs
    table's view (:func:`set_runs_view`). The parent is marked RUNNING while a stage runs and ends with the status
    of the stage that ended last. The metric ``cost/wall_seconds`` is logged when the block ends; a FINISHED run of
    a ``dvc.yaml`` stage then tags its outputs and links the upstream stages DVC did not run
    (:func:`link_cached_stages`). The run ends FINISHED, FAILED on an exception, or
    KILLED on Ctrl-C or SIGTERM: inside the block (main thread only) a SIGTERM handler ends the run KILLED at
    once, then raises :class:`StageTerminated` so the stage unwinds (sandboxes, files closed) and the process
    exits 143; the previous handler is restored when the block ends.

    Yields:
        the active ``mlflow.ActiveRun``.
    """
    import mlflow

    store = tracking_uri(uri)
    mlflow.set_tracking_uri(store)
    artifact_root = None if _server_store(store) else (repo_root() / "mlartifacts").as_uri()
    if mlflow.get_experiment_by_name(experiment) is None:
        mlflow.create_experiment(experiment, artifact_location=artifact_root)
    mlflow.set_experiment(experiment)
    execution = pipeline_execution()
    client = mlflow.MlflowClient()
    experiment_id = mlflow.get_experiment_by_name(experiment).experiment_id
    set_runs_view(client, experiment_id)
    parent_id = parent_run_id(experiment_id, execution, claim_for=stage)  # RUNNING; stale runs marked KILLED
    from orchestry.runtime import machine_info

    tags = {**execution, "pipeline_execution": execution_key(execution), "stage": stage,
            "mlflow.parentRunId": parent_id, VOCABULARY_TAG: VOCABULARY_VERSION, **process_tags(),
            **{f"machine.{k}": str(v) for k, v in machine_info().items()}}  # fmt: skip
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
            if status == "FINISHED":
                link_cached_stages(client, experiment_id, parent_id, run_id, stage)
                try:  # descriptions help the reader; they never fail a stage
                    describe_stage_run(client, run_id, stage)
                    describe_parent_run(client, parent_id, execution)
                except Exception as e:
                    log.warning("could not write the run descriptions (%s)", e)
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


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log numeric metrics (non-finite and non-numeric values are skipped; names via :func:`metric_name`)."""
    import mlflow

    clean = {
        metric_name(k): float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }
    if clean:
        mlflow.log_metrics(clean, step=step)
