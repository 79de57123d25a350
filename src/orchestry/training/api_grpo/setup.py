"""What an API-GRPO run is built from besides its clients (:func:`orchestry.llm.clients.open_clients`): its task
(:func:`make_task`) and the library it may start from (:func:`read_transfer`, ``api_grpo.init_behaviors``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestry.algorithms.behaviors import TransferredLibrary, read_library
from orchestry.paths import resolve_path
from orchestry.tasks.code_collaboration import CodeCollaboration
from orchestry.tasks.code_review import CodeReview
from orchestry.tasks.common import Task
from orchestry.tasks.documentation import Documentation
from orchestry.tasks.research_synthesis import ResearchSynthesis
from orchestry.tasks.story import Story

if TYPE_CHECKING:
    from orchestry.config import ApiGrpoParams


TASK_ROLES: dict[str, tuple[str, ...]] = {
    t.name: t.roles for t in (CodeCollaboration, CodeReview, Story, Documentation, ResearchSynthesis)
}
"""Each ``api_grpo.task``'s agents in turn order (where a transferred library's guidelines go: see
:meth:`orchestry.algorithms.behaviors.TransferredLibrary.mapped`)."""


def make_task(cfg: ApiGrpoParams) -> Task:
    """The task named in ``api_grpo.task``."""
    if cfg.task == "code_review":
        return CodeReview()
    if cfg.task == "story":
        return Story(cfg.story)
    if cfg.task == "documentation":
        return Documentation(cfg.documentation)
    if cfg.task == "research_synthesis":
        return ResearchSynthesis(cfg.research, root=resolve_path("."))
    return CodeCollaboration(main_sees_helper=cfg.main_sees_helper)


def read_transfer(cfg: ApiGrpoParams) -> TransferredLibrary | None:
    """The library named in ``api_grpo.init_behaviors`` (repo-relative or absolute), or None when it is null.

    Raises:
        LibraryError: missing or malformed file, naming the key and the path.
    """
    if cfg.init_behaviors is None:
        return None
    return read_library(resolve_path(cfg.init_behaviors), cfg.init_behaviors)
