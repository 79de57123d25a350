"""What the MLflow UI shows (``orchestry ui``): the runs table's shared view and the addresses of its pages, and
the key metrics of a pipeline execution copied onto its parent run.

The experiment holds MLflow's shared view state (tag :data:`VIEW_TAG`) that selects the columns :data:`VIEW_TAGS`
and :data:`VIEW_METRICS` (:func:`set_runs_view`); :func:`runs_table_url` is the address of the runs table with that
view. The ``plot`` stage copies the execution's key metrics (:func:`execution_metrics`) onto the parent run
(:func:`log_execution_metrics`), so a collapsed runs table already compares executions.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestry.tracking.metric_names import metric_name

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
