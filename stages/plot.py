"""Stage `plot`: PNG figures under reports/figures/ (learning curves, methods, schemes, API-GRPO, orchestrator)
and the HTML report of every result, reports/index.html (:mod:`orchestry.reporting.report`). The last stage: it also copies
the execution's key metrics onto the pipeline execution's parent MLflow run (tracking.ui.log_execution_metrics)."""

import json
import sys
from pathlib import Path

import mlflow

from orchestry.reporting.plots import (
    plot_collaboration,
    plot_learning_curves,
    plot_methods,
    plot_scheme_evolution,
    plot_schemes,
)
from orchestry.reporting.plots_api_grpo import plot_api_grpo
from orchestry.reporting.plots_orchestrator import plot_orchestrator
from orchestry.reporting.report import ReportError, write_report
from orchestry.reporting.results import results_markdown
from orchestry.runtime import run_stage, start_stage
from orchestry.tracking.runs import stage_run
from orchestry.tracking.ui import log_execution_metrics

OUT = Path("reports/figures")
REPORT = Path("reports/index.html")
RESULTS = Path("reports/results.md")


def main() -> None:
    params = start_stage("plot")
    cfg = params.plot
    OUT.mkdir(parents=True, exist_ok=True)
    with stage_run("plot", cfg.model_dump(), params.mlflow.experiment, params.mlflow.tracking_uri):
        plot_learning_curves("reports/train/magrpo_steps.csv", OUT / "learning_curves.png", cfg.dpi)
        metrics = json.loads(Path("reports/metrics.json").read_text())
        RESULTS.write_text(
            results_markdown(metrics)
        )  # README's "What the default run shows" (a test compares)
        mlflow.log_artifact(str(RESULTS))
        print(RESULTS.read_text())
        plot_methods(metrics, OUT / "methods.png", cfg.dpi)
        plot_collaboration(metrics, OUT / "collaboration.png", cfg.dpi)
        first = plot_scheme_evolution("reports/train/magrpo_steps.csv", OUT / "scheme_evolution.png", cfg.dpi)
        print("schemes first seen at training step:", first or "none")
        mlflow.log_dict({"first_step": first}, "schemes_first_step.json")
        plot_schemes(json.loads(Path("reports/schemes.json").read_text()), OUT / "schemes.png", cfg.dpi)
        plot_api_grpo(Path("reports/api_grpo"), OUT / "api_grpo.png", cfg.dpi)
        plot_orchestrator(Path("reports/orchestrator"), OUT, cfg.dpi)
        mlflow.log_artifacts(str(OUT), "figures")
        # the parent run gets the key metrics: a collapsed runs table compares executions
        key = log_execution_metrics(Path("reports"))
        print(f"{len(key)} key metrics on the parent run")
        print("figures:", ", ".join(sorted(p.name for p in OUT.glob("*.png"))))
        try:
            write_report(Path("."), REPORT)
        except ReportError as e:
            sys.exit(f"error: {REPORT} not built: {e}")
        mlflow.log_artifact(str(REPORT))
        print("report:", REPORT)


if __name__ == "__main__":
    run_stage(main)
