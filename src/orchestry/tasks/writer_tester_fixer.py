"""A three-agent sequential workflow: writer -> tester -> fixer.

The writer writes the task's function; the tester reads it and writes up to :data:`MAX_TESTS` asserts; the
asserts run on the writer's code in the sandbox (:func:`tester_reports`) and the fixer reads the writer's code
and that report, then writes the final function. The episode's joint reward is the single-agent level reward of
the fixer's code on the problem's hidden asserts (:func:`workflow_rewards`).

Trust: the tester's asserts are untrusted model code, run only inside the sandbox like any candidate program.
The problem's hidden asserts are never shown to any agent: the tester sees the task and the writer's code, the
fixer sees the tester's own asserts and their outcomes.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from orchestry.problems import Problem
from orchestry.rewards.code import LevelReward, RewardConfig, extract_code, single_rewards
from orchestry.sandbox import Job

MAX_TESTS = 6
_REASON_CHARS = 120
WRITER_SYSTEM = "You are a Python programmer who writes a first version of a function."
TESTER_SYSTEM = "You are a Python tester who writes short assert statements."
FIXER_SYSTEM = "You are a Python programmer who fixes a function using test results."


def _code(text: str) -> str:
    code, _ = extract_code(text or "")
    return code.strip()


def writer_prompt(problem: Problem) -> str:
    """The writer's user message: the task; answer with the whole function in one python block."""
    return (
        f"Solve this problem in Python:\n\n{problem.prompt}\n"
        f"Write the complete function `{problem.entry_point}` in one ```python block."
    )


def tester_prompt(problem: Problem, writer_text: str) -> str:
    """The tester's user message: the task and the writer's code; answer with asserts calling the function."""
    return (
        f"Task:\n{problem.prompt}\nA teammate wrote:\n```python\n{_code(writer_text) or '(no code)'}\n```\n"
        f"Write at most {MAX_TESTS} one-line `assert` statements that call `{problem.entry_point}` directly and "
        "check what the task asks, in one ```python block."
    )


def fixer_prompt(problem: Problem, writer_text: str, report: str) -> str:
    """The fixer's user message: the task, the writer's code and the tester's report."""
    return (
        f"Solve this problem in Python:\n\n{problem.prompt}\n"
        f"A first version:\n```python\n{_code(writer_text) or '(no code)'}\n```\n"
        f"Test report:\n{report}\n"
        f"Write the corrected, complete function `{problem.entry_point}` in one ```python block."
    )


def _assert_source(node: ast.stmt) -> str | None:
    return ast.unparse(node) if isinstance(node, ast.Assert) else None


def extract_asserts(tester_text: str, max_tests: int = MAX_TESTS) -> list[str]:
    """The top-level ``assert`` statements of the tester's answer (its code block, or its text), in order.

    When the code does not parse as a whole, each line that starts with ``assert`` is parsed on its own.
    Duplicates are dropped; at most ``max_tests`` are kept.

    Returns:
        assert statements as source text (``ast.unparse``).
    """
    code = _code(tester_text) or (tester_text or "")
    found: list[str] = []
    try:
        found = [s for s in map(_assert_source, ast.parse(code).body) if s]
    except (SyntaxError, ValueError):
        for line in code.splitlines():
            if line.strip().startswith("assert"):
                try:
                    found += [s for s in map(_assert_source, ast.parse(line.strip()).body) if s]
                except (SyntaxError, ValueError):
                    continue
    out: list[str] = []
    for s in found:
        if s not in out:
            out.append(s)
    return out[:max_tests]


@dataclass
class TesterReport:
    """Outcome of the tester's asserts on the writer's code.

    Attributes:
        passed / total: asserts that passed / ran. text: what the fixer reads (one line per assert, PASS or
        FAIL with the reason, or why nothing ran). error: why nothing ran or the program failed to load.
    """

    passed: int
    total: int
    text: str
    error: str = ""


def tester_reports(
    problems: Sequence[Problem], writer_texts: Sequence[str], tester_texts: Sequence[str], sandbox
) -> list[TesterReport]:
    """Run each tester's asserts on its writer's code (``problem.context`` first), all in ONE ``run_batch``.

    Samples without asserts, or whose writer code does not compile, run nothing; their report says why.

    Raises:
        ValueError: the sequences differ in length.
    """
    n = len(problems)
    if len(writer_texts) != n or len(tester_texts) != n:
        raise ValueError(f"got {n} problems, {len(writer_texts)} writer and {len(tester_texts)} tester texts")
    reports: list[TesterReport | None] = [None] * n
    jobs, owners, asserts_of = [], [], {}
    for i, (p, w, t) in enumerate(zip(problems, writer_texts, tester_texts, strict=True)):
        asserts = extract_asserts(t)
        code = _code(w)
        if not asserts:
            reports[i] = TesterReport(0, 0, "the tester wrote no assert", "no assert")
            continue
        program = (p.context.rstrip() + "\n\n" if p.context.strip() else "") + code + "\n"
        try:
            compile(program, "<writer>", "exec")
        except (SyntaxError, ValueError) as e:
            msg = f"the writer's code does not compile: {type(e).__name__}: {e}"[:_REASON_CHARS]
            reports[i] = TesterReport(0, len(asserts), msg, msg)
            continue
        asserts_of[i] = asserts
        owners.append(i)
        jobs.append(Job(program=program, asserts=tuple(asserts)))
    for i, res in zip(owners, sandbox.run_batch(jobs) if jobs else [], strict=True):
        lines = []
        if res.error:
            lines.append(f"error: {res.error[:_REASON_CHARS]}")
        for a, o in zip(asserts_of[i], res.outcomes, strict=True):
            lines.append(f"PASS {a}" if o.passed else f"FAIL {a}  -> {o.reason[:_REASON_CHARS] or 'failed'}")
        reports[i] = TesterReport(res.passed, res.total, "\n".join(lines), res.error)
    return reports  # type: ignore[return-value]


def workflow_rewards(
    problems: Sequence[Problem],
    fixer_texts: Sequence[str],
    sandbox,
    config: RewardConfig | None = None,
    truncated: Sequence[bool] | None = None,
) -> list[LevelReward]:
    """The joint reward of each episode: the single-agent level reward
    (:func:`orchestry.rewards.code.single_rewards`) of the fixer's final code on the hidden asserts: structure
    (entry point, 0.6), syntax (0.5), tests (0..1); 0..2.1 with the default weights."""
    return single_rewards(problems, fixer_texts, sandbox, config, truncated=truncated)


__all__ = [
    "FIXER_SYSTEM",
    "MAX_TESTS",
    "TESTER_SYSTEM",
    "WRITER_SYSTEM",
    "TesterReport",
    "extract_asserts",
    "fixer_prompt",
    "tester_prompt",
    "tester_reports",
    "workflow_rewards",
    "writer_prompt",
]
