"""What identifies a pipeline execution, and its parent MLflow run.

A pipeline execution is identified by the DVC experiment name (``DVC_EXP_NAME``, set by ``dvc exp run``; absent
for a plain ``dvc repro``), the git revision it runs from (``DVC_EXP_BASELINE_REV`` in ``dvc exp run``, else
``HEAD``) and the SHA-256 of ``params.yaml`` (:func:`pipeline_execution`; inside a trial of ``orchestry tune`` also
the Optuna study and trial). Every stage of one execution finds (or, the first, creates) the parent run with those
tags (:func:`parent_run_id`), under a file lock in ``<root>/.orchestry`` so parallel stages (``--run-all -j 2``)
share one parent; the parent holds the flattened ``params.yaml``. Stage runs are opened by
:func:`orchestry.tracking.runs.stage_run`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestry.paths import repo_root
from orchestry.tracking.stale import STALE_TAG, mark_stale_runs, process_tags

#: Set by ``orchestry tune`` (:mod:`orchestry.tune`) for the ``dvc exp run`` of a trial: the Optuna study's name and
#: the trial's number, tagged on every run of that execution (:func:`pipeline_execution`).
TUNE_STUDY_ENV = "ORCHESTRY_TUNE_STUDY"
TUNE_TRIAL_ENV = "ORCHESTRY_TUNE_TRIAL"


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

    With ``claim_for`` (the stage about to run, :func:`~orchestry.tracking.runs.stage_run`), under the same lock: the parent gets this
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
