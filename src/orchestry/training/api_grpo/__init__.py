"""API-GRPO: beam-search episodes of API (or local) chat agents with a behaviour library (:mod:`.trainer`), its task
and transferred library (:mod:`.setup`) and its tables (:mod:`.outputs`)."""

from orchestry.training.api_grpo.setup import TASK_ROLES, make_task, read_transfer
from orchestry.training.api_grpo.trainer import run_api_grpo

__all__ = ["TASK_ROLES", "make_task", "read_transfer", "run_api_grpo"]
