"""The response cache when its sqlite file misbehaves: a paid response is always charged and returned, a write
that cannot happen is retried then reported, and a corrupt file is named in one line."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence

import pytest

from orchestry.llm.backends import ChatRequest, ChatResult
from orchestry.llm.cache import CachedChat, ResponseCache
from orchestry.llm.cost import CostTracker, Price


class _PaidBackend:
    """A backend that answers every request at 0.1 USD (no server needed)."""

    backend, model, price = "fake", "paid-model", Price(1.0, 1.0)

    def __init__(self, batched: bool, concurrency: int = 2):
        self.batched, self.concurrency = batched, concurrency
        self.sent: list[ChatRequest] = []

    def identity(self) -> dict:
        return {"backend": self.backend, "model": self.model}

    def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatResult]:
        self.sent.extend(requests)
        return [ChatResult(f"answer to {r.messages[0][1]}", 50_000, 16, 0.1) for r in requests]


def _reqs(n: int = 3) -> list[ChatRequest]:
    return [ChatRequest((("user", f"q{i}"),), "sys", 0, 16) for i in range(n)]


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "concurrent"])
def test_locked_cache_file_loses_no_paid_response(tmp_path, caplog, batched) -> None:
    path = tmp_path / "cache.sqlite"
    cache = ResponseCache(path)
    cache._db.execute(
        "PRAGMA busy_timeout = 100"
    )  # as timeout_s=0.1: a locked file fails after 0.1 s, not 5 s
    cache.retry_wait_s = 0.01
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    tracker = CostTracker(budget_usd=10.0)
    inner = _PaidBackend(batched)
    with caplog.at_level(logging.WARNING, logger="orchestry.llm.cache"):
        results = CachedChat(inner, cache, tracker).complete_batch(_reqs())
    # every paid response is returned and charged although none could be cached
    assert [r.text for r in results] == ["answer to q0", "answer to q1", "answer to q2"]
    assert not any(r.cached for r in results)
    assert tracker.total.calls == 3 and tracker.total.usd == pytest.approx(0.3)
    assert cache.write_failures == 3
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1  # one clear line for the batch, naming the file
    assert str(path) in errors[0].getMessage() and "3 of 3" in errors[0].getMessage()
    # the lock goes away: the next batch is cached again
    other.execute("ROLLBACK")
    other.close()
    CachedChat(inner, cache, tracker).complete_batch(_reqs())
    assert len(cache) == 3 and len(inner.sent) == 6
    again = CachedChat(inner, cache, CostTracker()).complete_batch(_reqs())
    assert all(r.cached for r in again) and len(inner.sent) == 6


def test_a_write_that_fails_once_is_retried(tmp_path) -> None:
    class Flaky(ResponseCache):
        fails = 2

        def _write(self, row) -> None:
            if self.fails:
                self.fails -= 1
                raise sqlite3.OperationalError("database is locked")
            super()._write(row)

    cache = Flaky(tmp_path / "c.sqlite", retry_wait_s=0.0)
    tracker = CostTracker()
    results = CachedChat(_PaidBackend(batched=True), cache, tracker).complete_batch(_reqs(2))
    assert len(results) == 2 and len(cache) == 2 and cache.write_failures == 0
    assert tracker.total.calls == 2


def test_corrupt_cache_file_gives_one_line_naming_the_file(tmp_path) -> None:
    path = tmp_path / "cache.sqlite"
    path.write_bytes(b"this is not a database \x00\xff" * 400)
    with pytest.raises(Exception) as err:
        ResponseCache(path)
    msg = str(err.value)
    assert not isinstance(err.value, sqlite3.Error)
    assert str(path) in msg and "\n" not in msg and "api_grpo.cache_path" in msg


def test_corrupt_cache_file_stops_the_stage_before_any_work(tmp_path) -> None:
    """The stage prints BackendConfigError as one `error:` line; a corrupt cache is one of them."""
    from orchestry.config import ApiGrpoParams, SamplingParams
    from orchestry.llm.backends import BackendConfigError
    from orchestry.llm.clients import open_clients

    path = tmp_path / "cache.sqlite"
    path.write_bytes(b"\xde\xad\xbe\xef" * 2048)
    cfg = ApiGrpoParams(backend="openai_compatible", model="m", base_url="http://127.0.0.1:9/v1", preflight=False,
                        budget_usd=None, cache_path=str(path))  # fmt: skip
    with pytest.raises(BackendConfigError, match="not a readable sqlite"):
        open_clients(cfg, SamplingParams())
