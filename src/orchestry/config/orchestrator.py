"""The ``train_orchestrator`` section of ``params.yaml`` (:class:`TrainOrchestratorParams`): the learned orchestrator
(:mod:`orchestry.config`).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator

from orchestry.config.base import BIG, Name, _unique
from orchestry.config.clients import ApiClientParams


class TrainOrchestratorParams(ApiClientParams):
    """Learned orchestrator (Puppeteer, arXiv 2505.19591): REINFORCE over which agent acts next."""

    SECTION: ClassVar[str] = "train_orchestrator"
    STAGE: ClassVar[str] = "train_orchestrator"

    agents: list[Name] = Field(
        default_factory=lambda: ["helper", "main", "tester", "fixer", "reviewer"],
        min_length=1,
        description="the pool, in order (see orchestry.tasks.agent_pool); `terminate` is always added last",
    )
    call_costs: dict[str, Annotated[float, Field(ge=0, le=1e6)]] = Field(
        default_factory=lambda: {"tester": 10.0},
        description="fixed cost per call of an agent, in the cost unit (a tool's only cost; model agents also "
        "pay their tokens/USD)",
    )
    eval_budget_fraction: float = Field(0.3, ge=0, lt=1, description="share of the budget kept for the eval")
    max_tokens: int = Field(96, ge=1, le=8192, description="completion tokens per agent call")
    temperature: float | None = Field(
        None, ge=0, le=2, description="None: sampling's (anthropic: model default)"
    )
    top_p: float | None = Field(None, gt=0, le=1, description="None: sampling's (anthropic: model default)")
    cache_path: Name = Field(
        ".orchestry/orchestrator_cache.sqlite",
        description="response cache, by (agent, prompt) (repo-relative)",
    )
    embedding_cache_path: Name = Field(
        ".orchestry/orchestrator_embeddings.sqlite", description="state-embedding cache (repo-relative)"
    )
    encoder_max_length: int = Field(256, ge=8, le=512, description="tokens per text the state encoder reads")
    preflight: bool = Field(True, description="check key and server before any work")
    cost_unit: Literal["tokens", "usd"] = Field(
        "tokens", description="c_t: prompt + completion tokens, or USD, of a call (+ the agent's call cost)"
    )
    cost_lambda: float = Field(2e-4, ge=0, le=1e6, description="lambda: reward units per cost unit")
    task_reward: Literal["level", "binary"] = Field(
        "level", description="r: the level reward (max 4.0), or success_bonus / failure_penalty"
    )
    success_bonus: float = Field(1.0, ge=-1e3, le=1e3, description="binary r when every assert passes")
    failure_penalty: float = Field(-1.0, ge=-1e3, le=1e3, description="binary r otherwise")
    min_steps: int = Field(2, ge=0, le=100, description="agent actions before `terminate` is allowed")
    max_steps: int = Field(4, ge=1, le=100, description="agent actions after which `terminate` is forced")
    gamma: float = Field(0.99, ge=0, le=1, description="discount of the returns")
    learning_rate: float = Field(0.03, gt=0, le=1, description="Adam step size of the policy")
    entropy_coef: float = Field(0.05, ge=0, le=10, description="entropy bonus beta_H")
    max_grad_norm: float = Field(1.0, gt=0, le=1e12, description="gradient-norm clip")
    baseline_momentum: float = Field(0.2, gt=0, le=1, description="moving-average baseline's step")
    hidden_size: int = Field(64, ge=1, le=4096, description="MLP width")
    num_episodes: int = Field(48, ge=1, le=BIG, description="training episodes")
    episodes_per_update: int = Field(12, ge=1, le=4096, description="episodes (in lockstep) per update")
    max_problems: int = Field(2, ge=1, le=BIG, description="train problems (the first, seeded order)")
    max_problems_eval: int = Field(4, ge=1, le=BIG, description="test problems of the evaluation")

    _agents_unique = field_validator("agents")(_unique)

    @field_validator("max_steps")
    @classmethod
    def _max_at_least_min(cls, v: int, info) -> int:
        lo = info.data.get("min_steps", 0)
        if v < lo:
            raise ValueError(f"max_steps ({v}) must be >= min_steps ({lo})")
        return v
