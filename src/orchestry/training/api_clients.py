"""What the two API-model loops (API-GRPO and the learned orchestrator) share when they open their clients.

Paths relative to the repository root, the options every chat backend of a run is made with, the cost tracker
with the training share of the hard budget and its spend ledger (:func:`open_budget`: the budget covers the
experiment across runs), and the sampling settings sent to the backend. Each loop's
``open_clients`` (:mod:`orchestry.training.api_grpo.setup`, :mod:`orchestry.training.orchestrator`) builds
on these.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestry.llm.cache import budget_scope
from orchestry.llm.cost import WARN_FRACTION, CostTracker

log = logging.getLogger("orchestry.training.api_clients")

if TYPE_CHECKING:
    from orchestry.config import ApiGrpoParams, SamplingParams, TrainOrchestratorParams
    from orchestry.llm.cache import CachedChat, ResponseCache


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


def resolve_path(path: str | Path) -> Path:
    """``path`` relative to the repository root (``DVC_ROOT`` in DVC experiments), absolute kept."""
    from orchestry.runtime import repo_root

    p = Path(path)
    return p if p.is_absolute() else repo_root() / p


def repo_relative(path: str | Path) -> str:
    """The inverse of :func:`resolve_path`: ``path`` relative to the repository root when it lies inside it (so
    the metrics a stage writes do not depend on where the repository was cloned), else as given."""
    from orchestry.runtime import repo_root

    try:
        return Path(path).resolve().relative_to(repo_root()).as_posix()
    except ValueError:
        return str(path)


def backend_options(
    cfg: ApiGrpoParams | TrainOrchestratorParams, model_path: str, model_dtype: str
) -> dict[str, Any]:
    """The keyword arguments of :func:`orchestry.llm.backends.make_backend` that come from the loop's params."""
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


def training_tracker(cfg: ApiGrpoParams | TrainOrchestratorParams, section: str = "api_grpo") -> CostTracker:
    """The run's cost tracker: the hard budget (``<section>.budget_usd``), of which training may spend
    ``1 - eval_budget_fraction``."""
    limit = None if cfg.budget_usd is None else cfg.budget_usd * (1 - cfg.eval_budget_fraction)
    return CostTracker(budget_usd=cfg.budget_usd, limit_usd=limit, param=f"{section}.budget_usd")


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
