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
share one parent. The parent holds the flattened ``params.yaml`` so the MLflow UI compares whole experiments;
stage runs are its children (tag ``mlflow.parentRunId``) and record system metrics (CPU, memory, disk, network;
GPU when ``pynvml`` is installed) every :data:`SYSTEM_METRICS_INTERVAL_S` seconds (or
``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` when set).

A stage run ends FINISHED, FAILED (an exception) or KILLED (SIGTERM, e.g. from ``dvc exp`` or a job scheduler,
or Ctrl-C). A process that cannot end its run (SIGKILL, the OOM killer, a power cut) leaves it RUNNING; every run
records its process (tags ``orchestry.process.*``: pid, host, start time) and the next stage that starts, of this
execution or another, ends KILLED each RUNNING run of the experiment whose process on this host is certainly gone,
with the tag ``orchestry.stale`` saying who found it and why (:func:`mark_stale_runs`). Runs of other hosts are
left as they are.

What a user sees (``orchestry ui``): every run carries the tags ``stage`` (stage runs), ``pipeline_execution`` (the
16-hex key of its execution), ``dvc_experiment``, ``git_revision`` and ``params_hash``; the ``plot`` stage copies
the execution's key metrics (:func:`execution_metrics`) onto the parent run, so a collapsed runs table already
compares executions. The experiment holds MLflow's shared view state (tag :data:`VIEW_TAG`) that selects those
columns; :func:`runs_table_url` is the address of the runs table with that view.

Stages DVC did not run (``dvc exp run -S plot.dpi=100`` runs only ``plot``: the others are unchanged or restored
from DVC's run cache) have no run in the execution. So that the execution still lands complete, every stage run of
a ``dvc.yaml`` stage, when it ends FINISHED, (1) tags itself ``outputs_digest`` (:func:`outputs_digest` of its
stage's ``cache: false`` outputs, the small report files) and (2) links each upstream stage of it that did not run
in this execution: the parent run gets the tag ``cached_run.<stage>`` (``@`` written ``_at_``) = the id of the
newest FINISHED run of that stage whose ``outputs_digest`` is the digest of the outputs on disk, i.e. the run that
made them (:func:`link_cached_stages`). Only upstream stages are linked, whose outputs are final when a stage that
depends on them runs; ``plot`` depends on every stage, so its run links them all. ``orchestry compare`` reads a
cached stage's metrics from the linked run (:func:`orchestry.reporting.compare.executions`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from orchestry.paths import repo_root
from orchestry.tracking.metric_names import VOCABULARY_TAG, VOCABULARY_VERSION

log = logging.getLogger("orchestry.tracking.runs")

#: Seconds between two system-metrics samples of a stage run (MLflow's ``system/*`` metrics).
SYSTEM_METRICS_INTERVAL_S = 10.0

#: Where ``orchestry ui`` serves by default.
UI_HOST = "127.0.0.1"
UI_PORT = 5000
#: Name of the runs table's view (MLflow's ``viewStateShareKey``) and the experiment tag that stores it.
VIEW_KEY = "orchestry"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
#: Run tags shown as columns of the runs table, in order.
VIEW_TAGS = ("stage", "dvc_experiment", "git_revision", "pipeline_execution")
#: Parent-run metrics (:func:`execution_metrics`) shown as columns of the runs table, in order.
VIEW_METRICS = (
    "test/magrpo/pass_at_1",
    "test/base/pass_at_1",
    "test/magrpo/reward",
    "test/base/reward",
    "test/magrpo/cooperation_rate",
    "test/orchestrator/learned/objective",
    "cost/magrpo/tokens_per_sample",
)


#: Tag of a stage run: :func:`outputs_digest` of its stage's uncached outputs as the run left them.
OUTPUTS_TAG = "outputs_digest"
#: Prefix of the parent-run tags that link a stage which did not run in the execution to the run that made its
#: outputs (:func:`cached_run_tag`).
CACHED_RUN_PREFIX = "cached_run."


class StageTerminated(SystemExit):
    """SIGTERM arrived during :func:`stage_run`; the process exits with code 128 + SIGTERM (143)."""


#: Set by ``orchestry tune`` (:mod:`orchestry.tune`) for the ``dvc exp run`` of a trial: the Optuna study's name and
#: the trial's number, tagged on every run of that execution (:func:`pipeline_execution`).
TUNE_STUDY_ENV = "ORCHESTRY_TUNE_STUDY"
TUNE_TRIAL_ENV = "ORCHESTRY_TUNE_TRIAL"


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
    hash, or ``unknown``), ``params_hash`` and, inside ``dvc exp run``, ``dvc_experiment``; inside a trial of
    ``orchestry tune`` also ``optuna_study`` and ``optuna_trial`` (from :data:`TUNE_STUDY_ENV` and
    :data:`TUNE_TRIAL_ENV`)."""
    rev = os.environ.get("DVC_EXP_BASELINE_REV") or git_revision(repo_root()).removesuffix("+dirty")
    tags = {"git_revision": rev, "params_hash": params_hash()}
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc_experiment"] = os.environ["DVC_EXP_NAME"]
    for env, tag in ((TUNE_STUDY_ENV, "optuna_study"), (TUNE_TRIAL_ENV, "optuna_trial")):
        if os.environ.get(env):
            tags[tag] = os.environ[env]
    return tags


def _pipeline_params() -> dict[str, str]:
    """``params.yaml`` of the working directory, flattened to MLflow params (``{}`` when absent)."""
    from orchestry.params_file import read_params_mapping

    path = Path("params.yaml")
    flat = _flatten(read_params_mapping(path)) if path.is_file() else {}
    return {k: (str(v)[:500] if v is not None else "None") for k, v in flat.items()}


def execution_key(execution: Mapping[str, str]) -> str:
    """The ``pipeline_execution`` tag of ``execution`` (:func:`pipeline_execution`): 16 hex digits of the SHA-256
    of its tags."""
    return hashlib.sha256(json.dumps(dict(execution), sort_keys=True).encode()).hexdigest()[:16]


def parent_run_id(experiment_id: str, execution: Mapping[str, str], claim_for: str | None = None) -> str:
    """Id of the parent run of ``execution`` (:func:`pipeline_execution`) in ``experiment_id``; created (tagged,
    with the flattened ``params.yaml`` as params) when it does not exist yet. A file lock in
    ``<root>/.orchestry`` makes find-or-create atomic across the processes of parallel stages.

    With ``claim_for`` (the stage about to run, :func:`stage_run`), under the same lock: the parent gets this
    process's :func:`process_tags` and is marked RUNNING, then the stale runs of the experiment are marked KILLED
    (:func:`mark_stale_runs`; never this parent)."""
    from filelock import FileLock
    from mlflow.entities import Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    key = execution_key(execution)
    lock_dir = repo_root() / ".orchestry"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_dir / "mlflow_parent.lock"), timeout=120):
        found = client.search_runs(
            [experiment_id],
            filter_string=f"tags.pipeline_execution = '{key}'",
            order_by=["attributes.start_time ASC"],
            max_results=1000,
        )
        # stage runs carry the key too: the parent is the run without a parent
        parents = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
        old_tags: Mapping[str, str] = {}
        if parents:
            run_id, old_tags = parents[0].info.run_id, parents[0].data.tags
        else:
            exp_name = execution.get("dvc_experiment")
            # a plain `dvc repro` is "workspace", as in `orchestry compare`
            name = exp_name or f"workspace {execution['git_revision'][:8]} {execution['params_hash'][:8]}"
            run = client.create_run(
                experiment_id, run_name=name, tags={**execution, "pipeline_execution": key}
            )
            run_id = run.info.run_id
            params = [Param(k, v) for k, v in _pipeline_params().items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                client.log_batch(run_id, params=params[i : i + 100])
        if claim_for is not None:
            # the tags first: a RUNNING parent always names a live process while a stage of it runs
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in process_tags().items()])
            if STALE_TAG in old_tags:  # an execution resumed after its process was killed: running again
                client.delete_tag(run_id, STALE_TAG)
            client.update_run(run_id, status="RUNNING")
            mark_stale_runs(client, experiment_id, by=claim_for, keep={run_id})
        return run_id


# ---------------------------------------------------------------- runs whose process died (SIGKILL, OOM, power)

#: Tags of every run :func:`stage_run` opens, and of a parent run each time a stage marks it RUNNING: the process
#: that holds the run RUNNING (:func:`process_tags`).
PID_TAG = "orchestry.process.pid"
HOST_TAG = "orchestry.process.host"
START_TAG = "orchestry.process.start_time"
PID_NAMESPACE_TAG = "orchestry.process.pid_namespace"
#: Tag of a run :func:`mark_stale_runs` ended KILLED: who did it, and why.
STALE_TAG = "orchestry.stale"


def _pid_namespace() -> str | None:
    """This process's PID namespace (``pid:[4026531836]`` on Linux; ``None`` elsewhere): two containers may share
    a host name and a store, not their PIDs."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_tags() -> dict[str, str]:
    """:data:`PID_TAG`, :data:`HOST_TAG`, :data:`START_TAG` (the process's start time, seconds since the epoch:
    tells a reused PID from the process that held the run) and, on Linux, :data:`PID_NAMESPACE_TAG` of this
    process."""
    import psutil

    tags = {
        PID_TAG: str(os.getpid()),
        HOST_TAG: socket.gethostname(),
        START_TAG: repr(psutil.Process().create_time()),
    }
    ns = _pid_namespace()
    if ns:
        tags[PID_NAMESPACE_TAG] = ns
    return tags


def process_gone(pid: int, start_time: float | None) -> str | None:
    """Why process ``pid`` of this machine, started at ``start_time`` (:func:`process_tags`; ``None``: unknown), is
    certainly gone: no such process, a zombie, or the PID now belongs to a process started at another time;
    ``None`` when it may be alive (it is, or it cannot be told)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return f"process {pid} exited (a zombie)"
        created = proc.create_time()
    except psutil.NoSuchProcess:
        return f"process {pid} no longer alive"
    except psutil.Error:  # e.g. AccessDenied: it exists, its owner is another user
        return None
    if start_time is not None and abs(created - start_time) > 0.01:
        return f"process {pid} no longer alive (the pid now belongs to a process started at {created:.2f})"
    return None


def mark_stale_runs(
    client: Any, experiment_id: str, by: str, keep: set[str] | frozenset = frozenset()
) -> list[str]:
    """End KILLED every RUNNING run of ``experiment_id`` whose process is certainly gone: its :func:`process_tags`
    name this host (and PID namespace) and :func:`process_gone` says so, and (a parent run) no child of it is
    still RUNNING. The run gets an end time (now) and :data:`STALE_TAG` = ``marked KILLED by <by> (pid <pid> on
    <host>): process <pid> on <host> no longer alive``. Runs of other hosts, runs without the tags (opened before
    they existed, or not by :func:`stage_run`) and runs in ``keep`` are left as they are; a failure is logged,
    never raised (the stage that starts matters more).

    Args:
        client: an ``mlflow.MlflowClient`` of the store.
        by: who marks them (the stage that starts), for the tag.
        keep: run ids never to mark (the parent this process has just marked RUNNING).

    Returns:
        the ids of the runs marked KILLED.
    """
    try:
        me = process_tags()
        host, ns = me[HOST_TAG], me.get(PID_NAMESPACE_TAG)
        running = client.search_runs(
            [experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=50000
        )
        # stage runs first: a parent is stale only once none of its children is RUNNING
        running.sort(key=lambda r: "mlflow.parentRunId" not in r.data.tags)
        killed: list[str] = []
        elsewhere = 0
        for r in running:
            tags, run_id = r.data.tags, r.info.run_id
            if run_id in keep or PID_TAG not in tags:
                continue
            if tags.get(HOST_TAG) != host or (ns and tags.get(PID_NAMESPACE_TAG, ns) != ns):
                elsewhere += 1
                continue
            if any(
                c.data.tags.get("mlflow.parentRunId") == run_id and c.info.run_id not in killed
                for c in running
            ):
                continue
            try:
                start = float(tags[START_TAG]) if START_TAG in tags else None
                why = process_gone(int(tags[PID_TAG]), start)
            except ValueError:
                continue
            if why is None:
                continue
            reason = f"marked KILLED by {by} (pid {me[PID_TAG]} on {host}): {why} on {host}"
            client.set_tag(run_id, STALE_TAG, reason)
            client.set_terminated(run_id, status="KILLED")
            log.warning("MLflow run %s (%s) was RUNNING: %s", run_id, tags.get("stage", "pipeline"), reason)
            killed.append(run_id)
        if elsewhere:
            log.info(
                "%d RUNNING MLflow run(s) of other hosts left as they are (no process to check)", elsewhere
            )
        return killed
    except Exception as e:  # noqa: BLE001
        log.warning("could not look for stale MLflow runs (%s: %s)", type(e).__name__, e)
        return []


#: What each ``dvc.yaml`` stage does and the metrics its MLflow run's description leads with (``mlflow.note.content``,
#: shown above the run's page in the MLflow UI; :func:`describe_stage_run`).
STAGE_SUMMARY: dict[str, tuple[str, tuple[str, ...]]] = {
    "prepare": ("writes the train/test/val problems and the transfer sets, checks every canonical solution in the "
                "sandbox, converts the embedded model", ("prepare/problems", "prepare/canonical_passed")),
    "baselines": ("the four untrained methods (single, concat, sequential, discussion) on the test split",
                  ("test/baseline_single/pass_at_1", "test/baseline_concat/pass_at_1")),
    "train_magrpo": ("the warm start, then MAGRPO's updates of the helper and main LoRA adapters",
                     ("train/summary/first_quarter_reward", "train/summary/last_quarter_reward")),
    "evaluate_base": ("the untrained pair on the test split and the transfer sets",
                      ("test/base/pass_at_1", "transfer/easy40/base/pass_at_1")),
    "evaluate": ("the trained pair on the test split and the transfer sets, paired with the base pair",
                 ("test/magrpo/pass_at_1", "test/base/pass_at_1", "transfer/easy40/magrpo/pass_at_1",
                  "transfer/others_a/magrpo/pass_at_1")),
    "train_api_grpo": ("API-GRPO's beam search and behavior library", ("test/api_grpo/with_minus_without/reward",)),
    "train_orchestrator": ("the learned orchestrator (REINFORCE with a cost penalty) against fixed orders",
                           ("test/orchestrator/learned/reward",)),
    "detect_schemes": ("the cooperation schemes of the trained pair's samples", ()),
    "plot": ("the figures and reports/index.html", ()),
}  # fmt: skip

#: MLflow's tag for a run's description (the "Description" box of the run page).
NOTE_TAG = "mlflow.note.content"


def describe_stage_run(client, run_id: str, stage: str) -> str:
    """Set and return the stage run's description: what the stage did, its headline figures (the metrics of
    :data:`STAGE_SUMMARY` that the run logged, 3 decimals) and where the report is."""
    what, keys = STAGE_SUMMARY.get(stage.split("@")[0], ("", ()))
    metrics = client.get_run(run_id).data.metrics
    figures = ", ".join(f"`{k}` {metrics[k]:.3f}" for k in keys if k in metrics)
    report = repo_root() / "reports" / "index.html"
    lines = [f"**{stage}**" + (f": {what}." if what else ".")]
    if figures:
        lines.append(f"Headline: {figures}.")
    lines.append(
        f"Report: `{report}` (`orchestry report` rebuilds it; `dvc repro` writes it in the plot stage)."
    )
    text = "\n\n".join(lines)
    client.set_tag(run_id, NOTE_TAG, text)
    return text


def params_diff(root: Path | None = None, ref: str = "HEAD") -> dict[str, tuple[Any, Any]]:
    """``{key: (committed, now)}`` for every flattened key of ``params.yaml`` whose value differs from git
    ``ref``'s (what ``dvc exp run -S`` changed); ``{}`` when nothing differs or either side cannot be read."""
    import yaml

    root = root or repo_root()
    try:
        now = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8")) or {}
        committed = subprocess.run(["git", "show", f"{ref}:params.yaml"], cwd=root, capture_output=True, text=True,
                                   timeout=20, check=True).stdout  # fmt: skip
        before = yaml.safe_load(committed) or {}
    except (OSError, subprocess.SubprocessError, yaml.YAMLError):
        return {}
    a, b = _flatten(before), _flatten(now)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def describe_parent_run(client, parent_id: str, execution: Mapping[str, Any]) -> str:
    """Set and return the parent run's description: the execution (DVC experiment or plain ``dvc repro``) and the
    params it changed against the commit (:func:`params_diff`)."""
    name = execution.get("dvc_experiment") or "dvc repro"
    rev = str(execution.get("git_revision") or "HEAD")
    diff = params_diff(ref=rev if rev != "unknown" else "HEAD")  # against the experiment's baseline commit
    lines = [f"**{name}** at `{str(execution.get('git_revision', '?'))[:8]}`."]
    if diff:
        lines.append(
            "Params changed from the commit: "
            + ", ".join(f"`{k}` {a!r} → {b!r}" for k, (a, b) in diff.items())
        )
    else:
        lines.append("Params: the committed params.yaml.")
    text = "\n\n".join(lines)
    client.set_tag(parent_id, NOTE_TAG, text)
    return text


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


# ---------------------------------------------------------------- stages DVC did not run: links to their runs


def cached_run_tag(stage: str) -> str:
    """The parent-run tag that links ``stage`` (DVC's name, e.g. ``evaluate``, or ``name@item`` of a matrix stage)
    to the run that made its outputs: ``cached_run.<stage>``, ``@`` written ``_at_`` (MLflow rejects ``@`` in tag
    names)."""
    return CACHED_RUN_PREFIX + metric_name(stage)


#: Version of the stage-graph cache's format (:func:`dvc_stages`); a new one makes every saved graph stale.
STAGE_GRAPH_FORMAT = 1


def _stage_graph_key(root: Path) -> str | None:
    """The key of ``<root>/dvc.yaml``'s stage graph: SHA-256 of the cache format, DVC's version, ``root`` relative
    to the working directory and the bytes of ``dvc.yaml`` and ``params.yaml`` (the only file DVC interpolates
    ``${...}`` and matrices from when ``dvc.yaml`` names no ``vars``). ``None`` (do not cache) when ``dvc.yaml``
    names ``vars`` anywhere (other files may feed it) or is not a mapping."""
    import yaml
    from dvc import __version__ as dvc_version

    def names_vars(node: Any) -> bool:  # top level, a stage, a foreach's ``do``: anywhere
        if isinstance(node, dict):
            return "vars" in node or any(names_vars(v) for v in node.values())
        return isinstance(node, list) and any(names_vars(v) for v in node)

    text = (root / "dvc.yaml").read_bytes()
    doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if not isinstance(doc, dict) or names_vars(doc):
        return None
    params = root / "params.yaml"
    # DVC names stages relative to the working directory (``addressing``): the key holds where it is asked from
    where = os.path.relpath(root)
    h = hashlib.sha256(f"{STAGE_GRAPH_FORMAT}\0{dvc_version}\0{where}\0".encode())
    for part in (text, params.read_bytes() if params.is_file() else b"<none>"):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def _read_dvc_stages(root: Path) -> dict[str, tuple[list[str], set[str]]]:
    """:func:`dvc_stages` computed by DVC itself (its repository index: ~1.3 s on the project's pipeline)."""
    import networkx as nx
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        graph = repo.index.graph  # edges run from a stage to the stages it depends on
        commands = {s for s in repo.index.stages if s.cmd}  # not the stages of .dvc files (no run to link)
        return {
            s.addressing: (
                sorted(os.path.relpath(o.fs_path, root) for o in s.outs if not o.use_cache),
                {u.addressing for u in nx.descendants(graph, s) if u in commands},
            )
            for s in commands
        }


def dvc_stages(root: str | Path = ".") -> dict[str, tuple[list[str], set[str]]]:
    """The stages of ``<root>/dvc.yaml`` as DVC reads them (matrix stages expanded): stage name -> (its
    ``cache: false`` outputs, paths relative to ``root``; the names of the stages with a command it depends on,
    transitively). ``{}`` when there is no ``dvc.yaml``.

    Every stage run asks this when it ends (:func:`link_cached_stages`) and DVC's index takes ~1.3 s to build, so
    the answer is kept in ``<root>/.orchestry/dvc_stages.json`` under :func:`_stage_graph_key` (the bytes of
    ``dvc.yaml`` and ``params.yaml``, DVC's version and where it is asked from) and read from there while the key
    holds; an unreadable or
    stale file is recomputed and replaced (written whole to a temporary file, then renamed: parallel stages never
    read half of one)."""
    root = Path(root).resolve()
    if not (root / "dvc.yaml").is_file():
        return {}
    key = _stage_graph_key(root)
    cache = root / ".orchestry" / "dvc_stages.json"
    if key is not None:
        try:
            saved = json.loads(cache.read_text())
            if saved["key"] == key:
                return {name: (list(outs), set(up)) for name, (outs, up) in saved["stages"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            pass
    stages = _read_dvc_stages(root)
    if key is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
            doc = {"key": key, "stages": {n: [outs, sorted(up)] for n, (outs, up) in sorted(stages.items())}}
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, cache)
        except OSError as e:  # a read-only checkout: compute again next time
            log.info("could not keep the stage graph in %s (%s)", cache, e)
    return stages


def outputs_digest(paths: list[str], root: str | Path = ".") -> str | None:
    """SHA-256 (hex) of the names and bytes of ``paths`` (files, or folders: every file in them) under ``root``;
    ``None`` when ``paths`` is empty or one is missing."""
    root = Path(root)
    h = hashlib.sha256()
    if not paths:
        return None
    for rel in sorted(paths):
        p = root / rel
        if not p.exists():
            return None
        for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
            if f.is_file():
                h.update(f.relative_to(root).as_posix().encode() + b"\0")
                h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def link_cached_stages(
    client: Any, experiment_id: str, parent_id: str, run_id: str, stage: str
) -> dict[str, str]:
    """At the end of stage run ``run_id`` of ``stage``: tag it :data:`OUTPUTS_TAG` and link every upstream stage
    that did not run in this execution (no child of ``parent_id``) to the newest FINISHED run of that stage whose
    outputs are the ones on disk (tag :func:`cached_run_tag` on the parent). Nothing happens for a stage that is
    not in ``./dvc.yaml``; a failure is logged, never raised (the stage's results are what matters).

    Returns:
        ``{stage: linked run id}``.
    """
    try:
        stages = dvc_stages()
        if stage not in stages:
            return {}
        outs, upstream = stages[stage]
        digest = outputs_digest(outs)
        if digest:
            client.set_tag(run_id, OUTPUTS_TAG, digest)
        children = client.search_runs(
            [experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'", max_results=5000
        )
        ran = {c.data.tags.get("stage") for c in children}
        links = {}
        for up in sorted(upstream - ran):
            d = outputs_digest(stages[up][0])
            if d is None:
                continue
            made_them = (
                f"tags.stage = '{up}' and tags.{OUTPUTS_TAG} = '{d}' and attributes.status = 'FINISHED'"
            )
            found = client.search_runs(
                [experiment_id],
                filter_string=made_them,
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
            if found:
                links[up] = found[0].info.run_id
                client.set_tag(parent_id, cached_run_tag(up), links[up])
            else:
                log.info("%s: no FINISHED MLflow run of stage %s made its outputs on disk", stage, up)
        return links
    except Exception as e:  # noqa: BLE001
        log.warning("%s: could not link the stages DVC did not run (%s: %s)", stage, type(e).__name__, e)
        return {}


def metric_name(key: str) -> str:
    """MLflow-safe metric name: ``pass@k`` becomes ``pass_at_k`` (MLflow rejects ``@``)."""
    return key.replace("@", "_at_")


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


# ---------------------------------------------------------------- what the MLflow UI shows


def runs_view_state() -> dict[str, Any]:
    """MLflow's view state of the runs table (the JSON of a shared view): the columns :data:`VIEW_TAGS`, then
    duration and :data:`VIEW_METRICS`, newest run first."""
    return {
        "selectedColumns": [
            *(f"tags.`{t}`" for t in VIEW_TAGS),
            *(f"metrics.`{m}`" for m in VIEW_METRICS),
        ],
        "orderByKey": "attributes.start_time",
        "orderByAsc": False,
    }


def set_runs_view(client: Any, experiment_id: str) -> None:
    """Store :func:`runs_view_state` in experiment ``experiment_id`` (tag :data:`VIEW_TAG`) unless it is there
    already; the MLflow UI applies it to a URL with ``viewStateShareKey=`` :data:`VIEW_KEY`.

    Args:
        client: an ``mlflow.MlflowClient`` of the store.
    """
    value = json.dumps(runs_view_state(), sort_keys=True)
    if client.get_experiment(experiment_id).tags.get(VIEW_TAG) != value:
        client.set_experiment_tag(experiment_id, VIEW_TAG, value)


def ui_base(host: str = UI_HOST, port: int = UI_PORT) -> str:
    """``http://<host>:<port>`` of an MLflow UI; a wildcard host (``0.0.0.0``, ``::``) becomes ``127.0.0.1``."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return f"http://{host}:{port}"


def runs_table_url(experiment_id: str, base: str | None = None) -> str:
    """Address of experiment ``experiment_id``'s runs table in MLflow 3's UI at ``base`` (:func:`ui_base`): the
    "Model training" mode (``workflowType=machine_learning``; the default GenAI mode opens on traces) with the
    columns of :func:`runs_view_state` (``viewStateShareKey``)."""
    return (
        f"{base or ui_base()}/#/experiments/{experiment_id}/runs"
        f"?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}"
    )


def run_url(experiment_id: str, run_id: str, base: str | None = None) -> str:
    """Address of one run's page in the MLflow UI at ``base`` (:func:`ui_base`)."""
    return f"{base or ui_base()}/#/experiments/{experiment_id}/runs/{run_id}"


def _mean(value: Any) -> Any:
    """``value["mean"]`` for a ``{mean, ci_low, ci_high}`` dict, else ``value``."""
    return value.get("mean") if isinstance(value, Mapping) else value


def execution_metrics(reports: str | Path = "reports") -> dict[str, float]:
    """The key metrics of a pipeline execution, read from its reports (a missing or unreadable file is skipped):

    * ``reports/metrics.json`` (``evaluate``): per method on the test split (``base``, ``magrpo``,
      ``baseline_<name>``) ``test/<method>/pass_at_1``, ``test/<method>/reward`` (mean level reward, 0-4),
      ``test/<method>/cooperation_rate`` (share of samples, 0-1), ``cost/<method>/tokens_per_sample`` (prompt +
      completion tokens) and ``cost/<method>/seconds`` (wall seconds of the method's generation);
    * ``reports/api_grpo/summary.json``: ``test/api_grpo/with_behaviors/reward``,
      ``test/api_grpo/without_behaviors/reward`` (0-4), ``cost/api_grpo/tokens``, ``cost/api_grpo/usd``;
    * ``reports/orchestrator/summary.json``: per policy ``test/orchestrator/<policy>/task_reward`` (0-4),
      ``.../cost`` (the summary's cost unit), ``.../objective`` (r - 2 lambda C, docs/orchestrator.md),
      ``.../success_rate``.

    Returns:
        ``{name: value}`` with finite numbers only (names as :func:`metric_name` makes them).
    """
    reports = Path(reports)

    def read(rel: str) -> dict:
        try:
            data = json.loads((reports / rel).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    out: dict[str, Any] = {}
    for method, m in (read("metrics.json").get("methods") or {}).items():
        if not isinstance(m, Mapping):
            continue
        out[f"test/{method}/pass_at_1"] = m.get("pass@1", m.get("pass_rate"))
        out[f"test/{method}/reward"] = m.get("reward")
        out[f"test/{method}/cooperation_rate"] = m.get("cooperation_rate")
        tokens = [m.get(k) for k in ("prompt_tokens", "completion_tokens")]
        if all(isinstance(t, int | float) for t in tokens):
            out[f"cost/{method}/tokens_per_sample"] = sum(tokens)
        out[f"cost/{method}/seconds"] = m.get("seconds")
    api = read("api_grpo/summary.json")
    ev = api.get("eval") or {}
    out["test/api_grpo/with_behaviors/reward"] = _mean(ev.get("with"))
    out["test/api_grpo/without_behaviors/reward"] = _mean(ev.get("without"))
    cost = api.get("cost") or {}
    out["cost/api_grpo/tokens"] = cost.get("tokens_total", cost.get("tokens"))
    out["cost/api_grpo/usd"] = cost.get("usd_total", cost.get("usd"))
    orch = (read("orchestrator/summary.json").get("eval") or {}).get("methods") or {}
    for policy, s in orch.items():
        if not isinstance(s, Mapping):
            continue
        for key in ("task_reward", "cost", "objective", "success_rate"):
            out[f"test/orchestrator/{policy}/{key}"] = _mean(s.get(key))
    return {
        metric_name(k): float(v)
        for k, v in out.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))
    }


def log_execution_metrics(reports: str | Path = "reports", run_id: str | None = None) -> dict[str, float]:
    """Log :func:`execution_metrics` of ``reports`` to the pipeline execution's parent run: ``run_id``, or the
    parent (``mlflow.parentRunId``) of the active run. Called by the ``plot`` stage, the last one, so a cached
    upstream stage's results still reach this execution's parent.

    Returns:
        the metrics logged (``{}`` when there is none).

    Raises:
        RuntimeError: no ``run_id`` and no active run with a parent.
    """
    import mlflow
    from mlflow.entities import Metric

    if run_id is None:
        active = mlflow.active_run()
        run_id = active.data.tags.get("mlflow.parentRunId") if active is not None else None
        if run_id is None:
            raise RuntimeError(
                "log_execution_metrics needs run_id or an active stage run (tracking.runs.stage_run)"
            )
    metrics = execution_metrics(reports)
    if metrics:
        mlflow.MlflowClient().log_batch(
            run_id,
            metrics=[Metric(k, v, int(time.time() * 1000), 0) for k, v in metrics.items()],
        )
    return metrics
