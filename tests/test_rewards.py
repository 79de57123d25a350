"""The level reward (MAGRPO paper / CoMLRL) on crafted helper/main pairs, run in the real sandbox."""

from __future__ import annotations

import pytest

from orchestry.problems import load_problems, make_problem
from orchestry.rewards.code import (
    LevelReward,
    RewardConfig,
    build_program,
    extract_code,
    level_rewards,
    single_rewards,
)
from orchestry.sandbox import Sandbox

TINY = make_problem(
    {
        "task_id": "Tiny/0",
        "prompt": 'def double_all(xs: list) -> list:\n    """Double every element of xs."""\n',
        "entry_point": "double_all",
        "test": (
            "def check(candidate):\n"
            "    assert candidate([]) == []\n"
            "    assert candidate([1]) == [2]\n"
            "    assert candidate([1, 2, 3]) == [2, 4, 6]\n"
        ),
        "canonical_solution": "    return [2 * x for x in xs]\n",
    }
)
# `maybe_none` passes its first assert with an empty body (returns None)
NONE_OK = make_problem(
    {
        "task_id": "Tiny/1",
        "prompt": "def maybe_none(x):\n    pass\n",
        "entry_point": "maybe_none",
        "test": "def check(candidate):\n    assert candidate(0) is None\n    assert candidate(1) == 1\n",
    }
)
AUX_DOUBLE = "def aux(x):\n    return 2 * x\n"
HE_HELPER = (
    "```python\nfrom typing import List\n\n"
    "def aux(numbers: List[float]) -> List[float]:\n"
    "    s = sorted(numbers)\n"
    "    return [b - a for a, b in zip(s, s[1:])]\n"
    "```\nThis helper returns the gaps between sorted neighbours."
)
HE_MAIN = (
    "Here is the solution:\n```python\n"
    "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    '    """Use the helper\'s gaps."""\n'
    "    return any(gap < threshold for gap in aux(numbers))\n"
    "```\nIt checks every gap."
)
FIELDS = {
    "structure",
    "syntax",
    "tests",
    "cooperation",
    "total",
    "format_paid",
    "passed",
    "total_asserts",
    "scheme",
    "reasons",
    "aux_defined",
    "aux_called",
    "aux_used",
    "truncated",
}


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(timeout_s=3.0) as sb:
        yield sb


@pytest.fixture(scope="module")
def he0():
    return next(p for p in load_problems("humaneval") if p.task_id == "HumanEval/0")


def tiny(sandbox, main: str, helper: str = AUX_DOUBLE, problem=TINY, **kw) -> LevelReward:
    return level_rewards([problem], [helper], [main], sandbox, **kw)[0]


def has_reason(reward: LevelReward, *parts: str) -> bool:
    return any(all(p in r for p in parts) for r in reward.reasons)


# ---------------------------------------------------------------------------------------------------------
# extraction
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("```python\ndef aux(x):\n    return x\n```\nThis returns x.", "def aux(x):\n    return x\n"),
        ("Sure:\n```\ndef aux(x):\n    return x\n```\n", "def aux(x):\n    return x\n"),
        ("```text\nnot code\n```\n```py\ny = 1\n```", "y = 1\n"),
        ("def aux(x):\n    return x\n```\nExplanation after the fence end.", "def aux(x):\n    return x\n"),
        ("```python\ndef aux(x):\n    return x", "def aux(x):\n    return x\n"),  # truncated answer
        # cut in a second function: the finished one is kept, the unfinished tail dropped
        (
            "```python\ndef f(xs):\n    return xs\n\n# again\ndef f(xs):\n    return sum(x",
            "def f(xs):\n    return xs\n\n# again\n",
        ),
        (
            "```python\ndef f(xs):\n    return sum(x",
            "def f(xs):\n    return sum(x\n",
        ),  # nothing finished: kept as is
        ("```python\nimport math\nprint(math.pi", "import math\n"),
        ("def aux(x):\n    return x\n", "def aux(x):\n    return x\n"),
        ("  ```python\n  def aux(x):\n      return x\n  ```", "def aux(x):\n    return x\n"),
        ("Intro.\ndef aux(x):\n    return x\n\nThis returns x, as asked.\n", "def aux(x):\n    return x\n"),
        (
            "Intro.\ndef aux(x):\n    return x\ndef g():\n    return 1\n",
            "def aux(x):\n    return x\ndef g():\n    return 1\n",
        ),
        ("def aux(x):\n    return x<|im_end|>", "def aux(x):\n    return x\n"),
        ("def aux(x):\n    return x +\n```\nProse after a broken block.", "def aux(x):\n    return x +\n"),
    ],
)
def test_extract_code(text: str, code: str) -> None:
    assert extract_code(text) == (code, "")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("I am sorry, I cannot write that.", "no code block found"),
        ("", "empty answer"),
        ("```bash\nls -la\n```", "no python code block found"),
        (None, "answer is not text"),
        ("x" * 200_001, "answer too long"),
    ],
)
def test_extract_code_failures(text, reason: str) -> None:
    code, why = extract_code(text)
    assert code == "" and why.startswith(reason)


# ---------------------------------------------------------------------------------------------------------
# the four levels
# ---------------------------------------------------------------------------------------------------------
def test_ideal_pair_on_humaneval_scores_max(sandbox, he0) -> None:
    r = level_rewards([he0], [HE_HELPER], [HE_MAIN], sandbox)[0]
    assert (r.structure, r.syntax, r.tests, r.cooperation) == (1.0, 0.5, 1.0, 1.5)
    assert r.total == 4.0 == RewardConfig().max_total
    assert (r.passed, r.total_asserts) == (7, 7) and r.all_passed
    assert r.scheme == "decorator" and r.reasons == []  # aux(numbers) is the generator's iterable: one call
    d = r.to_dict()
    assert set(d) == FIELDS and d["total"] == 4.0


def test_ideal_pair_tiny(sandbox) -> None:
    r = tiny(sandbox, "def double_all(xs):\n    return [aux(x) for x in xs]\n")
    assert r.total == 4.0 and r.scheme == "coordinator"


def test_structure_aux_without_return(sandbox) -> None:
    helper = "def aux(x):\n    print(2 * x)\n"
    r = tiny(sandbox, "def double_all(xs):\n    return [2 * x for x in xs]\n", helper=helper)
    assert r.structure == pytest.approx(0.6)
    assert has_reason(r, "helper", "does not return")


def test_structure_return_only_in_nested_def_does_not_count(sandbox) -> None:
    helper = "def aux(x):\n    def inner():\n        return 2 * x\n    inner()\n"
    r = tiny(sandbox, "def double_all(xs):\n    return [2 * x for x in xs]\n", helper=helper)
    assert r.structure == pytest.approx(0.6)


def test_structure_missing_entry_point_stops(sandbox) -> None:
    r = tiny(sandbox, "def something_else(xs):\n    return xs\n")
    assert (r.structure, r.syntax, r.tests, r.cooperation) == (0.4, 0.0, 0.0, 0.0)
    assert has_reason(r, "main: entry point `double_all` not defined")
    assert r.total_asserts == 3 and r.passed == 0


def test_structure_helper_without_aux(sandbox) -> None:
    r = tiny(
        sandbox,
        "def double_all(xs):\n    return [2 * x for x in xs]\n",
        helper="def helper(x):\n    return x\n",
    )
    assert r.structure == pytest.approx(0.6) and r.tests == 1.0 and r.cooperation == 0.0
    assert has_reason(r, "helper: `aux` not defined")
    assert has_reason(r, "cooperation", "defines no `aux`")


def test_syntax_error_stops_at_level_2(sandbox) -> None:
    r = tiny(sandbox, "def double_all(xs):\n    return [aux(x) for x in xs\n")
    assert (r.structure, r.syntax, r.tests) == (1.0, 0.0, 0.0)
    assert has_reason(r, "syntax: main: SyntaxError line")


def test_syntax_error_in_helper(sandbox) -> None:
    r = tiny(
        sandbox,
        "def double_all(xs):\n    return [aux(x) for x in xs]\n",
        helper="def aux(x):\n    return 2 *\n",
    )
    assert r.syntax == 0.0 and r.structure == 1.0
    assert has_reason(r, "syntax: helper")


def test_partial_tests_with_reasons(sandbox) -> None:
    r = tiny(sandbox, "def double_all(xs):\n    return [aux(x) for x in xs[:2]]\n")
    assert (r.passed, r.total_asserts) == (2, 3)
    assert r.tests == pytest.approx(2 / 3)
    assert has_reason(r, "tests: 2/3 passed", "assert 3")
    assert r.cooperation == 1.5  # >= 1 assert passed


def test_no_test_passed_means_no_cooperation(sandbox) -> None:
    r = tiny(sandbox, "def double_all(xs):\n    return [aux(x) + 1 for x in xs] + [0]\n")
    assert r.passed == 0 and r.cooperation == 0.0
    assert has_reason(r, "cooperation: no assert passed")
    assert r.scheme == "coordinator"  # reported even when level 4 is not reached


def test_runtime_error_counts_as_failed(sandbox) -> None:
    r = tiny(sandbox, "def double_all(xs):\n    raise RuntimeError('boom')\n")
    assert r.passed == 0 and r.tests == 0.0 and has_reason(r, "tests: 0/3 passed")


def test_main_does_not_call_aux(sandbox) -> None:
    r = tiny(sandbox, "def double_all(xs):\n    return [x + x for x in xs]\n")
    assert r.cooperation == 0.0 and r.total == 2.5
    assert has_reason(r, "cooperation: main does not call aux")


@pytest.mark.parametrize(
    "main",
    [
        "def maybe_none(x):\n    return aux(x)\n",
        "def maybe_none(x):\n    y = aux(x)\n    return y\n",
        'def maybe_none(x):\n    """Delegate."""\n    result = aux(x)\n    return result\n',
        # copies compute nothing: the warm-started MAGRPO learned `r = r` for the not-a-wrapper bonus
        "def maybe_none(x):\n    r = aux(x)\n    r = r\n    return r\n",
        "def maybe_none(x):\n    y = x\n    r: int = aux(y)\n    s = r\n    return s\n",
    ],
)
def test_wrapper_shapes_get_only_the_call_bonus(sandbox, main: str) -> None:
    helper = "def aux(x):\n    return None if x == 0 else x\n"
    r = tiny(sandbox, main, helper=helper, problem=NONE_OK)
    assert r.passed == 2 and r.cooperation == 0.5 and r.scheme == "wrapper"
    assert has_reason(r, "wrapper")


@pytest.mark.parametrize(
    ("body", "wrapper"),
    [
        ("r = aux(x)\n    r = r\n    return r", True),
        ("r = aux(x)\n    s = r\n    t = s\n    return t", True),
        ("r = aux(x)\n    r = [v * 2 for v in r]\n    return r", False),  # main's own step
        ("r = aux(x)\n    r = x\n    return r", False),  # the copy overwrote aux's value
        ("r = aux(x)\n    s = r\n    return r + s", False),
        ("r = aux(x)\n    k = 2\n    return r", False),
        ("r = aux(x)\n    return", False),
        ("r = aux(x + 1)\n    return r", False),  # the argument is computed by main
    ],
)
def test_wrapper_follows_copies_not_computation(body: str, wrapper: bool) -> None:
    import ast

    from orchestry.analysis.aux_calls import is_wrapper_body

    fn = ast.parse(f"def f(x):\n    {body}\n").body[0]
    assert is_wrapper_body(fn) is wrapper


def test_empty_body_gets_no_cooperation(sandbox) -> None:
    r = tiny(sandbox, "def maybe_none(x):\n    pass\n", helper="def aux(x):\n    return x\n", problem=NONE_OK)
    assert r.passed == 1 and r.cooperation == 0.0 and r.scheme == "none"
    assert has_reason(r, "does not call aux")


def test_ignored_return_value_costs_half(sandbox) -> None:
    r = tiny(sandbox, "def double_all(xs):\n    aux(xs)\n    return [x * 2 for x in xs]\n")
    assert r.tests == 1.0
    assert r.cooperation == pytest.approx(0.5 + 1.0 - 0.5)
    assert has_reason(r, "cooperation: value of aux(...) ignored", "line 2")


def test_ignored_value_of_unused_assignment(sandbox) -> None:
    r = tiny(sandbox, "def double_all(xs):\n    unused = aux(1)\n    return [x * 2 for x in xs]\n")
    assert r.cooperation == pytest.approx(1.0)


def test_wrapper_and_ignored_value(sandbox) -> None:
    # a bare call before the wrapper's return: 2 statements, so not the wrapper shape; value ignored once
    r = tiny(
        sandbox,
        "def maybe_none(x):\n    aux(x)\n    return aux(x)\n",
        helper="def aux(x):\n    return x or None\n",
        problem=NONE_OK,
    )
    assert r.passed == 2 and r.cooperation == pytest.approx(1.0)


def test_shadowed_aux_is_not_cooperation(sandbox) -> None:
    r = tiny(sandbox, "def double_all(xs):\n    aux = lambda v: v * 2\n    return [aux(x) for x in xs]\n")
    assert r.tests == 1.0 and r.cooperation == 0.0 and r.scheme == "none"


def test_main_redefining_aux_runs_main_copy(sandbox) -> None:
    # the helper's aux is wrong; main's later definition wins at run time, so the tests pass
    helper = "def aux(x):\n    return x\n"
    main = "def aux(x):\n    return x * 2\n\ndef double_all(xs):\n    return [aux(x) for x in xs]\n"
    r = tiny(sandbox, main, helper=helper)
    assert r.tests == 1.0 and r.cooperation == 0.0 and r.scheme == "none"
    assert has_reason(r, "main: redefines `aux`")
    assert has_reason(r, "cooperation", "redefines")


def test_context_from_prompt_is_in_the_program(sandbox) -> None:
    he32 = next(p for p in load_problems("humaneval") if p.task_id == "HumanEval/32")
    helper = (
        "def aux(xs, lo, hi):\n    for _ in range(200):\n        mid = (lo + hi) / 2\n"
        "        if poly(xs, lo) * poly(xs, mid) <= 0:\n            hi = mid\n"
        "        else:\n            lo = mid\n"
        "    return lo\n"
    )
    main = (
        "def find_zero(xs):\n    lo, hi = -1.0, 1.0\n    while poly(xs, lo) * poly(xs, hi) > 0:\n"
        "        lo *= 2.0\n        hi *= 2.0\n    return aux(xs, lo, hi)\n"
    )
    assert build_program(he32, helper, main).startswith("import math\ndef poly(")
    r = level_rewards([he32], [helper], [main], sandbox)[0]
    assert r.total == 4.0, r.reasons


def test_batch_keeps_order_and_handles_duplicates(sandbox, he0) -> None:
    good = "def double_all(xs):\n    return [aux(x) for x in xs]\n"
    bad = "def double_all(xs):\n    return []\n"
    problems = [TINY, he0, TINY, TINY, TINY]
    helpers = [AUX_DOUBLE, HE_HELPER, AUX_DOUBLE, AUX_DOUBLE, "junk"]
    mains = [good, HE_MAIN, bad, good, good]
    rs = level_rewards(problems, helpers, mains, sandbox)
    assert [r.total for r in rs] == [
        4.0,
        4.0,
        pytest.approx(0.4 + 0.6 + 0.5 + 1 / 3),
        4.0,
        pytest.approx(0.6 + 0.5 + 1 / 3),
    ]
    assert has_reason(rs[4], "helper: no code block found")  # prose that parses ("junk") is not code
    assert has_reason(rs[4], "tests: 1/3 passed", "NameError")  # only `[]` passes: aux is never defined
    assert has_reason(rs[4], "cooperation", "defines no `aux`")


@pytest.mark.parametrize(
    "junk",
    [
        None,
        17,
        b"\x00\xff",
        "",
        "\x00\x00\x00",
        "```",
        "```python\n```",
        "(" * 10_000,
        "def double_all(xs):\n" + "    " * 200 + "return 1\n",
        "def aux(:\n",
        "\ud800 lone surrogate",
        "import os\nos._exit(0)\n",
        "x" * 1_000_000,
        "def double_all(xs):\n    return [aux(x) for x in xs]\n" * 1000,
    ],
)
def test_junk_never_raises(sandbox, junk) -> None:
    rs = level_rewards([TINY, TINY], [junk, AUX_DOUBLE], [AUX_DOUBLE, junk], sandbox)
    for r in rs:
        assert isinstance(r, LevelReward)
        assert 0.0 <= r.total <= 4.0
        assert r.total == 4.0 or r.reasons, r  # every lost point is explained


def test_extract_false_takes_text_as_code(sandbox) -> None:
    fenced = "```python\ndef double_all(xs):\n    return [aux(x) for x in xs]\n```"
    assert tiny(sandbox, fenced).total == 4.0
    r = tiny(sandbox, fenced, extract=False)
    # the fences stay in the code: the function is found by text, and the syntax level fails
    assert (r.structure, r.syntax) == (1.0, 0.0) and has_reason(r, "syntax: main")


def test_custom_weights(sandbox) -> None:
    cfg = RewardConfig(tests=2.0, not_wrapper=0.0)
    r = tiny(sandbox, "def double_all(xs):\n    return [aux(x) for x in xs]\n", config=cfg)
    assert r.tests == 2.0 and r.cooperation == 0.5 and r.total == cfg.max_total == 4.0


def test_length_mismatch_is_a_caller_error(sandbox) -> None:
    with pytest.raises(ValueError, match="same length"):
        level_rewards([TINY], [AUX_DOUBLE, AUX_DOUBLE], ["x"], sandbox)


# ---------------------------------------------------------------------------------------------------------
# ungated collaboration facts: aux_defined, aux_called, aux_used, truncated
# ---------------------------------------------------------------------------------------------------------
COMPREHENSION = "def double_all(xs):\n    return [aux(x) for x in xs]\n"
OWN_CODE = "def double_all(xs):\n    return [2 * x for x in xs]\n"
# (helper, main, (aux_defined, aux_called, aux_used))
FACT_CASES = {
    "ideal pair": (AUX_DOUBLE, COMPREHENSION, (True, True, True)),
    "aux defined in a class": (
        "class K:\n    def aux(self, x):\n        return 2 * x\n",
        COMPREHENSION,
        (False, True, True),
    ),
    "aux defined in a nested function": (
        "def outer():\n    def aux(x):\n        return 2 * x\n    return aux\n",
        OWN_CODE,
        (False, False, False),
    ),
    "broken top-level aux still defined": ("def aux(x):\n    return 2 *\n", OWN_CODE, (True, False, False)),
    "no helper code": ("I cannot help.", COMPREHENSION, (False, True, True)),
    "call inside a lambda": (
        AUX_DOUBLE,
        "def double_all(xs):\n    f = lambda v: aux(v)\n    return [f(x) for x in xs]\n",
        (True, True, True),
    ),
    "assigned, never read": (
        AUX_DOUBLE,
        "def double_all(xs):\n    x = aux(1)\n    return [2 * v for v in xs]\n",
        (True, True, False),
    ),
    "bare statement": (
        AUX_DOUBLE,
        "def double_all(xs):\n    aux(xs)\n    return [2 * v for v in xs]\n",
        (True, True, False),
    ),
    "awaited bare statement": (
        AUX_DOUBLE,
        "async def double_all(xs):\n    await aux(xs)\n    return [2 * v for v in xs]\n",
        (True, True, False),
    ),
    "two ignored calls on one line": (
        AUX_DOUBLE,
        "def double_all(xs):\n    aux(1); aux(2)\n    return [2 * v for v in xs]\n",
        (True, True, False),
    ),
    "one ignored, one read, same line": (
        AUX_DOUBLE,
        "def double_all(xs):\n    a = aux(1); b = aux(2)\n    return [b * v / 2 for v in xs]\n",
        (True, True, True),
    ),
    "ignored once, used once": (
        AUX_DOUBLE,
        "def double_all(xs):\n    aux(0)\n    return [aux(v) for v in xs]\n",
        (True, True, True),
    ),
    "aux passed as a value": (
        AUX_DOUBLE,
        "def double_all(xs):\n    return list(map(aux, xs))\n",
        (True, True, True),
    ),
    "through main's own function": (
        AUX_DOUBLE,
        "def g(v):\n    return aux(v)\n\ndef double_all(xs):\n    return [g(x) for x in xs]\n",
        (True, True, True),
    ),
    "in a function the entry point never calls": (
        AUX_DOUBLE,
        "def g(v):\n    return aux(v)\n\ndef double_all(xs):\n    return [2 * x for x in xs]\n",
        (True, False, False),
    ),
    "shadowed by a local": (
        AUX_DOUBLE,
        "def double_all(xs):\n    aux = lambda v: v * 2\n    return [aux(x) for x in xs]\n",
        (True, False, False),
    ),
    "main redefines aux": (
        AUX_DOUBLE,
        "def aux(x):\n    return x * 2\n\ndef double_all(xs):\n    return [aux(x) for x in xs]\n",
        (True, False, False),
    ),
    "no entry point": (AUX_DOUBLE, "def other(xs):\n    return [aux(x) for x in xs]\n", (True, False, False)),
    "main does not parse": (
        AUX_DOUBLE,
        "def double_all(xs):\n    return [aux(x) for x in xs\n",
        (True, False, False),
    ),
    # ungated: no assert passes (so no cooperation bonus) but main does call and use aux
    "tests fail, aux still used": (
        AUX_DOUBLE,
        "def double_all(xs):\n    return [aux(x) + 1 for x in xs] + [0]\n",
        (True, True, True),
    ),
}


@pytest.fixture(scope="module")
def fact_rewards(sandbox) -> dict[str, LevelReward]:
    names = list(FACT_CASES)
    helpers = [FACT_CASES[n][0] for n in names]
    mains = [FACT_CASES[n][1] for n in names]
    return dict(zip(names, level_rewards([TINY] * len(names), helpers, mains, sandbox), strict=True))


@pytest.mark.parametrize("case", list(FACT_CASES))
def test_collaboration_facts(fact_rewards, case: str) -> None:
    r = fact_rewards[case]
    assert (r.aux_defined, r.aux_called, r.aux_used) == FACT_CASES[case][2], r.reasons
    d = r.to_dict()
    assert (d["aux_defined"], d["aux_called"], d["aux_used"]) == FACT_CASES[case][2]
    assert r.truncated is None and d["truncated"] is None  # not given


def test_collaboration_facts_are_ungated(fact_rewards) -> None:
    r = fact_rewards["tests fail, aux still used"]
    assert r.passed == 0 and r.cooperation == 0.0 and r.aux_called and r.aux_used
    assert fact_rewards["assigned, never read"].cooperation == pytest.approx(1.0)  # the -0.5 case
    assert fact_rewards["main redefines aux"].tests == 1.0  # main's own aux runs: not a call to the helper


def test_truncated_flag_is_passed_through(sandbox) -> None:
    rs = level_rewards([TINY, TINY], [AUX_DOUBLE] * 2, [COMPREHENSION] * 2, sandbox, truncated=[True, 0])
    assert [r.truncated for r in rs] == [True, False] and [r.to_dict()["truncated"] for r in rs] == [
        True,
        False,
    ]
    assert rs[1].total == 4.0
    # a cut answer earns its asserts and cooperation but never the format points the complete one earns
    assert (rs[0].structure, rs[0].syntax, rs[0].tests, rs[0].cooperation) == (1.0, 0.5, 1.0, 1.5)
    assert rs[0].format_paid is False and rs[0].total == 2.5 and has_reason(rs[0], "cut answer")
    assert rs[0].to_dict()["total"] == 2.5
    zero = level_rewards([TINY], [AUX_DOUBLE], [COMPREHENSION], sandbox, RewardConfig(cut_answers="zero"),
                         truncated=[True])  # fmt: skip
    assert (zero[0].structure, zero[0].syntax, zero[0].tests, zero[0].cooperation, zero[0].total) == (0,) * 5
    assert has_reason(zero[0], "truncated") and zero[0].aux_called  # the ungated facts are still recorded
    paid = level_rewards([TINY], [AUX_DOUBLE], [COMPREHENSION], sandbox, RewardConfig(cut_answers="paid"),
                         truncated=[True])  # fmt: skip
    assert paid[0].total == 4.0 and paid[0].truncated is True  # the switch: a flag only
    with pytest.raises(ValueError, match="one flag per sample"):
        level_rewards([TINY], [AUX_DOUBLE], [COMPREHENSION], sandbox, truncated=[True, False])


# ---------------------------------------------------------------------------------------------------------
# single-agent baseline
# ---------------------------------------------------------------------------------------------------------
def test_single_rewards(sandbox) -> None:
    good = "```python\ndef double_all(xs):\n    return [2 * x for x in xs]\n```"
    calls_aux = "def double_all(xs):\n    return [aux(x) for x in xs]\n"
    rs = single_rewards([TINY, TINY, TINY], [good, calls_aux, "no code"], sandbox)
    assert (rs[0].structure, rs[0].syntax, rs[0].tests, rs[0].cooperation) == (0.6, 0.5, 1.0, 0.0)
    assert rs[0].total == pytest.approx(2.1) and rs[0].scheme == "none" and rs[0].reasons == []
    assert rs[1].passed == 1 and has_reason(rs[1], "1/3", "NameError")  # no helper in a single-agent program
    assert rs[2].total == 0.0 and has_reason(rs[2], "main: no code block found")
    assert not any(r.aux_defined or r.aux_called or r.aux_used for r in rs)  # no helper to call
    assert single_rewards([TINY], [good], sandbox, truncated=[True])[0].truncated is True


def test_format_points_need_a_passing_assert(sandbox) -> None:
    """Well-formed wrong code earns 0 (its levels still recorded); one passing assert pays the format points."""
    wrong = "def double_all(xs):\n    return [0]\n"  # parses, defines the entry point, fails all 3 asserts
    one_pass = "def double_all(xs):\n    return []\n"  # passes only candidate([]) == []
    w, o = level_rewards([TINY, TINY], [AUX_DOUBLE] * 2, [wrong, one_pass], sandbox)
    assert (w.structure, w.syntax, w.passed, w.total, w.format_paid) == (1.0, 0.5, 0, 0.0, False)
    assert has_reason(w, "format:") and w.to_dict()["total"] == 0.0 and w.to_dict()["format_paid"] is False
    assert o.passed == 1 and o.format_paid and o.total == pytest.approx(1.0 + 0.5 + 1 / 3)
    gentle = level_rewards([TINY], [AUX_DOUBLE], [wrong], sandbox, RewardConfig(format_needs_a_pass=False))[0]
    assert gentle.format_paid and gentle.total == pytest.approx(1.5 + gentle.tests)
