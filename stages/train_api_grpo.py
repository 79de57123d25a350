"""Stage `train_api_grpo`: beam search + behaviour library for API-only models (offline by default).

Reads ``params.yaml`` (sections ``api_grpo``, ``sampling``, ``model``, ``sandbox``, ``intervals``) and the human
scores of ``data/overrides.jsonl`` (:mod:`orchestry.overrides`), checks the backend (key, price, server) before
any work, runs :func:`orchestry.training.api_grpo.run_api_grpo` and logs the
per-episode and total metrics, cost and the outputs under ``reports/api_grpo/`` to MLflow.
"""

import json
import sys

import mlflow

from orchestry.llm.backends import BackendConfigError
from orchestry.llm.cost import PriceError
from orchestry.metrics import flat_numbers as _flat_numbers
from orchestry.overrides import OverrideError, read_overrides
from orchestry.problems import read_problems
from orchestry.runtime import open_sandbox, start_stage
from orchestry.tracking import log_metrics, stage_run
from orchestry.training.api_grpo import open_clients, run_api_grpo

OUT = "reports/api_grpo"


def main() -> None:
    params = start_stage("train_api_grpo")
    cfg = params.api_grpo
    train = read_problems("data/problems/train.jsonl")
    test = read_problems("data/problems/test.jsonl")
    try:  # human scores (orchestry override / orchestry review); a missing file is none
        overrides = read_overrides("data/overrides.jsonl")
    except OverrideError as e:
        sys.exit(f"error: {e}")
    try:  # key, price and server are checked here, before the MLflow run, the model or the sandbox
        clients = open_clients(cfg, params.sampling, params.model.path, params.model.dtype)
    except (BackendConfigError, PriceError) as e:
        sys.exit(f"error: {e}")
    logged = {**cfg.model_dump(), "sampling": params.sampling.model_dump()}
    with stage_run("train_api_grpo", logged, params.mlflow.experiment, params.mlflow.tracking_uri):
        summary = run_api_grpo(
            cfg,
            params.sampling,
            train,
            test,
            lambda: open_sandbox(params),
            OUT,
            on_metrics=log_metrics,
            clients=clients,
            confidence=params.intervals.confidence,
            n_boot=params.intervals.resamples,
            overrides=overrides,
        )
        total = {
            f"summary/{k}": v for k, v in _flat_numbers(summary).items() if not k.startswith("cost/by_tag")
        }
        log_metrics(total)
        mlflow.set_tags(
            {"budget_status": summary["budget"]["status"], "eval_status": summary["eval"].get("status", "")}
        )
        mlflow.log_artifacts(OUT, "api_grpo")
    ev = summary["eval"]
    brief = {
        "episodes": summary["episodes_completed"],
        "with": ev.get("with", {}).get("mean"),
        "without": ev.get("without", {}).get("mean"),
        "difference": ev.get("difference"),
        "cache_hit_rate": summary["cache"]["hit_rate"],
        "usd": summary["cost"]["usd_total"],
        "tokens": summary["cost"]["tokens_total"],
        "budget": summary["budget"]["status"],
        "overrides_applied": summary["overrides"]["applied"],
    }
    print(json.dumps(brief, default=str))


if __name__ == "__main__":
    main()
