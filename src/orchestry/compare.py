"""``orchestry compare``: one row per pipeline execution from the MLflow store, with its key metrics.

Runs are read with ``mlflow.search_runs`` (a pandas DataFrame: ``metrics.*``, ``params.*``, ``tags.*`` columns).
A pipeline execution is

* a parent run and its child stage runs (``tags.mlflow.parentRunId``), when the pipeline logs one parent run per
  execution (tags ``dvc_experiment``, ``git_revision``, ``params_hash``; children tagged ``stage``);
* otherwise, for flat stage runs (one run per stage execution, tagged ``stage``), every run with the same
  ``dvc_experiment`` tag (``workspace`` when unset: a plain ``dvc repro``) and ``git_revision``.

A metric is named ``stage:metric`` (the newest run of that stage in the execution that logged it, e.g.
``evaluate:magrpo/reward``) or ``metric`` (the newest run of any stage that logged it). ``@`` is written as MLflow
stores it (``pass@1`` is ``pass_at_1``); either spelling is accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from orchestry.tracking import metric_name

#: Evaluate's trained and base rewards (max 4.0), the trained pair's cooperation rate and pass@1, and MAGRPO's
#: training reward (last quarter of the updates, and last minus first quarter).
DEFAULT_METRICS = (
    "evaluate:magrpo/reward",
    "evaluate:base/reward",
    "evaluate:magrpo/cooperation_rate",
    "evaluate:magrpo/pass_at_1",
    "train_magrpo:summary/last_quarter_reward",
    "train_magrpo:summary/difference",
)
PARENT = "tags.mlflow.parentRunId"
_TAGS = ("tags.stage", PARENT, "tags.dvc_experiment", "tags.git_revision", "tags.params_hash")
_STATUS_ORDER = ("FAILED", "KILLED", "RUNNING", "SCHEDULED", "FINISHED")  # an execution shows its worst stage


class CompareError(ValueError):
    """The store, experiment or a requested metric does not exist; the message says which."""


def load_runs(experiment: str, tracking_uri: str) -> pd.DataFrame:
    """Every run of ``experiment`` in the store at ``tracking_uri`` (``mlflow.search_runs``' DataFrame).

    Raises:
        CompareError: a ``sqlite:///`` store file that does not exist (it is not created), or no such experiment.
    """
    import mlflow

    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        if not db.is_file():
            raise CompareError(f"no MLflow store at {db} (run the pipeline first, or pass --tracking-uri)")
    client = mlflow.MlflowClient(tracking_uri)
    if client.get_experiment_by_name(experiment) is None:
        names = sorted(e.name for e in client.search_experiments())
        raise CompareError(
            f"no MLflow experiment {experiment!r} in {tracking_uri} (experiments: {', '.join(names) or 'none'})"
        )
    was_set = mlflow.tracking.is_tracking_uri_set()
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    try:
        return mlflow.search_runs(experiment_names=[experiment], output_format="pandas")
    finally:
        mlflow.set_tracking_uri(previous if was_set else None)


def _split(spec: str) -> tuple[str | None, str]:
    """``"stage:metric"`` -> ``(stage, MLflow metric name)``; ``"metric"`` -> ``(None, name)``."""
    stage, sep, name = spec.rpartition(":")
    return (stage if sep else None), metric_name(name)


def executions(
    runs: pd.DataFrame, metrics: Sequence[str] = DEFAULT_METRICS, strict: bool = False
) -> pd.DataFrame:
    """One row per pipeline execution (module docstring), newest first.

    Columns: ``execution`` (the DVC experiment name, ``workspace`` for a plain ``dvc repro``), ``git_revision``,
    ``params_hash`` (empty for flat runs), ``started`` (earliest run start, a UTC timestamp), ``stages`` (distinct
    stage tags), ``status`` (the worst status of its runs: FAILED, KILLED, RUNNING, FINISHED), ``seconds`` (sum
    of the stages' ``cost/wall_seconds``), then one column per entry of ``metrics`` (NaN where not logged).

    Raises:
        CompareError: ``strict`` and a metric that no run (of the named stage) logged.
    """
    cols = ["execution", "git_revision", "params_hash", "started", "stages", "status", "seconds", *metrics]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    df = runs.copy()
    for c in _TAGS:
        if c not in df:
            df[c] = None
    df = df.sort_values("start_time", kind="stable")
    parents = set(df[PARENT].dropna())
    flat_key = df["tags.dvc_experiment"].fillna("workspace") + "@" + df["tags.git_revision"].fillna("unknown")
    df["_group"] = df[PARENT].where(
        df[PARENT].notna(), df["run_id"].where(df["run_id"].isin(parents), flat_key)
    )
    if strict:
        for spec in metrics:
            stage, name = _split(spec)
            rows = df if stage is None else df[df["tags.stage"] == stage]
            if f"metrics.{name}" not in df or rows[f"metrics.{name}"].isna().all():
                where = f"stage {stage!r}" if stage else "any stage"
                known = sorted(c.removeprefix("metrics.") for c in df if c.startswith("metrics."))
                raise CompareError(
                    f"metric {name!r} was not logged by {where} (logged: {', '.join(known[:20]) or 'none'})"
                )
    out = []
    for key, g in df.groupby("_group", sort=False):
        head = g[g["run_id"] == key]  # the parent run, when there is one
        info = head.iloc[0] if len(head) else g.iloc[-1]
        stages = g["tags.stage"].dropna()
        statuses = set(g["status"])
        row = {
            "execution": info["tags.dvc_experiment"] or "workspace",
            "git_revision": g["tags.git_revision"].dropna().iloc[-1]
            if g["tags.git_revision"].notna().any()
            else "",
            "params_hash": g["tags.params_hash"].dropna().iloc[-1]
            if g["tags.params_hash"].notna().any()
            else "",
            "started": g["start_time"].min(),
            "stages": stages.nunique(),
            "status": next((s for s in _STATUS_ORDER if s in statuses), sorted(statuses)[0]),
            "seconds": g[g["tags.stage"].notna()]
            .get("metrics.cost/wall_seconds", pd.Series(dtype=float))
            .sum(),
        }
        if pd.isna(row["execution"]):
            row["execution"] = "workspace"
        for spec in metrics:
            stage, name = _split(spec)
            rows = g if stage is None else g[g["tags.stage"] == stage]
            values = rows[f"metrics.{name}"].dropna() if f"metrics.{name}" in rows else pd.Series(dtype=float)
            row[spec] = values.iloc[-1] if len(values) else float("nan")
        out.append(row)
    table = pd.DataFrame(out, columns=cols)
    return table.sort_values("started", ascending=False, kind="stable").reset_index(drop=True)
