"""What a ``params.yaml`` section that talks to a chat model says about its clients (:class:`ApiClientParams`, the
base of ``train_magrpo.coach``, ``api_grpo`` and ``train_orchestrator``) and a model's prices (:class:`ModelPrice`).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from orchestry.config.base import Seed, _Section


class ModelPrice(_Section):
    input_usd_per_mtok: float = Field(..., ge=0, le=1e6, description="USD per million input (prompt) tokens")
    output_usd_per_mtok: float = Field(
        ..., ge=0, le=1e6, description="USD per million output (completion) tokens"
    )


class ApiClientParams(_Section):
    """What a section that talks to a chat model says about its clients (``train_magrpo.coach``, ``api_grpo``,
    ``train_orchestrator``): the backend and model, the key, the budget and prices, the SDK's timeout, retries and
    parallelism (:func:`orchestry.llm.clients.backend_options`). ``SECTION``: the section's name in params.yaml;
    ``STAGE``: the stage whose spend ledger it opens."""

    SECTION: ClassVar[str]
    STAGE: ClassVar[str]

    backend: Literal["local", "anthropic", "openai_compatible"] = Field(
        "local", description="local: the frozen base model (model.path); or an API"
    )
    model: str | None = Field(None, description="API model id; local: a model folder (None: model.path)")
    base_url: str | None = Field(None, description="server URL (required for openai_compatible, e.g. .../v1)")
    api_key_env: str | None = Field(None, description="env var with the key (None: ANTHROPIC_API_KEY / none)")
    budget_usd: float | None = Field(1.0, ge=0, le=1e6, description="hard spending cap (None: no cap)")
    prices: dict[str, ModelPrice] = Field(default_factory=dict, description="per-model price overrides")
    timeout_s: float = Field(60.0, gt=0, le=3600, description="seconds per API request (SDK timeout)")
    max_retries: int = Field(4, ge=0, le=100, description="SDK retries on 429/5xx/connection errors")
    concurrency: int = Field(4, ge=1, le=256, description="parallel API requests")
    local_batch_size: int = Field(32, ge=1, le=4096, description="rows per generate call (local backend)")
    seed: Seed = 0
