"""The ``train_magrpo`` section of ``params.yaml`` (:class:`TrainMagrpoParams`), its coach (:class:`CoachParams`) and
the names of its advantage estimators and critics (:mod:`orchestry.config`).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from orchestry.config.base import BIG, Name, Seed, _Section, _unique
from orchestry.config.clients import ApiClientParams

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
