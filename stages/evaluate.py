"""Stage `evaluate`: base agents vs MAGRPO-trained adapters on the test split, each transfer set (and the val split
with `evaluate.val`); gathers every method's metrics. The trained pair is sampled here; the base pair's samples are
`evaluate_base`'s (reports/eval_base), so a change to training alone does not sample the base pair again."""

import json
import logging
from pathlib import Path

import mlflow

from orchestry.analysis.metrics import key_metrics, summarize
from orchestry.evaluation.agents import (
    base_pair_settings,
    entry_points,
    evaluated_turns,
    problems_fingerprint,
    score_pairs,
    trained_minus_base,
)
from orchestry.problems import read_problems
from orchestry.runtime import (
    inputs_key,
    load_policy,
    machine_info,
    open_sandbox,
    read_jsonl,
    run_stage,
    start_stage,
    write_json,
    write_jsonl,
)
from orchestry.tracking.metric_names import method_metrics
from orchestry.tracking.models import log_samples_table
from orchestry.tracking.runs import log_metrics, stage_run
from orchestry.training.magrpo import WORKFLOW_AGENTS

ADAPTERS = Path("models/adapters/magrpo")
#: pass@1, base@1 (the base pair's), reward, coop, <set>@1 per transfer set: the only DVC metrics file.
KEY_METRICS = Path("reports/key_metrics.json")
log = logging.getLogger("evaluate")


#: The base pair's samples per evaluation set (``test``, ``transfer/<name>``, ``val``), made by ``evaluate_base``.
BASE = Path("reports/eval_base")
BASE_MADE = Path("reports/eval_base.json")  # what they were made with and from, each set's seconds
AGAIN = "`dvc repro evaluate_base` samples the base pair again"


def base_pair_record(params) -> dict:
    """``evaluate_base``'s ``reports/eval_base.json`` (what its samples were made with and from, each set's seconds), checked
    before any model is loaded: the settings (:func:`orchestry.evaluation.agents.base_pair_settings`) and, where
    ``dvc.yaml`` declares the stage, the key of everything it reads (:func:`orchestry.runtime.inputs_key`: its
    code, data, the base model, its params). A different machine (CPU flags, threads, kernels, torch, numerics)
    is logged as a warning: sampled tokens can differ across machines, so the two pairs' samples then come
    from two machines (``metrics.json`` records both).

    Raises:
        SystemExit: the base pair's samples are missing or were made with other settings or inputs; the message
            names what differs.
    """
    if not BASE_MADE.is_file():
        raise SystemExit(f"error: {BASE_MADE} is missing: {AGAIN}")
    recorded = json.loads(BASE_MADE.read_text())
    now = base_pair_settings(params)
    changed = sorted(k for k in now if recorded["settings"].get(k) != now[k])
    if changed:
        raise SystemExit(
            f"error: {BASE} holds samples made with other {', '.join(changed)} settings: {AGAIN}"
        )
    key = inputs_key("evaluate_base", params)
    if key is not None and recorded.get("inputs") != key:
        raise SystemExit(f"error: {BASE} holds samples made from other code, data or base model: {AGAIN}")
    machine = machine_info()
    keys = ("cpu_flags", "threads", "kernels", "torch", "numerics", "mkl_cbwr")
    if {k: recorded["machine"].get(k) for k in keys} != {k: machine[k] for k in keys}:
        log.warning("the base pair's samples were made on another machine: %s", recorded["machine"])
    return recorded


def both_pairs(
    set_name: str, problems, model, tok, sb, params, recorded: dict
) -> list[tuple[str, list[dict], dict]]:
    """``[("base", records, summary), ("magrpo", records, summary)]`` on one evaluation set: the base pair's records
    read from ``evaluate_base``'s ``reports/eval_base/<set_name>.jsonl`` (summarised here, its seconds from
    ``recorded``, :func:`base_pair_record`), the trained pair sampled and scored now.

    Raises:
        SystemExit: the set's base samples are missing or of other problems (the message says so).
    """
    path = BASE / f"{set_name}.jsonl"
    if not path.is_file() or set_name not in recorded["seconds"]:
        raise SystemExit(f"error: {path} is missing: {AGAIN}")
    if recorded["problems"].get(set_name) != problems_fingerprint(problems):
        raise SystemExit(f"error: {path} holds samples of other problems than the {set_name} set's: {AGAIN}")
    records = read_jsonl(path)
    cfg, iv = params.evaluate, params.intervals
    summary = summarize(
        records, sorted({1, cfg.num_samples}), iv.confidence, iv.resamples, entry_points(problems)
    )
    summary["seconds"] = recorded["seconds"][set_name]
    return [
        ("base", records, summary),
        *score_pairs(problems, model, tok, sb, params, pairs=("magrpo",)),
    ]


def extra_set(pairs, samples: str, prefix: str, n_problems: int, iv) -> dict:
    """One extra evaluation set (a transfer set, the val split): each pair's samples written to ``samples``
    (``{name}`` filled in), its metrics logged under ``<prefix>/<name>/`` (costs under ``cost/<prefix>/<name>/``), and trained - base paired."""
    methods: dict[str, dict] = {}
    records: dict[str, list[dict]] = {}
    for name, recs, summary in pairs:
        methods[name], records[name] = summary, recs
        write_jsonl(samples.format(name=name), recs)
        log_metrics(method_metrics(prefix, name, summary))
    return {
        "problems": n_problems,
        "methods": methods,
        "trained_minus_base": trained_minus_base(records["base"], records["magrpo"], iv),
    }


def main() -> None:
    params = start_stage("evaluate")
    cfg = params.evaluate
    problems = read_problems("data/problems/test.jsonl")[: cfg.max_problems]
    iv = params.intervals
    logged = {**cfg.model_dump(), **params.sampling.model_dump(), **params.model.model_dump()}
    methods: dict[str, dict] = {}
    turns = evaluated_turns(params)  # the episode the policy was trained in
    recorded = base_pair_record(params)  # evaluate_base's samples fit these settings (else exit 1)
    with stage_run("evaluate", logged, params.mlflow.experiment, params.mlflow.tracking_uri):
        workflow = params.train_magrpo.workflow == "writer_tester_fixer"
        agents = WORKFLOW_AGENTS[params.train_magrpo.workflow]
        model, tok = load_policy(params, with_adapters=str(ADAPTERS), agents=agents)
        with open_sandbox(params) as sb:
            records: dict[str, list[dict]] = {}
            for name, recs, summary in both_pairs("test", problems, model, tok, sb, params, recorded):
                methods[name] = summary
                records[name] = recs
                write_jsonl(f"reports/eval/{name}.jsonl", recs)
                mlflow.log_artifact(f"reports/eval/{name}.jsonl", "samples")
                log_samples_table(recs, f"samples/eval_{name}.json")  # per-sample table (mlflow.load_table)
                log_metrics(method_metrics("test", name, summary))
            test_entries = entry_points(read_problems("data/problems/test.jsonl"))  # the baselines' problems
            for path in sorted(Path("reports/baselines").glob("*.jsonl")):
                recs = read_jsonl(path)
                ks_b = sorted({1, params.baselines.num_samples})
                methods[f"baseline_{path.stem}"] = summarize(
                    recs, ks_b, iv.confidence, iv.resamples, test_entries
                )
                log_samples_table(recs, f"samples/eval_baseline_{path.stem}.json")
            report = {
                "test_problems": len(problems),
                "turns": turns,
                # trained - base on the same problems, paired, bootstrap over problems (the learning claim)
                "trained_minus_base": trained_minus_base(records["base"], records["magrpo"], iv),
                "samples_per_problem": cfg.num_samples,
                "intervals": iv.model_dump(),  # the level the figures state is read from here
                "methods": methods,
            }
            # transfer: the same base and trained pairs on each extra evaluation set (prepare.transfer)
            report["transfer"] = {}
            for path in [] if workflow else sorted(Path("data/problems/transfer").glob("*.jsonl")):
                extra = read_problems(path)[: cfg.max_problems_transfer]
                pairs = both_pairs(f"transfer/{path.stem}", extra, model, tok, sb, params, recorded)
                report["transfer"][path.stem] = extra_set(
                    pairs,
                    f"reports/eval/transfer/{path.stem}_{{name}}.jsonl",
                    f"transfer/{path.stem}",
                    len(extra),
                    iv,
                )
            # the validation split (evaluate.val): the split `orchestry tune` optimises, never the test split
            if cfg.val:
                val = read_problems("data/problems/val.jsonl")
                pairs = both_pairs("val", val, model, tok, sb, params, recorded)
                report["val"] = extra_set(pairs, "reports/eval/val/{name}.jsonl", "val", len(val), iv)
        api = Path("reports/api_grpo/summary.json")
        if api.exists():
            report["api_grpo"] = json.loads(api.read_text())
        report["machine"] = machine_info()
        # evaluate_base's: where the base pair's samples were made
        report["base_machine"] = recorded["machine"]
        write_json("reports/metrics.json", report)
        mlflow.log_artifact("reports/metrics.json")
        # in key order, not sorted: DVC shows a metrics file's keys in file order
        KEY_METRICS.write_text(json.dumps(key_metrics(report), indent=2) + "\n")
        for name, m in methods.items():
            print(f"{name:22s} reward {m.get('reward', 0):.3f}  pass@1 {m.get('pass@1', 0):.3f}  "
                  f"coop {m.get('cooperation_rate', 0):.3f}")  # fmt: skip
        for set_name, t in report["transfer"].items():
            for name, m in t["methods"].items():
                print(f"transfer {set_name}/{name:12s} reward {m.get('reward', 0):.3f}  "
                      f"pass@1 {m.get('pass@1', 0):.3f}")  # fmt: skip


if __name__ == "__main__":
    run_stage(main)
