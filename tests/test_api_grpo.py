"""API-GRPO: beam pruning, advantages, the behaviour extractor, the judge, and whole runs against fake APIs.

Whole runs use the real anthropic SDK / HTTP client against local servers (tests/fake_llm_servers.py),
the real sandbox and the real level reward, on two tiny crafted problems.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
from pathlib import Path

import pytest
from fake_llm_servers import FakeAnthropic, FakeOpenAI

from orchestry.algorithms.api_grpo import beam_search, expand, prune, value_advantages
from orchestry.algorithms.behaviors import contrast, extract_behaviors, split_top_bottom
from orchestry.config import ApiGrpoParams, SamplingParams
from orchestry.llm.backends import ChatResult
from orchestry.problems import make_problem
from orchestry.rewards.judge import Judge, first_numbers, parse_guidelines, parse_scores
from orchestry.sandbox import Sandbox
from orchestry.tasks.code_collaboration import CodeCollaboration
from orchestry.tasks.code_review import CodeReview
from orchestry.tasks.common import Turn
from orchestry.training.api_grpo import run_api_grpo

REPO = Path(__file__).resolve().parents[1]
INC = make_problem(
    {"task_id": "T/inc", "entry_point": "inc", "prompt": 'def inc(x):\n    """Return x + 1."""\n',
     "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n"}
)  # fmt: skip
DOUBLE = make_problem(
    {"task_id": "T/double", "entry_point": "double", "prompt": 'def double(x):\n    """Return 2 * x."""\n',
     "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(0) == 0\n"}
)  # fmt: skip
FN = {"inc": "x + 1", "double": "2 * x"}

HELPER = "```python\ndef aux(x):\n    return {body}\n```"
MAIN_GOOD = (
    "```python\ndef {name}(x):\n    r = aux(x)\n    if r is None:\n        return {body}\n    return r\n```"
)
MAIN_BAD = "Sure! Here is the code:\n```python\ndef {name}(x):\n    return x\n```\nThis function returns the input unchanged, which is simple and fast."


# ---- the search math ---------------------------------------------------------------------------------------------
def test_prune_keeps_exactly_the_top_n_by_value() -> None:
    values = [0.1, 0.9, 0.5, 0.9, 0.3]
    assert prune(values, 3) == [1, 3, 2]  # ties keep candidate order
    assert prune(values, 1) == [1]
    assert prune(values, 10) == [1, 3, 2, 4, 0]
    assert prune(values, 2, keys=["a", "b", "c", "b", "d"]) == [1, 2]  # duplicate of a kept one skipped
    assert prune([1.0, 1.0], 2, keys=["a", "a"]) == [
        0,
        1,
    ]  # duplicates fill the beam when nothing else is left


def test_value_advantages_and_expand() -> None:
    assert value_advantages([1.0, 2.0, 3.0]) == [-1.0, 0.0, 1.0]
    assert value_advantages([]) == []
    assert expand(2, 3) == [(0, 0), (0, 1), (0, 2), (1, 3), (1, 4), (1, 5)]


def test_beam_search_extends_only_the_kept_trajectories() -> None:
    """Value = the digits of the transcript read as a number: the best candidates are known in advance."""
    seen = []

    def sample(requests):
        seen.append([(e, "".join(t.turns), s) for e, t, s in requests])
        return [str((7 * s + 3 * len(t.turns) + e) % 10) for e, t, s in requests]

    def value(items, final):
        return [(float("".join(c.turns)), {"final": final}) for _, c in items]

    out = beam_search(2, 3, k_samples=3, beam_width=2, sample=sample, value=value)
    assert [len(r) for r in seen] == [2 * 3, 2 * 2 * 3, 2 * 2 * 3]  # first turn: one empty parent per episode
    for e, res in enumerate(out):
        assert len(res.group) == 2 * 3
        for h in res.history:  # kept = exactly the top-2 values of that turn's candidates
            assert sorted(h["kept"]) == sorted(
                sorted(range(len(h["values"])), key=lambda i: -h["values"][i])[:2]
            )
        turn2 = [v for ep, v, _ in seen[2] if ep == e]
        parents = {"".join(res.group[i].turns[:2]) for i in range(len(res.group))}
        assert parents == set(turn2)  # the last turn only extends the 2 kept trajectories
        values = [c.value for c in res.group]
        assert res.advantages == pytest.approx([v - sum(values) / len(values) for v in values])
        assert res.selected == max(range(len(values)), key=lambda i: values[i])
        assert all(c.info == {"final": True} for c in res.group)


# ---- behaviour extraction ------------------------------------------------------------------------------------
def _traj(task, problem, helper: str, main: str, reward: dict) -> dict:
    turns = (Turn("helper", "", "", helper), Turn("main", "", "", main, completion_tokens=30))
    return task.features(problem, turns, reward)


def test_deterministic_extractor_on_crafted_episodes() -> None:
    task = CodeCollaboration()
    good = {"total": 4.0, "syntax": 0.5, "passed": 2, "total_asserts": 2}
    bad = {"total": 1.1, "syntax": 0.5, "passed": 0, "total_asserts": 2}
    helper = HELPER.format(body="x + 1")
    feats, advs = [], []
    for _ in range(5):  # top: main calls aux with a fallback, code only
        feats.append(_traj(task, INC, helper, MAIN_GOOD.format(name="inc", body="x + 1"), good))
        advs.append(1.5)
    for _ in range(5):  # bottom: main ignores aux and talks after the code
        feats.append(_traj(task, INC, helper, MAIN_BAD.format(name="inc"), bad))
        advs.append(-1.5)
    for _ in range(10):  # groups without signal
        feats.append(_traj(task, INC, helper, MAIN_BAD.format(name="inc"), bad))
        advs.append(0.0)
    assert feats[0]["scheme_fallback"] == 1.0 and feats[5]["scheme_none"] == 1.0
    upd = extract_behaviors(
        feats, advs, task.feature_guides, after_episode=7, top_fraction=0.2, max_per_role=3
    )
    assert (upd.pool, upd.top, upd.bottom) == (20, 4, 4)
    effects = {c.name: c.effect for c in upd.contrasts}
    assert effects["main_calls_aux"] == 1.0 and effects["scheme_fallback"] == 1.0
    assert effects["main_prose_after_code"] == -1.0 and effects["outcome_all_tests_passed"] == 1.0
    assert effects["helper_code_lines"] == 0.0  # identical helpers: no effect
    texts = {g.text for g in upd.guidelines}
    assert "Call `aux` inside the requested function and use its return value." in texts
    assert "Stop after the code block: no explanation after the code." in texts
    assert all(g.role == "main" for g in upd.guidelines) and len(upd.guidelines) <= 3
    assert not any(g.feature.startswith("outcome_") for g in upd.guidelines)
    assert "Guidelines learned" in INC.main_prompt(behaviors=upd.behaviors()["main"])


def test_extractor_needs_a_contrast() -> None:
    task = CodeCollaboration()
    f = _traj(task, INC, HELPER.format(body="x"), MAIN_BAD.format(name="inc"), {"total": 1.0})
    upd = extract_behaviors([f] * 4, [0.0] * 4, task.feature_guides, 4)
    assert upd.guidelines == [] and "no contrast" in upd.note
    # one trajectory per side is not evidence: a single differing example gives no 0/1 guideline
    g = _traj(task, INC, HELPER.format(body="x"), MAIN_GOOD.format(name="inc", body="x + 1"), {"total": 4.0})
    upd = extract_behaviors([g, f], [1.0, -1.0], task.feature_guides, 2, top_fraction=0.5)
    assert (upd.top, upd.bottom) == (1, 1) and not [
        x for x in upd.guidelines if x.feature == "main_calls_aux"
    ]


def test_split_and_contrast() -> None:
    assert split_top_bottom([0.5, -1.0, 2.0, 0.0, -0.2], 0.4) == ([2, 0], [1, 4])
    c = {
        x.name: x
        for x in contrast(
            [{"a": 1.0, "n": 10.0}, {"a": 1.0, "n": 12.0}], [{"a": 0.0, "n": 2.0}, {"a": 1.0, "n": 4.0}]
        )
    }
    assert c["a"].binary and c["a"].effect == 0.5
    assert not c["n"].binary and c["n"].effect == pytest.approx(8 / 2**0.5)


# ---- judge ---------------------------------------------------------------------------------------------------------
class _ScriptedClient:
    def __init__(self, answers):
        self.answers, self.requests = list(answers), []

    def complete_batch(self, reqs):
        self.requests.extend(reqs)
        return [ChatResult(self.answers.pop(0), 10, 5, 0.0) for _ in reqs]


def test_judge_score_parsing() -> None:
    assert parse_scores("QUALITY: 8\nCollaboration = 12\n**EFFICIENCY:** 3.5") == {
        "quality": 8.0, "collaboration": 10.0, "efficiency": 3.5}  # fmt: skip
    assert parse_scores("quality 8") is None
    assert first_numbers("I'd say 7, then 4") == {"quality": 7.0, "collaboration": 4.0, "efficiency": None}


def test_judge_asks_once_more_then_falls_back() -> None:
    client = _ScriptedClient(["QUALITY: 9\nCOLLABORATION: 6\nEFFICIENCY: 3", "great work", "meh 6 and 4",
                              "QUALITY: 2\nCOLLABORATION: 2\nEFFICIENCY: 2", "still nothing", "7"])  # fmt: skip
    judge = Judge(client, {"quality": 2, "collaboration": 1, "efficiency": 1})
    s = judge.score(["p1", "p2", "p3"])  # first batch: answers 0-2; retries (p2, p3): answers 3-4
    assert [x.how for x in s] == ["format", "retry", "neutral"]
    assert s[0].combined == pytest.approx((2 * 9 + 6 + 3) / 4)
    assert (s[2].quality, s[2].collaboration, s[2].efficiency) == (
        6.0,
        4.0,
        5.0,
    )  # first numbers, then neutral
    assert judge.failures == 1 and len(client.requests) == 5
    assert client.requests[3].messages[-1][0] == "user" and client.requests[3].messages[1][0] == "assistant"


def test_parse_guidelines() -> None:
    text = "Here you go:\n- main: Use aux with a fallback.\n* HELPER: Return a value.\nmain: Use aux with a fallback.\nfoo: x"
    assert parse_guidelines(text, ("helper", "main"), 3) == {
        "main": ["Use aux with a fallback."],
        "helper": ["Return a value."],
    }


# ---- whole runs against fake APIs ---------------------------------------------------------------------------
def _collab_reply():
    counter = itertools.count()

    def reply(body: dict) -> str:
        user = body["messages"][-1]["content"]
        if "Score the transcript" in user or "Answer with exactly three lines" in user:
            return "QUALITY: 8\nCOLLABORATION: 6\nEFFICIENCY: 10"
        if "Write at most" in user:
            return "main: Use aux with a fallback.\nhelper: Return a value."
        name = "inc" if "inc(" in user else "double"
        if "helper function named `aux`" in user:
            return HELPER.format(body=FN[name])
        i = next(counter)
        return MAIN_GOOD.format(name=name, body=FN[name]) if i % 2 == 0 else MAIN_BAD.format(name=name)

    return reply


def _cfg(srv, tmp_path, **kw) -> ApiGrpoParams:
    base = dict(backend="anthropic", model="claude-haiku-4-5", base_url=srv.url, num_episodes=4, behavior_every=2,
                k_samples=2, beam_width=2, max_tokens=64, max_problems_eval=2, concurrency=1, preflight=False,
                cache_path=str(tmp_path / "cache.sqlite"))  # fmt: skip
    base.update(kw)
    return ApiGrpoParams(**base)


def _run(cfg, out, **kw):
    return run_api_grpo(
        cfg,
        SamplingParams(),
        [INC, DOUBLE],
        [INC, DOUBLE],
        lambda: Sandbox(timeout_s=3.0, max_workers=1),
        out,
        **kw,
    )


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")


def test_rerun_with_same_params_makes_zero_server_calls(tmp_path, key, monkeypatch) -> None:
    # a stage runs in the repository root: the recorded cache path is relative to it
    monkeypatch.chdir(tmp_path)
    srv = FakeAnthropic(reply=_collab_reply(), usage={"input_tokens": 100, "output_tokens": 20})
    metrics = []
    with srv.running():
        cfg = _cfg(srv, tmp_path)
        s1 = _run(cfg, tmp_path / "run1", on_metrics=lambda m, step: metrics.append((step, m)))
        n_first = len(srv.requests)
        s2 = _run(cfg, tmp_path / "run2")
    assert n_first == s1["cost"]["calls"] > 0
    assert len(srv.requests) == n_first  # the second run sent nothing
    assert s2["cache"]["hit_rate"] == 1.0 and s2["cost"]["calls"] == 0 and s2["cost"]["usd"] == 0.0
    assert s1["cache"]["path"] == "cache.sqlite"  # not the absolute path of this clone
    assert s2["cost"]["tokens_per_episode"] == s1["cost"]["tokens_per_episode"] > 0  # consumed, cache or not
    assert s2["cost"]["usd_saved_by_cache"] == pytest.approx(
        s1["cost"]["usd"] + s1["cost"]["usd_saved_by_cache"]
    )
    assert (tmp_path / "run1" / "episodes.jsonl").read_text() != ""
    ep1 = [json.loads(x) for x in (tmp_path / "run1" / "episodes.jsonl").read_text().splitlines()]
    ep2 = [json.loads(x) for x in (tmp_path / "run2" / "episodes.jsonl").read_text().splitlines()]
    texts = lambda eps: [[t["text"] for tr in e["trajectories"] for t in tr["turns"]] for e in eps]  # noqa: E731
    assert texts(ep1) == texts(ep2)
    # cost: usage fields x Haiku's price; 6 agent calls per episode = k * (1 + N * (turns - 1))
    assert s1["cost"]["usd"] == pytest.approx(n_first * (100 * 1e-6 + 20 * 5e-6))
    train = [e for e in ep1 if e["phase"] == "train"]
    assert len(train) == 4 and all(e["cost"]["calls"] + e["cost"]["cached_calls"] == 6 for e in train)
    assert [s for s, _ in metrics] == [0, 1, 2, 3] and "train/usd" in metrics[-1][1]
    # the library was extracted after episodes 2 and 4 and injected into episodes 3-4
    lib = json.loads((tmp_path / "run1" / "learned_behaviors.json").read_text())
    assert [u["after_episode"] for u in lib["updates"]] == [2, 4]
    assert lib["version"] >= 1 and "main" in lib["behaviors"]
    assert (
        train[2]["behaviors_version"] == 1
        and "Guidelines learned" in train[2]["trajectories"][0]["turns"][1]["prompt"]
    )
    assert s1["eval"]["status"] == "done" and s1["eval"]["with"]["n"] == s1["eval"]["without"]["n"] == 2
    with open(tmp_path / "run1" / "rewards.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 * 4 + 2 * 2  # 4 episodes x N*k trajectories + 2 arms x 2 test problems
    assert {r["phase"] for r in rows} == {"train", "eval"}


def test_seeds_do_not_share_api_samples(tmp_path, key) -> None:
    """A sweep over api_grpo.seed: each seed gets its own samples; the same seed replays its own."""
    from orchestry.llm.backends import ChatRequest
    from orchestry.llm.clients import open_clients

    srv = FakeAnthropic(reply=lambda b: "sample", usage={"input_tokens": 10, "output_tokens": 5})
    req = ChatRequest((("user", "write inc"),), "be brief", 0, 16)
    with srv.running():
        for seed, sent_after in ((0, 1), (1, 2), (0, 2), (1, 2)):
            clients = open_clients(_cfg(srv, tmp_path, seed=seed), SamplingParams())
            try:
                clients.chat.complete_batch([req])
            finally:
                clients.close()
            assert len(srv.posts) == sent_after, seed


def test_budget_stop_is_clean_and_saves_everything(tmp_path, key, caplog) -> None:
    srv = FakeAnthropic(reply=_collab_reply(), usage={"input_tokens": 100, "output_tokens": 20})
    prices = {
        "claude-haiku-4-5": {"input_usd_per_mtok": 100.0, "output_usd_per_mtok": 100.0}
    }  # 0.012 USD/call
    with srv.running(), caplog.at_level(logging.WARNING):
        cfg = _cfg(srv, tmp_path, num_episodes=8, behavior_every=1, budget_usd=0.3, eval_budget_fraction=0.0,
                   prices=prices)  # fmt: skip
        summary = _run(cfg, tmp_path / "out")
    assert summary["budget"]["status"] == "exhausted" and summary["stopped_early"]
    assert "of the budget" in caplog.text  # the 80 % warning came first
    n = summary["episodes_completed"]
    assert 1 <= n < 8
    assert summary["budget"]["spent_usd"] <= 0.3
    assert len(srv.posts) == summary["cost"]["calls"]  # every call sent was recorded and paid for
    eps = [json.loads(x) for x in (tmp_path / "out" / "episodes.jsonl").read_text().splitlines()]
    assert len([e for e in eps if e["phase"] == "train"]) == n
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["budget"]["status"] == "exhausted" and "budget" in saved["eval"]["status"]
    assert (tmp_path / "out" / "learned_behaviors.json").exists() and (
        tmp_path / "out" / "rewards.csv"
    ).exists()


def test_a_rerun_continues_the_budget_instead_of_a_fresh_one(tmp_path, key) -> None:
    """A run stopped by the budget, run again with the same params: the budget is the experiment's, not the
    process's (the spend ledger in the cache's database), so the rerun sends nothing new; a raised budget goes on."""
    srv = FakeAnthropic(reply=_collab_reply(), usage={"input_tokens": 100, "output_tokens": 20})
    prices = {
        "claude-haiku-4-5": {"input_usd_per_mtok": 100.0, "output_usd_per_mtok": 100.0}
    }  # 0.012 USD/call
    with srv.running():
        cfg = _cfg(srv, tmp_path, num_episodes=8, behavior_every=1, budget_usd=0.3, eval_budget_fraction=0.0,
                   prices=prices)  # fmt: skip
        first = _run(cfg, tmp_path / "run1")
        sent = len(srv.posts)
        again = _run(
            cfg.model_copy(update={"timeout_s": 30.0}), tmp_path / "run2"
        )  # a retry knob: same budget
        assert len(srv.posts) == sent  # before the ledger: a fresh 0.3 USD, 138 % of the cap in all
        raised = _run(cfg.model_copy(update={"budget_usd": 0.45}), tmp_path / "run3")
    b1, b2, b3 = first["budget"], again["budget"], raised["budget"]
    assert b1["status"] == b2["status"] == "exhausted" and b1["spent_before_usd"] == 0.0
    assert b2["spent_before_usd"] == pytest.approx(b1["spent_usd"]) and b2["spent_this_run_usd"] == 0.0
    assert b2["spent_usd"] == pytest.approx(b1["spent_usd"]) and b1["spent_usd"] <= 0.3
    assert b2["scope"] == b1["scope"]
    assert again["episodes_completed"] == first["episodes_completed"]  # replayed from the cache, free
    assert b3["spent_before_usd"] == pytest.approx(b1["spent_usd"]) and b3["scope"] == b1["scope"]
    assert len(srv.posts) > sent and b3["spent_usd"] <= 0.45
    assert b3["spent_usd"] == pytest.approx(len(srv.posts) * 0.012)  # every call sent, counted once


def test_usage_above_max_tokens_stops_the_run_and_says_why(tmp_path, key) -> None:
    """A server that ignores max_tokens (5,000 output tokens for max_tokens=64): the first answer is charged as
    reported and the run stops there, instead of spending 10x the budget in one batch."""
    srv = FakeAnthropic(reply=_collab_reply(), usage={"input_tokens": 100, "output_tokens": 5000})
    prices = {
        "claude-haiku-4-5": {"input_usd_per_mtok": 100.0, "output_usd_per_mtok": 100.0}
    }  # 0.51 USD/call
    with srv.running():
        cfg = _cfg(srv, tmp_path, budget_usd=1.0, prices=prices)
        summary = _run(cfg, tmp_path / "out")
    assert len(srv.posts) == 1  # concurrency 1: nothing after the first overrun
    assert summary["stopped_early"] and "max_tokens=64" in summary["stop_reason"]
    assert "5000 completion tokens" in summary["stop_reason"] and summary["budget"]["status"] == "exhausted"
    assert summary["budget"]["spent_usd"] == pytest.approx(5100 * 1e-4)  # charged as reported
    assert summary["eval"]["status"].startswith("skipped")


def test_unwritable_outputs_are_found_before_any_request(tmp_path, key) -> None:
    """reports/ that cannot be written (here its parent is a file) stops the run before the sandbox or any paid
    request, not after them."""
    from orchestry.runtime import OutputNotWritable

    srv = FakeAnthropic(reply=_collab_reply())
    (tmp_path / "reports").write_text("a file where the folder should be")
    with srv.running(), pytest.raises(OutputNotWritable, match="cannot write to .*reports/api_grpo"):
        _run(_cfg(srv, tmp_path), tmp_path / "reports" / "api_grpo")
    assert srv.requests == []


def test_a_failed_output_write_leaves_no_tmp_file(tmp_path, key) -> None:
    """A full disk while writing an output (episodes.jsonl.tmp is /dev/full): the error goes up, no .tmp is left."""
    import errno
    import os

    srv = FakeAnthropic(reply=_collab_reply(), usage={"input_tokens": 10, "output_tokens": 5})
    out = tmp_path / "out"
    out.mkdir()
    (out / "episodes.jsonl.tmp").symlink_to("/dev/full")  # every write to it fails with ENOSPC
    with srv.running(), pytest.raises(OSError) as err:
        _run(_cfg(srv, tmp_path, num_episodes=2), out)
    assert err.value.errno == errno.ENOSPC
    assert not os.path.lexists(out / "episodes.jsonl.tmp") and not list(out.glob("*.tmp"))


def test_judge_is_mixed_into_the_value_and_proposes_guidelines(tmp_path, key) -> None:
    srv = FakeAnthropic(reply=_collab_reply())
    with srv.running():
        cfg = _cfg(
            srv, tmp_path, num_episodes=2, judge={"enabled": True, "weight": 0.25}, max_problems_eval=1
        )
        summary = _run(cfg, tmp_path / "out")
    with open(tmp_path / "out" / "rewards.csv") as f:
        train = [r for r in csv.DictReader(f) if r["phase"] == "train"]
    for r in train:
        assert float(r["judge"]) == pytest.approx(8.0)
        assert float(r["value"]) == pytest.approx(0.75 * float(r["reward"]) + 0.25 * 4.0 * 0.8)
    judge_usage = summary["cost"]["by_tag"]["judge"]  # identical transcripts are judged once (cache)
    assert (
        summary["judge"]["calls"] == len(train)
        and judge_usage["calls"] + judge_usage["cached_calls"] == len(train) + 1
    )
    assert judge_usage["calls"] < len(train) + 1
    lib = json.loads((tmp_path / "out" / "learned_behaviors.json").read_text())
    judged = [g for g in lib["updates"][-1]["guidelines"] if g["source"] == "judge"]
    assert {g["text"] for g in judged} == {"Use aux with a fallback.", "Return a value."}


def test_code_review_task_through_an_openai_compatible_server(tmp_path) -> None:
    def reply(body: dict) -> str:
        user = body["messages"][-1]["content"]
        name = "inc" if "inc(" in user else "double"
        if user.startswith("Review this solution"):
            return "Bug: wrong result. Edge case: negative numbers."
        if user.startswith("Problem:"):
            return f"```python\ndef {name}(x):\n    return {FN[name]}\n```"
        return f"```python\ndef {name}(x):\n    return x\n```"

    srv = FakeOpenAI(reply=reply)
    with srv.running():
        cfg = ApiGrpoParams(backend="openai_compatible", model="local-vllm", base_url=srv.url + "/v1",
                            task="code_review", num_episodes=1, k_samples=2, beam_width=1, max_problems_eval=1,
                            cache_path=str(tmp_path / "c.sqlite"), budget_usd=None)  # fmt: skip
        summary = _run(cfg, tmp_path / "out")
    assert srv.requests[0]["method"] == "GET"  # preflight
    ep = json.loads((tmp_path / "out" / "episodes.jsonl").read_text().splitlines()[0])
    assert summary["max_reward"] == pytest.approx(2.1)
    traj = ep["trajectories"][ep["selected"]]
    assert [t["role"] for t in traj["turns"]] == ["writer", "reviewer", "refactorer"]
    assert "return x" in traj["turns"][1]["prompt"] and "Edge case" in traj["turns"][2]["prompt"]
    assert traj["reward"]["total"] == pytest.approx(2.1)  # the refactorer's code passes every test
    assert len(ep["trajectories"]) == 2  # final group = N * k
    assert CodeReview().max_reward == pytest.approx(2.1)


@pytest.mark.slow
def test_stage_library_with_the_embedded_model(tmp_path) -> None:
    """One tiny real run with SmolLM2 (models/base): local backend, batched generate, real rewards, plot."""
    import torch

    from orchestry.problems import read_problems
    from orchestry.reporting.plots_api_grpo import plot_api_grpo

    if (
        not (REPO / "models" / "base" / "model.safetensors").exists()
        or not (REPO / "data/problems/test.jsonl").exists()
    ):
        pytest.skip("models/base or data/problems not prepared")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = ApiGrpoParams(num_episodes=2, behavior_every=2, k_samples=2, beam_width=1, max_tokens=32,
                            max_problems_eval=1, cache_path=str(tmp_path / "c.sqlite"))  # fmt: skip
        train = read_problems(REPO / "data/problems/train.jsonl")
        test = read_problems(REPO / "data/problems/test.jsonl")
        summary = run_api_grpo(cfg, SamplingParams(), train, test, lambda: Sandbox(max_workers=1), tmp_path / "out",
                               model_path=str(REPO / "models" / "base"))  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert (
        summary["episodes_completed"] == 2 and summary["cost"]["usd"] == 0 and summary["cost"]["tokens"] > 0
    )
    assert summary["eval"]["status"] == "done"
    plot_api_grpo(tmp_path / "out", tmp_path / "fig.png")
    assert (tmp_path / "fig.png").stat().st_size > 10_000


def test_plot_from_a_fake_run(tmp_path, key) -> None:
    from orchestry.reporting.plots_api_grpo import plot_api_grpo

    srv = FakeAnthropic(reply=_collab_reply())
    with srv.running():
        _run(_cfg(srv, tmp_path, num_episodes=2), tmp_path / "out")
    plot_api_grpo(tmp_path / "out", tmp_path / "figures" / "api_grpo.png")
    assert (tmp_path / "figures" / "api_grpo.png").stat().st_size > 10_000


def test_judge_agreement_is_logged_and_progress_shown(tmp_path, key, monkeypatch, capsys) -> None:
    """A judge that scores the good transcripts high and the bad ones low agrees with the executable reward:
    Spearman and weighted kappa > 0, logged per block and in summary.json; the bars are drawn when forced on."""
    monkeypatch.setenv("ORCHESTRY_PROGRESS", "1")
    base = _collab_reply()

    def reply(body: dict) -> str:
        user = body["messages"][-1]["content"]
        if "Score the transcript" in user:  # the bad main answer ends with this sentence
            q = 1 if "returns the input unchanged" in user else 9
            return f"QUALITY: {q}\nCOLLABORATION: {q}\nEFFICIENCY: {q}"
        return base(body)

    srv = FakeAnthropic(reply=reply)
    metrics = []
    with srv.running():
        cfg = _cfg(srv, tmp_path, judge={"enabled": True, "extract_behaviors": False}, max_problems_eval=1)
        summary = _run(cfg, tmp_path / "out", on_metrics=lambda m, step: metrics.append((step, m)))
    agree = summary["judge"]["agreement"]
    assert (
        agree["pairs"] == 16 and agree["spearman"] > 0.5 and agree["kappa"] > 0.5
    )  # 4 episodes x 4 trajectories
    logged = [(s, m) for s, m in metrics if "train/judge/kappa" in m]
    assert [s for s, _ in logged] == [2, 4] and logged[-1][1]["train/judge/kappa"] == pytest.approx(
        agree["kappa"]
    )
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["judge"]["agreement"] == agree
    err = capsys.readouterr().err
    assert "api_grpo: train" in err and "4/4" in err and "best=" in err and "reward=" in err
    assert "api_grpo: eval 2 episodes" in err and "2/2" in err  # 1 problem x (with, without); 2 turns


def test_without_judge_the_summary_has_no_agreement(tmp_path, key) -> None:
    srv = FakeAnthropic(reply=_collab_reply())
    with srv.running():
        summary = _run(_cfg(srv, tmp_path, num_episodes=2, max_problems_eval=1), tmp_path / "out")
    assert summary["judge"] == {"enabled": False, "calls": 0, "neutral_fallbacks": 0}
