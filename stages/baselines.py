"""Stage `baselines@<method>`: single / concat / sequential / discussion with the base model on the test split."""

import argparse
import json
import time

import mlflow

from orchestry.analysis.metrics import summarize
from orchestry.config import BASELINE_METHODS
from orchestry.evaluation.baselines import run_method
from orchestry.numerics import machine_info
from orchestry.problems import read_problems
from orchestry.runtime import load_policy, open_sandbox, run_stage, start_stage, write_json, write_jsonl
from orchestry.tracking.metric_names import method_metrics
from orchestry.tracking.runs import log_metrics, stage_run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", required=True, choices=BASELINE_METHODS)
    args = ap.parse_args()
    params = start_stage(f"baselines@{args.method}")
    cfg = params.baselines
    problems = read_problems("data/problems/test.jsonl")[: cfg.max_problems]
    logged = {
        **cfg.model_dump(),
        "method": args.method,
        **params.sampling.model_dump(),
        **params.model.model_dump(),
    }
    with stage_run(f"baselines@{args.method}", logged, params.mlflow.experiment, params.mlflow.tracking_uri):
        t0 = time.time()
        model, tok = load_policy(params)
        with open_sandbox(params) as sb:
            records = run_method(
                args.method,
                problems,
                model,
                tok,
                sb,
                params.sampling,
                cfg.num_samples,
                cfg.seed,
                cfg.batch_size,
            )
        seconds = time.time() - t0
        iv = params.intervals
        summary = summarize(records, sorted({1, cfg.num_samples}), iv.confidence, iv.resamples)
        summary["seconds"] = seconds
        summary["machine"] = machine_info()  # what the seconds (and the low bits) depend on
        out = f"reports/baselines/{args.method}.jsonl"
        write_jsonl(out, records)
        write_json(f"reports/baselines/{args.method}.json", summary)
        log_metrics(method_metrics("test", f"baseline_{args.method}", summary))
        log_metrics(
            {
                "cost/prompt_tokens": sum(r["prompt_tokens"] for r in records),
                "cost/completion_tokens": sum(r["completion_tokens"] for r in records),
                "cost/usd": 0.0,
            }
        )
        mlflow.log_artifact(out, "samples")
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()}))


if __name__ == "__main__":
    run_stage(main)
