"""Stage `baselines`: single / concat / sequential / discussion with the base model on the test split.

Every method of ``baselines.methods`` runs in this one process, in that order, on one loaded model and one sandbox
(a process per method paid the imports, the model's load and MLflow's start-up four times: ~20 s of the default
run). Each method's samples are drawn with ``baselines.seed`` from the same state as when it ran alone, so its
records do not depend on which other methods run. The methods share a store of the bare model's samples
(:func:`sample_cache`): discussion's first drafts are the very call concat makes (same prompts, seed and batches),
so they are read instead of decoded again (about a third of discussion's decoding time on the defaults), and a
queued experiment with the same inputs reads every call."""

import json
import logging
import time
from pathlib import Path

import mlflow

from orchestry.analysis.metrics import summarize
from orchestry.evaluation.baselines import run_method
from orchestry.fingerprint import folder_fingerprint, package_fingerprint
from orchestry.llm.decoding import decode_numerics
from orchestry.llm.sampling import SampleCache
from orchestry.paths import repo_root
from orchestry.problems import read_problems
from orchestry.runtime import (
    load_policy,
    machine_info,
    open_sandbox,
    run_stage,
    start_stage,
    write_json,
    write_jsonl,
)
from orchestry.tracking.metric_names import method_metrics
from orchestry.tracking.runs import log_metrics, stage_run

log = logging.getLogger("baselines")
#: ``<method>.jsonl`` (every sample) and ``<method>.json`` (its summary, seconds and machine) per method.
OUT = Path("reports/baselines")
#: The run's bookkeeping (uncached, in git): the methods in order, the model's load seconds, the sampling calls read
#: from the store, the machine (each method's seconds are in its ``<method>.json``). Its digest links a later execution that did not run the stage to this run
#: (:func:`orchestry.tracking.stage_cache.link_cached_stages`).
MADE = Path("reports/baselines.json")


def sample_cache(params) -> SampleCache:
    """The bare model's store of sampled completions (:class:`orchestry.llm.sampling.SampleCache`) in
    ``.orchestry/samples/`` of the repository (:func:`orchestry.paths.repo_root`; git-ignored, outside DVC,
    safe to delete). Its identity: the model folder's fingerprint, ``model.dtype`` and ``model.load_in_4bit``,
    the decoder's resolved numerics, the machine record (:func:`orchestry.runtime.machine_info`) and the code's
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
    params = start_stage("baselines")
    cfg = params.baselines
    problems = read_problems("data/problems/test.jsonl")[: cfg.max_problems]
    entries = {p.task_id: p.entry_point for p in problems}  # where summarize judges main's chain form
    logged = {**cfg.model_dump(), **params.sampling.model_dump(), **params.model.model_dump()}
    with stage_run("baselines", logged, params.mlflow.experiment, params.mlflow.tracking_uri):
        t_load = time.time()
        model, tok = load_policy(params)
        made = {"methods": list(cfg.methods), "load_seconds": time.time() - t_load, "read_calls": {}}
        machine, iv = machine_info(), params.intervals  # what the seconds (and the low bits) depend on
        cache = sample_cache(params)  # discussion's drafts: concat's samples, drawn just before
        OUT.mkdir(parents=True, exist_ok=True)
        totals = {"cost/prompt_tokens": 0, "cost/completion_tokens": 0}
        with open_sandbox(params) as sb:
            for method in cfg.methods:
                t0, hits = time.time(), cache.hits
                records = run_method(
                    method,
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
                summary = summarize(
                    records, sorted({1, cfg.num_samples}), iv.confidence, iv.resamples, entries
                )
                summary["seconds"] = time.time() - t0  # this method's sampling and scoring (one shared load)
                summary["machine"] = machine
                write_jsonl(OUT / f"{method}.jsonl", records)
                write_json(OUT / f"{method}.json", summary)
                log_metrics(method_metrics("test", f"baseline_{method}", summary))
                made["read_calls"][method] = cache.hits - hits
                if cache.hits > hits:  # discussion's drafts: concat's call, decoded just before
                    log.info("%s: %d sampling call(s) read from %s", method, cache.hits - hits, cache.root)
                totals["cost/prompt_tokens"] += sum(r["prompt_tokens"] for r in records)
                totals["cost/completion_tokens"] += sum(r["completion_tokens"] for r in records)
                mlflow.log_artifact(str(OUT / f"{method}.jsonl"), "samples")
                brief = {k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()}
                print(json.dumps({"method": method, **{k: v for k, v in brief.items() if k != "machine"}}))
        log_metrics({**totals, "cost/usd": 0.0})
        write_json(MADE, {**made, "machine": machine})


if __name__ == "__main__":
    run_stage(main)
