"""Persistent response cache (sqlite) and the wrapper that puts cache, cost and budget in front of a backend.

Key: SHA-256 of the backend's identity (backend, model, and for the local backend the weights' fingerprint
and seed) plus the request's messages, system prompt, sampling parameters and sample index
(:meth:`orchestry.llm.backends.ChatRequest.key_fields`). The same stage run twice with the same params
therefore sends no request the second time, and a run stopped by the budget or a crash resumes for free
up to where it stopped.

Each response is committed as soon as it arrives, so a paid response is never lost.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from orchestry.llm.backends import ChatModel, ChatRequest, ChatResult, as_messages
from orchestry.llm.cost import CostTracker, estimate_tokens

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    model TEXT NOT NULL,
    request TEXT NOT NULL,
    text TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    usd REAL NOT NULL,
    seconds REAL NOT NULL,
    stop_reason TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def cache_key(identity: dict, request: ChatRequest) -> str:
    """SHA-256 hex of the canonical JSON of ``identity`` and the request's response-determining fields."""
    payload = json.dumps({"identity": identity, "request": request.key_fields()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


class ResponseCache:
    """A sqlite table of responses; ``hits``/``misses`` count lookups since opening.

    Args:
        path: the database file (parents created); ``":memory:"`` for a throwaway cache.
    """

    def __init__(self, path: str | Path):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        self._db.commit()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> ChatResult | None:
        with self._lock:
            row = self._db.execute(
                "SELECT text, prompt_tokens, completion_tokens, usd, stop_reason FROM responses WHERE key = ?",
                (key,),
            ).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return ChatResult(row[0], row[1], row[2], row[3], cached=True, seconds=0.0, stop_reason=row[4])

    def put(self, key: str, identity: dict, request: ChatRequest, result: ChatResult) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    str(identity.get("backend", "")),
                    str(identity.get("model", "")),
                    json.dumps(request.key_fields()),
                    result.text,
                    result.prompt_tokens,
                    result.completion_tokens,
                    result.usd,
                    result.seconds,
                    result.stop_reason,
                    time.time(),
                ),
            )
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    @property
    def hit_rate(self) -> float:
        """Hits / lookups since opening (0 when nothing was looked up)."""
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    def close(self) -> None:
        with self._lock:
            self._db.close()


class CachedChat:
    """A :class:`~orchestry.llm.backends.ChatModel` behind the response cache, the cost tracker and the budget.

    For each batch: cache hits are answered from sqlite (counted as cached, free); identical requests in
    the batch are sent once; before anything is sent the worst-case cost of all misses (input tokens
    estimated from characters, output = ``max_tokens``) is reserved against the budget, so a batch that
    might not fit raises :class:`orchestry.llm.cost.BudgetExceeded` without sending anything. Responses are
    cached and charged as they arrive; if one request fails, the others that succeeded are kept and the
    first error is raised.
    """

    def __init__(self, inner: ChatModel, cache: ResponseCache, tracker: CostTracker | None = None):
        self.inner, self.cache = inner, cache
        self.tracker = tracker or CostTracker()
        self.backend, self.model = inner.backend, inner.model

    def worst_case_usd(self, request: ChatRequest) -> float:
        """Upper-side cost estimate of one request in USD (see the class docstring)."""
        return self.inner.price.usd(estimate_tokens(request.chars()), request.max_tokens)

    def complete(self, messages, system: str | None = None, sample_index: int = 0, max_tokens: int = 256,
                 temperature: float | None = None, top_p: float | None = None,
                 tags: tuple[str, ...] = ()) -> ChatResult:  # fmt: skip
        """One request (see :meth:`complete_batch`)."""
        req = ChatRequest(as_messages(messages), system, sample_index, max_tokens, temperature, top_p, tags)
        return self.complete_batch([req])[0]

    def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatResult]:
        """Answer every request, from the cache when possible; results in input order.

        Raises:
            BudgetExceeded: the misses' worst case does not fit in the budget (nothing was sent).
            Exception: the backend's error for a failed request (successful ones are cached first).
        """
        identity = self.inner.identity()
        keys = [cache_key(identity, r) for r in requests]
        results: list[ChatResult | None] = [None] * len(requests)
        first_of: dict[str, int] = {}
        for i, (req, key) in enumerate(zip(requests, keys, strict=True)):
            if key in first_of:
                continue
            hit = self.cache.get(key)
            if hit is not None:
                results[i] = hit
                self.tracker.charge(hit.prompt_tokens, hit.completion_tokens, hit.usd, True, req.tags)
            else:
                first_of[key] = i
        todo = list(first_of.values())
        if todo:
            worst = sum(self.worst_case_usd(requests[i]) for i in todo)
            self.tracker.reserve(worst)
            try:
                self._send(requests, keys, todo, results, identity)
            finally:
                self.tracker.release(worst)
        for i, key in enumerate(keys):  # duplicates inside the batch: served by the first copy
            if results[i] is None:
                src = results[first_of.get(key, i)] or self.cache.get(key)
                results[i] = replace(src, cached=True, seconds=0.0)  # type: ignore[arg-type]
                r = results[i]
                self.tracker.charge(r.prompt_tokens, r.completion_tokens, r.usd, True, requests[i].tags)
        return results  # type: ignore[return-value]

    def _store(self, i: int, requests, keys, results, identity, result: ChatResult) -> None:
        self.cache.put(keys[i], identity, requests[i], result)
        result = replace(result, cached=False)
        results[i] = result
        self.tracker.charge(
            result.prompt_tokens, result.completion_tokens, result.usd, False, requests[i].tags
        )

    def _send(self, requests, keys, todo: list[int], results, identity) -> None:
        if getattr(self.inner, "batched", False):
            out = self.inner.complete_batch([requests[i] for i in todo])
            for i, res in zip(todo, out, strict=True):
                self._store(i, requests, keys, results, identity, res)
            return
        workers = max(1, min(getattr(self.inner, "concurrency", 1), len(todo)))
        error: BaseException | None = None
        with cf.ThreadPoolExecutor(workers) as pool:
            futures = {pool.submit(self.inner.complete_batch, [requests[i]]): i for i in todo}
            for fut in cf.as_completed(futures):
                try:
                    res = fut.result()[0]
                except BaseException as e:  # keep the others' paid responses, raise the first error after
                    error = error or e
                    continue
                self._store(futures[fut], requests, keys, results, identity, res)
        if error is not None:
            raise error
