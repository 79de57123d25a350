"""The clients of the loops that talk to a chat model (API-GRPO and the learned orchestrator), opened by one
:func:`open_clients`: the backend(s) behind the response cache and the cost tracker with the training share of the
hard budget and its spend ledger (:func:`open_budget`: the budget covers the experiment across runs), and the
sampling settings sent to the backend. :func:`backend_options` are the keyword arguments every chat backend of a
section is made with (the coach's too).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestry.llm.backends import BackendConfigError, make_backend
from orchestry.llm.cache import CachedChat, ResponseCache, budget_scope
from orchestry.llm.cost import WARN_FRACTION, CostTracker, require_price
from orchestry.paths import repo_relative, resolve_path

log = logging.getLogger("orchestry.llm.clients")

if TYPE_CHECKING:
    from orchestry.config import ApiClientParams, ApiGrpoParams, SamplingParams, TrainOrchestratorParams


@dataclass
class Clients:
    """The cached, costed clients of one run and the sampling settings resolved from params (``judge_chat``: API-GRPO's
    judge, ``None`` when it has none or for the orchestrator)."""

    chat: CachedChat
    tracker: CostTracker
    cache: ResponseCache
    max_tokens: int
    temperature: float | None
    top_p: float | None
    judge_chat: CachedChat | None = None

    def close(self) -> None:
        self.cache.close()
        for c in {
            id(x): x for x in (self.chat.inner, self.judge_chat.inner if self.judge_chat else None) if x
        }.values():
            getattr(c, "close", lambda: None)()


def backend_options(cfg: ApiClientParams, model_path: str, model_dtype: str) -> dict[str, Any]:
    """The keyword arguments of :func:`orchestry.llm.backends.make_backend` that come from a section's client
    params (``api_grpo``, ``train_orchestrator``, ``train_magrpo.coach``)."""
    return dict(
        base_url=cfg.base_url,
        api_key_env=cfg.api_key_env,
        timeout_s=cfg.timeout_s,
        max_retries=cfg.max_retries,
        concurrency=cfg.concurrency,
        seed=cfg.seed,
        local_model_path=model_path,
        local_dtype=model_dtype,
        local_batch_size=cfg.local_batch_size,
    )


def training_tracker(cfg: ApiGrpoParams | TrainOrchestratorParams) -> CostTracker:
    """The run's cost tracker: the hard budget (``<section>.budget_usd``), of which training may spend
    ``1 - eval_budget_fraction``."""
    limit = None if cfg.budget_usd is None else cfg.budget_usd * (1 - cfg.eval_budget_fraction)
    return CostTracker(budget_usd=cfg.budget_usd, limit_usd=limit, param=f"{cfg.SECTION}.budget_usd")


def open_budget(
    tracker: CostTracker,
    cache: ResponseCache,
    stage: str,
    cfg: ApiGrpoParams | TrainOrchestratorParams,
    sampling: SamplingParams,
) -> None:
    """Attach the spend ledger of this experiment to ``tracker`` (API backends only; the local one is free).

    The scope is the stage and a hash of its params section and ``sampling`` without the budget, timeouts,
    retries and parallelism (:func:`orchestry.llm.cache.budget_scope`): a re-run of the same experiment, after a
    budget stop, a crash or a kill, starts from what the earlier runs spent (logged), and raising
    ``budget_usd`` is the one way to spend more. ``orchestry budget --reset SCOPE`` forgets a scope on purpose.

    Raises:
        CacheFileError: the ledger cannot be read or written (before any work).
    """
    if cfg.backend == "local":
        return
    scope, params = budget_scope(
        stage, cfg.model_dump(mode="json"), {"sampling": sampling.model_dump(mode="json")}
    )
    earlier, orphaned = cache.open_spend(scope, stage, params)
    where = repo_relative(cache.path)
    tracker.scope, tracker.earlier_usd = scope, earlier
    tracker.reset_hint = (
        f"the spend of this experiment's earlier runs is kept in {where}; `orchestry budget --reset {scope} "
        f"--cache {where}` forgets it on purpose"
    )
    if orphaned > 0:
        log.warning(
            "budget %s: an earlier run was stopped with requests in flight; their worst case, %.4f USD, is "
            "counted as spent",
            scope,
            orphaned,
        )
    if earlier > 0:
        cap = "no budget" if cfg.budget_usd is None else f"the budget of {cfg.budget_usd:.4f} USD"
        log.warning(
            "budget %s: earlier runs of this experiment spent %.4f USD of %s (ledger %s); this run continues "
            "that budget (raise %s to spend more)",
            scope,
            earlier,
            cap,
            where,
            tracker.param,
        )
        if tracker.budget_usd and earlier >= WARN_FRACTION * tracker.budget_usd:
            tracker.status = "warned"


def sampling_settings(
    cfg: ApiGrpoParams | TrainOrchestratorParams, sampling: SamplingParams
) -> tuple[float | None, float | None]:
    """``(temperature, top_p)``: the loop's own values, else the ``sampling`` section's; recent Claude models
    reject sampling parameters, so the ``anthropic`` backend gets only explicit ones."""
    if cfg.backend == "anthropic":
        return cfg.temperature, cfg.top_p
    temperature = cfg.temperature if cfg.temperature is not None else sampling.temperature
    top_p = cfg.top_p if cfg.top_p is not None else sampling.top_p
    return temperature, top_p


def open_clients(
    cfg: ApiGrpoParams | TrainOrchestratorParams,
    sampling: SamplingParams,
    model_path: str = "models/base",
    model_dtype: str = "float32",
    cache_path: str | Path | None = None,
) -> Clients:
    """The clients of the ``api_grpo`` or ``train_orchestrator`` section ``cfg`` (its judge too, where it has one
    enabled: API-GRPO's); every misconfiguration raises here, before any work.

    Order of checks: model name, API key (``BackendConfigError`` naming the variable), price
    (``PriceError`` naming ``<section>.prices``), server reachability (``preflight``), then the cache file and
    its spend ledger (what earlier runs of this experiment spent counts against the budget: :func:`open_budget`).

    Raises:
        BackendConfigError, PriceError: see above.
    """
    local = cfg.backend == "local"
    if not local and not cfg.model:
        raise BackendConfigError(f"the {cfg.backend} backend needs a model name: set {cfg.SECTION}.model")
    common = backend_options(cfg, model_path, model_dtype)
    policy = make_backend(cfg.backend, cfg.model, **common)
    policy.price = require_price(policy.model, cfg.prices, local, cfg.budget_usd)
    judge = getattr(cfg, "judge", None)  # API-GRPO's LLM judge; the orchestrator has none
    judge_backend = None
    if judge is not None and judge.enabled:
        if judge.model and judge.model != cfg.model:
            judge_backend = make_backend(
                cfg.backend, judge.model, shared_local=policy if local else None, **common
            )
            judge_backend.price = require_price(judge_backend.model, cfg.prices, local, cfg.budget_usd)
        else:
            judge_backend = policy
    if cfg.preflight:
        policy.preflight()
        if judge_backend is not None and judge_backend is not policy:
            judge_backend.preflight()
    tracker = training_tracker(cfg)
    cache = ResponseCache(cache_path or resolve_path(cfg.cache_path))
    try:
        open_budget(tracker, cache, cfg.STAGE, cfg, sampling)
    except BaseException:
        cache.close()
        raise
    chat = CachedChat(policy, cache, tracker)
    judge_chat = None
    if judge_backend is not None:
        judge_chat = chat if judge_backend is policy else CachedChat(judge_backend, cache, tracker)
    temperature, top_p = sampling_settings(cfg, sampling)
    max_tokens = cfg.max_tokens or sampling.max_completion_length
    return Clients(chat, tracker, cache, max_tokens, temperature, top_p, judge_chat)
