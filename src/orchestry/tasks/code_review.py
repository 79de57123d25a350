"""Code review as a three-turn episode: ``writer`` solves, ``reviewer`` critiques, ``refactorer`` rewrites.

The final code is the refactorer's; it is scored by the problem's tests with the single-agent level reward
(:func:`orchestry.rewards.code.single_rewards`: entry point 0.6 + syntax 0.5 + tests 1.0 = max 2.1). A
refactorer answer without code scores 0 (it was asked for the complete function). Unfinished transcripts
are scored on the latest code: after the writer (and after the reviewer, who writes no code) the writer's
code, so the value cannot separate reviewer samples unless the LLM judge is mixed in (``judge.on_partial``);
the beam then keeps the first N reviewer samples.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from orchestry.analysis.code_ast import safe_parse, top_level_function
from orchestry.problems import SINGLE_SYSTEM, Problem
from orchestry.rewards.code import RewardConfig, extract_code, single_rewards
from orchestry.tasks.common import Turn, answer_features, answer_guides, write_review_revise

if TYPE_CHECKING:
    from orchestry.sandbox import Sandbox

REVIEWER_SYSTEM = "You are a careful Python code reviewer."
REFACTORER_SYSTEM = "You are a Python programmer who improves code after a review."
_EDGE = re.compile(r"edge case|empty|zero|negative|boundary|corner|none\b|duplicate", re.IGNORECASE)


def _norm(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines())


class CodeReview:
    """Writer -> reviewer -> refactorer (three turns); reward: tests of the refactorer's code (max 2.1)."""

    name = "code_review"
    roles = ("writer", "reviewer", "refactorer")

    def __init__(self, reward_config: RewardConfig | None = None):
        self.reward_config = reward_config or RewardConfig()
        c = self.reward_config
        self.max_reward = c.entry_point + c.syntax + c.tests
        self._memo: dict[tuple[str, str], dict] = {}
        guides: dict[str, tuple[str, str | None, str | None]] = {}
        for role in ("writer", "refactorer"):
            guides.update(answer_guides(role))
        guides.update(
            {
                "writer_defines_entry": (
                    "writer",
                    "Define the requested function itself, at the top level.",
                    None,
                ),
                "refactorer_defines_entry": ("refactorer", "Return the complete requested function.", None),
                "reviewer_mentions_edge_cases": (
                    "reviewer",
                    "Name concrete edge cases the code must handle (empty input, zero, negatives, duplicates).",
                    None,
                ),
                "reviewer_writes_code": (
                    "reviewer",
                    "Show the fix as code.",
                    "Describe the problems in words; leave the rewriting to the refactorer.",
                ),
                "reviewer_chars": (
                    "reviewer",
                    "Give a detailed review (top episodes: about {top:.0f} characters, others {bottom:.0f}).",
                    "Keep the review brief (top episodes: about {top:.0f} characters, others {bottom:.0f}).",
                ),
                "refactorer_changed_code": (
                    "refactorer",
                    "Apply the review: change the code where it points to a problem.",
                    "Keep the writer's code unless the review finds a real bug.",
                ),
            }
        )
        self.feature_guides = guides

    def messages(
        self, problem: Problem, turns: Sequence[Turn], behaviors: Mapping[str, str]
    ) -> tuple[str, str]:
        """``(system, user)`` for the next agent of ``writer -> reviewer -> refactorer``.

        Raises:
            ValueError: the episode is already finished.
        """

        def review(code: str) -> tuple[str, str]:
            return REVIEWER_SYSTEM, (
                f"Review this solution of the problem below. List concrete bugs, missed edge cases and "
                f"simplifications, briefly. Do not rewrite the whole function.\n\nProblem:\n{problem.prompt}\n"
                f"Solution:\n```python\n{code}\n```"
            )

        def refactor(code: str, review: str) -> tuple[str, str]:
            return REFACTORER_SYSTEM, (
                f"Problem:\n{problem.prompt}\nCurrent solution:\n```python\n{code}\n```\n"
                f"Review:\n{review}\n\nWrite the complete improved function "
                f"`{problem.entry_point}` in one ```python block."
            )

        write = (SINGLE_SYSTEM, problem.single_prompt())
        return write_review_revise(self, turns, behaviors, write, review, refactor)

    def score(
        self, problems: Sequence[Problem], transcripts: Sequence[Sequence[Turn]], sandbox: Sandbox
    ) -> list[dict]:
        """Single-agent level rewards of the latest code (writer's, or the refactorer's when finished).

        Results are memoised per (task_id, answer), so re-scoring a writer's code after the reviewer's turn
        costs no sandbox run.
        """
        answers = [(t[2].text if len(t) >= 3 else t[0].text) if t else "" for t in transcripts]
        keys = [(p.task_id, a) for p, a in zip(problems, answers, strict=True)]
        todo = [i for i, k in enumerate(keys) if k not in self._memo]
        if todo:
            out = single_rewards(
                [problems[i] for i in todo], [answers[i] for i in todo], sandbox, self.reward_config
            )
            for i, r in zip(todo, out, strict=True):
                self._memo[keys[i]] = r.to_dict()
        return [dict(self._memo[k]) for k in keys]

    def features(self, problem: Problem, turns: Sequence[Turn], reward: Mapping) -> dict[str, float]:
        """Answer features of writer and refactorer, the review's length/edge-case mentions, whether the
        refactorer changed the code."""
        writer, reviewer, refactorer = turns[0], turns[1], turns[2]
        feats = {**answer_features("writer", writer), **answer_features("refactorer", refactorer)}
        w_code, _ = extract_code(writer.text)
        r_code, _ = extract_code(refactorer.text)
        review_code, _ = extract_code(reviewer.text)

        def defines(code: str) -> bool:
            tree = safe_parse(code)
            return tree is not None and top_level_function(tree, problem.entry_point) is not None

        feats.update(
            writer_defines_entry=float(defines(w_code)),
            refactorer_defines_entry=float(defines(r_code)),
            reviewer_chars=float(len(reviewer.text)),
            reviewer_mentions_edge_cases=float(bool(_EDGE.search(reviewer.text))),
            reviewer_writes_code=float(bool(review_code.strip()) and "```" in reviewer.text),
            refactorer_changed_code=float(bool(r_code) and _norm(r_code) != _norm(w_code)),
            outcome_syntax_ok=float(reward.get("syntax", 0) > 0),
            outcome_any_test_passed=float(reward.get("passed", 0) > 0),
            outcome_all_tests_passed=float(
                reward.get("total_asserts", 0) > 0 and reward.get("passed") == reward.get("total_asserts")
            ),
        )
        return feats
