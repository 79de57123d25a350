"""Stage `detect_schemes`: classify main's code of every evaluated sample into a cooperation scheme.

``reports/schemes.json`` is a method x scheme crosstab (pandas): ``counts`` (schemes seen), ``distribution``
(shares of every scheme in :data:`orchestry.analysis.schemes.SCHEMES`, each method's row summing to 1),
``distribution_when_a_test_passes`` (the same over samples with at least one passed assert) and ``samples``.
"""

from pathlib import Path

import mlflow
import pandas as pd

from orchestry.analysis.schemes import SCHEMES, detect_scheme
from orchestry.problems import read_problems
from orchestry.rewards.code import extract_code
from orchestry.runtime import read_jsonl, run_stage, start_stage, write_json, write_jsonl
from orchestry.tracking.metric_names import scheme_metrics
from orchestry.tracking.runs import log_metrics, stage_run


def _shares(df: pd.DataFrame) -> dict[str, dict[str, float]]:
    """``{method: {scheme: share}}`` over every scheme of SCHEMES (0.0 where unseen)."""
    table = pd.crosstab(df["method"], df["scheme"], normalize="index")
    return table.reindex(columns=list(SCHEMES), fill_value=0.0).to_dict(orient="index")


def main() -> None:
    params = start_stage("detect_schemes")
    cfg = params.detect_schemes
    entry = {p.task_id: p.entry_point for p in read_problems("data/problems/all.jsonl")}
    files = sorted(Path("reports/eval").glob("*.jsonl")) + sorted(Path("reports/baselines").glob("*.jsonl"))
    rows, test_passed = [], []
    with stage_run("detect_schemes", cfg.model_dump(), params.mlflow.experiment, params.mlflow.tracking_uri):
        for f in files:
            method = f.stem if f.parent.name == "eval" else f"baseline_{f.stem}"
            if cfg.methods and method not in cfg.methods:
                continue
            for r in read_jsonl(f):
                code, _ = extract_code(r["main"])
                scheme = detect_scheme(code, entry.get(r["task_id"]))
                rows.append(
                    {"method": method, "task_id": r["task_id"], "sample": r["sample"], "scheme": scheme}
                )
                test_passed.append(r["passed"] > 0)
        df = pd.DataFrame(rows, columns=["method", "task_id", "sample", "scheme"])
        counts = pd.crosstab(df["method"], df["scheme"])
        report = {
            "schemes": list(SCHEMES),
            "distribution": _shares(df),
            "counts": {m: {s: int(c) for s, c in row.items() if c} for m, row in counts.iterrows()},
            "distribution_when_a_test_passes": _shares(df[pd.Series(test_passed, dtype=bool).to_numpy()]),
            "samples": {m: int(n) for m, n in df["method"].value_counts().items()},
        }
        write_json("reports/schemes.json", report)
        write_jsonl("reports/schemes_samples.jsonl", rows)
        for m, dist in report["distribution"].items():
            log_metrics(scheme_metrics(m, dist))
        mlflow.log_artifact("reports/schemes.json")
        for m, dist in report["distribution"].items():
            print(m, {k: round(v, 2) for k, v in dist.items() if v})


if __name__ == "__main__":
    run_stage(main)
