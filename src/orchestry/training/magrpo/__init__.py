"""MAGRPO: the multi-agent GRPO trainer of LoRA agents on one local base model (:mod:`.trainer`) and the parts of
its loop (rollouts, turns, workflows, rewards, sampling, batching, checkpoints, step log, warm start)."""

from orchestry.training.magrpo.common import AGENTS, WORKFLOW_AGENTS, Rollout, agent_names, flat_groups
from orchestry.training.magrpo.trainer import MAGRPOTrainer

__all__ = ["AGENTS", "WORKFLOW_AGENTS", "MAGRPOTrainer", "Rollout", "agent_names", "flat_groups"]
