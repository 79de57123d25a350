"""Stage `evaluate_base`: the base pair (the base model's helper and main, no adapters) on the test split, on each
transfer set and, with `evaluate.val`, on the val split: the reference `evaluate` compares the trained pair with.

A stage of its own so that DVC runs it again only when what it reads changes (the base model, the problems, the
`evaluate`, `sampling`, `model` and `sandbox` settings, the episode's workflow and turns), not when training does:
a `dvc exp run -S train_magrpo.<key>=<value>` sweep or a new training seed evaluates the trained pair alone. The
samples are the ones `evaluate` drew in the same process before this stage existed (same seeds, batches and
kernels; the adapters were off for them)."""

from pathlib import Path

from orchestry.evaluation.agents import base_pair_settings, problems_fingerprint, score_pairs
from orchestry.problems import read_problems
from orchestry.runtime import (
    inputs_key,
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

#: ``<set>.jsonl`` per evaluation set (``test``, ``transfer/<name>``, ``val``); ``reports/eval_base.json``: the settings
#: the samples were made with (:func:`orchestry.evaluation.agents.base_pair_settings`), the key of everything this
#: stage reads (:func:`orchestry.runtime.inputs_key`), each set's problems' fingerprint and seconds, the machine.
OUT = Path("reports/eval_base")
MADE = Path("reports/eval_base.json")


def main() -> None:
    params = start_stage("evaluate_base")
    cfg = params.evaluate
    logged = {**cfg.model_dump(), **params.sampling.model_dump(), **params.model.model_dump()}
    sets = {"test": read_problems("data/problems/test.jsonl")[: cfg.max_problems]}
    if params.train_magrpo.workflow != "writer_tester_fixer":  # the workflow is evaluated on the test split
        for path in sorted(Path("data/problems/transfer").glob("*.jsonl")):
            sets[f"transfer/{path.stem}"] = read_problems(path)[: cfg.max_problems_transfer]
    if cfg.val:
        sets["val"] = read_problems("data/problems/val.jsonl")
    with stage_run("evaluate_base", logged, params.mlflow.experiment, params.mlflow.tracking_uri):
        model, tok = load_policy(params)  # the bare base model: the base pair's samples need no adapters
        seconds = {}
        with open_sandbox(params) as sb:
            for name, problems in sets.items():
                ((_, records, summary),) = score_pairs(problems, model, tok, sb, params, pairs=("base",))
                write_jsonl(OUT / f"{name}.jsonl", records)
                seconds[name] = summary["seconds"]
                log_metrics(method_metrics(name, "base", summary))
                print(
                    f"{name:22s} base reward {summary.get('reward', 0):.3f}  pass@1 {summary.get('pass@1', 0):.3f}"
                )
        made = {
            "settings": base_pair_settings(params),
            "inputs": inputs_key("evaluate_base", params),
            "problems": {name: problems_fingerprint(problems) for name, problems in sets.items()},
            "seconds": seconds,
            "machine": machine_info(),
        }
        write_json(MADE, made)


if __name__ == "__main__":
    run_stage(main)
