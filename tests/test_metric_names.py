"""The MLflow metric vocabulary (docs/metrics.md): every stage's names are documented, one name per meaning, and
``orchestry compare`` reads runs logged under the old names."""

import csv
import json
import re
import time
from pathlib import Path

import mlflow
import pytest

from orchestry.analysis.metrics import flat_numbers, summarize
from orchestry.reporting.compare import DEFAULT_METRICS, executions, load_runs
from orchestry.runtime import machine_info
from orchestry.tracking.metric_names import (
    VOCABULARY_TAG,
    api_grpo_summary_name,
    legacy_name,
    magrpo_step_metrics,
    magrpo_summary_metrics,
    method_metrics,
    orchestrator_summary_name,
    prepare_metrics,
    renamed,
    scheme_metrics,
)
from orchestry.tracking.runs import log_metrics, stage_run
from orchestry.tracking.ui import execution_metrics


# ---- reading docs/metrics.md (test-only: the stages build names, this checks them against the table) ----
def vocabulary_pattern(name: str) -> re.Pattern:
    """The regular expression of a documented name: ``<key>`` = one or more segments, any other ``<...>`` one
    segment, ``{a,b}`` one of the listed words."""
    out = ""
    for part in re.split(r"(<[^>]+>|\{[^}]+\})", name):
        if part == "<key>":
            out += r"[^/]+(?:/[^/]+)*"
        elif part.startswith("<"):
            out += r"[^/]+"
        elif part.startswith("{"):
            out += "(?:" + "|".join(re.escape(w) for w in part[1:-1].split(",")) + ")"
        else:
            out += re.escape(part)
    return re.compile(out + "$")


def read_vocabulary(markdown: str) -> list[tuple[str, set[str]]]:
    """The names of the vocabulary table of ``docs/metrics.md``: the rows (first cell a code span) of its section
    ``## The names``, as ``(name, stages)`` (the stage column's stage names)."""
    names = []
    section = ""
    for line in markdown.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        if section != "The names":
            continue
        m = re.match(r"\|\s*`([^`]+)`\s*\|", line)
        if m:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            stages = {s.split(" (")[0].strip() for s in cells[3].split(",")}
            names.append((m.group(1), stages))
    return names


def documented(name: str, stage: str, vocabulary: list[tuple[str, set[str]]]) -> bool:
    """``name`` is one of ``vocabulary``'s (:func:`read_vocabulary`) documented for ``stage`` (``baselines@<m>``, a
    stage of runs before the baselines became one stage, counts as ``baselines``; ``every stage`` matches all)."""
    stage = stage.split("@")[0]
    return any(
        (stage in stages or "every stage" in stages) and vocabulary_pattern(v).match(name)
        for v, stages in vocabulary
    )


# ---------------------------------------------------------------------------------------------- legacy names

#: Prefixes of the current vocabulary: a name without one is an old name (:func:`legacy_name`).


ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
VOCAB = read_vocabulary((ROOT / "docs/metrics.md").read_text())


def _records() -> list[dict]:
    """Three evaluated samples of two problems, as evaluate/baselines write them."""
    base = {"structure": 1.0, "syntax": 0.5, "cooperation": 0.0, "prompt_tokens": 10, "completion_tokens": 5,
            "helper": "def aux(x):\n    return x\n", "main": "def f(x):\n    r = aux(x)\n    return r\n"}  # fmt: skip
    return [
        {**base, "task_id": "t/0", "sample": 0, "total": 2.5, "tests": 1.0, "passed": 2, "total_asserts": 2},
        {**base, "task_id": "t/0", "sample": 1, "total": 1.5, "tests": 0.0, "passed": 0, "total_asserts": 2},
        {
            **base,
            "task_id": "t/1",
            "sample": 0,
            "total": 3.0,
            "tests": 1.0,
            "passed": 1,
            "total_asserts": 1,
            "cooperation": 0.5,
            "aux_called": True,
        },
    ]


def _step_record() -> dict:
    """A MAGRPO step record with every column of the committed steps CSV and the options' columns."""
    with open(REPORTS / "train/magrpo_steps.csv") as f:
        row = next(csv.DictReader(f))
    rec = {k: float(v) for k, v in row.items() if v not in ("", None)}
    rec.update(
        {
            "reward/turn_1": 1.0,
            "reward/turn_2": 1.5,
            "turns_run": 2,
            "reward/helper": 1.0,
            "credit/main": 0.2,
            "credit/main/turn_2": 0.1,
            "coach/score/helper": 6.0,
            "coach/calls": 4,
            "advantage_abs/helper": 0.3,
            "loss/main": 0.01,
            "rows_updated/main": 8,
            "tester_pass_rate": 0.5,
            "remax/greedy_reward": 1.0,  # advantage remax
            "remax/greedy_reward/turn_2": 1.2,
            "remax/greedy_pass_rate": 0.5,
            "remax/greedy_turns": 2,
            "tokens/prompt/greedy": 100,
            "tokens/completion/greedy": 50,
            "seconds/greedy": 1.0,
            "critic/value_loss": 0.5,  # advantage critic
            "critic/value_loss_after": 0.4,
            "critic/value_mean": 1.0,
            "chain_form_rate": 0.5,  # not CSV columns: logged to MLflow only
            "distinct_solutions": 0.5,
            "problems": ["t/0"],
        }
    )
    return rec


def _logged_by_stage() -> dict[str, dict[str, float]]:
    """What each stage logs, built by the stages' own mapping functions from real records and the committed
    reports (the JSON files the stages wrote), keeping what ``log_metrics`` keeps: numbers (a report's text,
    such as its ``machine`` record, is never logged as a metric)."""
    s = summarize(_records(), [1, 2], 0.95, 50)
    s["seconds"] = 3.0
    metrics = json.loads((REPORTS / "metrics.json").read_text())
    api = json.loads((REPORTS / "api_grpo/summary.json").read_text())
    orch = json.loads((REPORTS / "orchestrator/summary.json").read_text())
    orch_flat = flat_numbers({k: orch[k] for k in ("train", "eval", "learned", "cost", "cache")})
    schemes = json.loads((REPORTS / "schemes.json").read_text())["distribution"]
    prepare = json.loads((REPORTS / "prepare.json").read_text())
    train = json.loads((REPORTS / "train/magrpo.json").read_text())
    evaluate = method_metrics("test", "magrpo", s) | method_metrics(
        "test", "base", metrics["methods"]["base"]
    )
    evaluate |= method_metrics("transfer/humaneval", "magrpo", s) | method_metrics("val", "base", s)
    base_sets = ("test", "transfer/humaneval", "val")  # evaluate_base: the base pair on each evaluation set
    evaluate_base = {k: v for name in base_sets for k, v in method_metrics(name, "base", s).items()}
    logged = {
        "train_magrpo": magrpo_step_metrics(_step_record())
        | magrpo_summary_metrics(
            {
                **train,
                "coach_usd": 0.1,
                "coach_calls": 3,
                "warm_start_loss_helper_last": 1,
                "greedy_prompt_tokens": 10,
                "greedy_completion_tokens": 5,
            }
        )
        | {"cost/prompt_tokens": 1},
        "baselines": method_metrics("test", "baseline_single", s)
        | method_metrics("test", "baseline_discussion", s)
        | {"cost/prompt_tokens": 1, "cost/completion_tokens": 1, "cost/usd": 0.0},
        "evaluate": evaluate,
        "evaluate_base": evaluate_base,
        "train_api_grpo": renamed(flat_numbers(api), api_grpo_summary_name)
        | {
            "train/part/correct": 1.0,
            "train/selected_reward": 1.0,
            "train/usd": 0.1,
            "train/episode_usd": 0.1,
            "train/cache_hit_rate": 0.5,
            "train/judge/kappa": 0.3,
        },
        "train_orchestrator": renamed(orch_flat, orchestrator_summary_name)
        | {
            "train/update/mean_reward": 1.0,
            "train/update/agent_share/main": 0.5,
            "train/objective": 1.0,
            "train/agent_count/main": 1,
        },
        "detect_schemes": {k: v for m, d in schemes.items() for k, v in scheme_metrics(m, d).items()},
        "prepare": prepare_metrics(prepare),
    }
    return {stage: {k: v for k, v in d.items() if _is_number(v)} for stage, d in logged.items()}


def _is_number(v: object) -> bool:
    """What :func:`orchestry.tracking.runs.log_metrics` logs (it skips the rest; non-finite numbers count here)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def test_the_table_is_readable_and_every_stage_is_in_it():
    assert len(VOCAB) > 50
    stages = set().union(*(s for _, s in VOCAB))
    assert {"train_magrpo", "train_api_grpo", "train_orchestrator", "evaluate", "baselines"} <= stages
    assert {"detect_schemes", "prepare", "every stage", "plot"} <= stages
    # the patterns: a placeholder is one segment, <key> one or more, {a,b} one of the words
    assert vocabulary_pattern("test/<method>/pass_at_<k>").match("test/baseline_single/pass_at_1")
    assert not vocabulary_pattern("test/<method>/pass_at_<k>").match("test/a/b/pass_at_1")
    assert vocabulary_pattern("train/{usd,tokens}").match("train/usd")
    assert not vocabulary_pattern("train/{usd,tokens}").match("train/calls")
    assert vocabulary_pattern("cost/<key>").match("cost/cache/hit_rate")


@pytest.mark.parametrize("stage", list(_logged_by_stage()))
def test_every_name_a_stage_logs_is_documented_for_that_stage(stage):
    names = _logged_by_stage()[stage]
    assert names
    undocumented = sorted(n for n in names if not documented(n.replace("@", "_at_"), stage, VOCAB))
    assert not undocumented, f"{stage} logs names docs/metrics.md does not list: {undocumented}"


def test_no_bare_names_and_the_issue_examples_are_gone():
    logged = _logged_by_stage()
    prefixes = ("train/", "test/", "transfer/", "val/", "cost/", "schemes/", "prepare/")
    for stage, names in logged.items():
        assert all(n.startswith(prefixes) for n in names), stage
    magrpo = logged["train_magrpo"]
    # training curves are train/...; the tokens of a step and of the run have distinct names
    assert {"train/reward", "train/tests", "train/prompt_tokens", "cost/prompt_tokens"} <= set(magrpo)
    assert {"train/chain_form_rate", "train/distinct_solutions"} <= set(magrpo)  # the collapse figures
    assert {"test/magrpo/chain_form_rate", "test/magrpo/distinct_solutions"} <= set(logged["evaluate"])
    assert not any(n.startswith(("summary/", "tokens/", "scheme/")) for n in magrpo)
    # the baselines' reward is the test-set mean under the method's name, never the bare `reward`
    assert {"test/baseline_single/reward", "test/baseline_discussion/reward"} <= set(logged["baselines"])
    assert "cost/baseline_single/seconds" in logged["baselines"]  # each method's own seconds
    orch = logged["train_orchestrator"]
    assert "test/orchestrator/learned-all_in_order/objective_ci_high" in orch
    assert max(len(n) for n in orch) < 60 and not any(n.endswith("/n") for n in orch)
    # the stage runs' test names are the parent run's (plot: tracking.execution_metrics)
    parent = execution_metrics(REPORTS)
    evaluate = logged["evaluate"]
    assert parent["test/base/reward"] == pytest.approx(evaluate["test/base/reward"])
    assert parent["cost/base/seconds"] == pytest.approx(evaluate["cost/base/seconds"])
    api = logged["train_api_grpo"]
    assert parent["test/api_grpo/with_behaviors/reward"] == pytest.approx(
        api["test/api_grpo/with_behaviors/reward"]
    )


def test_a_stage_run_logs_documented_names_and_is_tagged(tmp_path, monkeypatch):
    """A real stage run in a temporary sqlite store: the names MLflow stores are the documented ones."""
    monkeypatch.chdir(tmp_path)
    for var in ("DVC_ROOT", "DVC_EXP_NAME"):
        monkeypatch.delenv(var, raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logged = _logged_by_stage()
    try:
        for stage in ("train_magrpo", "baselines", "evaluate"):
            with stage_run(stage, {}, "orchestry", uri=uri) as run:
                rec = _step_record()
                for step in range(2):
                    log_metrics(magrpo_step_metrics(rec) if stage == "train_magrpo" else {}, step=step)
                log_metrics(logged[stage])
            stored = mlflow.MlflowClient(uri).get_run(run.info.run_id)
            assert stored.data.tags[VOCABULARY_TAG] == "2"
            machine = machine_info()  # what the run's numbers and seconds depend on, as tags
            for key in ("cpu", "cpu_flags", "threads", "kernels", "numerics"):
                assert stored.data.tags[f"machine.{key}"] == str(machine[key]), key
            names = set(stored.data.metrics) - {"cost/wall_seconds"}
            names = {n for n in names if not n.startswith("system/")}
            assert len(names) >= 10
            assert all(documented(n, stage, VOCAB) for n in names), sorted(
                n for n in names if not documented(n, stage, VOCAB)
            )
    finally:
        mlflow.set_tracking_uri(None)


def test_legacy_names_map_to_the_new_ones():
    assert legacy_name("evaluate", "magrpo/reward") == "test/magrpo/reward"
    assert legacy_name("evaluate", "base/seconds") == "cost/base/seconds"
    assert legacy_name("evaluate", "transfer/he/base/pass_at_1") == "transfer/he/base/pass_at_1"
    assert legacy_name("baselines@single", "reward") == "test/baseline_single/reward"
    assert legacy_name("train_magrpo", "reward") == "train/reward"
    assert legacy_name("train_magrpo", "tokens/prompt") == "train/prompt_tokens"
    assert legacy_name("train_magrpo", "summary/prompt_tokens") == "cost/prompt_tokens"
    assert legacy_name("train_magrpo", "summary/difference") == "train/summary/difference"
    assert legacy_name("train_api_grpo", "cost/usd") == "train/usd"  # the per-episode curve
    assert legacy_name("train_api_grpo", "summary/cost/usd") == "cost/usd"  # the run's total
    assert legacy_name("train_orchestrator", "update/loss") == "train/update/loss"
    assert legacy_name("detect_schemes", "magrpo/decorator") == "schemes/magrpo/decorator"
    assert legacy_name("prepare", "transfer/humaneval") == "prepare/transfer/humaneval"
    assert legacy_name("evaluate", "cost/wall_seconds") == "cost/wall_seconds"


def test_compare_reads_old_and_new_runs_under_the_new_names(tmp_path, monkeypatch):
    """An execution logged with the old names (no vocabulary tag) and one with the new: the default columns
    read both; an old name given as stage:name reads the new one; API-GRPO's old per-episode cost/usd does not
    pass for the run's total."""
    monkeypatch.chdir(tmp_path)
    for var in ("DVC_ROOT", "DVC_EXP_NAME"):
        monkeypatch.delenv(var, raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("orchestry")
    try:
        old = {
            "train_magrpo": {"reward": 1.0, "summary/last_quarter_reward": 1.3, "summary/difference": 0.5},
            "evaluate": {
                "magrpo/reward": 1.1,
                "base/reward": 0.6,
                "magrpo/pass@1": 0.25,
                "magrpo/cooperation_rate": 0.4,
            },
            "train_api_grpo": {"cost/usd": 0.7, "summary/cost/usd": 0.9},
        }
        for stage, m in old.items():
            with mlflow.start_run(run_name=stage, tags={"stage": stage, "git_revision": "old111"}):
                log_metrics(m)
            time.sleep(0.01)
        monkeypatch.setenv("DVC_EXP_NAME", "new")
        with stage_run("evaluate", {}, "orchestry", uri=uri):
            log_metrics({"test/magrpo/reward": 2.0, "test/base/reward": 1.0})
        with stage_run("train_api_grpo", {}, "orchestry", uri=uri):
            log_metrics({"cost/usd": 0.3})
        runs = load_runs("orchestry", uri)
    finally:
        mlflow.set_tracking_uri(None)
    table = executions(
        runs,
        [*DEFAULT_METRICS, "evaluate:magrpo/reward", "train_api_grpo:cost/usd", "train_api_grpo:train/usd"],
    ).set_index("execution")
    ws, new = table.loc["workspace"], table.loc["new"]
    assert ws["evaluate:test/magrpo/reward"] == 1.1 and ws["evaluate:test/base/reward"] == 0.6
    assert ws["evaluate:test/magrpo/pass_at_1"] == 0.25 and ws["evaluate:test/magrpo/cooperation_rate"] == 0.4
    assert ws["train_magrpo:train/summary/last_quarter_reward"] == 1.3
    assert ws["train_magrpo:train/summary/difference"] == 0.5
    assert ws["evaluate:magrpo/reward"] == 1.1  # an old name reads the same column
    assert ws["train_api_grpo:cost/usd"] == 0.9 and ws["train_api_grpo:train/usd"] == 0.7
    assert new["evaluate:test/magrpo/reward"] == 2.0 and new["evaluate:magrpo/reward"] == 2.0
    assert new["train_api_grpo:cost/usd"] == 0.3
    assert new["train_magrpo:train/summary/difference"] != new["train_magrpo:train/summary/difference"]  # NaN
