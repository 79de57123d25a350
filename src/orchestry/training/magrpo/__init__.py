"""MAGRPO: the multi-agent GRPO trainer of LoRA agents on one local base model (:mod:`.trainer`:
``MAGRPOTrainer``) and the parts of its loop (rollouts, turns, workflows, rewards, sampling, batching, checkpoints,
step log, warm start, value baselines). The package exports the light shared names only, so the evaluation's rollouts
(``evaluation/agents`` imports :mod:`.rollouts`) do not load the trainer: a change of the trainer does not re-run
``evaluate_base``."""

from orchestry.training.magrpo.common import AGENTS, WORKFLOW_AGENTS, Rollout, agent_names, flat_groups

__all__ = ["AGENTS", "WORKFLOW_AGENTS", "Rollout", "agent_names", "flat_groups"]
