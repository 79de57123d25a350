"""Stage `train_orchestrator`: a learned orchestrator (Puppeteer, arXiv 2505.19591) picks which agent acts next.

Reads ``params.yaml`` (sections ``train_orchestrator``, ``sampling``, ``model``, ``sandbox``, ``intervals``),
checks the backend (key, price, server) before any work, runs
:func:`orchestry.training.orchestrator.run_orchestrator` (REINFORCE on train problems, then the learned policy
against fixed pipelines on test problems) and logs per-episode and per-update metrics, the summary and the
outputs to MLflow. Outputs: ``models/orchestrator/`` (policy weights) and ``reports/orchestrator/``.

Human overrides: the orchestrator-episode lines (``oe-...``) of ``data/overrides.jsonl`` are checked first (ids,
scores in the task reward's range; a bad file is one error line, exit 2) and a training episode with an override
trains on the person's score as its task reward; ``summary.json``'s ``overrides`` counts those read, applied and
unknown (warned: no training episode of this run has the id).
"""

import json
import re
import sys
import time

import mlflow

from orchestry.analysis.metrics import flat_numbers as _flat_numbers
from orchestry.llm.backends import BackendConfigError, BackendError
from orchestry.llm.clients import open_clients
from orchestry.llm.cost import PriceError
from orchestry.overrides import OverrideError, check_for_orchestrator, read_overrides
from orchestry.problems import read_problems
from orchestry.runtime import OutputNotWritable, open_sandbox, run_stage, start_stage
from orchestry.tracking.metric_names import orchestrator_summary_name, renamed
from orchestry.tracking.runs import log_metrics, stage_run
from orchestry.training.orchestrator import run_orchestrator, task_reward_range

OUT = "reports/orchestrator"
POLICY = "models/orchestrator"
OVERRIDES = "data/overrides.jsonl"


def _log(metrics: dict, step: int | None = None) -> None:
    """``log_metrics`` with names MLflow accepts (agent and pipeline names may hold other characters)."""
    log_metrics({re.sub(r"[^A-Za-z0-9_\-./: ]", "_", k): v for k, v in metrics.items()}, step)


def main() -> None:
    t0 = time.time()
    params = start_stage("train_orchestrator")
    cfg = params.train_orchestrator
    train = read_problems("data/problems/train.jsonl")
    test = read_problems("data/problems/test.jsonl")
    try:  # the human scores, checked before the backend, the model or the sandbox
        overrides = check_for_orchestrator(read_overrides(OVERRIDES), *task_reward_range(cfg))
    except OverrideError as e:  # a malformed data/overrides.jsonl: bad input, exit code 2
        print(f"error: {OVERRIDES}: {e}", file=sys.stderr)
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
        with stage_run("train_orchestrator", logged, params.mlflow.experiment, params.mlflow.tracking_uri):
            summary = run_orchestrator(
                cfg,
                params.sampling,
                train,
                test,
                lambda: open_sandbox(params),
                OUT,
                POLICY,
                on_metrics=_log,
                clients=clients,
                confidence=params.intervals.confidence,
                n_boot=params.intervals.resamples,
                overrides=overrides,
            )
            flat = _flat_numbers({k: summary[k] for k in ("train", "eval", "learned", "cost", "cache")})
            _log(renamed(flat, orchestrator_summary_name))
            mlflow.set_tags(
                {"eval_status": summary["eval"]["status"], "budget_status": summary["cost"]["budget_status"]}
            )
            mlflow.log_artifacts(OUT, "orchestrator")
            mlflow.log_artifacts(POLICY, "policy")
    except BackendError as e:  # the MLflow run is marked FAILED on the way out
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except OutputNotWritable as e:  # found before the sandbox or any request: bad setup, exit code 2
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if summary["overrides"]["unknown"]:  # read, but no training episode of this run has their ids
        print(
            f"warning: {summary['overrides']['unknown']} orchestrator override(s) met no training episode of "
            "this run: " + ", ".join(summary["overrides"]["unknown_ids"][:10]),
            file=sys.stderr,
        )
    methods = summary["eval"]["methods"]
    brief = {
        m: {k: round(s[k]["mean"], 3) for k in ("reward", "tokens", "objective")} for m, s in methods.items()
    }
    brief["learned_agent_share"] = {k: round(v, 3) for k, v in summary["learned"]["agent_share"].items()}
    brief["learned_cycle_share"] = summary["learned"]["cycle_share"]
    brief["overrides_applied"] = summary["overrides"]["applied"]
    brief["overrides_unknown"] = summary["overrides"]["unknown"]
    brief["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(brief))


if __name__ == "__main__":
    run_stage(main)
