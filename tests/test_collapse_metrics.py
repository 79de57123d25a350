"""Collapse metrics (docs/metrics.md): the chain form of main's code, programs compared up to names, and the
``chain_form_rate`` / ``distinct_solutions`` figures of an evaluation summary and a MAGRPO step record."""

from __future__ import annotations

import pytest
import torch

from orchestry.analysis.code_forms import chain_form, normalized_solution
from orchestry.analysis.metrics import chain_form_rate, distinct_solutions, joint_program, summarize
from orchestry.config import TrainMagrpoParams
from orchestry.problems import Problem
from orchestry.training.magrpo.common import Rollout
from orchestry.training.magrpo.step_log import step_record

TEMPLATE = """def is_even(n: int) :
    r = aux(n)
    r = r if r else 0
    return r
"""

# --- chain_form ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        TEMPLATE,
        # a docstring is skipped; the first assignment may be the argument; annotated and += steps
        'def f(xs):\n    """Doubled evens."""\n    r = xs\n    r = [x for x in r if x % 2 == 0]\n    return r\n',
        "def f(xs):\n    r: list = aux(xs)\n    r += [1]\n    return r\n",
        "def f(s):\n    out = s.lower()\n    return out\n",  # two statements, any single name
        "def aux(x):\n    return x\n\ndef f(x):\n    r = aux(x)\n    r = r * 2\n    return r\n",
    ],
)
def test_chain_form_true(code):
    assert chain_form(code, None)


@pytest.mark.parametrize(
    "code",
    [
        "def f(xs):\n    return sum(x*x for x in xs)\n",  # one statement
        "def f(n):\n    a = aux(n)\n    b = a + 1\n    return b\n",  # a two-name chain
        "def f(n):\n    r = aux(n)\n    r = r + 1\n    return n\n",  # returns another name
        "def f(n):\n    r = aux(n)\n    r = r + 1\n    return r + 1\n",  # returns an expression
        "def f(n):\n    r = aux(n)\n    if r:\n        r = 0\n    return r\n",  # a branch
        "def f(n):\n    r = s = aux(n)\n    return r\n",  # two targets
        "def f(n):\n    r += 1\n    return r\n",  # the first statement must assign, not augment
        "def f(n)\n    r = aux(n)\n    return r\n",  # syntax error
        "",
    ],
)
def test_chain_form_false(code):
    assert not chain_form(code, None)


def test_chain_form_judges_the_named_entry_point():
    code = "def f(x):\n    r = x\n    r = r + 1\n    return r\n\ndef g(x):\n    return x\n"
    assert chain_form(code, "f")
    assert not chain_form(code, "g") and not chain_form(code, None)  # None: the last function, g
    assert not chain_form(code, "missing")
    assert not chain_form(None, None)


# --- normalized_solution ----------------------------------------------------------------------------------------


def test_normalized_solution_ignores_names_comments_docstrings_and_formatting():
    a = 'def is_even(n):\n    """Even?"""\n    r = aux(n)  # the helper\n    r = r if r else 0\n    return r\n'
    b = "def is_even( value ) :\n\n    out=aux( value )\n    out = (out if out else 0)\n    return out\n"
    assert normalized_solution(a) == normalized_solution(b)
    assert (
        normalized_solution(a)
        == "def is_even(v0):\n    v1 = aux(v0)\n    v1 = v1 if v1 else 0\n    return v1"
    )
    # comprehension variables and nested scopes are local names too; the function name and globals are kept
    c = "def f(xs):\n    return [x * K for x in xs]\n"
    d = "def f(items):\n    return [item * K for item in items]\n"
    assert normalized_solution(c) == normalized_solution(d) == "def f(v0):\n    return [v1 * K for v1 in v0]"


def test_normalized_solution_tells_different_programs_apart():
    a = "def f(n):\n    r = aux(n)\n    return r\n"
    assert normalized_solution(a) != normalized_solution("def f(n):\n    r = aux(n)\n    return -r\n")
    assert normalized_solution(a) != normalized_solution("def g(n):\n    r = aux(n)\n    return r\n")
    assert normalized_solution(a) != normalized_solution("def f(n):\n    r = aux2(n)\n    return r\n")
    # the order of first appearance is part of the form: f(a, b) -> a - b differs from b - a
    assert normalized_solution("def f(a, b):\n    return a - b\n") != normalized_solution(
        "def f(a, b):\n    return b - a\n"
    )
    assert normalized_solution("def f(:\n  x") == "def f(:\n  x"  # unparsable: the stripped text
    assert normalized_solution(None) == ""


# --- the evaluation summary ----------------------------------------------------------------------------------


def _rec(task_id: str, main: str, helper: str = "def aux(x):\n    return x\n") -> dict:
    return {"task_id": task_id, "helper": helper, "main": main, "passed": 1, "total_asserts": 1, "total": 2.0,
            "structure": 1.0, "syntax": 0.5, "tests": 1.0, "cooperation": 0.0}  # fmt: skip


HELPER_RENAMED = "def aux(value):\n    # same helper\n    return value\n"
RECORDS = [
    _rec("t/0", TEMPLATE),
    # the same joint program up to names, a comment, fences and formatting
    _rec(
        "t/0",
        "```python\ndef is_even(k: int):\n    res = aux(k)  # call\n    res = (res if res else 0)\n    return res\n```",
        HELPER_RENAMED,
    ),  # fmt: skip
    _rec("t/0", "def is_even(n):\n    return n % 2 == 0\n"),
    _rec("t/1", "def sum_sq(xs):\n    return sum(x*x for x in xs)\n"),
    _rec(
        "t/1", "Here it is:\n```python\ndef sum_sq(xs):\n    r = aux(xs)\n    r = sum(r)\n    return r\n```\n"
    ),
]
ENTRIES = {"t/0": "is_even", "t/1": "sum_sq"}


def test_summary_has_the_collapse_figures():
    s = summarize(RECORDS, [1], 0.95, 20, ENTRIES)
    # chain form: t/0's first two and t/1's second of 5 samples
    assert s["chain_form_rate"] == pytest.approx(3 / 5)
    # distinct joint programs / samples: t/0 2 of 3 (the first two are one program), t/1 2 of 2
    assert s["distinct_solutions"] == pytest.approx((2 / 3 + 2 / 2) / 2)
    assert joint_program(RECORDS[0]) == joint_program(RECORDS[1]) != joint_program(RECORDS[2])
    assert "pass@1" in s


def test_one_template_everywhere_gives_rate_one_and_one_over_n():
    recs = [_rec(f"t/{p}", TEMPLATE.replace("is_even", f"f{p}")) for p in range(3) for _ in range(4)]
    s = summarize(recs, [1, 4], 0.95, 20, {f"t/{p}": f"f{p}" for p in range(3)})
    assert s["chain_form_rate"] == 1.0 and s["distinct_solutions"] == pytest.approx(1 / 4)
    assert "pass@4" in s
    # a helper that differs makes the joint programs differ
    recs[1] = {**recs[1], "helper": "def aux(x):\n    return x + 1\n"}
    assert distinct_solutions([recs[:4]]) == pytest.approx(2 / 4)


def test_collapse_figures_are_none_without_texts():
    recs = [{k: v for k, v in r.items() if k not in ("helper", "main")} for r in RECORDS]
    s = summarize(recs, [1], 0.95, 20)
    assert s["chain_form_rate"] is None and s["distinct_solutions"] is None
    assert chain_form_rate([]) is None and distinct_solutions([]) is None


# --- the MAGRPO step record ------------------------------------------------------------------------------------


def test_step_record_has_the_collapse_figures():
    problems = [Problem(task_id=t, prompt="", entry_point=e, test="") for t, e in ENTRIES.items()]
    G = 2
    details = [
        {
            "structure": 1.0,
            "syntax": 0.5,
            "tests": 0.0,
            "cooperation": 0.0,
            "passed": 0,
            "total_asserts": 1,
            **r,
        }
        for r in (RECORDS[0], RECORDS[1], RECORDS[3], RECORDS[4])
    ]
    ro = Rollout(problems, None, torch.zeros(2, G), details, G, tokens=(0, 0))
    rec = step_record(TrainMagrpoParams(), 0, ro, {}, 0.0, 0.0, 0.0)
    assert rec["chain_form_rate"] == pytest.approx(3 / 4)
    assert rec["distinct_solutions"] == pytest.approx((1 / 2 + 2 / 2) / 2)  # group 0 is one program
