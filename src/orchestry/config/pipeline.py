"""The ``params.yaml`` sections of the model, sampling and sandbox settings and of the stages around training:
``prepare``, ``baselines``, ``evaluate``, ``detect_schemes``, ``intervals``, ``plot`` and ``mlflow``
(:mod:`orchestry.config`).
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field, field_validator

from orchestry.config.base import BIG, Name, Seed, _Section, _unique

BaselineMethod = Literal["single", "concat", "sequential", "discussion"]
BASELINE_METHODS: tuple[str, ...] = get_args(BaselineMethod)
"""The MAGRPO paper's baselines (``baselines.methods``, run in this order by ``stages/baselines.py``)."""


class ModelParams(_Section):
    path: Name = Field(
        "models/base",
        description="local folder of the base model (safetensors + tokenizer); `prepare` always writes the "
        "embedded model to models/base",
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="weight dtype of the frozen base")
    load_in_4bit: bool = Field(False, description="NF4-quantise the frozen base with bitsandbytes (QLoRA)")
    numerics: Literal["native", "portable"] = Field(
        "native",
        description="native (each CPU's fastest kernels; bf16_update auto) | portable (the same kernel paths on "
        "every x86-64 CPU with AVX2 and an fp32 update, for numbers that match across CPU kinds; slower; "
        "orchestry.numerics, docs/reproducibility.md)",
    )
    decode_products: Literal["onednn", "mkl"] = Field(
        "onednn",
        description="how decoding computes the base model's projections on the CPU (orchestry.llm.decoding."
        "LlamaDecoder): onednn (faster; a reordered copy of the base weights during each generate call, +0.5 GB "
        "for the embedded model) | mkl (transformers' own products, no copy)",
    )
    decode_dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32",
        description="operands of decoding's projections on the CPU (onednn products): float32 (the same samples "
        "on every CPU kind) | bfloat16 (bf16 weights and inputs, fp32 sums: faster where the CPU has AVX-512 BF16 "
        "or AMX, emulated and slow elsewhere; samples differ from float32's) | auto (bfloat16 only where native, "
        "float32 under numerics: portable); orchestry.numerics.resolve_decode_bf16",
    )


class SamplingParams(_Section):
    max_completion_length: int = Field(128, ge=1, le=4096, description="max new tokens per completion")
    temperature: float = Field(0.8, ge=0.0, le=2.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)


class CompositionalParams(_Section):
    """``prepare.compositional``: the generated problems (:mod:`orchestry.generators.compositional`)."""

    num_train: int = Field(48, ge=0, le=10_000, description="training problems")
    num_val: int = Field(8, ge=0, le=10_000, description="validation problems")
    num_test: int = Field(
        32, ge=1, le=10_000, description="test problems (compositions never seen in training)"
    )
    difficulty: list[Annotated[int, Field(ge=1, le=4)]] = Field(
        [1, 2], min_length=1, description="primitives composed per problem (1-4); several: stratified mix"
    )
    types: list[Literal["ints", "str"]] = Field(["ints", "str"], min_length=1, description="input types")
    num_tests: int = Field(4, ge=3, le=5, description="asserts per problem")
    beginner_train: int = Field(
        48,
        ge=0,
        le=10_000,
        description="training problems of the beginner family (orchestry.generators.beginner: digit arithmetic, "
        "predicates, two-argument functions, loops, dictionaries, strings; plain prompts, no named decomposition) "
        "added to the train split, from its training templates",
    )
    beginner_test: int = Field(
        0,
        ge=0,
        le=10_000,
        description="problems of the beginner family's held-out templates, written as the transfer set "
        "data/problems/transfer/beginner.jsonl (templates never trained on)",
    )
    seed: Seed = 0

    _lists_unique = field_validator("difficulty", "types")(_unique)


class PrepareParams(_Section):
    source: Name = Field(
        "compositional",
        description="'compositional' (generated, prepare.compositional), 'humaneval' or a HumanEval-format file",
    )
    compositional: CompositionalParams = CompositionalParams()
    transfer: list[Name] = Field(
        [
            "humaneval",
            "data/external/easy40.jsonl",
            "data/external/mbpp_easy.jsonl",
            "data/external/others_a.jsonl",
        ],
        description="extra evaluation sets: 'humaneval' (its test split, HumanEval/133-163) or HumanEval-format "
        "files; written to data/problems/transfer/<name>.jsonl",
    )
    split: Literal["magrpo", "random"] = "magrpo"
    _transfer_unique = field_validator("transfer")(_unique)
    fractions: tuple[
        Annotated[float, Field(ge=0, le=1)],
        Annotated[float, Field(ge=0, le=1)],
        Annotated[float, Field(ge=0, le=1)],
    ] = Field((0.2, 0.6, 0.2), description="val/train/test shares for 'random' (each >= 0, sum 1)")
    seed: Seed = 0

    @field_validator("fractions")
    @classmethod
    def _sum_to_one(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        if abs(sum(v) - 1.0) > 1e-6:
            raise ValueError(f"val/train/test fractions must sum to 1, got {sum(v):g}")
        return v


class SandboxParams(_Section):
    timeout_s: float = Field(
        1.0,
        gt=0,
        le=3600,
        description="seconds per assert and for loading (wall time minus time waiting for a CPU)",
    )
    memory_mb: int = Field(1024, ge=64, le=1 << 20)
    workers: int | None = Field(None, ge=1, le=1024, description="parallel programs (default: CPU count)")
    max_timeouts: int | None = Field(
        1,
        ge=1,
        le=BIG,
        description="a program stops after this many timed-out asserts (null: run every assert)",
    )


class BaselinesParams(_Section):
    methods: list[BaselineMethod] = Field(
        default_factory=lambda: list(BASELINE_METHODS),
        min_length=1,
        description=f"run in this order by the baselines stage, one process: {' | '.join(BASELINE_METHODS)}",
    )
    num_samples: int = Field(1, ge=1, le=1000, description="samples per problem (k of pass@k)")
    max_problems: int | None = Field(
        None, ge=1, le=BIG, description="cap on test problems (None: whole split)"
    )
    batch_size: int = Field(64, ge=1, le=4096, description="rows per generate call")
    seed: Seed = 0

    _methods_unique = field_validator("methods")(_unique)


class EvaluateParams(_Section):
    num_samples: int = Field(2, ge=1, le=1000, description="k: samples per problem for pass@k / accuracy@k")
    max_problems: int | None = Field(
        None, ge=1, le=BIG, description="cap on test problems (None: whole split)"
    )
    max_problems_transfer: int | None = Field(
        40, ge=1, le=BIG, description="cap on the problems of each transfer set (prepare.transfer; None: all)"
    )
    batch_size: int = Field(
        256,
        ge=1,
        le=4096,
        description="rows per generate call (256: each default evaluation set in one call)",
    )
    turns: int | None = Field(
        None,
        ge=1,
        le=8,
        description="turns per episode (None: train_magrpo.turns, the turns the policy was trained with)",
    )
    seed: Seed = 1
    val: bool = Field(
        False,
        description="also evaluate the base and trained pairs on the val split (metrics.json `val`): the split "
        "`orchestry tune` optimises",
    )


class DetectSchemesParams(_Section):
    methods: list[Name] | None = Field(
        None, min_length=1, description="methods to analyse (None: every evaluated method)"
    )

    _methods_unique = field_validator("methods")(_unique)


class IntervalsParams(_Section):
    """Every percentile-bootstrap confidence interval (reports and figures): one level, one resample count."""

    confidence: float = Field(
        0.95, gt=0, lt=1, description="level of every bootstrap confidence interval (0.95: 95 %)"
    )
    resamples: int = Field(1000, ge=100, le=BIG, description="bootstrap resamples per interval")


class PlotParams(_Section):
    dpi: int = Field(120, ge=50, le=600)


class MlflowParams(_Section):
    experiment: Name = "orchestry"
    tracking_uri: str | None = Field(None, description="default: sqlite:///<repo root>/mlflow.db")
