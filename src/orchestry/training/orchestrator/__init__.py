"""The learned orchestrator: a REINFORCE policy that picks the next agent of a pool (:mod:`.trainer`) in its
environment of episodes and fixed pipelines (:mod:`.env`)."""

from orchestry.training.orchestrator.env import Episode, FixedPipeline, OrchestratorEnv, transition_counts
from orchestry.training.orchestrator.trainer import run_orchestrator, task_reward_range

__all__ = [
    "Episode",
    "FixedPipeline",
    "OrchestratorEnv",
    "run_orchestrator",
    "task_reward_range",
    "transition_counts",
]
