"""Stage `detect_schemes`: classify main's code of every evaluated sample into a cooperation scheme."""

from collections import Counter, defaultdict
from pathlib import Path

import mlflow

from orchestry.problems import read_problems
from orchestry.rewards.code import extract_code
from orchestry.runtime import read_jsonl, start_stage, write_json, write_jsonl
from orchestry.schemes import SCHEMES, detect_scheme, scheme_distribution
from orchestry.tracking import log_metrics, stage_run


def main() -> None:
    params = start_stage("detect_schemes")
    cfg = params.detect_schemes
    entry = {p.task_id: p.entry_point for p in read_problems("data/problems/all.jsonl")}
    files = sorted(Path("reports/eval").glob("*.jsonl")) + sorted(Path("reports/baselines").glob("*.jsonl"))
    labels: dict[str, list[str]] = defaultdict(list)
    passing: dict[str, list[str]] = defaultdict(list)
    rows = []
    with stage_run("detect_schemes", cfg.model_dump(), params.mlflow.experiment):
        for f in files:
            method = f.stem if f.parent.name == "eval" else f"baseline_{f.stem}"
            if cfg.methods and method not in cfg.methods:
                continue
            for r in read_jsonl(f):
                code, _ = extract_code(r["main"])
                scheme = detect_scheme(code, entry.get(r["task_id"]))
                labels[method].append(scheme)
                if r["passed"] > 0:
                    passing[method].append(scheme)
                rows.append(
                    {"method": method, "task_id": r["task_id"], "sample": r["sample"], "scheme": scheme}
                )
        report = {
            "schemes": list(SCHEMES),
            "distribution": {m: scheme_distribution(v) for m, v in labels.items()},
            "counts": {m: dict(Counter(v)) for m, v in labels.items()},
            "distribution_when_a_test_passes": {m: scheme_distribution(v) for m, v in passing.items() if v},
            "samples": {m: len(v) for m, v in labels.items()},
        }
        write_json("reports/schemes.json", report)
        write_jsonl("reports/schemes_samples.jsonl", rows)
        for m, dist in report["distribution"].items():
            log_metrics({f"{m}/{s}": v for s, v in dist.items()})
        mlflow.log_artifact("reports/schemes.json")
        for m, dist in report["distribution"].items():
            print(m, {k: round(v, 2) for k, v in dist.items() if v})


if __name__ == "__main__":
    main()
