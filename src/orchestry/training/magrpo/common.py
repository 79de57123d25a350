"""What the MAGRPO trainer's parts share: the agents, the seed offsets, :class:`Rollout` (one step's samples) and
:class:`Trainer` (the trainer's state the parts read), so that no part imports the trainer or another part's
internals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.loading import adapter_parameters
from orchestry.llm.local import GenerationBatch
from orchestry.problems import AGENTS, Problem

WORKFLOW_AGENTS = {"helper_main": AGENTS, "writer_tester_fixer": ("writer", "tester", "fixer")}
# the coach's description of each role
ROLES = {
    "helper": "helper (writes the helper function `aux` the main agent may call)",
    "main": "main (writes the task's function, calling the helper's `aux` where useful)",
    "writer": "writer (writes the first version of the function)",
    "tester": "tester (writes asserts that are run on the writer's function)",
    "fixer": "fixer (writes the final function from the writer's code and the test report)",
}
BASE = "__base__"  # peft's per-row adapter name for the bare base model
FLAT_ATOL = 1e-6  # joint rewards closer than this count as equal (sums of the same levels in another order)
# seed offsets of the extra rollouts (resamples, the curriculum's base rollout), far from the steps' own seeds
RESAMPLE_SEED = 1_000_000_007
CURRICULUM_SEED = 1 << 40
TURN_SEED = 1 << 36  # seed offset of turn t (and of the workflow's phases)
SELF_DISTILL_SEED = 1 << 44  # seed offset of the warm start's sampling of the base pair's own answers


def agent_names(cfg: TrainMagrpoParams) -> tuple[str, ...]:
    """The adapters (agents) a ``train_magrpo`` config trains, in row order."""
    return WORKFLOW_AGENTS[cfg.workflow]


def flat_groups(rewards: torch.Tensor, atol: float = FLAT_ATOL) -> torch.Tensor:
    """``[N]`` bool: the groups of ``rewards [N, G]`` whose G joint rewards are all equal (within ``atol``).

    Their group-relative advantages are zero: they give no gradient (DAPO's "zero-variance" groups)."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) <= atol


@dataclass
class Rollout:
    """One step's samples. Rows of ``batch`` are ordered [problem n][agent a][generation g]."""

    problems: list[Problem]
    batch: GenerationBatch
    rewards: torch.Tensor  # [N, G] joint rewards
    details: list[dict]  # N*G reward breakdowns (LevelReward.to_dict()) + texts
    G: int
    reward_seconds: float = 0.0
    # dynamic_sampling=resample: share of flat groups when first sampled (None: as in ``rewards``), extra
    # rollouts made, groups replaced, and tokens of every row generated this step (None: ``batch.items``'s)
    zero_variance_groups: float | None = None
    resample_rollouts: int = 0
    resampled_groups: int = 0
    tokens: tuple[int, int] | None = None
    # agents whose rows ``batch`` holds, in row order (a phase of the writer/tester/fixer workflow holds one)
    agents: tuple[str, ...] = AGENTS
    # per-agent [N, G] rewards the advantage is computed from (counterfactual credit, coach mix); None: ``rewards``
    agent_rewards: dict[str, torch.Tensor] | None = None
    # [N, G] bool: samples generated in this turn (later turns skip the samples that passed every assert); None: all
    active: torch.Tensor | None = None
    turn: int = 0
    weight: float = 1.0  # loss weight of this turn (``turn_weights``)
    shared_prompt: bool = True  # the G rows of a problem share one prompt (turn 1); later turns: one per row
    metrics: dict = field(default_factory=dict)  # this rollout's step metrics (coach, credit)
    # advantage remax: the greedy joint rollout (G = 1) of the same problems at this turn, never trained
    greedy: Rollout | None = None

    @staticmethod
    def row_of(n: int, a: int, g: int, agents: int, G: int) -> int:
        """The batch row of problem ``n``, agent ``a`` (of ``agents``) and generation ``g`` (of ``G``): the one
        place the layout [problem n][agent a][generation g] is written (also for batches not yet a rollout)."""
        return (n * agents + a) * G + g

    def rows(self, agent: str | int) -> list[int]:
        """Batch rows of ``agent`` (its name, or its index in ``agents``), ordered [problem n][generation g]."""
        a = agent if isinstance(agent, int) else self.agents.index(agent)
        k = len(self.agents)
        return [self.row_of(n, a, g, k, self.G) for n in range(len(self.problems)) for g in range(self.G)]

    def reward_of(self, agent: str) -> torch.Tensor:
        """``[N, G]`` rewards that ``agent``'s advantage comes from."""
        if self.agent_rewards is not None and agent in self.agent_rewards:
            return self.agent_rewards[agent]
        return self.rewards


def new_optimizers(model, agents: Sequence[str], cfg: TrainMagrpoParams) -> dict[str, torch.optim.AdamW]:
    """One AdamW per agent over its own LoRA parameters (``learning_rate``, ``weight_decay``)."""
    return {
        a: torch.optim.AdamW(
            adapter_parameters(model, a),
            lr=cfg.learning_rate,
            weight_decay=cfg.weight_decay,
        )
        for a in agents
    }


class Trainer(Protocol):
    """The trainer's state that its parts (rollouts, turns, rewards, workflows, sampling, checkpoints, step log)
    read and write: :class:`orchestry.training.magrpo.trainer.MAGRPOTrainer` is one."""

    model: object
    tokenizer: object
    problems: Sequence[Problem]
    sandbox: object
    cfg: TrainMagrpoParams
    sampling: SamplingParams
    checkpoint_dir: Path
    reward_fn: Callable[[list[Problem], list[str], list[str]], list] | None
    history: list[dict]
    samples: list[dict]
    resume_key: str
    curriculum: dict | None
    warm_start: dict | None
    reward_baseline: dict[str, float]
    coach: object | None
    agents: tuple[str, ...]
    order: list[int]
    optimizers: dict[str, torch.optim.Optimizer]
    rank: int
    world_size: int

    def rollout(
        self, problems: Sequence[Problem], step: int, attempt: int = 0, base: bool = False
    ) -> Rollout:
        """A step's helper/main rollout (:func:`orchestry.training.magrpo.rollouts.rollout`)."""
        ...
