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

from orchestry.llm.chat import (
    BackendConfigError,
    ChatModel,
    ChatRequest,
    ChatResult,
    PromptTooLong,
    as_messages,
    min_prompt_tokens,
)
from orchestry.llm.cost import (
    BudgetExceeded,
    CostTracker,
    SpendNotRecorded,
    UsageOverrun,
    estimate_tokens,
)

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

_SPEND_SCHEMA = """
CREATE TABLE IF NOT EXISTS spend (
    scope TEXT PRIMARY KEY,
    stage TEXT NOT NULL,
    params TEXT NOT NULL,
    usd REAL NOT NULL DEFAULT 0,
    calls INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    pending_usd REAL NOT NULL DEFAULT 0,
    runs INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    updated REAL NOT NULL
)
"""

#: Params that do not change what an experiment sends (the budget itself, retries, timeouts, parallelism, checks):
#: left out of :func:`budget_scope`, so raising the budget or the timeout continues the same budget.
NOT_IN_SCOPE = frozenset(
    {
        "budget_usd",
        "eval_budget_fraction",
        "timeout_s",
        "max_retries",
        "concurrency",
        "preflight",
        "local_batch_size",
    }
)


def budget_scope(stage: str, section: dict, extra: dict | None = None) -> tuple[str, str]:
    """``(scope, params_json)``: the spend ledger's key of one experiment, ``<stage>:<12 hex>`` (SHA-256 of the
    stage's params section without :data:`NOT_IN_SCOPE`, and of ``extra``, e.g. the ``sampling`` section), and the
    canonical JSON it was made from."""
    params = {k: v for k, v in section.items() if k not in NOT_IN_SCOPE}
    payload = json.dumps(
        {"stage": stage, "params": params, "extra": extra or {}}, sort_keys=True, default=str
    )
    return f"{stage}:{hashlib.sha256(payload.encode()).hexdigest()[:12]}", payload


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
            self._db.execute(_SPEND_SCHEMA)
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

    def _write(self, rows: Sequence[tuple], spend: Sequence[tuple] = ()) -> None:
        """Insert ``rows`` and apply the ledger updates ``spend`` (:meth:`spend_update`) in one transaction (all
        or none)."""
        with self._lock:
            try:
                self._db.executemany(
                    "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
                )
                self._db.executemany(
                    "UPDATE spend SET usd = usd + ?, calls = calls + ?, prompt_tokens = prompt_tokens + ?, "
                    "completion_tokens = completion_tokens + ?, pending_usd = MAX(0, pending_usd - ?), "
                    "updated = ? WHERE scope = ?",
                    spend,
                )
                self._db.commit()
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self._db.rollback()
                raise

    def put_rows(self, rows: Sequence[tuple], spend: Sequence[tuple] = ()) -> None:
        """Write ``rows`` (from :meth:`row`) and the ledger updates ``spend`` (from :meth:`spend_update`) in one
        transaction, retrying a write that may pass later.

        Raises:
            sqlite3.Error: the last attempt's error (locked after ``write_attempts`` tries, disk full, corrupt).
        """
        for attempt in range(self.write_attempts):
            try:
                self._write(rows, spend) if spend else self._write(rows)
                return
            except sqlite3.OperationalError:  # locked, busy, I/O: may pass
                if attempt + 1 == self.write_attempts:
                    raise
                time.sleep(self.retry_wait_s * 2**attempt)

    def put(self, key: str, identity: dict, request: ChatRequest, result: ChatResult) -> None:
        """Write one response (see :meth:`put_rows`)."""
        self.put_rows([self.row(key, identity, request, result)])

    # ---- the spend ledger ----------------------------------------------------------------------------------------
    @staticmethod
    def spend_update(
        scope: str, usd: float, calls: int, prompt_tokens: int, completion_tokens: int, release_usd: float
    ) -> tuple:
        """A ledger update for :meth:`put_rows`: add a paid response's cost and tokens to ``scope`` and move
        ``release_usd`` out of its pending reservation."""
        return (usd, calls, prompt_tokens, completion_tokens, release_usd, time.time(), scope)

    def _ledger(self, sql: str, args: tuple) -> None:
        """One ledger statement in its own transaction, retried like :meth:`put_rows`."""
        for attempt in range(self.write_attempts):
            try:
                with self._lock:
                    try:
                        self._db.execute(sql, args)
                        self._db.commit()
                    except BaseException:
                        with contextlib.suppress(sqlite3.Error):
                            self._db.rollback()
                        raise
                return
            except sqlite3.OperationalError:
                if attempt + 1 == self.write_attempts:
                    raise
                time.sleep(self.retry_wait_s * 2**attempt)

    def open_spend(self, scope: str, stage: str = "", params: str = "") -> tuple[float, float]:
        """Start a run of ``scope``: ``(earlier_usd, orphaned_usd)``, what earlier runs spent, including
        ``orphaned_usd``, the pending reservation a killed run left behind (counted as spent from now on, at its
        worst case).

        Raises:
            CacheFileError: the ledger cannot be read or written (the stage stops before any work).
        """
        now = time.time()
        try:
            self._ledger(
                "INSERT OR IGNORE INTO spend (scope, stage, params, created, updated) VALUES (?, ?, ?, ?, ?)",
                (scope, stage, params, now, now),
            )
            with self._lock:
                orphaned = float(
                    self._db.execute("SELECT pending_usd FROM spend WHERE scope = ?", (scope,)).fetchone()[0]
                )
            self._ledger(
                "UPDATE spend SET usd = usd + pending_usd, pending_usd = 0, runs = runs + 1, updated = ? "
                "WHERE scope = ?",
                (now, scope),
            )
            return float(self.spend(scope)["usd"]), orphaned  # type: ignore[index]
        except sqlite3.DatabaseError as e:
            raise self._file_error(e) from None

    def reserve_spend(self, scope: str, usd: float) -> None:
        """Record ``usd`` as pending on ``scope`` before a batch is sent (durable before any request).

        Raises:
            sqlite3.Error: the write failed after the retries.
        """
        self._ledger(
            "UPDATE spend SET pending_usd = pending_usd + ?, updated = ? WHERE scope = ?",
            (usd, time.time(), scope),
        )

    def spend(self, scope: str) -> dict | None:
        """The ledger row of ``scope`` (``None``: never charged in this file)."""
        rows = [r for r in self.spends() if r["scope"] == scope]
        return rows[0] if rows else None

    def spends(self) -> list[dict]:
        """Every ledger row, newest first: scope, stage, params, usd, calls, tokens, pending_usd, runs, times."""
        with self._lock:
            cur = self._db.execute("SELECT * FROM spend ORDER BY updated DESC")
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def reset_spend(self, scope: str) -> bool:
        """Forget the spend of ``scope`` (on purpose: its next run starts a fresh budget); False if unknown."""
        with self._lock:
            n = self._db.execute("DELETE FROM spend WHERE scope = ?", (scope,)).rowcount
            self._db.commit()
        return n > 0

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
    """The cache writes and the spend of one batch: rows (and their ledger updates) left for one write at the
    end, what failed, each request's worst case, which were settled, and why the batch stopped sending."""

    attempted: int = 0
    failed: int = 0
    deferred: list[tuple] = field(default_factory=list)
    deferred_spend: list[tuple] = field(default_factory=list)
    error: BaseException | None = None
    worst: dict[int, float] = field(default_factory=dict)
    settled: set[int] = field(default_factory=set)
    ledger_reserved: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    overrun: str = ""
    over_limit: bool = False


class CachedChat:
    """A :class:`~orchestry.llm.chat.ChatModel` behind the response cache, the cost tracker and the budget.

    For each batch: cache hits are answered from sqlite (counted as cached, free); identical requests in
    the batch are sent once; before anything is sent the worst-case cost of all misses (input tokens
    estimated from characters, output = ``max_tokens``) is reserved against the budget (and, with a budget
    scope, recorded as pending in the spend ledger), so a batch that might not fit raises
    :class:`orchestry.llm.cost.BudgetExceeded` without sending anything. Each response is charged and kept as it
    arrives, then written to the cache with its spend; if one request fails, the others that succeeded are kept
    and the first error is raised.

    A response whose completion tokens exceed its ``max_tokens`` (a server that ignores the cap, a model that
    bills hidden reasoning tokens) is charged as reported, cached, and, when a budget is set, halts the tracker:
    the batch's requests not yet sent are not sent and :class:`orchestry.llm.cost.UsageOverrun` is raised (and
    by every later batch that would send anything). A response that only costs more than its estimate stops the
    batch the same way once the budget could be passed (:class:`BudgetExceeded`).

    A cache write that fails after the cache's retries does not lose the response: it is still charged and
    returned, the batch's later writes are tried together at its end, and one error line per batch (naming the
    file and the count) is logged; ``cache.write_failures`` counts them. A run is not stopped for a cache it
    cannot write: what was paid for is used, and only a re-run would pay for it again (the ledger keeps the
    batch's pending reservation then, so the budget is still counted). A ledger that cannot be written before a
    batch stops the run (:class:`orchestry.llm.cost.SpendNotRecorded`) before anything is sent.
    """

    def __init__(self, inner: ChatModel, cache: ResponseCache, tracker: CostTracker | None = None):
        self.inner, self.cache = inner, cache
        self.tracker = tracker or CostTracker()
        self.backend, self.model = inner.backend, inner.model
        self._warned_overrun = False

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
            BudgetExceeded: the misses' worst case does not fit in the budget (nothing was sent), or a response
                cost more than its worst case (:class:`UsageOverrun`; charged and cached, the rest not sent).
            SpendNotRecorded: the spend ledger cannot be written (nothing was sent).
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
        self._check_context([requests[i] for i in todo])
        if todo:
            writes = _Writes(worst={i: self.worst_case_usd(requests[i]) for i in todo})
            worst = sum(writes.worst.values())
            self.tracker.reserve(worst)
            try:
                self._reserve_ledger(worst, writes)
                self._send(requests, keys, todo, results, identity, writes)
            finally:
                self.tracker.release(sum(w for i, w in writes.worst.items() if i not in writes.settled))
                self._finish_writes(writes)
            if writes.overrun:
                raise UsageOverrun(writes.overrun, self.tracker.spent_total_usd, self.tracker.limit_usd)
            if writes.over_limit:
                tr = self.tracker
                raise BudgetExceeded(
                    tr.spent_total_usd, 0.0, tr.limit_usd or 0.0, tr.param, tr.earlier_usd, tr.reset_hint
                )
        for i, key in enumerate(keys):  # duplicates inside the batch: served by the first copy
            if results[i] is None:
                src = results[first_of.get(key, i)] or self.cache.get(key)
                results[i] = replace(src, cached=True, seconds=0.0)  # type: ignore[arg-type]
                r = results[i]
                self.tracker.charge(r.prompt_tokens, r.completion_tokens, r.usd, True, requests[i].tags)
        return results  # type: ignore[return-value]

    def _check_context(self, requests: Sequence[ChatRequest]) -> None:
        """Refuse the batch before anything is sent when one request cannot fit the model's context.

        Raises:
            PromptTooLong: names the request's tokens (counted low), its ``max_tokens`` and the context; counts the
                batch's requests that do not fit.
        """
        context = getattr(self.inner, "context_tokens", None)
        if not context:
            return
        over = [(min_prompt_tokens(r.chars()), r) for r in requests]
        over = [(n, r) for n, r in over if n + r.max_tokens > context]
        if over:
            n, r = over[0]
            raise PromptTooLong(
                f"{len(over)} of {len(requests)} request(s) cannot fit {self.backend} model {self.model}'s context "
                f"of {context} tokens: the first has at least {n} prompt tokens + max_tokens {r.max_tokens}; "
                "nothing of this batch was sent or charged (shorten the prompt or lower max_tokens)"
            )

    def _reserve_ledger(self, worst: float, writes: _Writes) -> None:
        """Record the batch's worst case as pending in the ledger before anything is sent (with a scope)."""
        scope = self.tracker.scope
        if scope is None or worst <= 0:
            return
        try:
            self.cache.reserve_spend(scope, worst)
        except sqlite3.Error as e:
            raise SpendNotRecorded(
                f"the spend ledger in {self.cache.path} cannot be written ({type(e).__name__}: {e}): nothing more "
                "is sent, so that a re-run cannot exceed the budget; run again once the file is writable"
            ) from None
        writes.ledger_reserved = True

    @staticmethod
    def _overran(request: ChatRequest, result: ChatResult) -> bool:
        """A paid response with more completion tokens than the request's ``max_tokens``."""
        return result.completion_tokens > request.max_tokens and result.usd > 0

    def _check_usage(self, i: int, request: ChatRequest, result: ChatResult, writes: _Writes) -> None:
        """After charging response ``i``: usage above ``max_tokens`` halts the run (with a budget); a spend past
        the limit stops the batch's unsent requests."""
        tr = self.tracker
        if self._overran(request, result):
            reason = (
                f"{self.backend} model {self.model} answered with {result.completion_tokens} completion tokens to "
                f"a request capped at max_tokens={request.max_tokens} (the server ignores the cap, or bills "
                f"hidden reasoning tokens): charged as reported, {result.usd:.4f} USD against a worst case of "
                f"{writes.worst[i]:.4f} USD"
            )
            if tr.limit_usd is None:
                if not self._warned_overrun:
                    self._warned_overrun = True
                    log.warning("%s; no budget is set, so the run goes on", reason)
                return
            reason += (
                f"; the run stops so that the budget stays hard (spent {tr.spent_total_usd:.4f} of "
                f"{tr.limit_usd:.4f} USD; use a server or model that honours max_tokens)"
            )
            tr.halt(reason)
            writes.overrun = writes.overrun or reason
            writes.stop.set()
        elif tr.over_limit():
            writes.over_limit = True
            writes.stop.set()

    def _store(self, i: int, requests, keys, results, identity, result: ChatResult, writes: _Writes) -> None:
        """Charge and keep a paid response first, then write it and its spend to the cache (a failure is only
        recorded)."""
        result = replace(result, cached=False)
        results[i] = result
        self.tracker.charge(
            result.prompt_tokens, result.completion_tokens, result.usd, False, requests[i].tags
        )
        self.tracker.release(writes.worst[i])
        writes.settled.add(i)
        self._check_usage(i, requests[i], result, writes)
        row = self.cache.row(keys[i], identity, requests[i], result)
        spend = []
        if writes.ledger_reserved and self.tracker.scope is not None:
            spend = [
                self.cache.spend_update(
                    self.tracker.scope, result.usd, 1, result.prompt_tokens, result.completion_tokens,
                    writes.worst[i],
                )
            ]  # fmt: skip
        writes.attempted += 1
        if writes.error is not None:  # the cache already failed in this batch: one more try at its end
            writes.deferred.append(row)
            writes.deferred_spend.extend(spend)
            return
        try:
            self.cache.put_rows([row], spend)
        except sqlite3.Error as e:
            writes.failed += 1
            writes.error = e
            writes.deferred_spend.extend(spend)

    def _finish_writes(self, writes: _Writes) -> None:
        spend = list(writes.deferred_spend)
        unsettled = sum(w for i, w in writes.worst.items() if i not in writes.settled)
        if writes.ledger_reserved and self.tracker.scope is not None and unsettled > 0:
            spend.append(self.cache.spend_update(self.tracker.scope, 0.0, 0, 0, 0, unsettled))
        if writes.deferred or spend:
            try:
                self.cache.put_rows(writes.deferred, spend)
            except sqlite3.Error as e:
                writes.failed += len(writes.deferred)
                writes.error = e
                if spend:
                    log.error(
                        "spend ledger in %s: this batch's spend could not be recorded (%s: %s); its worst case "
                        "stays reserved there and the next run of this experiment counts it as spent",
                        self.cache.path,
                        type(e).__name__,
                        e,
                    )
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

        def send(i: int) -> ChatResult | None:
            if writes.stop.is_set():  # a response cost more than its worst case: send nothing more
                return None
            res = self.inner.complete_batch([requests[i]])[0]
            if self._overran(requests[i], res) and self.tracker.limit_usd is not None:
                writes.stop.set()  # at once, before this worker takes the next request (charged in _store)
            return res

        with cf.ThreadPoolExecutor(workers) as pool:
            futures = {pool.submit(send, i): i for i in todo}
            for fut in cf.as_completed(futures):
                try:
                    res = fut.result()
                except BaseException as e:  # keep the others' paid responses, raise the first error after
                    error = error or e
                    continue
                if res is not None:
                    self._store(futures[fut], requests, keys, results, identity, res, writes)
        if error is not None and not writes.stop.is_set():
            raise error
        if error is not None:
            log.error("a request of the stopped batch failed too: %s: %s", type(error).__name__, error)
