"""The orchestrator's agent pool on the code task: who may act next, what each one sees and what it changes.

One episode works on one problem. Its :class:`EpisodeState` holds the shared artefacts -- the helper's answer
(``aux``), main's answer (the entry point), the reviewer's comments, the tester's last report -- and the
history of steps. At each step the orchestrator picks one agent (or ``terminate``); the agent acts on the
shared state:

================  =================================================================  =====================
agent             acts                                                               cost per call
================  =================================================================  =====================
``helper``        writes ``aux`` (the helper prompt of :mod:`orchestry.problems`)     its tokens
``main``          writes the entry point, may call ``aux`` (sees the helper's code)   its tokens
``tester``        runs the sandbox on helper + main, reports failing asserts          ``call_cost`` (tool)
``fixer``         rewrites main given the tester's report and the review             its tokens
``reviewer``      comments on the code (three lines, no code)                        its tokens
``terminate``     ends the episode (the last action; see orchestry.algorithms)       0
================  =================================================================  =====================

Model agents run on any chat backend (:mod:`orchestry.llm.backends`) behind the response cache and the budget
(:class:`orchestry.llm.cache.CachedChat`): a prompt seen before -- the same agent in the same relevant state --
is answered from the cache, so a repeated state costs no compute on a re-run (its *cost* as a decision, the
tokens it would take, is still charged to the episode, so the learned policy does not depend on the cache).

Adding an agent is one small class (see ``docs/orchestrator.md``)::

    class Documenter(ModelAgent):
        name = "documenter"
        system = "You are a Python programmer who writes docstrings."

        def user_prompt(self, state):
            return f"Add a one-line docstring to this function:\\n```python\\n{state.main_code}\\n```"

        def apply(self, state, text):
            state.main = text

Subclasses register themselves by ``name``; list the name in ``train_orchestrator.agents`` to use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, Problem
from orchestry.rewards.code import extract_code, level_rewards

if TYPE_CHECKING:
    from orchestry.sandbox import Sandbox

TERMINATE = "terminate"
AGENTS: dict[str, type[Agent]] = {}
"""Every agent class by name (filled by subclassing :class:`ModelAgent` / :class:`ToolAgent`)."""

_SHORT = 600  # characters of an artefact shown in history texts


@dataclass
class Step:
    """One action of an episode.

    Attributes:
        agent: the acting agent's name (``terminate`` for the last action).
        text: what the agent produced (a model answer or a tool report).
        prompt_tokens / completion_tokens: tokens of the model call (0 for tools; a cached answer counts its
            original tokens). usd: its price when first made. cached: served by the response cache.
        cost: the step's cost c_t in the run's cost unit (tokens or USD), the agent's ``call_cost`` included.
    """

    agent: str
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float = 0.0
    cached: bool = False
    cost: float = 0.0

    def to_dict(self) -> dict:
        return {
            "agent": self.agent,
            "text": self.text,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "usd": self.usd,
            "cached": self.cached,
            "cost": self.cost,
        }


@dataclass
class EpisodeState:
    """The shared state of one episode (the orchestrator's S_t).

    Attributes:
        problem: the task.
        helper / main / review: the latest answer of the helper, of main (or the fixer) and of the reviewer.
        test: the tester's last report (a level-reward dict: ``total``, ``passed``, ``total_asserts``, ...),
            ``None`` before the first test. tested: ``(helper, main)`` that report is about.
        steps: actions so far. cost: C_t so far, in the cost unit. done: terminated.
        last_prompts: each model agent's last prompt (an agent asked the same prompt again is a no-op).
    """

    problem: Problem
    helper: str = ""
    main: str = ""
    review: str = ""
    test: dict | None = None
    tested: tuple[str, str] | None = None
    steps: list[Step] = field(default_factory=list)
    cost: float = 0.0
    done: bool = False
    last_prompts: dict[str, str] = field(default_factory=dict)

    @property
    def helper_code(self) -> str:
        return extract_code(self.helper)[0] if self.helper else ""

    @property
    def main_code(self) -> str:
        return extract_code(self.main)[0] if self.main else ""

    @property
    def test_is_current(self) -> bool:
        """The last test report is about the current code."""
        return self.test is not None and self.tested == (self.helper, self.main)

    @property
    def agents(self) -> list[str]:
        """Names of the agents that acted, in order (``terminate`` excluded)."""
        return [s.agent for s in self.steps if s.agent != TERMINATE]

    def history_text(self) -> str:
        """The history the state encoder reads: newest step first (a truncating encoder drops the oldest)."""
        lines = []
        for i, s in reversed(list(enumerate(self.steps))):
            body = " ".join(s.text.split())[:_SHORT]
            lines.append(f"step {i + 1} {s.agent}: {body}")
        return "\n".join(lines) if lines else "no agent has acted yet"


class Agent:
    """An agent of the pool: a ``name``, a fixed ``call_cost`` per call (cost unit; tools' only cost), and when
    it may act (:meth:`available`)."""

    name: ClassVar[str] = ""
    call_cost: ClassVar[float] = 0.0
    uses_model: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            AGENTS[cls.name] = cls

    def available(self, state: EpisodeState) -> bool:
        """Whether the agent may act in ``state`` (the policy masks it otherwise)."""
        return True

    def is_noop(self, state: EpisodeState) -> bool:
        """Acting now could not change the state (masked too): see :class:`ModelAgent` and :class:`Tester`."""
        return False


class ModelAgent(Agent):
    """An LLM agent: a role (``system``), a user prompt built from the state, and how its answer changes the state."""

    system: ClassVar[str] = ""

    def user_prompt(self, state: EpisodeState) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def is_noop(self, state: EpisodeState) -> bool:
        """The agent would be asked its last prompt again: answers are cached by (agent, prompt), so the answer,
        and the state, would not change."""
        return state.last_prompts.get(self.name) == self.user_prompt(state)

    def apply(self, state: EpisodeState, text: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class ToolAgent(Agent):
    """A tool agent (no model): :meth:`run` acts on a batch of states at once and returns one report each."""

    uses_model: ClassVar[bool] = False

    def run(self, states: Sequence[EpisodeState], scorer: LevelScorer) -> list[str]:  # pragma: no cover
        raise NotImplementedError


# ---- the code task's pool --------------------------------------------------------------------------------------
class HelperWriter(ModelAgent):
    """Writes ``aux`` (MAGRPO's helper prompt)."""

    name = "helper"
    system = HELPER_SYSTEM

    def user_prompt(self, state: EpisodeState) -> str:
        return state.problem.helper_prompt()

    def apply(self, state: EpisodeState, text: str) -> None:
        state.helper = text


class MainWriter(ModelAgent):
    """Writes the entry point; sees the helper's code when there is one (the sequential baseline's prompt)."""

    name = "main"
    system = MAIN_SYSTEM

    def user_prompt(self, state: EpisodeState) -> str:
        return state.problem.main_prompt(state.helper_code or None)

    def apply(self, state: EpisodeState, text: str) -> None:
        state.main = text


class Tester(ToolAgent):
    """Runs helper + main in the sandbox (the level reward's checks) and reports the failing asserts.

    ``show_asserts``: the report quotes up to two failing asserts of the problem's tests, as a developer's
    test run would. This shows hidden tests to the fixer: scores of pipelines that use the tester are not
    HumanEval's blind pass@1 (they stay comparable with each other).
    """

    name = "tester"
    call_cost = 10.0  # tokens-equivalent of a sandbox run (about 1 s of CPU), or USD when cost_unit is usd
    show_asserts: ClassVar[bool] = True

    def available(self, state: EpisodeState) -> bool:
        return bool(state.main)

    def is_noop(self, state: EpisodeState) -> bool:
        """The current code was tested already."""
        return state.test_is_current

    def run(self, states: Sequence[EpisodeState], scorer: LevelScorer) -> list[str]:
        rewards = scorer.score([(s.problem, s.helper, s.main) for s in states])
        reports = []
        for s, r in zip(states, rewards, strict=True):
            s.test, s.tested = r, (s.helper, s.main)
            reports.append(self.report(s.problem, r))
        return reports

    def report(self, problem: Problem, r: Mapping) -> str:
        """``tests passed p/n`` and the reasons points were lost, with up to two failing asserts quoted."""
        lines = [
            f"tests passed {r.get('passed', 0)}/{r.get('total_asserts', 0)} (reward {r.get('total', 0):.2f})"
        ]
        lines += [str(x) for x in r.get("reasons", [])[:3]]
        if self.show_asserts:
            failing = [int(m) for m in re.findall(r"assert (\d+):", " ".join(r.get("reasons", [])))]
            for i in failing[:2]:
                if 0 < i <= len(problem.asserts):
                    lines.append(f"failing: {problem.asserts[i - 1].strip().splitlines()[-1][:200]}")
        return "\n".join(lines)


class Fixer(ModelAgent):
    """Rewrites main given the code, the tester's last report and the reviewer's comments."""

    name = "fixer"
    system = "You are a Python programmer who fixes a function so that its tests pass."

    def available(self, state: EpisodeState) -> bool:
        return bool(state.main)

    def user_prompt(self, state: EpisodeState) -> str:
        p = state.problem
        aux = state.helper_code
        parts = [f"Fix this solution of the problem below.\n\nProblem:\n{p.prompt}"]
        if aux:
            parts.append(f"A helper function `aux` is already defined:\n```python\n{aux}\n```")
        parts.append(f"Current `{p.entry_point}`:\n```python\n{state.main_code or state.main}\n```")
        if state.test is not None:
            parts.append("Test report:\n" + Tester().report(p, state.test))
        if state.review:
            parts.append("Reviewer's comments:\n" + state.review.strip()[:_SHORT])
        parts.append(f"Write the corrected function `{p.entry_point}` only. Do not redefine `aux`.")
        return "\n\n".join(parts)

    def apply(self, state: EpisodeState, text: str) -> None:
        state.main = text


class Reviewer(ModelAgent):
    """Comments on the current code (read by the fixer)."""

    name = "reviewer"
    system = "You are a careful code reviewer. You point out bugs briefly and write no code."

    def available(self, state: EpisodeState) -> bool:
        return bool(state.main or state.helper)

    def user_prompt(self, state: EpisodeState) -> str:
        p = state.problem
        code = "\n\n".join(c for c in (state.helper_code, state.main_code) if c)
        return (
            f"Problem:\n{p.prompt}\n\nCode:\n```python\n{code}\n```\n\n"
            f"List at most three concrete bugs in `{p.entry_point}`, one short line each. Do not write code."
        )

    def apply(self, state: EpisodeState, text: str) -> None:
        state.review = text


DEFAULT_AGENTS: tuple[str, ...] = ("helper", "main", "tester", "fixer", "reviewer")


def make_agents(names: Sequence[str], call_costs: Mapping[str, float] | None = None) -> list[Agent]:
    """Instances of the named agents, in order; ``call_costs`` overrides each class's ``call_cost``.

    Raises:
        ValueError: an unknown name (the message lists the known agents) or ``terminate`` in ``names``.
    """
    out: list[Agent] = []
    for n in names:
        if n == TERMINATE:
            raise ValueError(f"'{TERMINATE}' is always the last action; do not list it among the agents")
        if n not in AGENTS:
            raise ValueError(f"unknown agent {n!r} (known: {', '.join(sorted(AGENTS))})")
        agent = AGENTS[n]()
        if call_costs and n in call_costs:
            agent.call_cost = float(call_costs[n])  # type: ignore[misc]  # instance override
        out.append(agent)
    for n in call_costs or {}:
        if n not in names:
            raise ValueError(f"call cost given for {n!r}, which is not in the pool ({', '.join(names)})")
    return out


class LevelScorer:
    """The level reward (:func:`orchestry.rewards.code.level_rewards`) of ``(problem, helper, main)`` answers,
    memoised: a program scored once in a run is never run in the sandbox again (the tester and the final
    reward share it).

    Args:
        sandbox: an open :class:`orchestry.sandbox.Sandbox`.
    """

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self._memo: dict[tuple[str, str, str], dict] = {}
        self.runs = 0

    def score(self, items: Sequence[tuple[Problem, str, str]]) -> list[dict]:
        """Level-reward dicts (:meth:`orchestry.rewards.code.LevelReward.to_dict`), one per item; the new ones
        scored in one sandbox batch."""
        todo: dict[tuple[str, str, str], tuple[Problem, str, str]] = {}
        for p, h, m in items:
            k = (p.task_id, h, m)
            if k not in self._memo:
                todo[k] = (p, h, m)
        if todo:
            vals = list(todo.values())
            rewards = level_rewards(
                [v[0] for v in vals], [v[1] for v in vals], [v[2] for v in vals], self.sandbox
            )
            self.runs += len(vals)
            for k, r in zip(todo, rewards, strict=True):
                self._memo[k] = r.to_dict()
        return [dict(self._memo[(p.task_id, h, m)]) for p, h, m in items]
