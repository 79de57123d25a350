"""Cooperation-scheme detection on hand-written main code (MAGRPO paper's schemes, plus wrapper/none)."""

from __future__ import annotations

import pytest

from orchestry.analysis.schemes import SCHEMES, aux_call_info, detect_scheme, scheme_distribution

EXAMPLES = {
    # ---- fallback ----
    "try_except": (
        "fallback",
        "def f(xs):\n    try:\n        return aux(xs)\n    except Exception:\n        return sorted(xs)\n",
    ),
    "none_check": (
        "fallback",
        "def f(xs):\n    r = aux(xs)\n    if r is None:\n        r = sorted(xs)\n    return r\n",
    ),
    "direct_none_check_ifexp": ("fallback", "def f(x):\n    return x if aux(x) is None else aux(x) + 1\n"),
    "or_default": ("fallback", "def f(xs):\n    return aux(xs) or sorted(xs)\n"),
    "try_in_loop": (
        "fallback",
        "def f(xs):\n    out = []\n    for v in xs:\n        try:\n            out.append(aux(v))\n"
        "        except ValueError:\n            out.append(v)\n    return out\n",
    ),
    # ---- strategy filter ----
    "if_call": ("strategy_filter", "def f(x):\n    if aux(x):\n        return x * 2\n    return -x\n"),
    "if_variable": (
        "strategy_filter",
        "def f(x):\n    kind = aux(x)\n    if kind == 'even':\n        return x // 2\n    return 3 * x + 1\n",
    ),
    "elif": (
        "strategy_filter",
        "def f(x):\n    if x < 0:\n        return 0\n    elif aux(x) > 3:\n        return 1\n    return 2\n",
    ),
    "ifexp": ("strategy_filter", "def f(x):\n    return x + 1 if aux(x) else x - 1\n"),
    "while": ("strategy_filter", "def f(x):\n    while aux(x):\n        x //= 2\n    return x\n"),
    "comprehension_filter": ("strategy_filter", "def f(xs):\n    return [v for v in xs if aux(v)]\n"),
    "filter_builtin": ("strategy_filter", "def f(xs):\n    return list(filter(aux, xs))\n"),
    "or_inside_test": (
        "strategy_filter",
        "def f(a, b):\n    if aux(a) or aux(b):\n        return 1\n    return 0\n",
    ),
    # ---- coordinator ----
    "for_loop": (
        "coordinator",
        "def f(xs):\n    total = 0\n    for v in xs:\n        total += aux(v)\n    return total\n",
    ),
    "accumulator_tested_later": (
        "coordinator",
        "def f(xs):\n    t = 0\n    for v in xs:\n        t += aux(v)\n    return t if t > 0 else 0\n",
    ),
    "comprehension": ("coordinator", "def f(xs):\n    return sum(aux(v) for v in xs)\n"),
    "two_call_sites": ("coordinator", "def f(a, b):\n    return max(aux(a), aux(b))\n"),
    "map_value": ("coordinator", "def f(xs):\n    return list(map(aux, xs))\n"),
    "sort_key": ("coordinator", "def f(xs):\n    return sorted(xs, key=aux)\n"),
    "lambda_in_call": ("coordinator", "def f(xs):\n    return sorted(xs, key=lambda v: (aux(v), v))\n"),
    "while_body": (
        "coordinator",
        "def f(x):\n    out = []\n    while x > 0:\n        out.append(aux(x))\n"
        "        x -= 1\n    return out\n",
    ),
    # ---- decorator ----
    "post_processing": ("decorator", "def f(x):\n    return aux(x) + 1\n"),
    "pre_processing": ("decorator", "def f(xs):\n    xs = [v for v in xs if v > 0]\n    return aux(xs)\n"),
    "computed_argument": ("decorator", "def f(xs):\n    return aux(sorted(xs))\n"),
    "assign_then_process": ("decorator", "def f(s):\n    words = aux(s)\n    return ' '.join(words)\n"),
    "nested_function": (
        "decorator",
        "def f(x):\n    def inner(y):\n        return aux(y) * 2\n    return inner(x)\n",
    ),
    "plain_lambda": ("decorator", "def f(x):\n    g = lambda y: aux(y) - 1\n    return g(x)\n"),
    "decorated_with_docstring": (
        "decorator",
        "import functools\n\n@functools.lru_cache(maxsize=None)\ndef f(x):\n"
        '    """Doc mentioning aux(x)."""\n'
        "    return str(aux(x))\n",
    ),
    # ---- wrapper ----
    "return_call": ("wrapper", "def f(x, y):\n    return aux(x, y)\n"),
    "assign_return": ("wrapper", "def f(x):\n    result = aux(x)\n    return result\n"),
    "docstring_wrapper": ("wrapper", 'def f(x):\n    """Just delegate."""\n    return aux(x, key=x.real)\n'),
    "annotated_wrapper": ("wrapper", "def f(x):\n    r: int = aux(x)\n    return r\n"),
    # ---- none ----
    "no_call": ("none", "def f(x):\n    return x * 2\n"),
    "pass_body": ("none", "def f(x):\n    pass\n"),
    "shadow_local_variable": ("none", "def f(x):\n    aux = abs\n    return aux(x) + 1\n"),
    "shadow_parameter": ("none", "def f(x, aux=abs):\n    return aux(x)\n"),
    "shadow_nested_def": ("none", "def f(x):\n    def aux(y):\n        return y\n    return aux(x) + 1\n"),
    "shadow_assigned_later": ("none", "def f(x):\n    y = aux(x)\n    aux = 3\n    return y + aux\n"),
    "shadow_in_lambda": ("none", "def f(xs):\n    return [(lambda aux: aux(v))(abs) for v in xs]\n"),
    "shadow_in_comprehension": ("none", "def f(fs):\n    return [aux(1) for aux in fs]\n"),
    "module_redefines_aux": ("none", "def aux(x):\n    return x\n\ndef f(x):\n    return aux(x) + 1\n"),
    "attribute_not_helper": ("none", "import helpers\ndef f(x):\n    return helpers.aux(x) + 1\n"),
    "unparsable": ("none", "def f(x):\n    return aux(x\n"),
    "entry_point_missing": ("none", "def g(x):\n    return aux(x) + 1\n"),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples(name: str) -> None:
    expected, code = EXAMPLES[name]
    assert detect_scheme(code, "f") == expected, code


def test_every_scheme_has_an_example() -> None:
    assert {scheme for scheme, _ in EXAMPLES.values()} == set(SCHEMES)


def test_nested_scope_sees_helper_when_only_sibling_shadows() -> None:
    code = "def f(x):\n    def g(aux):\n        return aux(1)\n    return g(len) + aux(x)\n"
    info = aux_call_info(code, "f")
    assert info.calls_aux and info.call_sites == 1 and info.scheme == "decorator"


def test_shadowing_in_nested_function_reaches_only_that_scope() -> None:
    code = "def f(x):\n    def g(y):\n        aux = abs\n        return aux(y)\n    return g(x)\n"
    assert detect_scheme(code, "f") == "none"


def test_follows_main_own_functions() -> None:
    looped = "def g(v):\n    return aux(v) + 1\n\ndef f(xs):\n    return [g(v) for v in xs]\n"
    once = "def g(v):\n    return aux(v) + 1\n\ndef f(x):\n    return g(x) * 2\n"
    unused = "def g(v):\n    return aux(v)\n\ndef f(x):\n    return x\n"
    assert detect_scheme(looped, "f") == "coordinator"
    assert detect_scheme(once, "f") == "decorator"
    assert detect_scheme(unused, "f") == "none"


def test_recursion_between_own_functions_terminates() -> None:
    code = "def g(v):\n    return g(v - 1) if v else aux(v)\n\ndef f(x):\n    return g(x) + 1\n"
    assert aux_call_info(code, "f").calls_aux


def test_entry_point_none_takes_last_function() -> None:
    code = "def helper_of_main(x):\n    return x\n\ndef solve(x):\n    return aux(x) + helper_of_main(x)\n"
    assert detect_scheme(code) == "decorator"


def test_custom_aux_name() -> None:
    code = "def f(x):\n    return helper_fn(x)\n"
    assert detect_scheme(code, "f", aux_name="helper_fn") == "wrapper"
    assert detect_scheme(code, "f") == "none"


def test_ignored_values() -> None:
    bare = aux_call_info("def f(x):\n    aux(x)\n    return x + 1\n", "f")
    unused = aux_call_info("def f(x):\n    r = aux(x)\n    return x + 1\n", "f")
    used = aux_call_info("def f(x):\n    r = aux(x)\n    return r + 1\n", "f")
    assert bare.ignored_lines == (2,) and bare.ignores_value and bare.calls_aux
    assert unused.ignored_lines == (2,)
    assert used.ignored_lines == () and not used.ignores_value


def test_wrapper_shapes_and_empty_body() -> None:
    assert aux_call_info("def f(x):\n    return aux(x)\n", "f").is_wrapper
    assert aux_call_info("def f(x):\n    y = aux(x)\n    return y\n", "f").is_wrapper
    assert aux_call_info("def f(x):\n    '''doc'''\n    pass\n", "f").is_wrapper
    assert aux_call_info("def f(x):\n    ...\n", "f").is_wrapper
    assert not aux_call_info("def f(x):\n    y = aux(x)\n    return x\n", "f").is_wrapper
    assert not aux_call_info("def f(x):\n    return aux(x) * 2\n", "f").is_wrapper


def test_redefinition_is_reported() -> None:
    info = aux_call_info("aux = len\n\ndef f(x):\n    return aux(x) + 1\n", "f")
    assert info.redefines_aux and not info.calls_aux and info.scheme == "none"


@pytest.mark.parametrize(
    "junk",
    [
        "",
        "\x00\x01\x02",
        "(" * 500,
        "def f(x):\n" + "    if x:\n" * 120 + "        pass\n",
        "def f(",
        None,
        42,
    ],
)
def test_junk_never_raises(junk) -> None:
    assert detect_scheme(junk, "f") == "none"


def test_scheme_distribution() -> None:
    dist = scheme_distribution(["wrapper", "wrapper", "fallback", "bogus"])
    assert set(dist) == set(SCHEMES)
    assert dist["wrapper"] == 0.5 and dist["fallback"] == 0.25 and dist["none"] == 0.25
    assert sum(dist.values()) == pytest.approx(1.0)
    assert scheme_distribution([]) == dict.fromkeys(SCHEMES, 0.0)
