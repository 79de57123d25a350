"""Typed ``params.yaml``: one pydantic model per stage section; unknown keys and bad values fail before any work.

Field names follow TRL's GRPOConfig where one exists (``num_generations``, ``max_completion_length``,
``temperature``, ``top_p``, ``learning_rate``, ``beta``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ParamsError(ValueError):
    """``params.yaml`` is invalid; the message names each bad key with the allowed values."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelParams(_Section):
    path: str = Field(
        "models/base",
        description="local folder of the base model (safetensors + tokenizer); `prepare` always writes the "
        "embedded model to models/base",
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="weight dtype of the frozen base")
    load_in_4bit: bool = Field(False, description="NF4-quantise the frozen base with bitsandbytes (QLoRA)")


class SamplingParams(_Section):
    max_completion_length: int = Field(96, ge=1, le=4096, description="max new tokens per completion")
    temperature: float = Field(0.8, ge=0.0, le=2.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)


class PrepareParams(_Section):
    source: str = Field("humaneval", description="'humaneval' or a HumanEval-format JSON/JSONL file")
    split: Literal["magrpo", "random"] = "magrpo"
    fractions: tuple[float, float, float] = Field((0.2, 0.6, 0.2), description="val/train/test for 'random'")
    seed: int = 0


class SandboxParams(_Section):
    timeout_s: float = Field(
        1.0, gt=0, description="seconds per assert and for loading (wall time minus time waiting for a CPU)"
    )
    memory_mb: int = Field(1024, ge=64)
    workers: int | None = Field(None, ge=1, description="parallel programs (default: CPU count)")
    max_timeouts: int | None = Field(
        1, ge=1, description="a program stops after this many timed-out asserts (null: run every assert)"
    )


class BaselinesParams(_Section):
    methods: list[Literal["single", "concat", "sequential", "discussion"]] = Field(
        default_factory=lambda: ["single", "concat", "sequential", "discussion"],
        description="expanded by dvc.yaml's matrix into one stage per method",
    )
    num_samples: int = Field(1, ge=1, description="samples per problem (k of pass@k)")
    max_problems: int | None = Field(None, ge=1, description="cap on test problems (None: whole split)")
    batch_size: int = Field(64, ge=1, description="rows per generate call")
    seed: int = 0


class TrainMagrpoParams(_Section):
    num_steps: int = Field(16, ge=1, description="policy updates")
    problems_per_step: int = Field(2, ge=1, description="problems whose groups form one update")
    num_generations: int = Field(4, ge=2, description="G: completions per agent per problem")
    learning_rate: float = Field(1e-3, gt=0, description="AdamW learning rate of each LoRA adapter")
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    advantage: Literal["mean", "mean_std", "rloo", "max", "raw"] = "mean"
    beta: float = Field(0.0, ge=0, description="KL weight to the reference (base) policy; 0 disables")
    lora_r: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    bf16_update: bool = Field(True, description="bf16 autocast for the training forward/backward")
    checkpoint_every: int = Field(4, ge=1)
    max_problems: int | None = Field(None, ge=1, description="cap on train problems (None: whole split)")
    seed: int = 0
    micro_batch_tokens: int = Field(
        1024,
        ge=1,
        description="tokens (prompt + completions) per training forward/backward; fixed, so the adapters do not "
        "depend on the machine's free memory. 1024: about 3.3 GiB of activations for the default 135M model "
        "in fp32 (3.5 MB per token), which fits a 24 GiB laptop; lower it for larger models",
    )


class EvaluateParams(_Section):
    num_samples: int = Field(2, ge=1, description="k: samples per problem for pass@k / accuracy@k")
    max_problems: int | None = Field(None, ge=1)
    batch_size: int = Field(64, ge=1, description="rows per generate call")
    seed: int = 1


class DetectSchemesParams(_Section):
    methods: list[str] | None = Field(None, description="methods to analyse (None: every evaluated method)")


class ModelPrice(_Section):
    input_usd_per_mtok: float = Field(..., ge=0, description="USD per million input (prompt) tokens")
    output_usd_per_mtok: float = Field(..., ge=0, description="USD per million output (completion) tokens")


class ApiGrpoJudgeParams(_Section):
    enabled: bool = Field(False, description="mix an LLM judge's 0-10 scores into the value estimator")
    model: str | None = Field(None, description="judge model on the same backend (None: api_grpo.model)")
    weight: float = Field(0.3, ge=0, le=1, description="share of the value from the judge (rest: executable)")
    quality_weight: float = Field(1.0, ge=0)
    collaboration_weight: float = Field(1.0, ge=0)
    efficiency_weight: float = Field(1.0, ge=0)
    on_partial: bool = Field(False, description="also judge unfinished trajectories when pruning the beam")
    extract_behaviors: bool = Field(True, description="also ask the judge for guidelines from top episodes")
    max_tokens: int = Field(64, ge=8, le=4096)


class ApiGrpoParams(_Section):
    backend: Literal["local", "anthropic", "openai_compatible"] = "local"
    model: str | None = Field(None, description="API model id; local: a model folder (None: model.path)")
    base_url: str | None = Field(None, description="server URL (required for openai_compatible, e.g. .../v1)")
    api_key_env: str | None = Field(None, description="env var with the key (None: ANTHROPIC_API_KEY / none)")
    task: Literal["code_collaboration", "code_review"] = "code_collaboration"
    k_samples: int = Field(2, ge=1, description="k: sampled responses per beam trajectory per turn")
    beam_width: int = Field(2, ge=1, description="N: trajectories kept after each turn")
    num_episodes: int = Field(4, ge=1, description="training episodes (one beam search on one train problem)")
    behavior_every: int = Field(2, ge=1, description="m: refresh the behaviour library every m episodes")
    top_fraction: float = Field(
        0.2, gt=0, le=0.5, description="top (and bottom) share of trajectories compared"
    )
    max_behaviors: int = Field(3, ge=0, le=10, description="guidelines injected per agent")
    main_sees_helper: bool = Field(
        True, description="code_collaboration: main's prompt shows the helper's code"
    )
    judge: ApiGrpoJudgeParams = ApiGrpoJudgeParams()
    budget_usd: float | None = Field(1.0, ge=0, description="hard spending cap (None: no cap)")
    eval_budget_fraction: float = Field(
        0.3, ge=0, lt=1, description="share of the budget kept for the test eval"
    )
    prices: dict[str, ModelPrice] = Field(default_factory=dict, description="per-model price overrides")
    max_tokens: int | None = Field(80, ge=1, le=8192, description="tokens per call (None: sampling's)")
    temperature: float | None = Field(
        None, ge=0, le=2, description="None: sampling's (anthropic: model default)"
    )
    top_p: float | None = Field(None, gt=0, le=1, description="None: sampling's (anthropic: model default)")
    max_problems_eval: int = Field(
        6, ge=1, description="test problems of the with/without-behaviours comparison"
    )
    eval_samples: int = Field(1, ge=1, description="episodes per test problem and arm")
    cache_path: str = Field(".orchestry/api_grpo_cache.sqlite", description="response cache (repo-relative)")
    timeout_s: float = Field(60.0, gt=0, description="seconds per API request (SDK timeout)")
    max_retries: int = Field(4, ge=0, description="SDK retries on 429/5xx/connection errors")
    concurrency: int = Field(4, ge=1, description="parallel API requests")
    local_batch_size: int = Field(32, ge=1, description="rows per generate call (local backend)")
    preflight: bool = Field(True, description="check key and server before any work")
    seed: int = 0


class PlotParams(_Section):
    dpi: int = Field(120, ge=50, le=600)
    confidence: float = Field(0.95, gt=0, lt=1)
    bootstrap: int = Field(1000, ge=100)


class MlflowParams(_Section):
    experiment: str = "orchestry"
    tracking_uri: str | None = Field(None, description="default: sqlite:///<repo root>/mlflow.db")


class Params(_Section):
    """The whole ``params.yaml``; a missing section takes its defaults."""

    model: ModelParams = ModelParams()
    sampling: SamplingParams = SamplingParams()
    sandbox: SandboxParams = SandboxParams()
    prepare: PrepareParams = PrepareParams()
    baselines: BaselinesParams = BaselinesParams()
    train_magrpo: TrainMagrpoParams = TrainMagrpoParams()
    api_grpo: ApiGrpoParams = ApiGrpoParams()
    evaluate: EvaluateParams = EvaluateParams()
    detect_schemes: DetectSchemesParams = DetectSchemesParams()
    plot: PlotParams = PlotParams()
    mlflow: MlflowParams = MlflowParams()


def _allowed_for(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names allowed at the parent of ``loc`` (for 'unknown key' messages)."""
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = cur.model_fields.get(part) if isinstance(cur, type) and issubclass(cur, BaseModel) else None
        if field is None:
            return []
        cur = field.annotation
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return list(cur.model_fields)
    return []


def format_validation_error(err: ValidationError, source: str = "params.yaml") -> str:
    lines = [f"{source} is invalid:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            allowed = _allowed_for(Params, e["loc"])
            lines.append(f"  {key}: unknown key (allowed: {', '.join(allowed)})")
        else:
            got = e.get("input")
            lines.append(f"  {key}: {e['msg']} (got {got!r})")
    return "\n".join(lines)


def parse_params(data: dict | None, source: str = "params.yaml") -> Params:
    """Validate a params mapping.

    Raises:
        ParamsError: naming every unknown key (with the allowed keys) and bad value (with the allowed values).
    """
    data = dict(data or {})
    try:
        return Params.model_validate(data)
    except ValidationError as e:
        raise ParamsError(format_validation_error(e, source)) from None


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``params.yaml`` (see :func:`parse_params`)."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ParamsError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ParamsError(f"{path} must be a mapping of sections, got {type(data).__name__}")
    return parse_params(data, str(path))
