"""Stage `prepare`: problem records + splits, canonical solutions checked in the sandbox, model conversion."""

import sys
import time
from pathlib import Path

from orchestry.generators.compositional import GeneratorError, generate_splits
from orchestry.problems import (
    Problem,
    ProblemFormatError,
    check_canonical_solutions,
    load_problems,
    make_problem,
    split_problems,
)
from orchestry.runtime import open_sandbox, run_stage, start_stage, write_json, write_jsonl
from orchestry.tracking.metric_names import prepare_metrics
from orchestry.tracking.runs import log_metrics, stage_run


def _fail(key: str, error: Exception) -> None:
    print(f"error: prepare.{key}: {error}", file=sys.stderr)
    raise SystemExit(2)


def training_splits(cfg) -> tuple[dict[str, list[Problem]], dict[str, dict]]:
    """The val/train/test problems of ``prepare.source`` and, for generated problems, their records
    (``composition``, ``difficulty``, ``aux_spec`` kept in the JSONL beside the Problem fields)."""
    if cfg.source == "compositional":
        c = cfg.compositional
        sizes = {"test": c.num_test, "val": c.num_val, "train": c.num_train}
        try:
            recs = generate_splits(sizes, c.difficulty, c.seed, c.types, c.num_tests)
        except GeneratorError as e:
            _fail("compositional", e)
        if (
            c.beginner_train or c.beginner_test
        ):  # the beginner family: plain prompts, train/held-out templates
            from orchestry.generators.beginner import beginner_problems, split_templates

            train_t, test_t = split_templates(c.seed)
            try:
                recs["train"] = recs["train"] + beginner_problems(c.beginner_train, c.seed, train_t)
                held = beginner_problems(c.beginner_test, c.seed + 1, test_t) if c.beginner_test else []
            except ValueError as e:
                _fail("compositional", e)
            # held-out templates' problems: their own ids (the transfer set never shares one with the train split)
            recs["beginner"] = [
                {**r, "task_id": r["task_id"].replace("Beginner/", "BeginnerHeldOut/")} for r in held
            ]
        splits = {k: [make_problem(r, r["task_id"]) for r in recs[k]] for k in ("val", "train", "test")}
        if recs.get("beginner"):
            splits["transfer/beginner"] = [make_problem(r, r["task_id"]) for r in recs["beginner"]]
        extra = {r["task_id"]: {"composition": r["composition"], "difficulty": r["difficulty"]}
                 for rs in recs.values() for r in rs}  # fmt: skip
        return splits, extra
    try:
        problems = load_problems(cfg.source)
    except ProblemFormatError as e:
        _fail("source", e)
    return split_problems(problems, cfg.split, cfg.seed, cfg.fractions), {}


def transfer_sets(cfg) -> dict[str, list[Problem]]:
    """``prepare.transfer``: 'humaneval' is HumanEval's test split (the MAGRPO authors' 133-163); a file is
    named by its stem."""
    out: dict[str, list[Problem]] = {}
    for source in cfg.transfer:
        try:
            if source == "humaneval":
                out["humaneval"] = split_problems(load_problems("humaneval"), "magrpo")["test"]
            else:
                out[Path(source).name.split(".")[0]] = load_problems(source)
        except ProblemFormatError as e:
            _fail("transfer", e)
    return out


def main() -> None:
    params = start_stage("prepare")
    cfg = params.prepare
    splits, extra = training_splits(cfg)
    transfer = transfer_sets(cfg)
    if "transfer/beginner" in splits:  # the beginner family's held-out templates: one more transfer set
        transfer["beginner"] = splits.pop("transfer/beginner")
    problems = [p for name in ("val", "train", "test") for p in splits[name]]
    ids = {p.task_id for p in problems}
    for items in transfer.values():
        problems += [p for p in items if p.task_id not in ids]
        ids |= {p.task_id for p in items}

    def rows(items):
        return ({**p.to_dict(), **extra.get(p.task_id, {})} for p in items)

    with stage_run("prepare", cfg.model_dump(), params.mlflow.experiment, params.mlflow.tracking_uri):
        for name, items in splits.items():
            write_jsonl(f"data/problems/{name}.jsonl", rows(items))
        for name, items in transfer.items():
            write_jsonl(f"data/problems/transfer/{name}.jsonl", rows(items))
        write_jsonl("data/problems/all.jsonl", rows(problems))
        t0 = time.time()
        with open_sandbox(params) as sb:
            checked, failed = check_canonical_solutions(problems, sb)
            layer = sb.isolation_layer
        sandbox_s = time.time() - t0
        report = {
            "problems": len(problems),
            "asserts": sum(len(p.asserts) for p in problems),
            "split_sizes": {k: len(v) for k, v in splits.items()},
            "transfer_sizes": {k: len(v) for k, v in transfer.items()},
            "canonical_checked": checked,
            "canonical_passed": checked - len(failed),
            "canonical_failed": failed,
            "canonical_seconds": round(sandbox_s, 2),
            "sandbox_isolation": layer,
        }
        print(f"canonical solutions: {report['canonical_passed']}/{checked} pass ({layer}, {sandbox_s:.1f}s)")
        if failed:
            print(f"  failing: {failed[:10]}")
        from orchestry.llm.loading import convert_embedded_model

        info = convert_embedded_model(Path("models/base"))
        report["model"] = info
        print(f"embedded model converted to models/base in {info['seconds']}s")
        write_json("reports/prepare.json", report)
        log_metrics(prepare_metrics(report))


if __name__ == "__main__":
    run_stage(main)
