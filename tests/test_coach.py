"""Coach process rewards: the parser, and the Coach through the real backends' code path against local fake APIs.

The real openai SDK (OpenAI-compatible backend) and the real anthropic SDK talk to tests/fake_llm_servers.py,
behind the real response cache and cost tracker (:class:`orchestry.llm.cache.CachedChat`).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from fake_llm_servers import FakeAnthropic, FakeOpenAI, openai_error

from orchestry.llm.backends import AnthropicChat, OpenAICompatibleChat
from orchestry.llm.cache import CachedChat, ResponseCache
from orchestry.llm.cost import BudgetExceeded, CostTracker, Price
from orchestry.rewards.coach import (
    Coach,
    coach_prompt,
    first_number,
    mix_rewards,
    parse_feedback,
    parse_process_score,
)

PROMPT = coach_prompt("Write inc(x) returning x + 1.", "helper", "def aux(x):\n    return x + 1",
                      previous_feedback="Define aux first.")  # fmt: skip
GOOD = "FEEDBACK: aux is correct and reusable.\nPROCESS_SCORE: 7"


def _is_reask(body: dict) -> bool:
    return any(m["role"] == "assistant" for m in body["messages"])


def _openai_coach(srv: FakeOpenAI, tracker: CostTracker | None = None, **kw) -> Coach:
    chat = OpenAICompatibleChat("coach-model", srv.url + "/v1", price=Price(1.0, 1.0), **kw)
    return Coach(CachedChat(chat, ResponseCache(":memory:"), tracker or CostTracker()))


def test_parser_good_bad_out_of_range_and_no_number() -> None:
    assert parse_process_score("FEEDBACK: fine\nPROCESS_SCORE: 7") == 7.0
    assert parse_process_score("**Process score** = 8.5") is None  # the bold label breaks the key
    assert parse_process_score("process_score: **8.5**") == 8.5
    assert (
        parse_process_score("PROCESS_SCORE: 12") == 10.0 and parse_process_score("PROCESS_SCORE: -3") == 0.0
    )
    assert parse_process_score("I would give it 7") is None and parse_process_score(None) is None
    assert first_number("I would give it 7 of 10") == 7.0 and first_number("about 42") == 10.0
    assert first_number("no digits here") is None
    assert parse_feedback(GOOD) == "aux is correct and reusable."
    assert parse_feedback("Looks fine.\nPROCESS_SCORE: 6") == "Looks fine."
    assert "helper agent" in PROMPT and "Define aux first." in PROMPT and "PROCESS_SCORE" in PROMPT


def test_good_answer_through_openai_compatible_and_costed() -> None:
    srv = FakeOpenAI(reply=lambda b: GOOD)
    tracker = CostTracker()
    with srv.running():
        coach = _openai_coach(srv, tracker)
        [s] = coach.score([PROMPT])
    assert (s.score, s.feedback, s.how) == (7.0, "aux is correct and reusable.", "format")
    assert len(srv.posts) == 1 and srv.posts[0]["body"]["messages"][1]["content"] == PROMPT
    assert coach.counters() == {"calls": 1, "reasks": 0, "fallbacks": 0, "failures": 0}
    assert tracker.by_tag["coach"].usd > 0  # charged under the coach tag


def test_bad_then_good_answer_reasks_once() -> None:
    srv = FakeOpenAI(reply=lambda b: GOOD if _is_reask(b) else "Nice work overall!")
    with srv.running():
        coach = _openai_coach(srv)
        [s] = coach.score([PROMPT])
    assert (s.score, s.how) == (7.0, "retry")
    assert len(srv.posts) == 2
    sent = srv.posts[1]["body"]["messages"]
    assert (
        sent[2] == {"role": "assistant", "content": "Nice work overall!"}
        and "PROCESS_SCORE" in sent[3]["content"]
    )
    assert coach.counters() == {"calls": 2, "reasks": 1, "fallbacks": 0, "failures": 0}


def test_bad_twice_takes_the_first_number_or_neutral(caplog) -> None:
    answers = {"step A": ("I'd say 6 out of 10.", "still six"), "step B": ("Looks good.", "Really good.")}

    def reply(body: dict) -> str:
        first, second = next(v for k, v in answers.items() if k in body["messages"][1]["content"])
        return second if _is_reask(body) else first

    srv = FakeOpenAI(reply=reply)
    with srv.running(), caplog.at_level(logging.WARNING, logger="orchestry.rewards.coach"):
        coach = _openai_coach(srv)
        a, b = coach.score([coach_prompt("t", "main", "step A"), coach_prompt("t", "main", "step B")])
    assert (a.score, a.how) == (6.0, "number")
    assert (b.score, b.how) == (5.0, "neutral")
    assert coach.counters() == {"calls": 4, "reasks": 2, "fallbacks": 1, "failures": 1}
    assert "no score for 1 of 2 steps" in caplog.text


def test_server_error_gives_neutral_counted_and_logged(caplog) -> None:
    srv = FakeOpenAI(reply=lambda b: GOOD)
    srv.script = [openai_error(500)]
    with srv.running(), caplog.at_level(logging.WARNING, logger="orchestry.rewards.coach"):
        coach = _openai_coach(srv, max_retries=0)
        [s] = coach.score([PROMPT])
    assert (s.score, s.how, s.feedback) == (5.0, "error", "")
    assert coach.counters() == {"calls": 0, "reasks": 0, "fallbacks": 0, "failures": 1}
    assert "coach call failed" in caplog.text and "HTTP 500" in caplog.text


def test_cache_hit_on_repeat_sends_nothing() -> None:
    srv = FakeOpenAI(reply=lambda b: GOOD)
    with srv.running():
        coach = _openai_coach(srv)
        first = coach.score([PROMPT])
        again = coach.score([PROMPT])
    assert len(srv.posts) == 1 and again == first
    assert coach.client.cache.hits == 1 and coach.client.tracker.total.cached == 1


def test_budget_stop_propagates() -> None:
    srv = FakeOpenAI(reply=lambda b: GOOD)
    with srv.running():
        chat = OpenAICompatibleChat("m", srv.url + "/v1", price=Price(1e6, 1e6))
        coach = Coach(CachedChat(chat, ResponseCache(":memory:"), CostTracker(budget_usd=0.01)))
        with pytest.raises(BudgetExceeded):
            coach.score([PROMPT])
    assert srv.posts == []


def test_anthropic_sdk_path(monkeypatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    srv = FakeAnthropic(reply=lambda b: "FEEDBACK: main ignores aux.\nPROCESS_SCORE: 3")
    with srv.running():
        chat = AnthropicChat("claude-haiku-4-5", base_url=srv.url, max_retries=0, price=Price(1.0, 5.0))
        coach = Coach(CachedChat(chat, ResponseCache(":memory:")))
        [s] = coach.score([PROMPT], tags=[("coach", "agent:main")])
    assert (s.score, s.feedback, s.how) == (3.0, "main ignores aux.", "format")
    assert srv.posts[0]["path"] == "/v1/messages" and srv.posts[0]["body"]["system"].startswith(
        "You are a coach"
    )


def test_mix_rewards() -> None:
    assert mix_rewards(8.0, 2.0, 0.1, 1.0) == pytest.approx(2.8)
    np.testing.assert_allclose(mix_rewards([10, 0], [4.0, 1.0], 0.5, 0.5), [7.0, 0.5])
    with pytest.raises(ValueError, match="weights"):
        mix_rewards(1.0, 1.0, -0.1, 1.0)
    with pytest.raises(ValueError, match="broadcast"):
        mix_rewards([1, 2, 3], [1, 2], 0.5, 0.5)


def test_few_shot_puts_the_worked_examples_before_the_question() -> None:
    from orchestry.rewards.coach import FEW_SHOT

    srv = FakeOpenAI(reply=lambda b: GOOD)
    with srv.running():
        chat = OpenAICompatibleChat("coach-model", srv.url + "/v1", price=Price(1.0, 1.0))
        coach = Coach(CachedChat(chat, ResponseCache(":memory:"), CostTracker()), few_shot=True)
        [s] = coach.score([PROMPT])
    assert s.score == 7.0
    sent = srv.posts[0]["body"]["messages"][1:]  # after the system message
    assert [(m["role"], m["content"]) for m in sent] == [*FEW_SHOT, ("user", PROMPT)]
    assert "PROCESS_SCORE: 2" in FEW_SHOT[1][1] and "PROCESS_SCORE: 9" in FEW_SHOT[3][1]
