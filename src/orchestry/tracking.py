"""MLflow tracking: one run per stage execution, in a sqlite store at the repository root.

The store is ``sqlite:///<root>/mlflow.db`` and artifacts go to ``<root>/mlartifacts``, where ``<root>`` is
``DVC_ROOT`` when DVC sets it (``dvc exp run --temp/--queue`` runs in a copy; results must land in the real
repository) and the current directory otherwise. View with ``mlflow ui --backend-store-uri sqlite:///mlflow.db``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("orchestry.tracking")


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
    ``cost/wall_seconds`` is logged when the block ends (also on error, the run is then marked FAILED).

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
    with mlflow.start_run(run_name=stage, tags=tags) as run:
        flat = {k: (str(v)[:500] if v is not None else "None") for k, v in _flatten(params).items()}
        if flat:
            mlflow.log_params(flat)
        try:
            yield run
        finally:
            mlflow.log_metric("cost/wall_seconds", time.time() - t0)


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
