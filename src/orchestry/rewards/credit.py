"""Counterfactual per-agent credit (difference rewards) for the helper/main code-collaboration task.

Source: difference rewards, D_i = R(z) - R(z_{-i} + c_i) (Wolpert & Tumer 2002; the counterfactual baseline
idea of COMA, Foerster et al. 2018, arXiv 1705.08926), computed with the executable level reward of
:mod:`orchestry.rewards.code` and no extra generation: each agent's output is replaced by a fixed default
and the pair is scored again in the sandbox.

    credit_helper = R(helper, main) - R(DEFAULT_HELPER, main)
    credit_main   = R(helper, main) - R(helper, default_main(problem))

Defaults:

- helper: :data:`DEFAULT_HELPER`, ``aux`` that returns its first argument (``None`` without arguments). It
  defines ``aux`` and returns a value, so it keeps the structure points a helper gets for merely writing a
  returning ``aux``: the credit measures what the helper's ``aux`` does for the tests and the cooperation
  level, and a helper that main never calls gets exactly 0. (A helper whose ``aux`` returns nothing gets
  -0.4, the structure points the trivial one has.)
- main: :func:`default_main`, the entry point with main's signature replaced by ``(*args, **kwargs)`` and
  body ``return None``: it defines the entry point and compiles (structure 0.6 + syntax 0.5 kept), calls no
  ``aux`` and passes no assert that needs a value. Rewriting main's own code without its aux calls was
  rejected: removing calls changes data flow unpredictably.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestry.problems import Problem
from orchestry.rewards.code import RewardConfig, level_rewards

if TYPE_CHECKING:
    from orchestry.sandbox import Sandbox

DEFAULT_HELPER = "def aux(*args, **kwargs):\n    return args[0] if args else None\n"


def default_main(problem: Problem) -> str:
    """The counterfactual main of ``problem``: ``def <entry_point>(*args, **kwargs):\\n    return None``."""
    return f"def {problem.entry_point}(*args, **kwargs):\n    return None\n"


def _fenced(code: str) -> str:
    return f"```python\n{code}```"


@dataclass
class AgentCredit:
    """Counterfactual credit of one (helper, main) sample; rewards are level-reward totals (0..4.0).

    Attributes:
        joint: R(helper, main).
        without_helper: R(DEFAULT_HELPER, main). without_main: R(helper, default_main).
        helper / main: ``joint - without_helper`` / ``joint - without_main`` (can be negative).
    """

    joint: float
    without_helper: float
    without_main: float

    @property
    def helper(self) -> float:
        return self.joint - self.without_helper

    @property
    def main(self) -> float:
        return self.joint - self.without_main

    def to_dict(self) -> dict[str, float]:
        return {"joint": self.joint, "without_helper": self.without_helper, "without_main": self.without_main,
                "helper": self.helper, "main": self.main}  # fmt: skip


def counterfactual_credit(
    problems: Sequence[Problem],
    helpers: Sequence[str],
    mains: Sequence[str],
    sandbox: Sandbox,
    config: RewardConfig | None = None,
    extract: bool = True,
    joint: Sequence[float] | None = None,
) -> list[AgentCredit]:
    """Per-agent difference rewards of B samples, all pairs scored in ONE :func:`level_rewards` batch.

    Args:
        problems, helpers, mains: length B each, as for :func:`orchestry.rewards.code.level_rewards`.
        sandbox: an open :class:`orchestry.sandbox.Sandbox`.
        config: reward weights (``None``: the paper's defaults); must be the one that gave ``joint``.
        extract: the answers are raw model text (the defaults are then given in a ``python`` fence).
        joint: the already computed joint totals (e.g. from the training step); ``None``: scored here too.

    Returns:
        B :class:`AgentCredit` in input order.

    Raises:
        ValueError: the sequences (or ``joint``) differ in length.
    """
    n = len(problems)
    if len(helpers) != n or len(mains) != n or (joint is not None and len(joint) != n):
        raise ValueError(
            f"problems, helpers, mains (and joint) must have the same length, got {n}, {len(helpers)}, "
            f"{len(mains)}" + (f", {len(joint)}" if joint is not None else "")
        )
    wrap = _fenced if extract else (lambda code: code)
    p = list(problems) * 2
    h = [wrap(DEFAULT_HELPER)] * n + list(helpers)
    m = list(mains) + [wrap(default_main(q)) for q in problems]
    if joint is None:
        p, h, m = p + list(problems), h + list(helpers), m + list(mains)
    totals = [r.total for r in level_rewards(p, h, m, sandbox, config, extract)]
    joint_totals = list(joint) if joint is not None else totals[2 * n :]
    return [AgentCredit(float(joint_totals[i]), totals[i], totals[n + i]) for i in range(n)]


__all__ = ["DEFAULT_HELPER", "AgentCredit", "counterfactual_credit", "default_main"]
