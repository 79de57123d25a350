"""Stage `baselines@<method>`: single / concat / sequential / discussion with the base model on the test split.

The methods share a store of the bare model's samples (:func:`sample_cache`): discussion's first drafts are the
very call concat makes (same prompts, seed and batches), so whichever of the two runs second reads it instead of
decoding it again (about a third of discussion's decoding time on the defaults)."""

import argparse
import json
import logging
import time
from pathlib import Path

import mlflow

from orchestry.analysis.metrics import summarize
from orchestry.config import BASELINE_METHODS
from orchestry.evaluation.baselines import run_method
from orchestry.fingerprint import folder_fingerprint, package_fingerprint
from orchestry.llm.decoding import decode_numerics
from orchestry.llm.sampling import SampleCache
from orchestry.numerics import machine_info
from orchestry.problems import read_problems
from orchestry.runtime import (
    load_policy,
    open_sandbox,
    repo_root,
    run_stage,
    start_stage,
    write_json,
    write_jsonl,
)
from orchestry.tracking.metric_names import method_metrics
from orchestry.tracking.runs import log_metrics, stage_run

log = logging.getLogger("baselines")


def sample_cache(params) -> SampleCache:
    """The bare model's store of sampled completions (:class:`orchestry.llm.sampling.SampleCache`) in
    ``.orchestry/samples/`` of the repository (:func:`orchestry.runtime.repo_root`; git-ignored, outside DVC,
    safe to delete). Its identity: the model folder's fingerprint, ``model.dtype`` and ``model.load_in_4bit``,
    the decoder's resolved numerics, the machine record (:func:`orchestry.numerics.machine_info`) and the code's
    fingerprint, so a change to any of them, or to the call, decodes anew. Call after ``start_stage``."""
    model = Path(params.model.path)
    identity = {
        "model": folder_fingerprint(model) if model.is_dir() else str(model),
        "dtype": params.model.dtype,
        "load_in_4bit": params.model.load_in_4bit,
        "decoder": list(decode_numerics()),
        "machine": machine_info(),
        "code": package_fingerprint(),
    }
    return SampleCache(repo_root() / ".orchestry" / "samples", identity)


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
        cache = sample_cache(params)  # discussion's drafts: concat's samples, when concat ran here before
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
                cache=cache,
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
        if cache.hits:  # discussion's drafts: concat's call, decoded by baselines@concat before
            log.info("%d sample_texts call(s) read from %s, not decoded again", cache.hits, cache.root)
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
