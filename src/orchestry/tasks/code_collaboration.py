"""The code collaboration task as a two-turn episode: ``helper`` writes ``aux``, then ``main`` the entry point.

Prompts are :meth:`orchestry.problems.Problem.helper_prompt` / ``main_prompt`` (paraphrasing the MAGRPO
authors' experiment prompts) with the learned guidelines injected. With ``main_sees_helper`` (the default
for search) main's prompt shows the helper's code of *its* trajectory, as in the sequential baseline: the
beam then searches over helper code that main can build on. Scoring is the MAGRPO level reward
(:func:`orchestry.rewards.code.level_rewards`, max 4.0); an unfinished transcript (helper only) is scored
with an empty main, which leaves only the helper's structure points (0.4 for an ``aux`` that returns).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from orchestry.analysis.code_ast import safe_parse, top_level_function
from orchestry.analysis.schemes import SCHEMES, aux_call_info, detect_scheme
from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, Problem
from orchestry.rewards.code import RewardConfig, extract_code, level_rewards
from orchestry.tasks.common import Turn, answer_features, answer_guides, finished

if TYPE_CHECKING:
    from orchestry.sandbox import Sandbox

_SCHEME_GUIDES = {
    "fallback": "Call `aux` with a fallback: try it and fall back to your own logic (try/except or a check on its result).",
    "decorator": "Call `aux` once and add your own pre- or post-processing around its result.",
    "coordinator": "Call `aux` on each part of the input (in a loop or comprehension) and combine the results.",
    "strategy_filter": "Use the result of `aux` to choose a branch (`if aux(...)`).",
    "wrapper": "Returning `aux(...)` directly worked.",
    "none": "Solving the task without calling `aux` worked.",
}


class CodeCollaboration:
    """Helper -> main (two turns); reward: MAGRPO level reward (max 4.0)."""

    name = "code_collaboration"
    roles = ("helper", "main")

    def __init__(self, main_sees_helper: bool = True, reward_config: RewardConfig | None = None):
        self.main_sees_helper = main_sees_helper
        self.reward_config = reward_config or RewardConfig()
        self.max_reward = self.reward_config.max_total
        guides: dict[str, tuple[str, str | None, str | None]] = {}
        for role in self.roles:
            guides.update(answer_guides(role))
        guides.update(
            {
                "helper_aux_returns": (
                    "helper",
                    "Define `aux` at the top level and make it return a value.",
                    None,
                ),
                "main_defines_entry": (
                    "main",
                    "Define the requested function itself, at the top level.",
                    None,
                ),
                "main_calls_aux": (
                    "main",
                    "Call `aux` inside the requested function and use its return value.",
                    "Solve the task directly; calling `aux` did not help.",
                ),
                "main_is_wrapper": (
                    "main",
                    None,
                    "Do not just return `aux(...)`: add your own logic around it.",
                ),
                "main_redefines_aux": ("main", None, "Do not define `aux` again: it already exists."),
            }
        )
        for scheme in SCHEMES:
            positive = _SCHEME_GUIDES[scheme] if scheme not in ("wrapper", "none") else None
            guides[f"scheme_{scheme}"] = ("main", positive, None)
        self.feature_guides = guides

    def messages(
        self, problem: Problem, turns: Sequence[Turn], behaviors: Mapping[str, str]
    ) -> tuple[str, str]:
        """``(system, user)`` for ``helper`` (no turn yet) or ``main`` (after the helper's turn).

        Raises:
            ValueError: the episode is already finished.
        """
        if not turns:
            return HELPER_SYSTEM, problem.helper_prompt(behaviors=behaviors.get("helper", ""))
        if len(turns) == 1:
            helper_code = extract_code(turns[0].text)[0] if self.main_sees_helper else ""
            return MAIN_SYSTEM, problem.main_prompt(helper_code or None, behaviors=behaviors.get("main", ""))
        raise finished(self, turns)

    def score(
        self, problems: Sequence[Problem], transcripts: Sequence[Sequence[Turn]], sandbox: Sandbox
    ) -> list[dict]:
        """Level rewards (:meth:`LevelReward.to_dict`) of each transcript, all in one sandbox batch."""
        helpers = [t[0].text if t else "" for t in transcripts]
        mains = [t[1].text if len(t) > 1 else "" for t in transcripts]
        rewards = level_rewards(list(problems), helpers, mains, sandbox, self.reward_config)
        return [r.to_dict() for r in rewards]

    def features(self, problem: Problem, turns: Sequence[Turn], reward: Mapping) -> dict[str, float]:
        """Answer features of both agents plus aux definition/use and the cooperation scheme (one-hot).

        The scheme is :func:`orchestry.analysis.schemes.detect_scheme` on main's extracted code.
        """
        helper, main = turns[0], turns[1]
        feats = {**answer_features("helper", helper), **answer_features("main", main)}
        helper_code, _ = extract_code(helper.text)
        main_code, _ = extract_code(main.text)
        tree = safe_parse(helper_code)
        aux = top_level_function(tree, "aux") if tree is not None else None
        returns = aux is not None and any(
            isinstance(n, ast.Return) and n.value is not None for n in ast.walk(aux)
        )
        info = aux_call_info(main_code, problem.entry_point)
        scheme = detect_scheme(main_code, problem.entry_point)
        feats.update(
            helper_aux_returns=float(returns),
            main_defines_entry=float(info.entry_found),
            main_calls_aux=float(info.calls_aux),
            main_is_wrapper=float(info.is_wrapper and info.calls_aux),
            main_redefines_aux=float(info.redefines_aux),
            outcome_syntax_ok=float(reward.get("syntax", 0) > 0),
            outcome_any_test_passed=float(reward.get("passed", 0) > 0),
            outcome_all_tests_passed=float(
                reward.get("total_asserts", 0) > 0 and reward.get("passed") == reward.get("total_asserts")
            ),
        )
        for s in SCHEMES:
            feats[f"scheme_{s}"] = float(scheme == s)
        return feats
