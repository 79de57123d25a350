"""Persistent response cache (sqlite) and the wrapper that puts cache, cost and budget in front of a backend.

Key: SHA-256 of the backend's identity (``identity()``: backend, model, server URL and seed for the API
backends; weights' fingerprint, dtype, seed and batch size for the local one) plus the request's messages,
system prompt, sampling parameters (max_tokens, temperature, top_p) and sample index
(:meth:`orchestry.llm.chat.ChatRequest.key_fields`). The same stage run twice with the same params
therefore sends no request the second time, a run stopped by the budget or a crash resumes for free up to
where it stopped, and runs that differ in anything that changes a sample (e.g. the seeds of a sweep) never
share one.

Each response is charged to the cost tracker and returned as soon as it arrives, then committed to the cache;
a failed write (a file locked by another process fails after ``timeout_s``) is retried, and a write that still
fails never takes a paid response away from the run: it is logged (one error line per batch, naming the file)
and counted in ``ResponseCache.write_failures``, and only a re-run would pay for that response again. A file that
is not a sqlite database raises :class:`CacheFileError`, one line naming the file.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestry.llm.chat import BackendConfigError, ChatModel, ChatRequest, ChatResult, as_messages
from orchestry.llm.cost import CostTracker, estimate_tokens

log = logging.getLogger("orchestry.llm.cache")

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


class CacheFileError(BackendConfigError):
    """The cache file cannot be used (not a sqlite database, or locked when opened); the one-line message names
    the file and ``api_grpo.cache_path``. A :class:`BackendConfigError`, so the stage stops before any work."""


def cache_key(identity: dict, request: ChatRequest) -> str:
    """SHA-256 hex of the canonical JSON of ``identity`` and the request's response-determining fields."""
    payload = json.dumps({"identity": identity, "request": request.key_fields()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


class ResponseCache:
    """A sqlite table of responses; ``hits``/``misses`` count lookups since opening, ``write_failures`` the
    responses that could not be written.

    Args:
        path: the database file (parents created); ``":memory:"`` for a throwaway cache.
        timeout_s: how long one statement waits for another connection's lock (sqlite's busy timeout).
        write_attempts: tries of one write whose failure may pass (locked, busy, I/O); ``retry_wait_s`` doubles
            between them.

    Raises:
        CacheFileError: ``path`` is not a sqlite database (garbage, truncated) or is locked while opening.
    """

    def __init__(
        self, path: str | Path, timeout_s: float = 5.0, write_attempts: int = 3, retry_wait_s: float = 0.5
    ):
        self.path = str(path)
        self.write_attempts, self.retry_wait_s = max(1, write_attempts), retry_wait_s
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.write_failures = 0
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=timeout_s)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
            self._db.commit()
            self._db.execute("SELECT key FROM responses LIMIT 1").fetchall()
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise self._file_error(e) from None

    def _file_error(self, e: sqlite3.DatabaseError) -> CacheFileError:
        if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
            return CacheFileError(
                f"response cache {self.path} is locked by another process ({e}); wait for it to finish, or set "
                "api_grpo.cache_path to another file"
            )
        return CacheFileError(
            f"response cache {self.path} is not a readable sqlite database ({e}); move or delete it (it only "
            "holds cached responses: they would be requested again), or set api_grpo.cache_path to another file"
        )

    def get(self, key: str) -> ChatResult | None:
        """The cached response of ``key`` (``None``: not cached).

        Raises:
            CacheFileError: the file turned out to be corrupt (one line naming it).
        """
        try:
            with self._lock:
                row = self._db.execute(
                    "SELECT text, prompt_tokens, completion_tokens, usd, stop_reason FROM responses WHERE key = ?",
                    (key,),
                ).fetchone()
        except sqlite3.DatabaseError as e:
            raise self._file_error(e) from None
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return ChatResult(row[0], row[1], row[2], row[3], cached=True, seconds=0.0, stop_reason=row[4])

    @staticmethod
    def row(key: str, identity: dict, request: ChatRequest, result: ChatResult) -> tuple:
        """The table row of one response."""
        return (
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
        )

    def _write(self, rows: Sequence[tuple]) -> None:
        """Insert ``rows`` in one transaction (all or none)."""
        with self._lock:
            try:
                self._db.executemany(
                    "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
                )
                self._db.commit()
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self._db.rollback()
                raise

    def put_rows(self, rows: Sequence[tuple]) -> None:
        """Write ``rows`` (from :meth:`row`) in one transaction, retrying a write that may pass later.

        Raises:
            sqlite3.Error: the last attempt's error (locked after ``write_attempts`` tries, disk full, corrupt).
        """
        for attempt in range(self.write_attempts):
            try:
                self._write(rows)
                return
            except sqlite3.OperationalError:  # locked, busy, I/O: may pass
                if attempt + 1 == self.write_attempts:
                    raise
                time.sleep(self.retry_wait_s * 2**attempt)

    def put(self, key: str, identity: dict, request: ChatRequest, result: ChatResult) -> None:
        """Write one response (see :meth:`put_rows`)."""
        self.put_rows([self.row(key, identity, request, result)])

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


@dataclass
class _Writes:
    """The cache writes of one batch: rows left for one write at the end, and what failed."""

    attempted: int = 0
    failed: int = 0
    deferred: list[tuple] = field(default_factory=list)
    error: BaseException | None = None


class CachedChat:
    """A :class:`~orchestry.llm.chat.ChatModel` behind the response cache, the cost tracker and the budget.

    For each batch: cache hits are answered from sqlite (counted as cached, free); identical requests in
    the batch are sent once; before anything is sent the worst-case cost of all misses (input tokens
    estimated from characters, output = ``max_tokens``) is reserved against the budget, so a batch that
    might not fit raises :class:`orchestry.llm.cost.BudgetExceeded` without sending anything. Each response
    is charged and kept as it arrives, then written to the cache; if one request fails, the others that
    succeeded are kept and the first error is raised.

    A cache write that fails after the cache's retries does not lose the response: it is still charged and
    returned, the batch's later writes are tried together at its end, and one error line per batch (naming the
    file and the count) is logged; ``cache.write_failures`` counts them. A run is not stopped for a cache it
    cannot write: what was paid for is used, and only a re-run would pay for it again.
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
            Exception: the backend's error for a failed request (successful ones are charged and cached first).
            CacheFileError: the cache file is corrupt (found while looking responses up, before sending).
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
            writes = _Writes()
            try:
                self._send(requests, keys, todo, results, identity, writes)
            finally:
                self.tracker.release(worst)
                self._finish_writes(writes)
        for i, key in enumerate(keys):  # duplicates inside the batch: served by the first copy
            if results[i] is None:
                src = results[first_of.get(key, i)] or self.cache.get(key)
                results[i] = replace(src, cached=True, seconds=0.0)  # type: ignore[arg-type]
                r = results[i]
                self.tracker.charge(r.prompt_tokens, r.completion_tokens, r.usd, True, requests[i].tags)
        return results  # type: ignore[return-value]

    def _store(self, i: int, requests, keys, results, identity, result: ChatResult, writes: _Writes) -> None:
        """Charge and keep a paid response first, then write it to the cache (a failure is only recorded)."""
        result = replace(result, cached=False)
        results[i] = result
        self.tracker.charge(
            result.prompt_tokens, result.completion_tokens, result.usd, False, requests[i].tags
        )
        row = self.cache.row(keys[i], identity, requests[i], result)
        writes.attempted += 1
        if writes.error is not None:  # the cache already failed in this batch: one more try at its end
            writes.deferred.append(row)
            return
        try:
            self.cache.put_rows([row])
        except sqlite3.Error as e:
            writes.failed += 1
            writes.error = e

    def _finish_writes(self, writes: _Writes) -> None:
        if writes.deferred:
            try:
                self.cache.put_rows(writes.deferred)
            except sqlite3.Error as e:
                writes.failed += len(writes.deferred)
                writes.error = e
        if writes.failed:
            self.cache.write_failures += writes.failed
            log.error(
                "response cache %s: %d of %d paid responses of this batch could not be written (%s: %s); they "
                "are used and charged, but a re-run would pay for them again",
                self.cache.path,
                writes.failed,
                writes.attempted,
                type(writes.error).__name__,
                writes.error,
            )

    def _send(self, requests, keys, todo: list[int], results, identity, writes: _Writes) -> None:
        if getattr(self.inner, "batched", False):
            out = self.inner.complete_batch([requests[i] for i in todo])
            for i, res in zip(todo, out, strict=True):
                self._store(i, requests, keys, results, identity, res, writes)
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
                self._store(futures[fut], requests, keys, results, identity, res, writes)
        if error is not None:
            raise error
