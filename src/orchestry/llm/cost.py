"""Tokens, USD and a hard budget for chat calls.

Tokens come from the API's usage fields (Anthropic ``usage.input_tokens/output_tokens``, OpenAI-compatible
``usage.prompt_tokens/completion_tokens``, the local tokenizer's counts). USD = tokens x a per-model price
(USD per million tokens) from :data:`DEFAULT_PRICES`, overridable in ``params.yaml`` (``api_grpo.prices``).
The prices are Anthropic's published list prices as of the writing of this module (source:
https://docs.anthropic.com/en/docs/about-claude/pricing); check them and override when they change.

The budget is hard: :meth:`CostTracker.reserve` refuses a call whose worst case (input tokens estimated from
the characters sent, output = the call's ``max_tokens``) would push the spend past the limit, *before* the
call is made, so the spend never exceeds the budget except by the error of the input-token estimate. A
response whose usage exceeds its worst case (a server that ignores ``max_tokens``, a reasoning model billing
hidden tokens) is charged as reported and stops the run (:meth:`CostTracker.halt`, :class:`UsageOverrun`). A
warning is logged once at 80 % of the budget.

The budget covers an experiment across processes: a tracker with a ``scope`` starts from ``earlier_usd``, what
earlier runs of the same scope spent (the spend ledger in the response cache's database,
:mod:`orchestry.llm.cache`), so a run stopped by the budget or killed and started again continues the same
budget instead of a fresh one.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger("orchestry.llm.cost")

WARN_FRACTION = 0.8
CHARS_PER_TOKEN = 3.0  # conservative: English/code averages about 3.5-4 characters per token

# model id -> (USD per million input tokens, USD per million output tokens). Matched exactly or with a
# date suffix (``claude-haiku-4-5-20251001``); an unknown model has no price (see ``price_for``).
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4-0": (15.0, 75.0),
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-sonnet-4-0": (3.0, 15.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "claude-3-haiku": (0.25, 1.25),
}

# Anthropic prompt caching multipliers on the input price (cache write 5 min: 1.25x, cache read: 0.1x).
CACHE_WRITE_MULTIPLIER = 1.25
CACHE_READ_MULTIPLIER = 0.1


class BudgetExceeded(RuntimeError):
    """The next call would exceed the hard budget; nothing was sent. ``spent_usd``/``limit_usd`` in USD.

    ``spent_usd`` includes ``earlier_usd``, the spend of earlier runs of the same budget scope (the ledger);
    ``param`` is the parameter to raise (``api_grpo.budget_usd``), ``reset`` how to forget the ledger on purpose.
    """

    def __init__(
        self,
        spent_usd: float,
        needed_usd: float,
        limit_usd: float,
        param: str = "api_grpo.budget_usd",
        earlier_usd: float = 0.0,
        reset: str = "",
    ):
        self.spent_usd, self.needed_usd, self.limit_usd = spent_usd, needed_usd, limit_usd
        self.earlier_usd = earlier_usd
        earlier = f" ({earlier_usd:.4f} USD of it by earlier runs of this experiment)" if earlier_usd else ""
        super().__init__(
            f"budget reached: spent {spent_usd:.4f} USD{earlier}, the next call(s) may cost up to "
            f"{needed_usd:.4f} USD, limit {limit_usd:.4f} USD (raise {param} to continue"
            + (f"; {reset}" if reset else "")
            + ")"
        )


class UsageOverrun(BudgetExceeded):
    """A response cost more than its worst case (usage above ``max_tokens``): it was charged as reported and the
    run stops, so that the budget stays hard. ``reason`` says which request and by how much."""

    def __init__(self, reason: str, spent_usd: float, limit_usd: float | None):
        self.reason = reason
        self.spent_usd, self.needed_usd, self.limit_usd = spent_usd, 0.0, limit_usd
        self.earlier_usd = 0.0
        RuntimeError.__init__(self, reason)


class SpendNotRecorded(BudgetExceeded):
    """The spend ledger cannot be written: nothing more is sent, so that a re-run cannot exceed the budget."""

    def __init__(self, reason: str):
        self.reason = reason
        self.spent_usd = self.needed_usd = self.earlier_usd = 0.0
        self.limit_usd = None
        RuntimeError.__init__(self, reason)


class PriceError(ValueError):
    """No price is known for a paid model; the message names the ``api_grpo.prices`` parameter."""


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input_usd_per_mtok: float
    output_usd_per_mtok: float

    def usd(
        self, prompt_tokens: int, completion_tokens: int, cache_write: int = 0, cache_read: int = 0
    ) -> float:
        """Cost in USD of one call; ``prompt_tokens`` excludes the cache-write/cache-read tokens."""
        per_in = self.input_usd_per_mtok / 1e6
        return (
            prompt_tokens * per_in
            + cache_write * per_in * CACHE_WRITE_MULTIPLIER
            + cache_read * per_in * CACHE_READ_MULTIPLIER
            + completion_tokens * self.output_usd_per_mtok / 1e6
        )


FREE = Price(0.0, 0.0)


def price_for(model: str, overrides: Mapping[str, object] | None = None, free: bool = False) -> Price | None:
    """The price of ``model``: ``overrides`` first, then :data:`DEFAULT_PRICES`; ``None`` when unknown.

    A key matches the model id exactly or as a prefix followed by ``-2`` (a date suffix). ``overrides``
    values may be :class:`Price`, objects with ``input_usd_per_mtok``/``output_usd_per_mtok`` attributes,
    dicts with those keys, or ``(input, output)`` pairs. ``free=True`` (the local backend) returns 0 USD.
    """
    if free:
        return FREE
    for table in (overrides or {}, DEFAULT_PRICES):
        for key in sorted(table, key=len, reverse=True):
            if model == key or model.startswith(key + "-2"):
                return _as_price(table[key])
    return None


def _as_price(value: object) -> Price:
    if isinstance(value, Price):
        return value
    if isinstance(value, Mapping):
        return Price(float(value["input_usd_per_mtok"]), float(value["output_usd_per_mtok"]))
    if isinstance(value, tuple | list):
        return Price(float(value[0]), float(value[1]))
    return Price(float(value.input_usd_per_mtok), float(value.output_usd_per_mtok))  # type: ignore[attr-defined]


def require_price(
    model: str, overrides: Mapping[str, object] | None, free: bool, budget_usd: float | None
) -> Price:
    """:func:`price_for`, raising when a budget is set and no price is known (before any work).

    Raises:
        PriceError: naming ``api_grpo.prices`` (set ``{input_usd_per_mtok: .., output_usd_per_mtok: ..}``;
            0 for a free self-hosted server) or ``api_grpo.budget_usd: null`` to run without a cap.
    """
    price = price_for(model, overrides, free)
    if price is not None:
        return price
    if budget_usd is None:
        log.warning("no price known for model %r: USD will be reported as 0 (no budget set)", model)
        return FREE
    raise PriceError(
        f"no price known for model {model!r}: set api_grpo.prices.{model} = "
        "{input_usd_per_mtok: <USD>, output_usd_per_mtok: <USD>} in params.yaml (0 and 0 for a free "
        "self-hosted server), or api_grpo.budget_usd: null to run without a budget"
    )


def estimate_tokens(text_chars: int) -> int:
    """Upper-side estimate of the tokens of ``text_chars`` characters (``CHARS_PER_TOKEN`` per token)."""
    return int(text_chars / CHARS_PER_TOKEN) + 8


@dataclass
class Usage:
    """Accumulated usage of one run.

    ``calls``, ``prompt_tokens``, ``completion_tokens``, ``usd``: requests actually sent in this run (what was
    spent now). ``cached`` calls were served by the cache; ``cached_tokens``/``cached_usd`` are what those
    responses cost when they were first made. ``consumed_*`` = both together: the cost of the work as such,
    the same on a fresh and on a cached re-run.
    """

    calls: int = 0
    cached: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float = 0.0
    cached_tokens: int = 0
    cached_usd: float = 0.0

    def add(self, prompt_tokens: int, completion_tokens: int, usd: float, cached: bool) -> None:
        if cached:
            self.cached += 1
            self.cached_tokens += prompt_tokens + completion_tokens
            self.cached_usd += usd
        else:
            self.calls += 1
            self.prompt_tokens += prompt_tokens
            self.completion_tokens += completion_tokens
            self.usd += usd

    @property
    def consumed_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens + self.cached_tokens

    @property
    def consumed_usd(self) -> float:
        return self.usd + self.cached_usd

    def to_dict(self) -> dict:
        total = self.calls + self.cached
        return {
            "calls": self.calls,
            "cached_calls": self.cached,
            "cache_hit_rate": self.cached / total if total else 0.0,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "tokens": self.prompt_tokens + self.completion_tokens,
            "usd": self.usd,
            "usd_saved_by_cache": self.cached_usd,
            "consumed_tokens": self.consumed_tokens,
            "consumed_usd": self.consumed_usd,
        }


@dataclass
class CostTracker:
    """Spend so far, per tag (e.g. ``helper``, ``judge``, ``episode:3``), and the hard budget.

    Attributes:
        budget_usd: the hard total cap in USD (``None``: no cap).
        limit_usd: the cap currently enforced (``<= budget_usd``; a phase may keep part of the budget back).
        status: ``"ok"``, ``"warned"`` (80 % reached) or ``"exhausted"`` (a call was refused, or a response cost
            more than its worst case: :meth:`halt`).
        scope: the budget scope of the spend ledger (:func:`orchestry.llm.cache.budget_scope`; ``None``: this
            process only); ``earlier_usd``: what earlier runs of the scope spent, counted against the budget.
        param: the parameter named in messages (``api_grpo.budget_usd``); ``reset_hint``: how to forget the
            ledger's spend on purpose (named when the budget is reached).

    Only calls actually sent count against the budget; cache hits are counted separately
    (``Usage.cached``) and cost nothing.
    """

    budget_usd: float | None = None
    limit_usd: float | None = None
    total: Usage = field(default_factory=Usage)
    by_tag: dict[str, Usage] = field(default_factory=lambda: defaultdict(Usage))
    status: str = "ok"
    scope: str | None = None
    earlier_usd: float = 0.0
    param: str = "api_grpo.budget_usd"
    reset_hint: str = ""
    halted: str = ""
    _reserved: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.limit_usd is None:
            self.limit_usd = self.budget_usd
        if self.budget_usd and self.earlier_usd >= WARN_FRACTION * self.budget_usd:
            self.status = "warned"

    @property
    def spent_usd(self) -> float:
        """USD sent in this process."""
        return self.total.usd

    @property
    def spent_total_usd(self) -> float:
        """USD counted against the budget: earlier runs of the scope plus this process."""
        return self.earlier_usd + self.total.usd

    def reserve(self, worst_case_usd: float) -> None:
        """Reserve ``worst_case_usd`` for calls about to be sent (all or nothing).

        Raises:
            UsageOverrun: the run was halted (:meth:`halt`); nothing more may be sent.
            BudgetExceeded: earlier + spent + reserved + ``worst_case_usd`` > ``limit_usd``; status becomes
                exhausted.
        """
        with self._lock:
            if self.halted:
                self.status = "exhausted"
                raise UsageOverrun(self.halted, self.spent_total_usd, self.limit_usd)
            committed = self.earlier_usd + self.total.usd + self._reserved
            if self.limit_usd is not None and committed + worst_case_usd > self.limit_usd:
                self.status = "exhausted"
                raise BudgetExceeded(
                    committed, worst_case_usd, self.limit_usd, self.param, self.earlier_usd, self.reset_hint
                )
            self._reserved += worst_case_usd

    def release(self, worst_case_usd: float) -> None:
        """Give back a reservation (after the call was charged or failed)."""
        with self._lock:
            self._reserved = max(0.0, self._reserved - worst_case_usd)

    def over_limit(self) -> bool:
        """Earlier + spent + still reserved exceeds the limit (only after a response cost more than its
        worst case): the calls not yet sent must not be sent."""
        with self._lock:
            committed = self.earlier_usd + self.total.usd + self._reserved
            return self.limit_usd is not None and committed > self.limit_usd + 1e-12

    def halt(self, reason: str) -> None:
        """Stop the run: every later :meth:`reserve` raises :class:`UsageOverrun` with ``reason``."""
        with self._lock:
            self.halted = self.halted or reason
            self.status = "exhausted"

    def charge(
        self, prompt_tokens: int, completion_tokens: int, usd: float, cached: bool, tags: tuple[str, ...] = ()
    ) -> None:
        """Record one call (``cached``: served by the cache, free now) under the total and each tag."""
        with self._lock:
            self.total.add(prompt_tokens, completion_tokens, usd, cached)
            for tag in tags:
                self.by_tag[tag].add(prompt_tokens, completion_tokens, usd, cached)
            spent = self.earlier_usd + self.total.usd
            if self.budget_usd and self.status == "ok" and spent >= WARN_FRACTION * self.budget_usd:
                self.status = "warned"
                log.warning(
                    "spent %.4f USD = %.0f%% of the budget %.4f USD (%s)",
                    spent,
                    100 * spent / self.budget_usd,
                    self.budget_usd,
                    self.param,
                )

    def budget_fraction(self) -> float:
        """Spent (earlier runs of the scope included) / budget (0 when there is no budget)."""
        return self.spent_total_usd / self.budget_usd if self.budget_usd else 0.0

    def snapshot(self) -> dict:
        """Flat totals for logging: calls, cached_calls, cache_hit_rate, tokens, usd, budget_fraction, status,
        and ``earlier_usd`` (spent by earlier runs of the budget scope)."""
        d = self.total.to_dict()
        d.update(
            budget_usd=self.budget_usd,
            budget_fraction=self.budget_fraction(),
            budget_status=self.status,
            earlier_usd=self.earlier_usd,
        )
        return d
