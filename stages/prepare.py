"""Stage `prepare`: problem records + splits, canonical solutions checked in the sandbox, model conversion."""

import sys
import time
from pathlib import Path

from orchestry.problems import ProblemFormatError, check_canonical_solutions, load_problems, split_problems
from orchestry.runtime import open_sandbox, start_stage, write_json, write_jsonl
from orchestry.tracking import log_metrics, stage_run


def main() -> None:
    params = start_stage("prepare")
    cfg = params.prepare
    try:
        problems = load_problems(cfg.source)
    except ProblemFormatError as e:
        sys.exit(f"error: prepare.source: {e}")
    splits = split_problems(problems, cfg.split, cfg.seed, cfg.fractions)
    with stage_run("prepare", cfg.model_dump(), params.mlflow.experiment):
        for name, items in splits.items():
            write_jsonl(f"data/problems/{name}.jsonl", (p.to_dict() for p in items))
        write_jsonl("data/problems/all.jsonl", (p.to_dict() for p in problems))
        t0 = time.time()
        with open_sandbox(params) as sb:
            checked, failed = check_canonical_solutions(problems, sb)
            layer = sb.isolation_layer
        sandbox_s = time.time() - t0
        report = {
            "problems": len(problems),
            "asserts": sum(len(p.asserts) for p in problems),
            "split_sizes": {k: len(v) for k, v in splits.items()},
            "canonical_checked": checked,
            "canonical_passed": checked - len(failed),
            "canonical_failed": failed,
            "canonical_seconds": round(sandbox_s, 2),
            "sandbox_isolation": layer,
        }
        print(f"canonical solutions: {report['canonical_passed']}/{checked} pass ({layer}, {sandbox_s:.1f}s)")
        if failed:
            print(f"  failing: {failed[:10]}")
        from orchestry.llm.local import convert_embedded_model

        info = convert_embedded_model(Path("models/base"))
        report["model"] = info
        print(f"embedded model converted to models/base in {info['seconds']}s")
        write_json("reports/prepare.json", report)
        log_metrics(
            {
                "problems": report["problems"],
                "asserts": report["asserts"],
                "canonical_passed": report["canonical_passed"],
                "canonical_checked": report["canonical_checked"],
                **{f"split/{k}": v for k, v in report["split_sizes"].items()},
            }
        )


if __name__ == "__main__":
    main()
