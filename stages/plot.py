"""Stage `plot`: PNG figures under reports/figures/ (learning curves, methods, schemes, API-GRPO)."""

import json
from pathlib import Path

import mlflow

from orchestry.plots import plot_learning_curves, plot_methods, plot_schemes
from orchestry.plots_api_grpo import plot_api_grpo
from orchestry.runtime import start_stage
from orchestry.tracking import stage_run

OUT = Path("reports/figures")


def main() -> None:
    params = start_stage("plot")
    cfg = params.plot
    OUT.mkdir(parents=True, exist_ok=True)
    with stage_run("plot", cfg.model_dump(), params.mlflow.experiment):
        plot_learning_curves("reports/train/magrpo_steps.csv", OUT / "learning_curves.png", cfg.dpi)
        plot_methods(json.loads(Path("reports/metrics.json").read_text()), OUT / "methods.png", cfg.dpi)
        plot_schemes(json.loads(Path("reports/schemes.json").read_text()), OUT / "schemes.png", cfg.dpi)
        plot_api_grpo(Path("reports/api_grpo"), OUT / "api_grpo.png", cfg.dpi)
        mlflow.log_artifacts(str(OUT), "figures")
        print("figures:", ", ".join(sorted(p.name for p in OUT.glob("*.png"))))


if __name__ == "__main__":
    main()
