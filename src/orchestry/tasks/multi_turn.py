"""Prompts of turn t+1 in a multi-turn MAGRPO episode: each agent sees feedback on turn t.

Source: the MAGRPO paper's multi-turn setting (arXiv 2508.04652): turn-2 prompts append feedback on turn 1
(the test results, or an external expert's comments) and main sees the helper's previous code. Here the
feedback is what the sandbox reported (:func:`feedback_text`: every point the level reward withheld, with each
failing assert's source and its error), plus, optionally, a coach's comments (MAPPA's workflow, arXiv
2601.23228).

This is used for TRAINING only (the training split's asserts are shown); ``evaluate`` runs one turn, so no test
assert of the test split ever reaches a prompt.
"""

from __future__ import annotations

import re

from orchestry.problems import Problem
from orchestry.rewards.code import extract_code

MAX_FEEDBACK_CHARS = 900
_ASSERT = re.compile(r"assert (\d+): ([^;]*)")


def feedback_text(problem: Problem, reward: dict, max_chars: int = MAX_FEEDBACK_CHARS) -> str:
    """The sandbox's feedback on one (helper, main) sample, one line per withheld point.

    Args:
        problem: the sample's problem (its asserts are quoted for the failing ones).
        reward: the sample's :meth:`orchestry.rewards.code.LevelReward.to_dict` (``reasons``, ``passed``,
            ``total_asserts``).
        max_chars: the text is cut to this length.

    Returns:
        e.g. ``"tests: 1/3 passed\\n- failed: assert candidate(2) == 4  -> AssertionError"``, or
        ``"every level passed"`` when nothing was withheld.
    """
    lines: list[str] = []
    for reason in reward.get("reasons") or []:
        fails = _ASSERT.findall(reason)
        if reason.startswith("tests:") and fails:
            lines.append(reason.split(";")[0])
            for index, why in fails:
                i = int(index) - 1
                source = problem.asserts[i].strip() if 0 <= i < len(problem.asserts) else f"assert {index}"
                lines.append(f"- failed: {source}  -> {why.strip()}")
        else:
            lines.append(reason)
    text = "\n".join(lines) if lines else "every level passed"
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def _code(text: str) -> str:
    code, _ = extract_code(text or "")
    return code.strip() or "(no code)"


def next_turn_prompts(
    problem: Problem,
    helper_text: str,
    main_text: str,
    feedback: str,
    coach_feedback: dict[str, str] | None = None,
) -> tuple[str, str]:
    """User messages of turn t+1 for ``(helper, main)``.

    The helper sees its own previous ``aux`` and the feedback; main sees the helper's previous ``aux`` (as the
    sequential baseline does), its own previous code and the feedback. ``coach_feedback`` (``{"helper": ..,
    "main": ..}``) adds each agent's coach comment.

    Returns:
        ``(helper_prompt, main_prompt)``, to be rendered with :func:`orchestry.llm.local.chat_prompt` and the
        agents' system prompts.
    """
    coach_feedback = coach_feedback or {}
    helper_code, main_code = _code(helper_text), _code(main_text)

    def note(agent: str) -> str:
        c = (coach_feedback.get(agent) or "").strip()
        return f"\nCoach's comment on your last answer: {c[:400]}" if c else ""

    previous = f"\n\nFeedback on the last attempt (from running the tests):\n{feedback}\n"
    helper = (
        problem.helper_prompt()
        + f"\n\nYour last `aux`:\n```python\n{helper_code}\n```"
        + previous
        + note("helper")
        + "\nWrite an improved `aux`."
    )
    main = (
        problem.main_prompt(helper_code if helper_code != "(no code)" else None)
        + f"\n\nYour last `{problem.entry_point}`:\n```python\n{main_code}\n```"
        + previous
        + note("main")
        + f"\nWrite an improved `{problem.entry_point}`."
    )
    return helper, main


__all__ = ["MAX_FEEDBACK_CHARS", "feedback_text", "next_turn_prompts"]
