"""Typed ``params.yaml``: one pydantic model per stage section; unknown keys and bad values fail before any work.

Field names follow TRL's GRPOConfig where one exists (``num_generations``, ``max_completion_length``,
``temperature``, ``top_p``, ``learning_rate``, ``beta``).

The defaults here are the committed ``params.yaml`` (the laptop setting; a test keeps them equal). Every
number has a finite range (``inf``/``nan`` are rejected), lists of names are non-empty, and a key written twice
in the YAML file (at any depth, a repeated section included) is an error, not "the last one wins"
(the file is read by :mod:`orchestry.params_file`).
"""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

BaselineMethod = Literal["single", "concat", "sequential", "discussion"]
BASELINE_METHODS: tuple[str, ...] = get_args(BaselineMethod)
"""The MAGRPO paper's baselines (``baselines.methods``, run in this order by ``stages/baselines.py``)."""
AdvantageMode = Literal["mean", "mean_std", "rloo", "max", "raw"]
ADVANTAGE_MODES: tuple[str, ...] = get_args(AdvantageMode)
"""Group-relative modes of :func:`orchestry.algorithms.magrpo.group_advantages`."""
AdvantageEstimator = Literal[
    "mean", "mean_std", "rloo", "max", "raw", "reinforce", "agent_turn", "reinforce_pp", "remax", "critic"
]
ADVANTAGE_ESTIMATORS: tuple[str, ...] = get_args(AdvantageEstimator)
"""``train_magrpo.advantage``: a group-relative mode, ``reinforce`` (running-mean baseline), ``agent_turn``
(AT-GRPO's agent- and turn-wise groups), ``reinforce_pp`` (per-token; REINFORCE++), ``remax`` (the greedy
rollout's reward as the baseline) or ``critic`` (a learned value baseline, ``train_magrpo.critic``)."""
CriticMode = Literal["centralized", "per_agent"]
CRITIC_MODES: tuple[str, ...] = get_args(CriticMode)
"""``train_magrpo.critic``: the value network's sharing (:mod:`orchestry.algorithms.critic`)."""

Seed = Annotated[int, Field(ge=0, le=2**32 - 1, description="RNG seed")]
Name = Annotated[str, Field(min_length=1)]
BIG = 1_000_000  # upper bound of counts that have no natural one (steps, problems, bootstrap resamples)


def _scalar_kinds(annotation: Any) -> set | None:
    """The scalar types a field takes (``int``, ``float``, ``bool``, ``str``, ``None``, ``("literal", v)``), or None
    when it takes anything else too (a section, a list, a dict)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _scalar_kinds(get_args(annotation)[0])
    if origin in (Union, UnionType):
        parts = [_scalar_kinds(a) for a in get_args(annotation)]
        return None if any(p is None for p in parts) else set().union(*parts)  # type: ignore[arg-type]
    if origin is Literal:
        return {("literal", v) for v in get_args(annotation)}
    if annotation in (int, float, bool, str):
        return {annotation}
    if annotation is type(None):
        return {None}
    return None


def _fits(kinds: set, value: Any) -> bool:
    """``value`` is one of ``kinds`` as it is, without pydantic's coercions (bool -> int, str -> int, 3.0 -> 3)."""
    if value is None:
        return None in kinds
    if isinstance(value, bool):
        return bool in kinds or ("literal", value) in kinds
    if isinstance(value, int):
        return bool(kinds & {int, float}) or any(
            k == ("literal", value) for k in kinds if isinstance(k, tuple)
        )
    if isinstance(value, float):
        return float in kinds
    if isinstance(value, str):
        return str in kinds or ("literal", value) in kinds
    return True  # other objects: pydantic's own checks


def _strict(annotation: Any, value: Any) -> None:
    """Raise ValueError when ``value`` (or an item of a list, a value of a dict) would only fit ``annotation``
    through a coercion: ``true`` or ``'3'`` for a count, ``3.0`` for an integer, ``'yes'`` for a flag."""
    kinds = _scalar_kinds(annotation)
    if kinds is not None:
        if not _fits(kinds, value):
            want = sorted(
                "an integer" if k is int else "a number" if k is float else "true/false" if k is bool
                else "a string" if k is str else "null" if k is None else repr(k[1])
                for k in kinds
            )  # fmt: skip
            raise ValueError(f"expected {' or '.join(want)}, not {type(value).__name__}")
        return
    origin = get_origin(annotation)
    if origin is Annotated:
        _strict(get_args(annotation)[0], value)
    elif origin in (Union, UnionType):
        for arg in get_args(annotation):
            if get_origin(arg) in (list, dict) or get_origin(arg) is Annotated:
                _strict(arg, value)
    elif origin is list and isinstance(value, list):
        for item in value:
            _strict(get_args(annotation)[0], item)
    elif origin is dict and isinstance(value, dict):
        for item in value.values():
            _strict(get_args(annotation)[1], item)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_coercion(cls, value: Any, info: ValidationInfo) -> Any:
        """Strict scalars: no bool -> int, str -> int, 3.0 -> 3 or 'yes' -> true (``num_samples: true`` and
        ``num_samples: '3'`` are refused, not read as 1 and 3)."""
        field = cls.model_fields.get(info.field_name or "")
        if field is not None:
            _strict(field.annotation, value)
        return value


def _unique(values: list | None) -> list | None:
    dup = sorted({v for v in values or [] if values.count(v) > 1})
    if dup:
        raise ValueError(f"listed twice: {', '.join(map(str, dup))}")
    return values


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


class CoachParams(ApiClientParams):
    """Coach process rewards (MAPPA, arXiv 2601.23228): a coach LLM scores each agent action 0-10."""

    enabled: bool = Field(False, description="mix the coach's process score into each agent's reward")
    w_process: float = Field(0.1, ge=0, le=1e3, description="weight of the 0-10 process score")
    w_outcome: float = Field(1.0, ge=0, le=1e3, description="weight of the outcome (level) reward")
    max_tokens: int = Field(48, ge=8, le=4096, description="tokens per coach answer")
    few_shot: bool = Field(
        True,
        description="two worked examples before each question (small coach models then follow the format)",
    )
    show_feedback: bool = Field(
        False, description="turns > 1: the next turn's prompts also carry the coach's feedback"
    )
    cache_path: Name = Field(".orchestry/coach_cache.sqlite", description="response cache (repo-relative)")

    @model_validator(mode="after")
    def _weights(self) -> CoachParams:
        if self.w_process + self.w_outcome == 0:
            raise ValueError("w_process and w_outcome cannot both be 0")
        return self


class TrainMagrpoParams(_Section):
    num_steps: int = Field(24, ge=1, le=BIG, description="policy updates")
    problems_per_step: int = Field(2, ge=1, le=4096, description="problems whose groups form one update")
    num_generations: int = Field(4, ge=2, le=1024, description="G: completions per agent per problem")
    learning_rate: float = Field(1e-4, gt=0, le=1, description="AdamW learning rate of each LoRA adapter")
    weight_decay: float = Field(0.0, ge=0, le=1)
    max_grad_norm: float = Field(
        1.0, gt=0, le=1e12, description="gradient-norm clip per adapter (huge: none)"
    )
    advantage: AdvantageEstimator = Field(
        "mean",
        description=f"advantage estimator: {' | '.join(ADVANTAGE_ESTIMATORS)} (MAGRPO paper: mean; rloo: R minus "
        "the mean of the group's other G-1; reinforce: R minus a running mean of earlier steps' rewards "
        "(baseline_decay); agent_turn: AT-GRPO, mean/std within each agent's group at each turn, over the "
        "samples acting at that turn; reinforce_pp: per-token returns with the KL in the reward, whitened over all "
        "tokens of the agent's batch; remax: R minus the reward of one greedy joint rollout of the same problem "
        "(ReMax; its tokens count in the step's cost); critic: R minus a learned V(s) on the MiniLM embedding of "
        "the agents' prompts (train_magrpo.critic))",
    )
    beta: float = Field(
        0.0,
        ge=0,
        le=1e3,
        description="KL weight to the reference (base) policy; 0 disables. Group modes: k3 KL in the loss; "
        "reinforce_pp: -beta * KL per token in the reward",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="reinforce_pp: discount of the per-token returns")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k1", description="reinforce_pp: per-token KL estimator in the reward (paper: k1)"
    )
    baseline_decay: float = Field(
        0.9,
        ge=0,
        lt=1,
        description="advantage reinforce: b <- decay * b + (1 - decay) * (the step's mean reward), per agent and "
        "turn; the first step's baseline is its own mean",
    )
    critic: CriticMode = Field(
        "centralized",
        description="advantage critic: centralized (MAAC-style: one value network on the joint state, the "
        "concatenated prompt embeddings of all agents, shared by the agents) | per_agent (IAC-style: each agent its "
        "own value network on its own prompt embedding)",
    )
    critic_lr: float = Field(
        0.01, gt=0, le=1, description="advantage critic: Adam learning rate of the value net"
    )
    critic_hidden: int = Field(
        128, ge=1, le=1 << 16, description="advantage critic: hidden width of the value MLP"
    )
    critic_steps: int = Field(
        8,
        ge=1,
        le=10_000,
        description="advantage critic: full-batch Adam steps of the value net on each step's returns (after that "
        "step's advantages are computed)",
    )
    turns: int = Field(
        1,
        ge=1,
        le=8,
        description="turns per episode: turn t+1's prompts carry the sandbox's feedback on turn t",
    )
    turn_weights: list[float] | None = Field(
        None, description="loss weight of each turn (len = turns, each >= 0; None: 1 for every turn)"
    )
    credit: Literal["shared", "counterfactual"] = Field(
        "shared",
        description="shared (every agent gets the joint reward) | counterfactual (each agent's difference "
        "reward: joint minus the reward with its output replaced by a default; scored in the sandbox)",
    )
    workflow: Literal["helper_main", "writer_tester_fixer"] = Field(
        "helper_main",
        description="helper_main (aux + main, in parallel; the level reward) | writer_tester_fixer (three "
        "agents in sequence: the tester's asserts run on the writer's code, the fixer reads the report; "
        "reward: the fixer's code on the hidden asserts)",
    )
    coach: CoachParams = CoachParams()
    lora_r: int = Field(16, ge=1, le=4096)
    lora_alpha: int = Field(32, ge=1, le=1 << 16)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[Name] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1
    )
    bf16_update: Literal["auto"] | bool = Field(
        "auto",
        description="bf16 autocast for the training forward/backward: auto (bf16 only where the hardware runs it "
        "natively and, on a CPU, where it was measured faster than fp32 on this machine: measured once, recorded in "
        "~/.cache/orchestry/update_dtype.json, logged; fp32 elsewhere) | true (bf16 even where it is emulated, "
        "slowly) | false (fp32); resolved by orchestry.numerics.resolve_bf16",
    )
    checkpoint_every: int = Field(8, ge=1, le=BIG)
    max_problems: int | None = Field(
        None, ge=1, le=BIG, description="cap on train problems (None: whole split)"
    )
    seed: Seed = 0
    micro_batch_tokens: int = Field(
        1024,
        ge=1,
        le=1 << 20,
        description="tokens (prompt + completions) per training forward/backward; fixed, so the adapters do not "
        "depend on the machine's free memory. 1024: about 0.75 GiB kept for the backward for the default 135M "
        "model under bf16, 1.1 GiB in fp32 (docs/scaling.md); lower it for larger models",
    )
    dynamic_sampling: Literal["none", "skip", "resample"] = Field(
        "none",
        description="groups whose G joint rewards are all equal (no gradient; DAPO, arXiv 2503.14476): none "
        "(kept in the loss's mean over problems) | skip (left out of the loss) | resample (sampled again, up "
        "to max_resample times, then left out if still flat)",
    )
    max_resample: int = Field(
        2, ge=1, le=64, description="dynamic_sampling=resample: extra rollouts per step"
    )
    curriculum: Literal["none", "base_reward"] = Field(
        "none",
        description="order of the training problems: none (seeded shuffle) | base_reward (the base policy's "
        "mean group reward, from one rollout at the start, easiest first)",
    )
    warm_start_epochs: Literal["auto"] | int = Field(
        "auto",
        description="supervised warm start before the first MAGRPO step: epochs of next-token training of each "
        "agent on the train problems' reference decompositions (generated problems: the helper writes the "
        "first step as aux, the main calls aux and does the rest; orchestry.training.magrpo.warm_start). 0: off; "
        "auto: 2 (training.warm_start.AUTO_WARM_START_EPOCHS) when every train problem has a reference decomposition "
        "(prepare.source: compositional, workflow helper_main), 0 otherwise",
    )
    warm_start_lr: float = Field(5e-4, gt=0, le=1.0, description="warm start: AdamW learning rate")
    warm_start_batch: int = Field(8, ge=1, le=4096, description="warm start: examples per optimizer step")
    warm_start_plain_prompts: bool = Field(
        False,
        description="warm start: also train each target under the prompts of problems that name no "
        "decomposition (HumanEval, MBPP, --problems files), so the pair writes aux there too",
    )
    warm_start_plain_targets: Literal["delegate", "reference", "self"] = Field(
        "delegate",
        description="warm start, plain prompts: the targets there. delegate: the helper's aux computes the whole "
        "answer and the main returns aux's result (the split both agents can infer without a named "
        "decomposition); reference: the generated problem's own split (aux = first step, main the rest); self: "
        "the base pair's own answers that pass every assert, sampled before the warm start (rejection-sampled "
        "self-distillation, STaR / RFT: the pair keeps its own style instead of imitating the generator's form)",
    )
    warm_start_self_samples: int = Field(
        8,
        ge=1,
        le=256,
        description="warm_start_plain_targets self: joint samples of the base pair per train problem (plain prompts)",
    )
    warm_start_self_per_problem: int = Field(
        2,
        ge=1,
        le=256,
        description="warm_start_plain_targets self: passing samples kept per problem (distinct, cooperating and "
        "highest-reward first), so easy problems do not dominate the targets",
    )
    warm_start_problems: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="warm start: train on the first N train problems only (file order); MAGRPO still trains on "
        "all of them, so the rest are problems the warm-started pair has not seen. 0: all",
    )
    init_adapters: str | None = Field(
        None,
        description="start MAGRPO from these saved adapters (a folder with one peft folder per agent, e.g. a "
        "run's models/adapters/magrpo/warm_start copied out of DVC's outputs) instead of the warm start: arms of a "
        "comparison share one warm start; null: off",
    )
    num_processes: int = Field(
        1,
        ge=1,
        le=1024,
        description="data-parallel training processes: > 1 makes the stage relaunch itself under `accelerate "
        "launch` (one process per GPU, or gloo over CPU processes); each process takes problems_per_step problems "
        "of a step, so one update covers num_processes x problems_per_step problems",
    )

    _modules_unique = field_validator("target_modules")(_unique)

    @field_validator("warm_start_epochs", mode="before")
    @classmethod
    def _warm_start_epochs(cls, v: Any) -> str | int:
        """auto or a whole number 0..100 (not a YAML boolean)."""
        if isinstance(v, str) and v.strip().lower() == "auto":
            return "auto"
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 100:
            return v
        raise ValueError("must be auto or a whole number from 0 to 100")

    @field_validator("bf16_update", mode="before")
    @classmethod
    def _bf16_setting(cls, v: Any) -> str | bool:
        """auto | true | false: a YAML boolean or one of those three words (any case); nothing else (no 0/1)."""
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.strip().lower() in ("auto", "true", "false"):
            return {"auto": "auto", "true": True, "false": False}[v.strip().lower()]
        raise ValueError("must be auto, true or false")

    @model_validator(mode="after")
    def _consistent(self) -> TrainMagrpoParams:
        if self.turn_weights is not None:
            if len(self.turn_weights) != self.turns:
                raise ValueError(f"turn_weights has {len(self.turn_weights)} weights for turns={self.turns}")
            if any(not 0 <= w <= 1e3 for w in self.turn_weights) or sum(self.turn_weights) == 0:
                raise ValueError("turn_weights must each be in [0, 1000] and not all 0")
        if self.workflow == "writer_tester_fixer":
            if self.turns != 1:
                raise ValueError("workflow writer_tester_fixer runs one turn (its fixer is the second try)")
            if self.credit != "shared":
                raise ValueError("credit counterfactual is defined for workflow helper_main only")
            if self.dynamic_sampling != "none" or self.curriculum != "none":
                raise ValueError("workflow writer_tester_fixer runs without dynamic_sampling and curriculum")
            if self.warm_start_epochs not in (0, "auto"):
                raise ValueError("warm_start_epochs needs workflow helper_main (reference decompositions)")
        if self.advantage == "reinforce_pp" and self.dynamic_sampling != "none":
            raise ValueError("dynamic_sampling works on groups; advantage reinforce_pp has none")
        if self.init_adapters is not None and self.warm_start_epochs not in (0, "auto"):
            raise ValueError("init_adapters replaces the warm start: set warm_start_epochs to 0 or auto")
        if self.advantage in ("remax", "critic") and self.workflow != "helper_main":
            raise ValueError(f"advantage {self.advantage} is implemented for workflow helper_main only")
        if self.advantage == "critic" and self.num_processes > 1:
            raise ValueError(
                "advantage critic runs in one process (num_processes 1): its value net is not averaged"
            )
        return self


class EvaluateParams(_Section):
    num_samples: int = Field(2, ge=1, le=1000, description="k: samples per problem for pass@k / accuracy@k")
    max_problems: int | None = Field(
        None, ge=1, le=BIG, description="cap on test problems (None: whole split)"
    )
    max_problems_transfer: int | None = Field(
        40, ge=1, le=BIG, description="cap on the problems of each transfer set (prepare.transfer; None: all)"
    )
    batch_size: int = Field(64, ge=1, le=4096, description="rows per generate call")
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


class ApiGrpoJudgeParams(_Section):
    enabled: bool = Field(False, description="mix an LLM judge's 0-10 scores into the value estimator")
    model: str | None = Field(None, description="judge model on the same backend (None: api_grpo.model)")
    weight: float = Field(0.3, ge=0, le=1, description="share of the value from the judge (rest: executable)")
    quality_weight: float = Field(1.0, ge=0, le=1e3)
    collaboration_weight: float = Field(1.0, ge=0, le=1e3)
    efficiency_weight: float = Field(1.0, ge=0, le=1e3)
    on_partial: bool = Field(False, description="also judge unfinished trajectories when pruning the beam")
    extract_behaviors: bool = Field(True, description="also ask the judge for guidelines from top episodes")
    max_tokens: int = Field(64, ge=8, le=4096)


def _require_some_weight(section: _Section) -> None:
    """Raises ValueError unless one of the ``*_weight`` fields (a checked reward's part weights) is > 0."""
    if sum(v for k, v in section if k.endswith("_weight")) <= 0:
        raise ValueError("at least one weight must be > 0")


class ApiGrpoStoryParams(_Section):
    """``api_grpo.task: story`` (writer -> editor): generated story specs and the checkable reward's weights."""

    train_prompts: int = Field(16, ge=1, le=10_000, description="story specs for training episodes")
    test_prompts: int = Field(8, ge=1, le=10_000, description="story specs of the with/without evaluation")
    min_words: int = Field(30, ge=1, le=10_000, description="shortest allowed story (words, title excluded)")
    max_words: int = Field(80, ge=1, le=10_000, description="longest allowed story (words, title excluded)")
    required_words: int = Field(2, ge=0, le=10, description="words every story must use")
    length_weight: float = Field(1.0, ge=0, le=1e3, description="reward for a length in the range")
    words_weight: float = Field(1.0, ge=0, le=1e3, description="times the share of required words used")
    pov_weight: float = Field(1.0, ge=0, le=1e3, description="reward for the requested point of view")
    title_weight: float = Field(1.0, ge=0, le=1e3, description="reward for a <<title>> line")
    prose_gate: bool = Field(
        True,
        description="multiply the parts by the prose score (real sentences, no repetition; tasks/story.py)",
    )
    copy_max: float = Field(
        0.3, ge=0, le=1, description="a story with more of its words in 4-grams of the prompt scores 0"
    )
    seed: Seed = Field(0, description="which specs are generated (topics, words, point of view)")

    @model_validator(mode="after")
    def _range(self) -> ApiGrpoStoryParams:
        if self.min_words > self.max_words:
            raise ValueError(f"min_words ({self.min_words}) > max_words ({self.max_words})")
        _require_some_weight(self)
        return self


class ApiGrpoDocumentationParams(_Section):
    """``api_grpo.task: documentation`` (writer -> reviewer -> editor): the checkable reward's weights."""

    doctests_weight: float = Field(1.0, ge=0, le=1e3, description="times the share of passing doctests")
    params_weight: float = Field(0.5, ge=0, le=1e3, description="times the share of parameters described")
    returns_weight: float = Field(0.25, ge=0, le=1e3, description="reward for describing the return value")
    unchanged_weight: float = Field(0.25, ge=0, le=1e3, description="reward for leaving the code unchanged")
    require_unchanged: bool = Field(
        True, description="a changed function (AST) scores 0 on every part: its docs describe other code"
    )
    require_consistent: bool = Field(
        True,
        description="a docstring whose summary shares no word with the code (name, parameters, body) or whose "
        "stated return contradicts the examples' outputs scores 0 on doctests, params and returns",
    )

    @model_validator(mode="after")
    def _some_weight(self) -> ApiGrpoDocumentationParams:
        _require_some_weight(self)
        return self


class ApiGrpoResearchParams(_Section):
    """``api_grpo.task: research_synthesis`` (researchers -> synthesiser): bundles and the checks' weights."""

    bundles_path: Name = Field(
        "data/tasks/research_bundles.jsonl", description="question + 3-5 passages per line (repo-relative)"
    )
    test_bundles: int = Field(6, ge=1, le=10_000, description="the last bundles, kept for the evaluation")
    max_words: int = Field(120, ge=1, le=10_000, description="longest allowed answer (words)")
    cited_weight: float = Field(1.0, ge=0, le=1e3, description="times the share of claims citing a passage")
    valid_weight: float = Field(1.0, ge=0, le=1e3, description="times the share of citations that exist")
    coverage_weight: float = Field(1.0, ge=0, le=1e3, description="times the share of passages cited")
    length_weight: float = Field(0.5, ge=0, le=1e3, description="reward for 1..max_words words")
    support_min: float = Field(
        0.5,
        ge=0,
        le=1,
        description="a claim is supported when this share of its content words is in the cited passages",
    )
    copy_max: float = Field(
        0.5,
        ge=0,
        le=1,
        description="an answer with more of its words in 8-grams of the prompt/passages scores 0",
    )

    @model_validator(mode="after")
    def _some_weight(self) -> ApiGrpoResearchParams:
        _require_some_weight(self)
        return self


class ApiGrpoParams(ApiClientParams):
    SECTION: ClassVar[str] = "api_grpo"
    STAGE: ClassVar[str] = "train_api_grpo"

    task: Literal["code_collaboration", "code_review", "story", "documentation", "research_synthesis"] = (
        "code_collaboration"
    )
    k_samples: int = Field(2, ge=1, le=64, description="k: sampled responses per beam trajectory per turn")
    beam_width: int = Field(2, ge=1, le=64, description="N: trajectories kept after each turn")
    num_episodes: int = Field(
        4, ge=1, le=BIG, description="training episodes (one beam search on one train problem)"
    )
    behavior_every: int = Field(
        2, ge=1, le=BIG, description="m: refresh the behaviour library every m episodes"
    )
    top_fraction: float = Field(
        0.2, gt=0, le=0.5, description="top (and bottom) share of trajectories compared"
    )
    max_behaviors: int = Field(3, ge=0, le=10, description="guidelines injected per agent")
    init_behaviors: Name | None = Field(
        None,
        description="start from this learned_behaviors.json (of any task; the stage needs it under "
        "data/behaviors/) instead of an empty library, and evaluate none vs transferred vs learned here",
    )
    main_sees_helper: bool = Field(
        True, description="code_collaboration: main's prompt shows the helper's code"
    )
    judge: ApiGrpoJudgeParams = ApiGrpoJudgeParams()
    story: ApiGrpoStoryParams = ApiGrpoStoryParams()
    documentation: ApiGrpoDocumentationParams = ApiGrpoDocumentationParams()
    research: ApiGrpoResearchParams = ApiGrpoResearchParams()
    eval_budget_fraction: float = Field(
        0.3, ge=0, lt=1, description="share of the budget kept for the test eval"
    )
    max_tokens: int | None = Field(80, ge=1, le=8192, description="tokens per call (None: sampling's)")
    temperature: float | None = Field(
        None, ge=0, le=2, description="None: sampling's (anthropic: model default)"
    )
    top_p: float | None = Field(None, gt=0, le=1, description="None: sampling's (anthropic: model default)")
    max_problems_eval: int = Field(
        6, ge=1, le=BIG, description="test problems of the with/without-behaviours comparison"
    )
    eval_samples: int = Field(1, ge=1, le=1000, description="episodes per test problem and arm")
    cache_path: Name = Field(".orchestry/api_grpo_cache.sqlite", description="response cache (repo-relative)")
    preflight: bool = Field(True, description="check key and server before any work")


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


class Params(_Section):
    """The whole ``params.yaml``; a missing section takes its defaults."""

    model: ModelParams = ModelParams()
    sampling: SamplingParams = SamplingParams()
    sandbox: SandboxParams = SandboxParams()
    prepare: PrepareParams = PrepareParams()
    baselines: BaselinesParams = BaselinesParams()
    train_magrpo: TrainMagrpoParams = TrainMagrpoParams()
    api_grpo: ApiGrpoParams = ApiGrpoParams()
    train_orchestrator: TrainOrchestratorParams = TrainOrchestratorParams()
    evaluate: EvaluateParams = EvaluateParams()
    detect_schemes: DetectSchemesParams = DetectSchemesParams()
    intervals: IntervalsParams = IntervalsParams()
    plot: PlotParams = PlotParams()
    mlflow: MlflowParams = MlflowParams()

    @model_validator(mode="after")
    def _across_sections(self) -> Params:
        if self.model.numerics == "portable":
            if self.train_magrpo.bf16_update is True:
                raise ValueError(
                    "model.numerics: portable trains in fp32: set train_magrpo.bf16_update auto or false"
                )
            if self.model.dtype != "float32" or self.model.load_in_4bit:
                raise ValueError("model.numerics: portable needs model.dtype float32 and load_in_4bit false")
            if self.model.decode_dtype == "bfloat16":
                raise ValueError(
                    "model.numerics: portable decodes in fp32: set model.decode_dtype auto or float32"
                )
        if self.model.decode_dtype == "bfloat16" and self.model.decode_products != "onednn":
            raise ValueError("model.decode_dtype: bfloat16 needs model.decode_products: onednn")
        if self.train_magrpo.warm_start_epochs not in (0, "auto") and self.prepare.source != "compositional":
            raise ValueError(
                "train_magrpo.warm_start_epochs needs prepare.source: compositional (the generated problems' "
                f"reference decompositions; got {self.prepare.source!r}): set train_magrpo.warm_start_epochs: 0"
            )
        return self
