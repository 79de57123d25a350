"""Stage `train_api_grpo`: beam search + behaviour library for API-only models (offline by default).

Reads ``params.yaml`` (sections ``api_grpo``, ``sampling``, ``model``, ``sandbox``, ``intervals``), the human
scores of ``data/overrides.jsonl`` (:mod:`orchestry.overrides`) and, with ``api_grpo.init_behaviors``, the library
to start from, which must be a copy under ``data/behaviors/`` (a dependency of the stage in ``dvc.yaml``, so a
changed library re-runs it; a missing, misplaced or malformed one is one line and exit 2). It checks the backend
(key, price, server) before any work, runs :func:`orchestry.training.api_grpo.run_api_grpo` and logs the
per-episode and total metrics, cost and the outputs under ``reports/api_grpo/`` to MLflow.
"""

import json
import sys
from pathlib import PurePosixPath

import mlflow

from orchestry.algorithms.behaviors import LibraryError
from orchestry.analysis.metrics import flat_numbers as _flat_numbers
from orchestry.llm.backends import BackendConfigError, BackendError
from orchestry.llm.clients import open_clients
from orchestry.llm.cost import PriceError
from orchestry.overrides import OverrideError, check_for_stage, read_overrides
from orchestry.problems import read_problems
from orchestry.runtime import OutputNotWritable, open_sandbox, run_stage, start_stage
from orchestry.tracking.metric_names import api_grpo_summary_name, renamed
from orchestry.tracking.runs import log_metrics, stage_run
from orchestry.training.api_grpo import run_api_grpo
from orchestry.training.api_grpo.setup import make_task, read_transfer

OUT = "reports/api_grpo"
TRANSFER_DIR = "data/behaviors"  # libraries for api_grpo.init_behaviors; a dep of the stage (dvc.yaml)


def check_transfer(path: str | None) -> None:
    """Raises LibraryError unless ``path`` is null or a repo-relative file under ``data/behaviors/``."""
    if path is None:
        return
    p = PurePosixPath(path.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or p.parts[:2] != tuple(PurePosixPath(TRANSFER_DIR).parts):
        raise LibraryError(
            f"api_grpo.init_behaviors: {path}: a library to transfer must be a copy under {TRANSFER_DIR}/ "
            f"(a dependency of this stage), e.g. cp reports/api_grpo/learned_behaviors.json "
            f"{TRANSFER_DIR}/code_collaboration.json"
        )


def main() -> None:
    params = start_stage("train_api_grpo")
    cfg = params.api_grpo
    train = read_problems("data/problems/train.jsonl")
    test = read_problems("data/problems/test.jsonl")
    try:  # human scores (orchestry override / orchestry review); a missing file is none. Checked for this
        # task (ids, ranges) before any work; the check_overrides stage ran the same check before DVC removed
        # this stage's outputs
        overrides = check_for_stage(
            read_overrides("data/overrides.jsonl"), cfg.task, make_task(cfg).max_reward
        )
    except OverrideError as e:  # a malformed data/overrides.jsonl: bad input, exit code 2
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    try:  # the library to start from (api_grpo.init_behaviors), before anything is opened
        check_transfer(cfg.init_behaviors)
        read_transfer(cfg)
    except LibraryError as e:  # exit code 2 (bad input), like a bad params.yaml
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    try:  # key, price and server are checked here, before the MLflow run, the model or the sandbox
        clients = open_clients(cfg, params.sampling, params.model.path, params.model.dtype)
    except (
        BackendConfigError,
        PriceError,
    ) as e:  # a setting to fix (key, base_url, price, cache): exit code 2
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    logged = {**cfg.model_dump(), "sampling": params.sampling.model_dump()}
    try:  # a request that failed for good (HTTP error, unreachable server, unusable answers): one line
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
            log_metrics(renamed(_flat_numbers(summary), api_grpo_summary_name))
            mlflow.set_tags(
                {
                    "budget_status": summary["budget"]["status"],
                    "eval_status": summary["eval"].get("status", ""),
                }
            )
            mlflow.log_artifacts(OUT, "api_grpo")
    except BackendError as e:  # the MLflow run is marked FAILED on the way out
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except OutputNotWritable as e:  # found before the sandbox or any request: bad setup, exit code 2
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if summary["overrides"]["unknown"]:  # read, but no trajectory of this run has their ids
        print(
            f"warning: {summary['overrides']['unknown']} override(s) met no trajectory of this run: "
            + ", ".join(summary["overrides"]["unknown_ids"][:10]),
            file=sys.stderr,
        )
    ev = summary["eval"]
    brief = {
        "episodes": summary["episodes_completed"],
        "with": ev.get("with", {}).get("mean"),
        "without": ev.get("without", {}).get("mean"),
        "difference": ev.get("difference"),
        **({"transferred": ev["transfer"]["arms"]["transferred"]["mean"]} if "transfer" in ev else {}),
        "cache_hit_rate": summary["cache"]["hit_rate"],
        "usd": summary["cost"]["usd_total"],
        "tokens": summary["cost"]["tokens_total"],
        "budget": summary["budget"]["status"],
        "overrides_applied": summary["overrides"]["applied"],
        "overrides_unknown": summary["overrides"]["unknown"],
    }
    print(json.dumps(brief, default=str))


if __name__ == "__main__":
    run_stage(main)
