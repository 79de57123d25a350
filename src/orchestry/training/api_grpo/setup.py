"""What an API-GRPO run is built from: its clients (policy and judge backends behind the response cache and the
cost tracker; :func:`open_clients` checks every setting before any work), its task (:func:`make_task`) and the
library it may start from (:func:`read_transfer`, ``api_grpo.init_behaviors``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from orchestry.algorithms.behaviors import TransferredLibrary, read_library
from orchestry.llm.backends import BackendConfigError, make_backend
from orchestry.llm.cache import CachedChat, ResponseCache
from orchestry.llm.cost import require_price
from orchestry.tasks.code_collaboration import CodeCollaboration
from orchestry.tasks.code_review import CodeReview
from orchestry.tasks.common import Task
from orchestry.tasks.documentation import Documentation
from orchestry.tasks.research_synthesis import ResearchSynthesis
from orchestry.tasks.story import Story
from orchestry.training.api_clients import (
    Clients,
    backend_options,
    open_budget,
    resolve_path,
    sampling_settings,
    training_tracker,
)

if TYPE_CHECKING:
    from orchestry.config import ApiGrpoParams, SamplingParams


def open_clients(
    cfg: ApiGrpoParams,
    sampling: SamplingParams,
    model_path: str = "models/base",
    model_dtype: str = "float32",
    cache_path: str | Path | None = None,
) -> Clients:
    """Build backend(s), cache and cost tracker; every misconfiguration raises here, before any work.

    Order of checks: model name, API key (``BackendConfigError`` naming the variable), price
    (``PriceError`` naming ``api_grpo.prices``), server reachability (``preflight``), then the cache file and
    its spend ledger (what earlier runs of this experiment spent counts against the budget:
    :func:`orchestry.training.api_clients.open_budget`).

    Raises:
        BackendConfigError, PriceError: see above.
    """
    local = cfg.backend == "local"
    if not local and not cfg.model:
        raise BackendConfigError(f"the {cfg.backend} backend needs a model name: set api_grpo.model")
    common = backend_options(cfg, model_path, model_dtype)
    policy = make_backend(cfg.backend, cfg.model, **common)
    policy.price = require_price(policy.model, cfg.prices, local, cfg.budget_usd)
    judge_backend = None
    if cfg.judge.enabled:
        if cfg.judge.model and cfg.judge.model != cfg.model:
            judge_backend = make_backend(
                cfg.backend, cfg.judge.model, shared_local=policy if local else None, **common
            )
            judge_backend.price = require_price(judge_backend.model, cfg.prices, local, cfg.budget_usd)
        else:
            judge_backend = policy
    if cfg.preflight:
        policy.preflight()
        if judge_backend is not None and judge_backend is not policy:
            judge_backend.preflight()
    tracker = training_tracker(cfg, "api_grpo")
    cache = ResponseCache(cache_path or resolve_path(cfg.cache_path))
    try:
        open_budget(tracker, cache, "train_api_grpo", cfg, sampling)
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


TASK_ROLES: dict[str, tuple[str, ...]] = {
    t.name: t.roles for t in (CodeCollaboration, CodeReview, Story, Documentation, ResearchSynthesis)
}
"""Each ``api_grpo.task``'s agents in turn order (where a transferred library's guidelines go: see
:meth:`orchestry.algorithms.behaviors.TransferredLibrary.mapped`)."""


def make_task(cfg: ApiGrpoParams) -> Task:
    """The task named in ``api_grpo.task``."""
    if cfg.task == "code_review":
        return CodeReview()
    if cfg.task == "story":
        return Story(cfg.story)
    if cfg.task == "documentation":
        return Documentation(cfg.documentation)
    if cfg.task == "research_synthesis":
        return ResearchSynthesis(cfg.research, root=resolve_path("."))
    return CodeCollaboration(main_sees_helper=cfg.main_sees_helper)


def read_transfer(cfg: ApiGrpoParams) -> TransferredLibrary | None:
    """The library named in ``api_grpo.init_behaviors`` (repo-relative or absolute), or None when it is null.

    Raises:
        LibraryError: missing or malformed file, naming the key and the path.
    """
    if cfg.init_behaviors is None:
        return None
    return read_library(resolve_path(cfg.init_behaviors), cfg.init_behaviors)
