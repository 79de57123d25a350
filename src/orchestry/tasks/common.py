"""What the multi-agent tasks share: a turn of an episode, the task interface, answer features.

A *task* fixes the agents (roles, in turn order), what each agent is asked given the transcript so far,
how a (possibly unfinished) transcript is scored by executable checks, and which measurable features of a
transcript the behaviour library may contrast (:mod:`orchestry.algorithms.behaviors`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol

from orchestry.analysis.code_ast import safe_parse
from orchestry.problems import Problem
from orchestry.rewards.code import extract_code

if TYPE_CHECKING:
    from orchestry.sandbox import Sandbox

GUIDELINES_HEADER = "\n\nGuidelines learned from earlier episodes:\n"


@dataclass(frozen=True)
class Turn:
    """One agent's action in an episode.

    Attributes:
        role: the acting agent (``helper``, ``main``, ``writer``, ``reviewer``, ``refactorer``).
        system / prompt: what the agent was sent (system prompt, user message).
        text: the agent's answer.
        sample_index: which of the k samples this is (cache key).
        prompt_tokens / completion_tokens: tokens of the call; usd: its cost in USD when it was made.
        cached: the response came from the cache (free in this run).
        stop_reason: the backend's stop reason (``length``/``max_tokens`` when cut off).
    """

    role: str
    system: str
    prompt: str
    text: str
    sample_index: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float = 0.0
    cached: bool = False
    stop_reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def truncated(self) -> bool:
        return self.stop_reason in ("length", "max_tokens")


class Task(Protocol):
    """A multi-agent, multi-turn task: one turn per role, in order."""

    name: str
    roles: tuple[str, ...]
    max_reward: float
    feature_guides: Mapping[str, tuple[str, str | None, str | None]]

    def messages(
        self, problem: Problem, turns: Sequence[Turn], behaviors: Mapping[str, str]
    ) -> tuple[str, str]:
        """``(system, user)`` for the next agent, ``roles[len(turns)]``."""
        ...

    def score(
        self, problems: Sequence[Problem], transcripts: Sequence[Sequence[Turn]], sandbox: Sandbox
    ) -> list[dict]:
        """Executable reward of each (possibly unfinished) transcript: dicts with at least ``total``."""
        ...

    def features(self, problem: Problem, turns: Sequence[Turn], reward: Mapping) -> dict[str, float]:
        """Measurable features of a finished transcript (booleans as 0/1)."""
        ...


def with_guidelines(text: str, behaviors: str) -> str:
    """Append learned guidelines the way :meth:`orchestry.problems.Problem.helper_prompt` does."""
    return text + (GUIDELINES_HEADER + behaviors if behaviors else "")


def next_message(
    task: Task, turns: Sequence[Turn], behaviors: Mapping[str, str], system: str, user: str
) -> tuple[str, str]:
    """``(system, user)`` for the agent of the next turn, ``user`` with the guidelines learned for its role."""
    return system, with_guidelines(user, behaviors.get(task.roles[len(turns)], ""))


def finished(task: Task, turns: Sequence[Turn]) -> ValueError:
    """The error of ``messages`` on an episode that has had all its turns."""
    return ValueError(f"{task.name} has {len(task.roles)} turns; got a transcript of {len(turns)}")


def write_review_revise(
    task: Task,
    turns: Sequence[Turn],
    behaviors: Mapping[str, str],
    write: tuple[str, str],
    review: Callable[[str], tuple[str, str]],
    revise: Callable[[str, str], tuple[str, str]],
) -> tuple[str, str]:
    """The next message of a three-turn ``writer -> reviewer -> reviser`` episode: ``write`` is the writer's
    ``(system, user)``; ``review(draft)`` and ``revise(draft, review)`` make the others' from the code of the
    writer's answer (the answer itself when it holds none) and the reviewer's answer.

    Raises:
        ValueError: the episode is already finished.
    """
    if not turns:
        return next_message(task, turns, behaviors, *write)
    if len(turns) > 2:
        raise finished(task, turns)
    draft = extract_code(turns[0].text)[0] or turns[0].text
    if len(turns) == 1:
        return next_message(task, turns, behaviors, *review(draft))
    return next_message(task, turns, behaviors, *revise(draft, turns[1].text.strip()))


def part_weights(params: object, parts: Sequence[str]) -> dict[str, float]:
    """The weights of a checked reward's parts, in ``parts`` order: ``{part: params.<part>_weight}`` (the
    ``api_grpo.story``/``documentation``/``research`` params name them so)."""
    return {k: getattr(params, f"{k}_weight") for k in parts}


def checked_result_line(reward: Mapping, parts: Sequence[str], max_reward: float) -> str:
    """What the judge is told about a checked reward: its total of ``max_reward``, each part (0-1) and the
    first three ``reasons``."""
    shown = ", ".join(f"{k} {reward.get(k, 0):.2f}" for k in parts)
    reasons = "; ".join(reward.get("reasons", [])[:3])
    return f"checked reward {reward.get('total', 0):.2f} of {max_reward:.2f} ({shown})" + (
        f"; {reasons}" if reasons else ""
    )


_FENCE_LINE = re.compile(r"^[ \t]*```", re.MULTILINE)


def answer_features(role: str, turn: Turn) -> dict[str, float]:
    """Features of one answer, prefixed by ``role``: has_code, code_lines, chars, fenced, prose_after_code,
    truncated, has_docstring, parses."""
    code, _ = extract_code(turn.text)
    fences = list(_FENCE_LINE.finditer(turn.text))
    after = turn.text[fences[-1].end() :] if len(fences) >= 2 else ""
    tree = safe_parse(code) if code else None
    has_doc = False
    if tree is not None:
        has_doc = any(
            isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and ast.get_docstring(n)
            for n in ast.walk(tree)
        )
    return {
        f"{role}_has_code": float(bool(code.strip())),
        f"{role}_code_lines": float(sum(1 for ln in code.splitlines() if ln.strip())),
        f"{role}_chars": float(len(turn.text)),
        f"{role}_fenced": float(bool(fences)),
        f"{role}_prose_after_code": float(len(after.strip()) > 40),
        f"{role}_truncated": float(turn.truncated),
        f"{role}_has_docstring": float(has_doc),
        f"{role}_parses": float(tree is not None and bool(code.strip())),
    }


def answer_guides(role: str) -> dict[str, tuple[str, str | None, str | None]]:
    """Guideline templates for :func:`answer_features`: feature -> (role, if higher in top, if lower in top).

    ``{top}``/``{bottom}`` in a template are filled with the feature's mean in the top/bottom trajectories.
    """
    return {
        f"{role}_has_code": (role, "Always answer with code.", None),
        f"{role}_code_lines": (
            role,
            "Write a complete implementation (top episodes: about {top:.0f} lines of code, others {bottom:.0f}).",
            "Keep the code short (top episodes: about {top:.0f} lines of code, others {bottom:.0f}).",
        ),
        f"{role}_fenced": (
            role,
            "Put the code in one ```python block.",
            "Answer with plain code, without markdown fences.",
        ),
        f"{role}_prose_after_code": (
            role,
            None,
            "Stop after the code block: no explanation after the code.",
        ),
        f"{role}_truncated": (role, None, "Keep the answer short enough to finish within the token limit."),
        f"{role}_has_docstring": (
            role,
            "Give each function a one-line docstring.",
            "Skip docstrings and comments.",
        ),
        f"{role}_parses": (role, "Make sure the code is complete, valid Python.", None),
    }
