"""Human reward override: the file, the `override` and `review` commands, and its effect on an API-GRPO run.

Real parts: whole API-GRPO runs use the real anthropic SDK against the local fake server of
tests/fake_llm_servers.py (as tests/test_api_grpo.py does), the real sandbox and the real level reward; the
commands run through typer's CliRunner on report files those runs wrote.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fake_llm_servers import FakeAnthropic
from test_api_grpo import DOUBLE, INC, _cfg, _collab_reply
from typer.testing import CliRunner

from orchestry.cli import app
from orchestry.config import SamplingParams
from orchestry.overrides import (
    Override,
    OverrideError,
    apply_override,
    check_for_orchestrator,
    load_reviewables,
    orchestrator_episode_id,
    read_overrides,
    set_override,
    trajectory_id,
    write_overrides,
)
from orchestry.reporting.report import _api_grpo_section
from orchestry.sandbox import Sandbox
from orchestry.training.api_grpo import run_api_grpo

runner = CliRunner()


def _one_error_line(result, needle: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr


def _run(cfg, out: Path, overrides=None) -> dict:
    return run_api_grpo(cfg, SamplingParams(), [INC, DOUBLE], [INC, DOUBLE],
                        lambda: Sandbox(timeout_s=3.0, max_workers=1), out, overrides=overrides,
                        progress=False)  # fmt: skip


@pytest.fixture
def first_run(tmp_path, monkeypatch):
    """One API-GRPO run (4 episodes, library after 2 and 4) written to ``<root>/reports/api_grpo``; the fake
    server keeps running for re-runs (cached answers are replayed, new prompts get new answers)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    root = tmp_path / "repo"
    srv = FakeAnthropic(reply=_collab_reply(), usage={"input_tokens": 100, "output_tokens": 20})
    with srv.running():
        cfg = _cfg(srv, tmp_path)
        summary = _run(cfg, root / "reports" / "api_grpo")
        yield root, cfg, summary


def _episodes(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]


def _csv(out: Path) -> list[dict]:
    with open(out / "rewards.csv", newline="") as f:
        return list(csv.DictReader(f))


# ---- the file --------------------------------------------------------------------------------------------------
def test_ids_depend_on_the_content_only() -> None:
    a = trajectory_id("code_review", "T/1", [("writer", "x"), ("reviewer", "y")])
    assert a.startswith("ag-") and len(a) == 15
    assert a == trajectory_id("code_review", "T/1", [("writer", "x"), ("reviewer", "y")])
    assert a != trajectory_id("code_review", "T/1", [("writer", "x"), ("reviewer", "y!")])
    assert a != trajectory_id("code_review", "T/2", [("writer", "x"), ("reviewer", "y")])
    assert a != trajectory_id("code_review", "T/1", [("writer", "xy"), ("reviewer", "")])  # no run-together
    rec = {
        "phase": "eval",
        "method": "learned",
        "episode": 3,
        "task_id": "T/1",
        "steps": [{"agent": "main", "text": "t"}],
    }
    assert orchestrator_episode_id(rec).startswith("oe-")
    assert orchestrator_episode_id(rec) != orchestrator_episode_id({**rec, "episode": 4})


def test_read_write_and_bad_lines(tmp_path) -> None:
    f = tmp_path / "o.jsonl"
    assert read_overrides(f) == {}  # missing file: no overrides
    write_overrides(f, [Override("ag-1", 2.0, "n", "me", "2026-01-01T00:00:00+00:00")])
    assert read_overrides(f)["ag-1"].score == 2.0
    assert [p.name for p in tmp_path.iterdir()] == ["o.jsonl"]  # no temporary file left behind
    for bad, needle in (
        ('{"id": "x"}\n', 'finite number "score"'),
        ('{"id": "x", "score": NaN}\n', 'finite number "score"'),
        ('{"id": "x", "score": true}\n', 'finite number "score"'),
        ("not json\n", "not JSON"),
        ('{"id": "x", "score": 1}\n{"id": "x", "score": 2}\n', "appears twice"),
    ):
        f.write_text(bad)
        with pytest.raises(OverrideError, match=needle):
            read_overrides(f)
    r = apply_override({"total": 1.5, "tests": 1.0}, Override("ag-1", 0.25, "wrong", "me", "t"))
    assert (
        r["total"] == 0.25
        and r["automatic_total"] == 1.5
        and r["tests"] == 1.0
        and r["override"]["note"] == "wrong"
    )
    assert apply_override({"total": 1.5}, None) == {"total": 1.5}


def test_orchestrator_episodes_are_reviewable(tmp_path) -> None:
    rec = {"phase": "eval", "method": "learned", "episode": 0, "task_id": "T/inc", "agents": "main>tester",
           "reward": 1.1, "level_reward": {"total": 1.1, "tests": 0.5, "reasons": ["tests: 1/2"]},
           "steps": [{"agent": "main", "text": "def inc(x): return x"}, {"agent": "tester", "text": "1/2"}]}  # fmt: skip
    path = tmp_path / "reports" / "orchestrator" / "transcripts.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rec) + "\n")
    items = load_reviewables(tmp_path)
    oid = orchestrator_episode_id(rec)
    assert list(items) == [oid] and items[oid].max_score == 4.0 and items[oid].automatic == 1.1
    f = tmp_path / "data" / "overrides.jsonl"
    # train_orchestrator trains on its training episodes only: an evaluation episode's override is refused
    with pytest.raises(OverrideError, match="orchestrator evaluation episode"):
        set_override(f, oid, "good", "fine", root=tmp_path, who="ann")
    assert not f.exists()
    train = {**rec, "phase": "train"}
    path.write_text(json.dumps(train) + "\n")
    tid = orchestrator_episode_id(train)
    o = set_override(f, tid, "good", "fine", root=tmp_path, who="ann")
    assert o.score == 4.0 and read_overrides(f) == {tid: o}
    r = runner.invoke(app, ["override", tid, "2.5", "--root", str(tmp_path), "--who", "bob"])  # the CLI too
    assert r.exit_code == 0, r.output
    assert read_overrides(f)[tid].score == 2.5
    with pytest.raises(OverrideError, match=r"out of range \[0, 4\]"):
        set_override(f, tid, "5", root=tmp_path, who="ann")
    path.write_text(json.dumps(rec) + "\n\n{broken\n")  # the reports are read as strictly as the file
    with pytest.raises(OverrideError, match=r"transcripts.jsonl:3: not JSON"):
        load_reviewables(tmp_path)


def test_orchestrator_max_score_is_the_level_rewards_maximum() -> None:
    from orchestry.overrides import ORCHESTRATOR_MAX_REWARD
    from orchestry.rewards.code import RewardConfig

    assert RewardConfig().max_total == ORCHESTRATOR_MAX_REWARD


# ---- the commands ----------------------------------------------------------------------------------------------
def test_override_command_checks_and_never_loses_a_line(first_run) -> None:
    root, _, summary = first_run
    eps = _episodes(root / "reports" / "api_grpo")
    ids = [t["id"] for e in eps for t in e["trajectories"]]
    assert len(set(ids)) >= 4 and all(i.startswith("ag-") for i in ids)
    file = root / "data" / "overrides.jsonl"
    args = ["override", "--root", str(root)]
    ok = runner.invoke(app, [*args, ids[0], "1.5", "--note", "partly right", "--who", "ann"])
    assert ok.exit_code == 0, ok.output
    before = file.read_bytes()
    assert json.loads(before)["score"] == 1.5 and json.loads(before)["who"] == "ann"

    _one_error_line(runner.invoke(app, [*args, "ag-000000000000", "1"]), "unknown id 'ag-000000000000'")
    _one_error_line(runner.invoke(app, [*args, ids[1], "4.01"]), "out of range [0, 4]")
    _one_error_line(runner.invoke(app, [*args, ids[1], "--", "-1"]), "out of range [0, 4]")
    _one_error_line(runner.invoke(app, [*args, ids[1], "nan"]), "neither a number nor a verdict")
    _one_error_line(runner.invoke(app, [*args, ids[1], "great"]), "neither a number nor a verdict")
    assert file.read_bytes() == before  # every refused command left the file as it was

    assert runner.invoke(app, [*args, ids[1], "bad", "--note", "ignores aux"]).exit_code == 0
    assert runner.invoke(app, [*args, ids[0], "good"]).exit_code == 0  # replaces ids[0]'s line
    got = read_overrides(file)
    assert set(got) == {ids[0], ids[1]} and got[ids[0]].score == summary["max_reward"] == 4.0
    assert got[ids[1]].score == 0.0 and got[ids[1]].note == "ignores aux"
    assert len(file.read_text().splitlines()) == 2

    file.write_text("{broken\n")  # an unreadable file is reported, not overwritten
    _one_error_line(runner.invoke(app, [*args, ids[2], "1"]), "not JSON")
    assert file.read_text() == "{broken\n"


def test_review_pages_and_records(first_run) -> None:
    root, _, _ = first_run
    eps = _episodes(root / "reports" / "api_grpo")
    sel = [e["trajectories"][e["selected"]] for e in eps]
    keys = "n\n9\n\np\n2.5\nwrong edge case\nq\n"  # next, out-of-range score, previous, a score + note, quit
    res = runner.invoke(app, ["review", "--root", str(root), "--selected-only", "--who", "bob"], input=keys)
    assert res.exit_code == 0, res.output
    assert "[1/" in res.output and "--- helper ---" in res.output and "automatic reward" in res.output
    assert "out of range" in res.stderr  # the bad score was refused, the session went on
    got = read_overrides(root / "data" / "overrides.jsonl")
    assert list(got) == [sel[0]["id"]]  # 'n' then back with 'p': the first selected trajectory
    assert got[sel[0]["id"]].score == 2.5 and got[sel[0]["id"]].note == "wrong edge case"
    assert got[sel[0]["id"]].who == "bob"
    assert "1 override(s) written" in res.output
    empty = runner.invoke(app, ["review", "--root", str(root / "nowhere")])
    _one_error_line(empty, "nothing to review")


# ---- the stage reads them --------------------------------------------------------------------------------------
def test_an_override_changes_the_next_runs_library_and_report(first_run, tmp_path) -> None:
    """Human scores that invert the first block's rewards change the library the next run extracts."""
    root, cfg, s1 = first_run
    out1 = root / "reports" / "api_grpo"
    eps = _episodes(out1)
    lib1 = json.loads((out1 / "learned_behaviors.json").read_text())
    first_block = [e for e in eps if e["phase"] == "train" and e["episode"] in ("0", "1")]
    file = root / "data" / "overrides.jsonl"
    flipped = {}
    for e in first_block:
        for t in e["trajectories"]:
            score = 0.0 if t["reward"]["total"] >= 2.0 else 4.0  # the person disagrees with the tests
            if t["id"] not in flipped:
                set_override(file, t["id"], score, "inverted", root=root, who="test")
                flipped[t["id"]] = score
    assert s1["overrides"] == {"read": 0, "applied": 0, "rows": [], "unknown": 0, "unknown_ids": []}

    out2 = tmp_path / "run2"
    s2 = _run(cfg, out2, overrides=read_overrides(file))
    lib2 = json.loads((out2 / "learned_behaviors.json").read_text())
    assert lib1["updates"][0]["guidelines"] != lib2["updates"][0]["guidelines"]
    assert lib1["updates"][0]["features"] != lib2["updates"][0]["features"]
    rows = {r["id"]: r for r in _csv(out2) if r["phase"] == "train" and r["episode"] in ("0", "1")}
    assert set(rows) == set(flipped)  # the first block replayed the same answers: every id met again
    for tid, score in flipped.items():
        assert rows[tid]["overridden"] == "1" and float(rows[tid]["reward"]) == score
        assert float(rows[tid]["value"]) == score and float(rows[tid]["automatic_reward"]) != score
    assert all(r["overridden"] == "0" for r in _csv(out1))
    assert s2["overrides"]["read"] == len(flipped) and s2["overrides"]["applied"] >= len(flipped)
    html = _api_grpo_section(s2, out2 / "summary.json")
    assert "Human overrides" in html and next(iter(flipped)) in html and "inverted" in html
    assert "Human overrides" not in _api_grpo_section(s1, out1 / "summary.json")


# ---- checked where they are applied (issue 55) ------------------------------------------------------------------
def test_the_stage_check_refuses_out_of_range_unknown_and_orchestrator_ids() -> None:
    from orchestry.overrides import Override, check_for_stage

    ok = Override("ag-0123456789ab", 1.5)
    assert check_for_stage({ok.id: ok}, "documentation", 2.0) == {ok.id: ok}
    nine = Override("ag-aaaaaaaaaaaa", 9.0)  # the hand-written 9.0 on a 0-2 task (was applied)
    with pytest.raises(
        OverrideError, match=r"out of range \[0, 2\] for task documentation: ag-aaaaaaaaaaaa \(9\)"
    ):
        check_for_stage({ok.id: ok, nine.id: nine}, "documentation", 2.0)
    with pytest.raises(OverrideError, match=r"out of range.*ag-aaaaaaaaaaaa \(-1\)"):
        check_for_stage({nine.id: Override(nine.id, -1.0)}, "story", 4.0)
    with pytest.raises(OverrideError, match="unknown ids .*: typo-1, zz"):  # was ignored silently
        check_for_stage({"zz": Override("zz", 1.0), "typo-1": Override("typo-1", 1.0)}, "story", 4.0)
    # orchestrator episodes are train_orchestrator's: left out here, checked by check_for_orchestrator
    oe = Override("oe-0123456789ab", 9.0)
    assert check_for_stage({oe.id: oe}, "story", 4.0) == {}
    with pytest.raises(OverrideError, match=r"range \[0, 4\]: oe-0123456789ab \(9\)"):
        check_for_orchestrator({oe.id: oe})
    with pytest.raises(OverrideError, match="unknown orchestrator ids .*: oe-typo"):
        check_for_orchestrator({"oe-typo": Override("oe-typo", 1.0)})
    ok_oe = Override("oe-0123456789ab", -1.0)  # binary task reward: failure_penalty -1 to success_bonus 1
    assert check_for_orchestrator({ok_oe.id: ok_oe, nine.id: nine}, -1.0, 1.0) == {ok_oe.id: ok_oe}
    story = Override("ag-bbbbbbbbbbbb", 3.5, task="story")  # another task's line: its id can never match here
    assert check_for_stage({story.id: story}, "documentation", 2.0) == {}
    assert check_for_stage({story.id: story}, "story", 4.0) == {story.id: story}


def test_unknown_ids_are_counted_in_the_summary() -> None:
    from orchestry.training.api_grpo.outputs import override_summary

    eps = [{"phase": "train", "episode": "0", "task_id": "T", "trajectories": [
        {"id": "ag-000000000001", "reward": {"total": 1.0, "automatic_total": 2.0,
                                              "override": {"score": 1.0, "note": "", "who": "a"}}},
        {"id": "ag-000000000002", "reward": {"total": 2.0}}]}]  # fmt: skip
    s = override_summary(eps, 3, ["ag-000000000001", "ag-00000000000f", "ag-00000000000e"])
    assert (s["read"], s["applied"], s["unknown"]) == (3, 1, 2)
    assert s["unknown_ids"] == ["ag-00000000000e", "ag-00000000000f"]


def _check_stage(tmp_path: Path, overrides: str) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "overrides.jsonl").write_text(overrides)
    (tmp_path / "params.yaml").write_text((root / "params.yaml").read_text())
    return subprocess.run(
        [sys.executable, str(root / "stages" / "check_overrides.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_bad_overrides_file_stops_the_pipeline_before_train_api_grpo(tmp_path) -> None:
    """DVC removes a stage's outputs before its command runs: the check is a stage of its own that
    train_api_grpo depends on, so a bad file fails there and train_api_grpo's outputs stay."""
    stages = yaml.safe_load((Path(__file__).resolve().parents[1] / "dvc.yaml").read_text())["stages"]
    check = stages["check_overrides"]
    out = next(iter(check["outs"][0])) if isinstance(check["outs"][0], dict) else check["outs"][0]
    assert "data/overrides.jsonl" in check["deps"] and out in stages["train_api_grpo"]["deps"]
    bad = _check_stage(tmp_path, '{"id": "ag-aaaaaaaaaaaa", "score": 9.0}\n')  # code_collaboration: 0-4
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
        "error: scores out of range"
    )
    assert not (tmp_path / out).exists()
    broken = _check_stage(tmp_path, "{broken\n")
    assert broken.returncode == 2 and "overrides.jsonl:1: not JSON" in broken.stderr
    good = _check_stage(tmp_path, '{"id": "ag-aaaaaaaaaaaa", "score": 3.0}\n')
    assert good.returncode == 0, good.stderr
    assert json.loads((tmp_path / out).read_text())["for_task"] == 1
