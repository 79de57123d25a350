"""prepare.compositional.beginner_train / beginner_test: the beginner family joins the train split (its training
templates) and its held-out templates become the transfer set ``beginner``; the generated test split is unchanged."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from orchestry.params_file import parse_params

ROOT = Path(__file__).resolve().parents[1]


def _prepare():
    spec = importlib.util.spec_from_file_location("prepare_stage", ROOT / "stages" / "prepare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_beginner_problems_join_the_train_split_and_hold_out_their_own_templates():
    from orchestry.generators.beginner import split_templates

    prepare = _prepare()
    small = {"num_train": 6, "num_val": 2, "num_test": 4}
    plain = parse_params({"prepare": {"compositional": {**small, "beginner_train": 0}}}).prepare
    mixed = parse_params(
        {"prepare": {"compositional": {**small, "beginner_train": 5, "beginner_test": 3}}}
    ).prepare
    before, _ = prepare.training_splits(plain)
    after, extra = prepare.training_splits(mixed)
    assert [p.task_id for p in after["test"]] == [p.task_id for p in before["test"]]
    assert [p.task_id for p in after["train"][:6]] == [p.task_id for p in before["train"]]
    added = after["train"][6:]
    assert len(added) == 5 and all(p.task_id.startswith("Beginner/") and not p.aux_spec for p in added)
    held = after["transfer/beginner"]
    assert len(held) == 3
    train_t, test_t = split_templates(0)
    assert {extra[p.task_id]["composition"][1] for p in added} <= set(train_t)
    assert {extra[p.task_id]["composition"][1] for p in held} <= set(test_t)
    assert not {p.task_id for p in held} & {p.task_id for p in added}
