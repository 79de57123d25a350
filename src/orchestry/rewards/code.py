"""The level reward of the code-collaboration task (helper writes ``aux``, main writes the entry point).

Source: MAGRPO paper (arXiv 2508.04652, code-generation reward) and the authors' CoMLRL experiment code
(``rewards/code_rewards.py``: ``execution_reward_aux``). Each level gates the next; the maximum is 4.0:

1. structure (0..1.0): +0.4 if the helper's code defines ``aux`` at its top level and ``aux`` returns a value
   (a ``return <value>`` in aux's own body, not in a nested function; ``return None`` does not count);
   +0.6 if main's code defines the entry point at its top level. No entry point: stop. Code that does not
   parse is searched chunk by chunk (see ``_function_facts``), so a broken function still counts as defined
   and level 2 reports the error.
2. syntax (0 or 0.5): ``problem.context + helper + main`` compiles. Otherwise stop.
3. tests (0..1.0): passed / total of the problem's assert units, each run on its own in the sandbox.
4. cooperation (0..1.5, only if >= 1 assert passed and the helper defines ``aux``): +0.5 if the entry point
   uses aux; +1.0 more if it is not a mere wrapper of aux; -0.5 if aux is called but its value ignored.

Two deliberate differences from the paper's reward, both on by default (:class:`RewardConfig`): the structure
and syntax points are paid only to a program that passes at least one assert (``format_needs_a_pass``; the
levels are still recorded), and a sample cut at the token limit is scored on its finished statements without
the structure and syntax points (``cut_answers``). Without them a weak policy is paid for short
well-formed wrong code and for never finishing.

Alongside the gated levels, every sample gets ungated collaboration facts that can move long before a pair
passes an assert (:class:`LevelReward`): ``aux_defined`` (the helper defines a top-level ``aux``),
``aux_called`` (main's entry point calls or references the helper's ``aux``), ``aux_used`` (it calls aux and
keeps the value of at least one call) and ``truncated`` (a completion hit the token limit; only the caller
knows token counts, so it is passed in, ``None`` when unknown).

Differences from the authors' regex-based code, all deliberate: definitions, wrappers and ignored values are
read from the AST (see :mod:`orchestry.analysis.aux_calls`), so a shadowed ``aux`` is not a call to the helper; the
entry point only needs to be defined (docs/algorithms.md, section 2), not to contain ``return``; the tested
program is the extracted code of both agents as written (not only the two functions cut out of it).

A main that redefines ``aux`` is tested as written -- the later definition wins at run time, so the tests
run main's own copy -- but it gets no cooperation bonus (its calls do not reach the helper), and the reasons
say so. (The authors' later code zeroes such samples; this module keeps the gentler rule.)

Model answers are first reduced to code with :func:`extract_code` (:mod:`orchestry.analysis.extract`; the
embedded SmolLM2 answers with a ```` ```python ```` fence followed by prose, see docs/algorithms.md, section 1).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from orchestry.analysis.aux_calls import AuxCallInfo
from orchestry.analysis.code_ast import safe_parse, top_level_function
from orchestry.analysis.extract import MAX_ANSWER_CHARS, extract_code
from orchestry.analysis.schemes import aux_call_info
from orchestry.problems import Problem
from orchestry.sandbox import Job

if TYPE_CHECKING:  # the sandbox is only needed at run time, through the object the caller passes in
    from orchestry.sandbox import ExecutionResult, Sandbox

MAX_TOTAL = 4.0
_REASON_CHARS = 300

_CHUNK_START = re.compile(r"^(?:@|def |async def |class )")
_RETURN_LINE = re.compile(r"^[ \t]+return[ \t]+(?!None[ \t]*(?:#.*)?$)\S")


# ---------------------------------------------------------------------------------------------------------
# reward records
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RewardConfig:
    """Weights of the level reward; defaults are the MAGRPO paper's (CoMLRL ``execution_reward_aux``).

    Attributes:
        aux_defined_returns: level 1, helper defines ``aux`` and it returns a value.
        entry_point: level 1, main defines the entry point.
        syntax: level 2, the combined program compiles.
        tests: level 3, scaled by the share of asserts passed.
        calls_aux: level 4, the entry point uses aux.
        not_wrapper: level 4, the entry point is not a mere wrapper of aux (given it uses aux).
        ignored_return: level 4, added (negative) when an aux call's value is ignored (given it uses aux).
        aux_name: the helper function's name.
        max_answer_chars: longer answers score 0 with a reason (bounds parse/extraction work).
        format_needs_a_pass: the structure and syntax points are paid only to a program that passes at least
            one assert (the cooperation level's gate, applied to the format levels too). Otherwise a weak policy
            whose programs rarely pass is paid 1.5 of 4.0 for any short program that parses, and learns exactly
            that: on the generated problems the default run with format always paid raised the trained pair's
            mean reward from 1.02 to 1.43 while its pass@1 fell from 0.062 to 0.016 (one-line bodies such as
            ``return xs ** 2``). With the gate, a wrong program earns 0 however well-formed, so the reward
            rises only with correctness (partial: passed/total asserts) and cooperation.
        cut_answers: how a sample whose completion hit the token limit (``truncated=`` flags) is paid.
            ``finished_part`` (default): scored on its finished statements only (:func:`extract_code` drops
            the unfinished tail of an unclosed block), so it can earn its asserts and cooperation but never
            the format points, which complete answers can earn; nothing in the reward grows with length, and
            stopping is worth the format points (DAPO, arXiv 2503.14476, penalises overlong samples).
            ``zero``: 0 at every level, with a reason, even when its finished functions pass (the rule of
            earlier versions: on the generated test split it scored 0 a quarter of the base pair's samples
            that were correct before the cut); the ungated collaboration facts and the scheme are still
            recorded. ``paid``: like a complete answer. Before either rule a cut answer kept the structure
            points of the function it was cut in (a broken function still counts as defined) and a policy
            learned to never stop.
    """

    aux_defined_returns: float = 0.4
    entry_point: float = 0.6
    syntax: float = 0.5
    tests: float = 1.0
    calls_aux: float = 0.5
    not_wrapper: float = 1.0
    ignored_return: float = -0.5
    aux_name: str = "aux"
    max_answer_chars: int = MAX_ANSWER_CHARS
    cut_answers: Literal["finished_part", "zero", "paid"] = "finished_part"
    format_needs_a_pass: bool = True

    @property
    def max_total(self) -> float:
        """The best reachable total (4.0 with the defaults)."""
        return (
            self.aux_defined_returns
            + self.entry_point
            + self.syntax
            + self.tests
            + self.calls_aux
            + (self.not_wrapper)
        )


@dataclass
class LevelReward:
    """The reward of one (helper, main) sample, level by level (MAGRPO paper's code reward).

    Attributes:
        structure: level 1 (0..1.0 with the defaults).
        syntax: level 2 (0 or 0.5).
        tests: level 3 (0..1.0), ``passed / total_asserts``.
        cooperation: level 4 (0..1.5).
        passed: asserts passed (0 when level 3 was not reached).
        total_asserts: asserts of the problem (0 only for an unknown problem).
        scheme: cooperation scheme of main's code (:data:`orchestry.analysis.schemes.SCHEMES`); computed whenever
            main's code parses, even when level 4 is not reached (useful for analysis).
        aux_defined: (ungated) the helper's code defines ``aux`` at its top level (the structure level's
            test: a ``def aux`` nested in a class or function does not count; a broken top-level one does).
        aux_called: (ungated) main's entry point calls or references the helper's ``aux`` -- directly, in a
            nested function, lambda or comprehension, or through another top-level function of main's code it
            calls (:attr:`orchestry.analysis.aux_calls.AuxCallInfo.calls_aux`). False when main's code does not parse,
            does not define the entry point, or rebinds ``aux`` (its calls then reach main's own copy).
        aux_used: (ungated) ``aux_called`` and at least one aux call site's value is used: not every site is
            a bare statement ``aux(x)`` nor ``v = aux(x)`` with ``v`` never read (the cooperation level's
            "value ignored" test, :attr:`orchestry.analysis.aux_calls.AuxCallInfo.ignored_lines`). ``aux`` passed as a
            value (``map(aux, xs)``) counts as used.
        truncated: a completion of this sample hit the token limit (``max_completion_length``), as told by
            the caller (``truncated=`` of :func:`level_rewards`); ``None``: not known.
        format_paid: the structure and syntax points count in :attr:`total`. False when
            :attr:`RewardConfig.format_needs_a_pass` holds and no assert passed, or a completion was cut at
            the token limit (:attr:`RewardConfig.cut_answers` ``finished_part``): ``structure`` and ``syntax`` still
            record what the code reached (diagnostics), the reward pays only tests and cooperation.
        reasons: one line per lost point, prefixed by ``helper:``/``main:``/``syntax:``/``tests:``/
            ``cooperation:``.
    """

    structure: float = 0.0
    syntax: float = 0.0
    tests: float = 0.0
    cooperation: float = 0.0
    passed: int = 0
    total_asserts: int = 0
    scheme: str = "none"
    reasons: list[str] = field(default_factory=list)
    aux_defined: bool = False
    aux_called: bool = False
    aux_used: bool = False
    truncated: bool | None = None
    format_paid: bool = True

    @property
    def total(self) -> float:
        """The reward: sum of the four levels (max 4.0 with the default weights), the structure and syntax
        points counted only when :attr:`format_paid` (see :attr:`RewardConfig.format_needs_a_pass`)."""
        paid = self.structure + self.syntax if self.format_paid else 0.0
        return paid + self.tests + self.cooperation

    @property
    def all_passed(self) -> bool:
        """Every assert passed (the pass@1 event)."""
        return self.total_asserts > 0 and self.passed == self.total_asserts

    def to_dict(self) -> dict:
        """The flat fields ``structure, syntax, tests, cooperation, total, passed, total_asserts, scheme,
        reasons, aux_defined, aux_called, aux_used, truncated``: raw level values (``total`` in 0..4.0 with the
        default weights), ``reasons`` a new list, the ungated collaboration facts (``truncated`` may be null).
        """
        return {
            "structure": self.structure,
            "syntax": self.syntax,
            "tests": self.tests,
            "cooperation": self.cooperation,
            "total": self.total,
            "passed": self.passed,
            "total_asserts": self.total_asserts,
            "scheme": self.scheme,
            "reasons": list(self.reasons),
            "aux_defined": self.aux_defined,
            "aux_called": self.aux_called,
            "aux_used": self.aux_used,
            "truncated": self.truncated,
            "format_paid": self.format_paid,
        }


def build_program(problem: Problem, helper_code: str, main_code: str) -> str:
    """The tested program: ``problem.context`` (imports, prompt helpers) + helper's code + main's code.

    Nothing is removed: if main redefines ``aux``, main's later definition wins at run time (the reward
    notes it and withholds the cooperation bonus). The test setup and asserts are added by the sandbox.
    """
    parts = [p.strip("\n") for p in (problem.context, helper_code, main_code) if p and p.strip()]
    return "\n\n\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------------------
# level helpers
# ---------------------------------------------------------------------------------------------------------
def _short(text: str, limit: int = _REASON_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _function_facts(code: str, name: str) -> tuple[bool, bool]:
    """``(defined, returns_value)`` for the top-level function ``name`` of ``code``.

    On the AST when ``code`` parses (the last definition wins, as at run time). Otherwise per top-level
    chunk (split before column-0 ``def``/``class``/``@`` lines): a chunk that parses is read on its AST, a
    broken one by text (``def name(`` at column 0, an indented ``return <value>`` line), as the authors'
    regex check did -- so a function with a syntax error still counts as defined and level 2 reports the
    error.
    """
    if not code:
        return False, False
    tree = safe_parse(code)
    if tree is not None:
        fn = top_level_function(tree, name)
        return fn is not None, fn is not None and _returns_value(fn)
    found = (False, False)
    header = re.compile(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(")
    chunk: list[str] = []
    for line in [*code.splitlines(), "def _end_():"]:
        if _CHUNK_START.match(line) and chunk and not chunk[-1].startswith("@"):
            sub = safe_parse("\n".join(chunk))
            if sub is not None:
                fn = top_level_function(sub, name)
                if fn is not None:
                    found = (True, _returns_value(fn))
            elif any(header.match(c) for c in chunk):
                found = (True, any(_RETURN_LINE.match(c) for c in chunk))
            chunk = []
        chunk.append(line)
    return found


def _returns_value(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A ``return <value>`` (not ``return None``) in ``fn``'s own body (nested defs and lambdas excluded)."""
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            if node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None
            ):
                return True
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def _compile_error(code: str) -> str:
    """``""`` if ``code`` compiles, else ``"SyntaxError line N: message"``."""
    try:
        compile(code, "<program>", "exec", dont_inherit=True)
    except SyntaxError as e:
        return f"{type(e).__name__} line {e.lineno}: {e.msg}"
    except (ValueError, MemoryError, RecursionError, OverflowError) as e:
        return f"{type(e).__name__}: {e}"
    return ""


@dataclass
class _Pending:
    problem: Problem
    reward: LevelReward
    main_code: str = ""
    aux_defined: bool = False
    program: str | None = None  # set when level 3 is reached
    job: int = -1
    info: AuxCallInfo | None = None


def _answer(text: object, who: str, extract: bool, config: RewardConfig, reasons: list[str]) -> str:
    if extract:
        code, why = extract_code(text, config.max_answer_chars)  # type: ignore[arg-type]
    elif not isinstance(text, str):
        code, why = "", f"answer is not text ({type(text).__name__})"
    elif len(text) > config.max_answer_chars:
        code, why = "", f"answer too long ({len(text)} characters > {config.max_answer_chars})"
    else:
        code, why = text, ""
    if why:
        reasons.append(f"{who}: {why}")
    return code


def _levels_1_2(
    problem: Problem, helper: object, main: object, config: RewardConfig, extract: bool, pair: bool
):
    """Levels 1 and 2 on the AST; returns a :class:`_Pending` with ``program`` set if level 3 is due."""
    reward = LevelReward(total_asserts=len(problem.asserts))
    st = _Pending(problem=problem, reward=reward)
    reasons = reward.reasons
    aux = config.aux_name
    helper_code = _answer(helper, "helper", extract, config, reasons) if pair else ""
    main_code = _answer(main, "main", extract, config, reasons)
    st.main_code = main_code

    if pair:
        st.aux_defined, returns = _function_facts(helper_code, aux)
        if not st.aux_defined:
            if helper_code:
                reasons.append(f"helper: `{aux}` not defined")
        elif returns:
            reward.structure += config.aux_defined_returns
        else:
            reasons.append(f"helper: `{aux}` does not return a value")

    if not _function_facts(main_code, problem.entry_point)[0]:
        if main_code:
            reasons.append(f"main: entry point `{problem.entry_point}` not defined")
        return st
    reward.structure += config.entry_point
    st.info = aux_call_info(main_code, problem.entry_point, aux) if pair else None
    if st.info is not None:
        reward.scheme = st.info.scheme
        if st.info.redefines_aux:
            reasons.append(f"main: redefines `{aux}` (main's copy overrides the helper's at run time)")

    program = build_program(problem, helper_code, main_code)
    error = ""
    for who, code in (("helper", helper_code), ("main", main_code), ("program", program)):
        if code and (error := _compile_error(code)):
            reasons.append(f"syntax: {who}: {error}")
            break
    if error:
        return st
    reward.syntax = config.syntax
    if not problem.asserts:
        reasons.append("tests: problem has no asserts")
        return st
    st.program = program
    return st


def _run_jobs(sandbox: Sandbox, jobs: list) -> list[ExecutionResult | str]:
    """``sandbox.run_batch``; if the sandbox itself fails, each job alone, a failure becoming its message."""
    if not jobs:
        return []
    try:
        results = list(sandbox.run_batch(jobs))
        if len(results) == len(jobs):
            return results
    except Exception:  # fall back to one job at a time to keep every other result
        pass
    out: list[ExecutionResult | str] = []
    for job in jobs:
        try:
            out.append(sandbox.run(job))
        except Exception as e:  # the sandbox's failure is this job's result
            out.append(f"sandbox error: {type(e).__name__}: {_short(e)}")
    return out


def _level_3(states: list[_Pending], sandbox: Sandbox, config: RewardConfig) -> None:
    """One ``sandbox.run_batch`` for every pair that reached level 3 (identical programs run once)."""
    jobs: list = []
    index: dict[tuple, int] = {}
    for st in states:
        if st.program is None:
            continue
        p = st.problem
        key = (st.program, p.asserts, p.test_setup)
        if key not in index:
            index[key] = len(jobs)
            jobs.append(Job(program=st.program, asserts=tuple(p.asserts), setup=p.test_setup))
        st.job = index[key]
    results = _run_jobs(sandbox, jobs)
    for st in states:
        if st.program is None:
            continue
        reward, result = st.reward, results[st.job]
        total = len(st.problem.asserts)
        if isinstance(result, str):
            reward.reasons.append(f"tests: 0/{total} passed; {result}")
            continue
        outcomes = list(result.outcomes)[:total]
        passed = sum(1 for o in outcomes if o.passed)
        reward.passed = passed
        reward.tests = config.tests * passed / total
        if passed == total:
            continue
        fails = [
            f"assert {i + 1}: {_short(o.reason, 120) or 'failed'}"
            for i, o in enumerate(outcomes)
            if not o.passed
        ]
        detail = "; ".join(fails[:3]) + (f"; ... {len(fails) - 3} more" if len(fails) > 3 else "")
        if result.error:
            detail = f"error: {_short(result.error, 160)}" + (f"; {detail}" if detail else "")
        reward.reasons.append(
            _short(f"tests: {passed}/{total} passed" + (f"; {detail}" if detail else ""), 600)
        )


def _ignored_call_count(main_code: str, info: AuxCallInfo, aux: str) -> int:
    """How many aux call sites :func:`orchestry.analysis.schemes.aux_call_info` found ignored (``info.ignored_lines``
    holds their lines, deduplicated): the bare ``aux(..)`` statements, and the assignments of an ``aux(..)``
    call to one name never read, on those lines; so two ignored calls on one line (``aux(1); aux(2)``) count
    twice and ``x = aux(1); y = aux(2); return y`` counts one."""
    tree = safe_parse(main_code)
    if tree is None or not info.ignored_lines:
        return 0
    lines = set(info.ignored_lines)
    loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    count = 0
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) not in lines:
            continue
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Expr):
            targets = []
        else:
            continue
        if len(targets) > 1 or not all(isinstance(t, ast.Name) and t.id not in loads for t in targets):
            continue
        value = node.value.value if isinstance(node.value, ast.Await) else node.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == aux:
            count += 1
    return count


def _collaboration_facts(st: _Pending, config: RewardConfig) -> None:
    """The ungated fields ``aux_defined``, ``aux_called``, ``aux_used`` (see :class:`LevelReward`)."""
    reward = st.reward
    reward.aux_defined = st.aux_defined
    info = st.info  # set once main's code defines the entry point (by AST, or by text if it does not parse)
    if info is None or not info.calls_aux:
        return
    reward.aux_called = True
    # used: some call site is not among the ignored ones (the cooperation level's -0.5 test)
    reward.aux_used = info.call_sites > _ignored_call_count(st.main_code, info, config.aux_name)


def _level_4(st: _Pending, config: RewardConfig) -> None:
    """Cooperation bonus (MAGRPO paper): only if >= 1 assert passed and the helper defines aux."""
    reward, aux = st.reward, config.aux_name
    if st.program is None:
        return
    if reward.passed < 1:
        reward.reasons.append("cooperation: no assert passed (the bonus needs at least one)")
        return
    if not st.aux_defined:
        reward.reasons.append(f"cooperation: the helper defines no `{aux}`")
        return
    info = st.info or aux_call_info(st.main_code, st.problem.entry_point, aux)
    if info.redefines_aux:
        reward.reasons.append(f"cooperation: main does not call the helper's `{aux}` (it redefines `{aux}`)")
        return
    if not info.calls_aux:
        reward.reasons.append(f"cooperation: main does not call {aux}")
        return
    coop = config.calls_aux
    if info.is_wrapper:
        reward.reasons.append(f"cooperation: main is a mere wrapper of {aux} (it only returns its value)")
    else:
        coop += config.not_wrapper
    if info.ignores_value:
        coop += config.ignored_return
        lines = ", ".join(str(n) for n in info.ignored_lines)
        reward.reasons.append(f"cooperation: value of {aux}(...) ignored (main line {lines})")
    reward.cooperation = coop


def _score(
    problems: Sequence[Problem],
    helpers: Sequence[object] | None,
    mains: Sequence[object],
    sandbox: Sandbox,
    config: RewardConfig | None,
    extract: bool,
    truncated: Sequence[bool] | None = None,
) -> list[LevelReward]:
    config = config or RewardConfig()
    pair = helpers is not None
    if len(problems) != len(mains) or (pair and len(helpers) != len(mains)):
        raise ValueError(
            f"problems, helpers and mains must have the same length, got {len(problems)}, "
            f"{len(helpers) if pair else '-'}, {len(mains)}"
        )
    if truncated is not None and len(truncated) != len(mains):
        raise ValueError(f"truncated must have one flag per sample, got {len(truncated)} for {len(mains)}")
    states: list[_Pending] = []
    for k, (problem, main) in enumerate(zip(problems, mains, strict=True)):
        helper = helpers[k] if pair else ""
        try:
            states.append(_levels_1_2(problem, helper, main, config, extract, pair))
        except Exception as e:  # a reward must never crash a training step
            bad = LevelReward(
                total_asserts=len(problem.asserts), reasons=[f"internal: {type(e).__name__}: {e}"]
            )
            states.append(_Pending(problem=problem, reward=bad))
    if truncated is not None and config.cut_answers == "zero":
        for st, flag in zip(states, truncated, strict=True):
            if flag:
                st.reward.structure = st.reward.syntax = 0.0
                st.program = None  # no tests, so no cooperation either
                st.reward.reasons.insert(0, "truncated: a completion hit the token limit (scored 0)")
    _level_3(states, sandbox, config)
    for k, st in enumerate(states):
        if not (st.reward.structure or st.reward.syntax):
            continue
        if config.format_needs_a_pass and st.reward.passed == 0:
            st.reward.format_paid = False
            st.reward.reasons.append(
                "format: structure and syntax points are paid only with a passing assert"
            )
        elif truncated is not None and truncated[k] and config.cut_answers == "finished_part":
            st.reward.format_paid = False
            st.reward.reasons.append("format: a cut answer earns no structure and syntax points")
    if pair:
        for st in states:
            try:
                _level_4(st, config)
            except Exception as e:  # a reward must never crash a training step
                st.reward.reasons.append(f"cooperation: internal {type(e).__name__}: {e}")
            try:
                _collaboration_facts(st, config)
            except Exception as e:  # a reward must never crash a training step
                st.reward.reasons.append(f"collaboration facts: internal {type(e).__name__}: {e}")
    if truncated is not None:
        for st, flag in zip(states, truncated, strict=True):
            st.reward.truncated = bool(flag)
    return [st.reward for st in states]


def level_rewards(
    problems: Sequence[Problem],
    helpers: Sequence[str],
    mains: Sequence[str],
    sandbox: Sandbox,
    config: RewardConfig | None = None,
    extract: bool = True,
    truncated: Sequence[bool] | None = None,
) -> list[LevelReward]:
    """Level rewards of B (helper, main) samples: ``helpers[i]`` and ``mains[i]`` answer ``problems[i]``.

    Structure and syntax are judged on the AST for all pairs first, then the pairs that reach level 3 run
    in ONE ``sandbox.run_batch`` (identical programs once), then cooperation.

    Args:
        problems, helpers, mains: length B each; helpers/mains are raw model answers (or code, with
            ``extract=False``). Any value is accepted: non-strings, junk or huge text score 0 with a reason.
        sandbox: an open :class:`orchestry.sandbox.Sandbox` (its timeout applies per assert).
        config: weights; ``None`` means :class:`RewardConfig` defaults (the paper's).
        extract: run :func:`extract_code` on each answer first.
        truncated: optional, one flag per sample: a completion of it hit the token limit (the caller knows
            the token counts); copied to :attr:`LevelReward.truncated` (``None`` when not given).

    Returns:
        B :class:`LevelReward` in input order; ``total`` in [0, 4.0] with the defaults.

    Raises:
        ValueError: the sequences differ in length (a caller bug, not a model output).
    """
    return _score(problems, helpers, mains, sandbox, config, extract, truncated)


def single_rewards(
    problems: Sequence[Problem],
    mains: Sequence[str],
    sandbox: Sandbox,
    config: RewardConfig | None = None,
    extract: bool = True,
    truncated: Sequence[bool] | None = None,
) -> list[LevelReward]:
    """Level rewards for the single-agent baseline (one model writes everything, no helper).

    Same levels with no helper: structure counts only the entry point (0.6), cooperation is 0, scheme
    ``"none"``, and ``aux_defined``/``aux_called``/``aux_used`` are False (there is no helper to call); the
    best total is 2.1 with the defaults. ``truncated`` as in :func:`level_rewards`.
    """
    return _score(problems, None, mains, sandbox, config, extract, truncated)


__all__ = [
    "MAX_TOTAL",
    "LevelReward",
    "RewardConfig",
    "build_program",
    "extract_code",
    "level_rewards",
    "single_rewards",
]
