"""Behaviour transfer (``api_grpo.init_behaviors``): reading a library, placing its roles, a whole run that starts
from it and evaluates none vs transferred vs learned here, and the stage's exit 2 on a bad library.

Whole runs are those of tests/test_api_grpo.py: the real anthropic SDK against the local fake server of
tests/fake_llm_servers.py, the real sandbox and the real level reward on two tiny crafted problems.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fake_llm_servers import FakeAnthropic
from test_api_grpo import DOUBLE, INC, _cfg, _collab_reply

from orchestry.algorithms.behaviors import LibraryError, read_library
from orchestry.config import SamplingParams
from orchestry.problems import make_problem
from orchestry.reporting.report import _api_grpo_section
from orchestry.runtime import write_jsonl
from orchestry.sandbox import Sandbox
from orchestry.training.api_grpo import run_api_grpo
from orchestry.training.api_grpo.setup import TASK_ROLES

REPO = Path(__file__).resolve().parents[1]
# a story run's library: writer -> editor; code_collaboration has helper -> main
STORY_LIBRARY = {
    "task": "story",
    "version": 3,
    "behaviors": {
        "writer": "- Transferred: state the plan first.",
        "editor": "- Transferred: keep it short.",
    },
    "updates": [],
}


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")


def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def _run(cfg, out: Path) -> dict:
    return run_api_grpo(cfg, SamplingParams(), [INC, DOUBLE], [INC, DOUBLE],
                        lambda: Sandbox(timeout_s=3.0, max_workers=1), out, progress=False)  # fmt: skip


def _episodes(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]


# ---- reading and placing a library ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ("[1, 2]", "got list"),
        ({"task": "story"}, "'behaviors' must map"),
        ({"behaviors": {"writer": ["a list"]}}, "'behaviors' must map"),
        ({"behaviors": {}, "task": 3}, "'task' must be a task name"),
        ({"behaviors": {}, "version": "2"}, "'version' must be an integer"),
    ],
)
def test_a_missing_or_malformed_library_is_one_error_naming_key_and_path(tmp_path, content, needle) -> None:
    path = tmp_path / "lib.json"
    if content is not None:
        _write(path, content)
    with pytest.raises(LibraryError) as err:
        read_library(path, "data/behaviors/lib.json")
    msg = str(err.value)
    assert msg.startswith("api_grpo.init_behaviors: data/behaviors/lib.json: ") and needle in msg
    assert "\n" not in msg


def test_roles_are_kept_by_name_else_placed_by_turn_position(tmp_path) -> None:
    lib = read_library(_write(tmp_path / "s.json", STORY_LIBRARY))
    assert (lib.task, lib.version) == ("story", 3)
    collab = TASK_ROLES["code_collaboration"]
    placed, how = lib.mapped(collab, TASK_ROLES["story"])  # first to first, last to last
    assert placed == {
        "helper": "- Transferred: state the plan first.",
        "main": "- Transferred: keep it short.",
    }
    assert how == {"roles": {"writer": "helper", "editor": "main"}, "unused_roles": []}
    # the same names (story -> documentation: writer, editor) stay with their role
    placed, how = lib.mapped(TASK_ROLES["documentation"], TASK_ROLES["story"])
    assert how["roles"] == {"writer": "writer", "editor": "editor"} and "reviewer" not in placed
    # three roles onto two: the middle one goes to round(1 * 1 / 2) = 0, joined after the first's lines
    doc = read_library(_write(tmp_path / "d.json", {"task": "documentation", "behaviors": {
        "editor": "- e", "reviewer": "- r", "writer": "- w"}}))  # fmt: skip
    placed, how = doc.mapped(collab, TASK_ROLES["documentation"])
    assert placed == {"helper": "- w\n- r", "main": "- e"}
    # a file that does not say its task: only roles of the same name are used
    anon = read_library(_write(tmp_path / "a.json", {"behaviors": {"main": "- m", "writer": "- w"}}))
    assert anon.task == "" and anon.mapped(collab) == ({"main": "- m"}, {"roles": {"main": "main"},
                                                                         "unused_roles": ["writer"]})  # fmt: skip


# ---- whole runs ----------------------------------------------------------------------------------------------------
def test_training_starts_from_the_transferred_library_and_eval_has_three_arms(tmp_path, key) -> None:
    lib = _write(tmp_path / "behaviors" / "story.json", STORY_LIBRARY)
    srv = FakeAnthropic(reply=_collab_reply(), usage={"input_tokens": 100, "output_tokens": 20})
    with srv.running():
        summary = _run(_cfg(srv, tmp_path, init_behaviors=str(lib)), tmp_path / "out")
    out = tmp_path / "out"
    start = {"helper": "- Transferred: state the plan first.", "main": "- Transferred: keep it short."}
    assert summary["transfer"] == {"path": str(lib), "task": "story", "version": 3,
                                   "roles": {"writer": "helper", "editor": "main"}, "unused_roles": [],
                                   "behaviors": start}  # fmt: skip
    eps = _episodes(out)
    train = [e for e in eps if e["phase"] == "train"]
    # the first block (episodes 0-1) ran with the transferred library, in every agent's prompt
    for e in train[:2]:
        assert e["behaviors"] == start and e["behaviors_version"] == 0
        for t in e["trajectories"]:
            helper, main = t["turns"]
            assert "state the plan first" in helper["prompt"] and "keep it short" in main["prompt"]
    # the library learned here replaced it after episode 2 (the fake's good and bad answers separate)
    assert train[2]["behaviors_version"] == 1 and train[2]["behaviors"] != start
    lib_out = json.loads((out / "learned_behaviors.json").read_text())
    assert (
        lib_out["transferred_from"]["task"] == "story"
        and lib_out["behaviors"] == summary["behaviors"]["final"]
    )

    ev = summary["eval"]
    tr = ev["transfer"]
    assert ev["status"] == "done" and tr["learned_equals_transferred"] is False
    assert set(tr["arms"]) == {"none", "transferred", "learned"}
    assert set(tr["difference"]) == {
        "transferred_minus_none",
        "learned_minus_none",
        "learned_minus_transferred",
    }
    for ci in [*tr["arms"].values(), *tr["difference"].values()]:
        assert ci["n"] == 2 and ci["ci_low"] <= ci["mean"] <= ci["ci_high"]
    # learned and none are today's `with` and `without`, with the same intervals
    assert tr["arms"]["learned"] == ev["with"] and tr["arms"]["none"] == ev["without"]
    assert tr["difference"]["learned_minus_none"] == ev["difference"]
    assert (tr["confidence"], tr["resamples"]) == (ev["confidence"], ev["resamples"])

    # the three arms: same test problems, same sample numbers; only the guidelines differ
    evals = [e for e in eps if e["phase"] == "eval"]
    by_arm = {a: sorted((e["task_id"], e["trajectories"][0]["turns"][0]["sample_index"]) for e in evals
                        if e["arm"] == a) for a in ("with", "without", "transferred")}  # fmt: skip
    assert by_arm["with"] == by_arm["without"] == by_arm["transferred"] and len(by_arm["with"]) == 2
    for e in evals:
        prompts = " ".join(t["prompt"] for t in e["trajectories"][0]["turns"])
        assert ("Transferred:" in prompts) == (e["arm"] == "transferred")
        assert ("Guidelines learned" in prompts) == (e["arm"] != "without")
    mean = {
        a: sum(e["trajectories"][0]["reward"]["total"] for e in evals if e["arm"] == a) / 2 for a in by_arm
    }
    assert tr["arms"]["transferred"]["mean"] == pytest.approx(mean["transferred"])
    page = _api_grpo_section(summary, out / "summary.json")  # the report's table of the three arms
    assert (
        "Transfer from" in page and "writer → helper" in page and "difference (learned − transferred)" in page
    )
    with open(out / "rewards.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 * 4 + 3 * 2 and {r["arm"] for r in rows if r["phase"] == "eval"} == set(by_arm)


def test_without_init_behaviors_the_outputs_keep_todays_keys(tmp_path, key) -> None:
    srv = FakeAnthropic(reply=_collab_reply())
    with srv.running():
        summary = _run(_cfg(srv, tmp_path, num_episodes=2, max_problems_eval=1), tmp_path / "out")
    assert "transfer" not in summary
    assert set(summary["eval"]) == {"with", "without", "difference", "confidence", "resamples", "status",
                                    "problems", "samples_per_problem", "behaviors_learned", "max_reward"}  # fmt: skip
    lib = json.loads((tmp_path / "out" / "learned_behaviors.json").read_text())
    assert set(lib) == {"task", "version", "behaviors", "top_fraction", "behavior_every", "updates"}
    assert {e["arm"] for e in _episodes(tmp_path / "out") if e["phase"] == "eval"} == {"with", "without"}
    assert "Transfer from" not in _api_grpo_section(summary, tmp_path / "out" / "summary.json")


def test_a_bad_library_fails_before_any_request(tmp_path, key) -> None:
    srv = FakeAnthropic(reply=_collab_reply())
    missing = tmp_path / "nope.json"
    with (
        srv.running(),
        pytest.raises(LibraryError, match=re.escape(f"init_behaviors: {missing}: no such file")),
    ):
        _run(_cfg(srv, tmp_path, init_behaviors=str(missing)), tmp_path / "out")
    assert srv.requests == [] and not (tmp_path / "cache.sqlite").exists() and not (tmp_path / "out").exists()


def _stage(root: Path, init_behaviors: str) -> subprocess.CompletedProcess:
    problem = make_problem(
        {"task_id": "T/0", "entry_point": "inc", "prompt": "def inc(x):\n    \"\"\"x + 1\"\"\"\n",
         "test": "def check(candidate):\n    assert candidate(1) == 2\n"}
    )  # fmt: skip
    for split in ("train", "test"):
        write_jsonl(root / "data" / "problems" / f"{split}.jsonl", [problem.to_dict()])
    (root / "params.yaml").write_text(f"api_grpo:\n  init_behaviors: {init_behaviors}\n")
    return subprocess.run([sys.executable, str(REPO / "stages" / "train_api_grpo.py")], cwd=root,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    ("path", "content", "needle"),
    [
        ("data/behaviors/missing.json", None, "no such file"),
        ("data/behaviors/bad.json", "{not json", "not JSON"),
        ("reports/api_grpo/learned_behaviors.json", STORY_LIBRARY, "must be a copy under data/behaviors/"),
    ],
)
def test_stage_exits_2_with_one_line_on_a_bad_library(tmp_path, path, content, needle) -> None:
    if content is not None:
        _write(tmp_path / path, content)
    proc = _stage(tmp_path, path)
    assert proc.returncode == 2, proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert errors == [x for x in proc.stderr.splitlines() if x.strip()][-1:]  # the last line, the only error
    assert errors[0].startswith(f"error: api_grpo.init_behaviors: {path}: ") and needle in errors[0]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / ".orchestry").exists()
