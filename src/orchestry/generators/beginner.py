"""Procedurally generated beginner Python problems in HumanEval format: a wider training distribution.

The compositional generator (:mod:`orchestry.generators.compositional`) makes chains of list and string
primitives, all written ``r = ...; r = ...; return r`` with one phrasing. Problems written by people look
different: integer arguments, predicates, two arguments, dictionaries, loops with accumulators, each phrased in
its own words. This generator covers what a first Python course asks in its first weeks, each problem solvable
in one to four lines. Every *template* (:data:`TEMPLATES`, one table row each) varies per instance:

- the function name (2-3 synonyms) and the argument names (2-3 choices each);
- the docstring (3 phrasings with different openings: ``Return ...``, ``Given ...``, ``Check whether ...``,
  two-sentence descriptions), with exactly one ``>>>`` example taken from the first test;
- type annotations or none (a seeded coin);
- a constant where natural (``k`` in ``(3, 4, 5, 7)``, clamp bounds, grade thresholds);
- the reference solution's *shape* (2-3 per template: a comprehension, a for-loop with an accumulator, a
  builtin call, a conditional expression, ...), never the compositional ``r = ...`` chain.

Expected values come from running the chosen reference solution on seeded inputs (random ones, then fixed
edge cases such as empty inputs and zero). An instance is refused, and drawn again, when its outputs are all
equal, or when ``return None`` or returning the first argument unchanged would pass every assert.
:func:`split_templates` holds out whole templates for testing. Records have an empty ``aux_spec`` (plain
prompts, like HumanEval); :func:`delegated_targets` gives the helper/main pair's targets for them. Documented in
docs/problems.md.
"""

from __future__ import annotations

import ast
import builtins
import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from string import Template as _Sub

from orchestry.generators.compositional import GeneratorError

_WORDS = (
    "apple", "sun", "tree", "river", "stone", "cat", "dog", "moon", "bird", "fish", "red", "blue", "green",
    "code", "book", "lamp", "road", "rain", "snow", "star", "hill", "lake", "wind", "door", "map", "cup",
    "box", "pen", "king", "tiger", "owl", "bread", "milk", "egg", "sky", "leaf", "gold", "train", "house",
)  # fmt: skip
_NOVOWEL = ("rhythm", "sky", "xyz", "tv", "psst", "crwth", "myth", "gym", "by", "fly")


@dataclass(frozen=True)
class Template:
    """One kind of beginner problem.

    Attributes:
        name: identifier (``composition[1]`` of its records).
        category: ``digits``, ``predicates``, ``two_args``, ``conditionals``, ``loops``, ``dicts``, ``strings``,
            ``filtering`` or ``lists``.
        difficulty: 1 (one step) or 2 (two steps, e.g. split then count).
        names: the function-name synonyms.
        params: per parameter, ``(name choices, annotation)``.
        ret: the return annotation.
        docs: docstring phrasings; ``$a``/``$b`` are the parameter names, ``$k`` etc. the constants.
        shapes: reference solution bodies (unindented; the same placeholders); each computes the same function.
        gen: ``gen(rng, const) -> args``, one random input.
        edges: fixed edge-case inputs (a tuple of argument tuples, or ``edges(const)``).
        consts: the constant choices, each a dict of placeholder values.
    """

    name: str
    category: str
    difficulty: int
    names: tuple[str, ...]
    params: tuple[tuple[tuple[str, ...], str], ...]
    ret: str
    docs: tuple[str, ...]
    shapes: tuple[str, ...]
    gen: Callable
    edges: tuple | Callable = ()
    consts: tuple[dict, ...] = ({},)

    def edge_inputs(self, const: dict) -> list[tuple]:
        return list(self.edges(const) if callable(self.edges) else self.edges)


def _t(name, category, difficulty, names, params, ret, docs, shapes, gen, edges=(), consts=({},)) -> Template:
    """A table row: ``names`` and each parameter's choices as space-separated words."""
    return Template(
        name,
        category,
        difficulty,
        tuple(names.split()),
        tuple((tuple(p.split()), ann) for p, ann in params),
        ret,
        tuple(docs),
        tuple(shapes),
        gen,
        edges,
        tuple(consts),
    )


# ---------------------------------------------------------------- random inputs


def _ints(r: random.Random, lo: int = -9, hi: int = 9, n: tuple[int, int] = (3, 7)) -> list[int]:
    return [r.randint(lo, hi) for _ in range(r.randint(*n))]


def _words(r: random.Random, lo: int = 2, hi: int = 5) -> list[str]:
    return [r.choice(_WORDS) for _ in range(r.randint(lo, hi))]


def _text(r: random.Random, lo: int = 2, hi: int = 5) -> str:
    return " ".join(_words(r, lo, hi))


def _mixed(r: random.Random, lo: int = 2, hi: int = 4) -> str:
    """Words in mixed case: some capitalised, some upper case."""
    ws = [
        w.capitalize() if r.random() < 0.3 else w.upper() if r.random() < 0.15 else w
        for w in _words(r, lo, hi)
    ]
    return " ".join(ws)


def _pal(r: random.Random) -> str:
    """A palindrome about half the time, otherwise a random word."""
    if r.random() < 0.5:
        return r.choice(_WORDS)
    half = "".join(r.choice("abcdeklmnorst") for _ in range(r.randint(1, 3)))
    return half + (r.choice("xyz") if r.random() < 0.5 else "") + half[::-1]


def _dict(r: random.Random, lo: int = 2, hi: int = 4, distinct: bool = False) -> dict:
    keys = r.sample(_WORDS, r.randint(lo, hi))
    vals = r.sample(range(1, 30), len(keys)) if distinct else [r.randint(1, 20) for _ in keys]
    return dict(zip(keys, vals, strict=True))


def _maybe_sorted(r: random.Random) -> list[int]:
    xs = _ints(r, 0, 9, (3, 6))
    return sorted(xs) if r.random() < 0.5 else xs


# ---------------------------------------------------------------- the templates

_N = ("n num number", "int")
_X = ("n x value", "int")
_XS = ("xs nums values", "list")
_S = ("s text word", "str")
_SENT = ("s text sentence", "str")
_WS = ("words items strings", "list")
_D = ("d mapping table", "dict")

_TABLE: tuple[Template, ...] = (
    # ---- integer inputs and digit arithmetic
    _t("digit_sum", "digits", 1, "digit_sum sum_of_digits add_digits", [_N], "int",
       ["Return the sum of the decimal digits of the non-negative integer `$a`.",
        "Given a non-negative integer `$a`, add up its digits and return the total.",
        "Add together the digits of `$a`. The number `$a` is never negative."],
       ["return sum(int(d) for d in str($a))",
        "total = 0\nwhile $a > 0:\n    total += $a % 10\n    $a //= 10\nreturn total",
        "total = 0\nfor d in str($a):\n    total += int(d)\nreturn total"],
       lambda r, c: (r.randint(10, 99999),), ((0,), (7,))),
    _t("count_digits", "digits", 1, "count_digits digit_count num_digits", [_N], "int",
       ["Return how many digits the non-negative integer `$a` has.",
        "Given a non-negative integer `$a`, count its decimal digits. Zero has one digit.",
        "Count the digits of `$a` and return the count. `$a` is never negative."],
       ["return len(str($a))",
        "count = 1\nwhile $a >= 10:\n    $a //= 10\n    count += 1\nreturn count"],
       lambda r, c: (r.randint(10, 10 ** r.randint(2, 7)),), ((0,), (5,))),
    _t("last_digit", "digits", 1, "last_digit ones_digit final_digit", [_N], "int",
       ["Return the last digit of the non-negative integer `$a`.",
        "Given a non-negative integer `$a`, return its ones digit.",
        "Find the rightmost digit of `$a`. The number `$a` is never negative."],
       ["return $a % 10", "return int(str($a)[-1])"],
       lambda r, c: (r.randint(11, 9999),), ((0,), (10,))),
    _t("first_digit", "digits", 1, "first_digit leading_digit top_digit", [_N], "int",
       ["Return the first (leftmost) digit of the non-negative integer `$a`.",
        "Given a non-negative integer `$a`, return its leading digit.",
        "Find the most significant digit of `$a`. The number `$a` is never negative."],
       ["return int(str($a)[0])", "while $a >= 10:\n    $a //= 10\nreturn $a"],
       lambda r, c: (r.randint(10, 99999),), ((0,), (9,))),
    _t("reverse_digits", "digits", 1, "reverse_digits reversed_number flip_digits", [_N], "int",
       ["Return the number formed by the digits of the non-negative integer `$a` in reverse order.",
        "Given a non-negative integer `$a`, reverse its digits. Leading zeros of the result are dropped.",
        "Write the digits of `$a` backwards and return the result as an integer."],
       ["return int(str($a)[::-1])",
        "result = 0\nwhile $a > 0:\n    result = result * 10 + $a % 10\n    $a //= 10\nreturn result"],
       lambda r, c: (r.randint(12, 99999),), ((0,), (100,))),
    _t("is_divisible", "digits", 1, "is_divisible divides_evenly is_multiple", [_X], "bool",
       ["Return True if `$a` is divisible by $k, otherwise False.",
        "Check whether the integer `$a` is a multiple of $k.",
        "Given an integer `$a`, decide if $k divides it evenly. Return a boolean."],
       ["return $a % $k == 0", "if $a % $k == 0:\n    return True\nreturn False", "return not $a % $k"],
       lambda r, c: (r.randint(1, 20) * c["k"] + r.choice((0, 0, 1, 2)),), ((0,),),
       [{"k": k} for k in (3, 4, 5, 7)]),
    _t("count_even_digits", "digits", 2, "count_even_digits even_digit_count", [_N], "int",
       ["Return how many digits of the non-negative integer `$a` are even.",
        "Given a non-negative integer `$a`, count the digits that are even (0, 2, 4, 6 or 8).",
        "Count the even digits in `$a`. The number `$a` is never negative."],
       ["return sum(1 for d in str($a) if int(d) % 2 == 0)",
        "count = 0\nfor d in str($a):\n    if int(d) % 2 == 0:\n        count += 1\nreturn count",
        "return len([d for d in str($a) if d in '02468'])"],
       lambda r, c: (r.randint(10, 10**6),), ((0,), (135,))),
    # ---- predicates returning bool
    _t("is_even", "predicates", 1, "is_even even_number", [_X], "bool",
       ["Return True if `$a` is even, otherwise False.",
        "Check whether the integer `$a` is even.",
        "Given an integer `$a`, decide if it is divisible by 2. Return a boolean."],
       ["return $a % 2 == 0", "return not $a % 2", "if $a % 2 == 0:\n    return True\nreturn False"],
       lambda r, c: (r.randint(-50, 50),), ((0,), (-3,))),
    _t("is_palindrome", "predicates", 1, "is_palindrome reads_same_backwards is_mirror", [_S], "bool",
       ["Return True if the string `$a` reads the same forwards and backwards.",
        "Check whether `$a` is a palindrome, that is equal to its own reverse.",
        "Given a string `$a`, decide if it is a palindrome. The check is case-sensitive."],
       ["return $a == $a[::-1]",
        "for i in range(len($a) // 2):\n    if $a[i] != $a[-1 - i]:\n        return False\nreturn True",
        "return list($a) == list(reversed($a))"],
       lambda r, c: (_pal(r),), (("",), ("ab",))),
    _t("all_positive", "predicates", 1, "all_positive only_positive every_positive", [_XS], "bool",
       ["Return True if every number in `$a` is greater than 0. An empty list gives True.",
        "Check whether all numbers in the list `$a` are positive (True for an empty list).",
        "Given a list of integers `$a`, decide if none of them is zero or negative."],
       ["return all(x > 0 for x in $a)",
        "for x in $a:\n    if x <= 0:\n        return False\nreturn True",
        "return min($a) > 0 if $a else True"],
       lambda r, c: (_ints(r, 1, 9, (2, 5)) if r.random() < 0.5 else _ints(r),), (([],), ([0],))),
    _t("contains", "predicates", 1, "contains has_item includes",
       [("xs nums items", "list"), ("x target value", "int")], "bool",
       ["Return True if `$b` occurs in the list `$a`.",
        "Check whether the list `$a` contains the number `$b`.",
        "Given a list `$a` and a number `$b`, decide if `$b` is one of the elements."],
       ["return $b in $a",
        "for v in $a:\n    if v == $b:\n        return True\nreturn False",
        "return $a.count($b) > 0"],
       lambda r, c: (xs := _ints(r, 0, 9), r.choice(xs) if r.random() < 0.5 else r.randint(0, 9)),
       (([], 1), ([0], 0))),
    _t("starts_with", "predicates", 1, "starts_with begins_with has_prefix",
       [("s text word", "str"), ("prefix start head", "str")], "bool",
       ["Return True if the string `$a` begins with `$b`.",
        "Check whether `$a` starts with the prefix `$b`.",
        "Given two strings `$a` and `$b`, decide if `$a` starts with `$b`. Every string starts with the "
        "empty string."],
       ["return $a.startswith($b)", "return $a[:len($b)] == $b",
        "if len($b) > len($a):\n    return False\nreturn $a[0:len($b)] == $b"],
       lambda r, c: (w := r.choice(_WORDS), w[: r.randint(1, 3)] if r.random() < 0.5 else r.choice(_WORDS)[:2]),
       (("", "a"), ("cat", ""))),
    _t("has_vowel", "predicates", 1, "has_vowel contains_vowel", [_S], "bool",
       ["Return True if the string `$a` contains at least one vowel (a, e, i, o, u, in either case).",
        "Check whether `$a` has a vowel in it: a, e, i, o or u, upper or lower case.",
        "Given a string `$a`, decide if any of its characters is a vowel. Both cases count."],
       ["return any(c in 'aeiou' for c in $a.lower())",
        "for c in $a:\n    if c.lower() in 'aeiou':\n        return True\nreturn False",
        "return any(v in $a.lower() for v in 'aeiou')"],
       lambda r, c: ((r.choice(_NOVOWEL) if r.random() < 0.5 else r.choice(_WORDS)).upper()
                     if r.random() < 0.3 else (r.choice(_NOVOWEL) if r.random() < 0.5 else r.choice(_WORDS)),),
       (("",), ("Q",), ("E",))),
    _t("is_sorted", "predicates", 1, "is_sorted in_order is_ascending", [_XS], "bool",
       ["Return True if the numbers in `$a` are in non-decreasing order.",
        "Check whether the list `$a` is sorted from smallest to largest (equal neighbours are allowed).",
        "Given a list of integers `$a`, decide if each number is at most the next one. Empty lists count as "
        "sorted."],
       ["return $a == sorted($a)",
        "return all($a[i] <= $a[i + 1] for i in range(len($a) - 1))",
        "for i in range(1, len($a)):\n    if $a[i - 1] > $a[i]:\n        return False\nreturn True"],
       lambda r, c: (_maybe_sorted(r),), (([],), ([3, 3],), ([2, 1],))),
    # ---- two-argument functions
    _t("count_occurrences", "two_args", 1, "count_occurrences count_of how_many",
       [("xs nums items", "list"), ("x target value", "int")], "int",
       ["Return how many times `$b` appears in the list `$a`.",
        "Given a list `$a` and a value `$b`, count the elements equal to `$b`.",
        "Count the occurrences of `$b` in `$a`. Return 0 when there are none."],
       ["return $a.count($b)",
        "count = 0\nfor v in $a:\n    if v == $b:\n        count += 1\nreturn count",
        "return sum(1 for v in $a if v == $b)"],
       lambda r, c: (_ints(r, 0, 4, (3, 8)), r.randint(0, 4)), (([], 3), ([1, 1], 1))),
    _t("repeat_string", "two_args", 1, "repeat_string repeat_text echo",
       [("s text word", "str"), ("n times count", "int")], "str",
       ["Return the string `$a` repeated `$b` times.",
        "Given a string `$a` and a non-negative integer `$b`, join `$b` copies of `$a` together.",
        "Build a string made of `$b` copies of `$a`, one after another. Zero copies give the empty string."],
       ["return $a * $b", "result = ''\nfor _ in range($b):\n    result += $a\nreturn result",
        "return ''.join($a for _ in range($b))"],
       lambda r, c: (r.choice(_WORDS), r.randint(2, 4)), (("ab", 0), ("", 3), ("x", 1))),
    _t("larger", "two_args", 1, "larger bigger max_of_two",
       [("a x first", "int"), ("b y second", "int")], "int",
       ["Return the larger of the two numbers `$a` and `$b`.",
        "Given two integers `$a` and `$b`, return whichever is bigger (either one when they are equal).",
        "Compare `$a` and `$b`. Return the greater one."],
       ["return $a if $a > $b else $b", "if $a > $b:\n    return $a\nreturn $b", "return max($a, $b)"],
       lambda r, c: (r.randint(-20, 20), r.randint(-20, 20)), ((0, 0), (-1, -5), (2, 9))),
    _t("greater_than", "two_args", 1, "greater_than above_limit larger_than",
       [("xs nums values", "list"), ("k limit bound", "int")], "list",
       ["Return the numbers of `$a` that are greater than `$b`, in their original order.",
        "Given a list `$a` and a number `$b`, keep only the elements bigger than `$b`.",
        "Filter `$a` down to the elements above `$b`. Keep their order."],
       ["return [x for x in $a if x > $b]",
        "result = []\nfor x in $a:\n    if x > $b:\n        result.append(x)\nreturn result",
        "return list(filter(lambda x: x > $b, $a))"],
       lambda r, c: (_ints(r), r.randint(-3, 5)), (([], 0), ([1, 2], 5))),
    _t("pad_left", "two_args", 1, "pad_left left_pad fill_left",
       [("s text word", "str"), ("width n size", "int")], "str",
       ["Return `$a` padded on the left with '$k' characters until it is `$b` characters long. Longer "
        "strings are returned unchanged.",
        "Given a string `$a` and a width `$b`, put '$k' characters in front of `$a` until its length is `$b`.",
        "Left-pad `$a` with '$k' to length `$b`. If `$a` is already that long, return it as it is."],
       ["return $a.rjust($b, '$k')", "return '$k' * ($b - len($a)) + $a",
        "while len($a) < $b:\n    $a = '$k' + $a\nreturn $a"],
       lambda r, c: (w := r.choice(_WORDS), len(w) + r.randint(1, 4)), (("", 2), ("abc", 2)),
       [{"k": k} for k in ("*", ".", "0", "-")]),
    _t("trim_to", "two_args", 1, "first_chars trim_to truncate",
       [("s text word", "str"), ("n size limit", "int")], "str",
       ["Return the first `$b` characters of `$a` (all of `$a` when it is shorter).",
        "Given a string `$a` and a number `$b`, cut `$a` down to at most `$b` characters.",
        "Truncate `$a` to length `$b`. Shorter strings stay as they are."],
       ["return $a[:$b]",
        "result = ''\nfor c in $a:\n    if len(result) == $b:\n        break\n    result += c\nreturn result",
        "return $a if len($a) <= $b else $a[:$b]"],
       lambda r, c: (_text(r, 1, 3), r.randint(1, 5)), (("", 3), ("abc", 0), ("hi", 5))),
    _t("power", "two_args", 1, "power raise_to to_the_power",
       [("base x a", "int"), ("exp n e", "int")], "int",
       ["Return `$a` raised to the power `$b` (`$b` is never negative).",
        "Given an integer `$a` and a non-negative integer `$b`, multiply `$b` copies of `$a` together. "
        "Anything to the power 0 is 1.",
        "Compute `$a` to the power of `$b`, where `$b` >= 0."],
       ["return $a ** $b", "result = 1\nfor _ in range($b):\n    result *= $a\nreturn result",
        "return pow($a, $b)"],
       lambda r, c: (r.randint(-5, 6), r.randint(2, 4)), ((7, 0), (0, 3), (5, 1))),
    _t("add_to_each", "two_args", 1, "add_to_each shift_all increase_all",
       [("xs nums values", "list"), ("n k amount", "int")], "list",
       ["Return a new list with `$b` added to every number of `$a`.",
        "Given a list `$a` and a number `$b`, increase each element by `$b`.",
        "Add `$b` to each element of `$a`. Return the results as a new list in the same order."],
       ["return [x + $b for x in $a]",
        "result = []\nfor x in $a:\n    result.append(x + $b)\nreturn result",
        "return list(map(lambda x: x + $b, $a))"],
       lambda r, c: (_ints(r), r.choice((-3, -1, 1, 2, 5, 10))), (([], 4), ([0], 0))),
    _t("count_char", "two_args", 1, "count_char char_count count_letter",
       [("s text word", "str"), ("ch letter target", "str")], "int",
       ["Return how many times the character `$b` occurs in the string `$a`.",
        "Given a string `$a` and a single character `$b`, count the positions of `$a` holding `$b`.",
        "Count the occurrences of `$b` in `$a`. The comparison is case-sensitive."],
       ["return $a.count($b)",
        "count = 0\nfor x in $a:\n    if x == $b:\n        count += 1\nreturn count",
        "return sum(1 for x in $a if x == $b)"],
       lambda r, c: (t := _text(r, 1, 3), r.choice(t.replace(" ", "")) if r.random() < 0.7 else r.choice("aeioz")),
       (("", "a"), ("aaa", "a"))),
    _t("distance", "two_args", 1, "distance gap how_far_apart",
       [("a x first", "int"), ("b y second", "int")], "int",
       ["Return the absolute difference between `$a` and `$b`.",
        "Given two integers `$a` and `$b`, return how far apart they are on the number line.",
        "Compute the distance between `$a` and `$b`. The answer is never negative."],
       ["return abs($a - $b)", "return $a - $b if $a > $b else $b - $a",
        "if $a > $b:\n    return $a - $b\nreturn $b - $a"],
       lambda r, c: (r.randint(-20, 20), r.randint(-20, 20)), ((0, 0), (3, -2))),
    # ---- conditionals
    _t("sign", "conditionals", 1, "sign sign_of signum", [_X], "int",
       ["Return 1 if `$a` is positive, -1 if it is negative and 0 if it is zero.",
        "Given an integer `$a`, return its sign: 1, -1 or 0.",
        "Classify `$a` by its sign. Positive numbers give 1, negative numbers -1, and zero gives 0."],
       ["if $a > 0:\n    return 1\nif $a < 0:\n    return -1\nreturn 0",
        "return ($a > 0) - ($a < 0)",
        "return 1 if $a > 0 else -1 if $a < 0 else 0"],
       lambda r, c: (r.randint(-100, 100),), ((0,), (-7,))),
    _t("clamp", "conditionals", 1, "clamp limit_to keep_in_range", [_X], "int",
       ["Return `$a` limited to the range $lo to $hi: values below $lo become $lo and values above $hi "
        "become $hi.",
        "Given a number `$a`, clamp it into the interval [$lo, $hi].",
        "Keep `$a` between $lo and $hi. Numbers outside the range are moved to the nearest end."],
       ["return max($lo, min($hi, $a))",
        "if $a < $lo:\n    return $lo\nif $a > $hi:\n    return $hi\nreturn $a",
        "return $lo if $a < $lo else $hi if $a > $hi else $a"],
       lambda r, c: (r.randint(c["lo"] - 10, c["hi"] + 10),), lambda c: ((c["lo"],), (c["hi"] + 1,)),
       [{"lo": 0, "hi": 10}, {"lo": 0, "hi": 100}, {"lo": -5, "hi": 5}, {"lo": 1, "hi": 9}]),
    _t("grade", "conditionals", 1, "grade letter_grade grade_for", [("score points mark", "int")], "str",
       ["Return the letter grade for `$a`: 'A' from $t1, 'B' from $t2, 'C' from $t3, otherwise 'F'.",
        "Given a score `$a` between 0 and 100, return 'A' if it is at least $t1, 'B' if at least $t2, "
        "'C' if at least $t3, and 'F' below that.",
        "Convert the score `$a` to a letter. Scores of $t1 or more get 'A', $t2 or more 'B', $t3 or more "
        "'C', and the rest 'F'."],
       ["if $a >= $t1:\n    return 'A'\nif $a >= $t2:\n    return 'B'\nif $a >= $t3:\n    return 'C'\n"
        "return 'F'",
        "for limit, letter in (($t1, 'A'), ($t2, 'B'), ($t3, 'C')):\n    if $a >= limit:\n"
        "        return letter\nreturn 'F'"],
       lambda r, c: (r.randint(c["t3"] - 15, 100),), lambda c: ((0,), (100,), (c["t1"],)),
       [{"t1": 90, "t2": 80, "t3": 70}, {"t1": 85, "t2": 70, "t3": 55}, {"t1": 80, "t2": 65, "t3": 50}]),
    _t("fizz", "conditionals", 1, "fizz fizz_word fizz_or_number", [("n num number", "int")], "str",
       ["Return 'Fizz' if `$a` is divisible by $k, otherwise `$a` written as a string.",
        "Given a positive integer `$a`, return the word 'Fizz' for multiples of $k and the number as a "
        "string for every other value.",
        "Turn `$a` into text. Multiples of $k become 'Fizz', other numbers become their decimal string."],
       ["return 'Fizz' if $a % $k == 0 else str($a)",
        "if $a % $k == 0:\n    return 'Fizz'\nreturn str($a)",
        "text = str($a)\nif $a % $k == 0:\n    text = 'Fizz'\nreturn text"],
       lambda r, c: (r.randint(1, 40),), lambda c: ((c["k"],), (1,)), [{"k": k} for k in (3, 5, 7)]),
    _t("absolute", "conditionals", 1, "absolute abs_value magnitude", [_X], "int",
       ["Return the absolute value of the integer `$a`.",
        "Given an integer `$a`, drop its minus sign if it has one.",
        "Compute how far `$a` is from zero. The result is never negative."],
       ["return -$a if $a < 0 else $a", "if $a < 0:\n    return -$a\nreturn $a", "return abs($a)"],
       lambda r, c: (r.randint(-50, 50),), ((0,), (-1,))),
    _t("parity_word", "conditionals", 1, "parity_word even_or_odd parity_name", [_X], "str",
       ["Return 'even' if `$a` is even and 'odd' otherwise.",
        "Given an integer `$a`, describe its parity with the word 'even' or 'odd'.",
        "Check whether `$a` is even or odd. Return the answer as the string 'even' or 'odd'."],
       ["return 'even' if $a % 2 == 0 else 'odd'", "if $a % 2 == 0:\n    return 'even'\nreturn 'odd'",
        "return ('even', 'odd')[$a % 2]"],
       lambda r, c: (r.randint(-30, 30),), ((0,), (-3,))),
    _t("age_group", "conditionals", 1, "age_group life_stage stage_for_age", [("age years a", "int")], "str",
       ["Return 'child' if `$a` is below $young, 'teen' if it is below $adult, and 'adult' otherwise.",
        "Given an age `$a` in years, classify it: under $young is 'child', under $adult is 'teen', "
        "anything else is 'adult'.",
        "Decide the life stage for the age `$a`. Ages below $young give 'child', ages below $adult give "
        "'teen', the rest 'adult'."],
       ["if $a < $young:\n    return 'child'\nif $a < $adult:\n    return 'teen'\nreturn 'adult'",
        "return 'child' if $a < $young else 'teen' if $a < $adult else 'adult'"],
       lambda r, c: (r.randint(0, 80),), lambda c: ((0,), (c["adult"],)),
       [{"young": 13, "adult": 20}, {"young": 12, "adult": 18}]),
    # ---- loops with accumulators
    _t("factorial", "loops", 1, "factorial fact product_up_to", [_N], "int",
       ["Return the factorial of the non-negative integer `$a`, the product 1 * 2 * ... * `$a` (0 gives 1).",
        "Given a non-negative integer `$a`, multiply all the whole numbers from 1 to `$a`. The factorial "
        "of 0 is 1.",
        "Compute the factorial of `$a` with a loop. `$a` is never negative."],
       ["result = 1\nfor i in range(2, $a + 1):\n    result *= i\nreturn result",
        "result = 1\nwhile $a > 1:\n    result *= $a\n    $a -= 1\nreturn result"],
       lambda r, c: (r.randint(3, 9),), ((0,), (1,))),
    _t("sum_to_n", "loops", 1, "sum_to_n sum_up_to triangle_number", [_N], "int",
       ["Return 1 + 2 + ... + `$a` for a non-negative integer `$a`.",
        "Given a non-negative integer `$a`, add up all whole numbers from 1 to `$a`. Zero gives 0.",
        "Compute the sum of the numbers 1 through `$a`."],
       ["return sum(range(1, $a + 1))",
        "total = 0\nfor i in range(1, $a + 1):\n    total += i\nreturn total",
        "return $a * ($a + 1) // 2"],
       lambda r, c: (r.randint(2, 50),), ((0,), (1,))),
    _t("product_of_list", "loops", 1, "product_of multiply_all list_product", [_XS], "int",
       ["Return the product of all numbers in `$a`; an empty list gives 1.",
        "Given a list of integers `$a`, multiply them together. The product of no numbers is 1.",
        "Multiply every element of `$a` and return the result. An empty list has product 1."],
       ["result = 1\nfor x in $a:\n    result *= x\nreturn result",
        "result = 1\ni = 0\nwhile i < len($a):\n    result *= $a[i]\n    i += 1\nreturn result"],
       lambda r, c: (_ints(r, -5, 5, (2, 5)),), (([],), ([0, 5],))),
    _t("running_max", "loops", 2, "running_max prefix_max max_so_far", [_XS], "list",
       ["Return a list whose i-th element is the largest number among the first i + 1 numbers of `$a`.",
        "Given a list of integers `$a`, replace each element by the maximum seen up to and including it.",
        "Walk through `$a` keeping track of the largest value so far. Return those running maxima as a list."],
       ["result = []\nfor x in $a:\n    if not result or x > result[-1]:\n        result.append(x)\n    else:\n"
        "        result.append(result[-1])\nreturn result",
        "return [max($a[: i + 1]) for i in range(len($a))]"],
       lambda r, c: (_ints(r),), (([],), ([5],))),
    _t("sum_of_squares", "loops", 1, "sum_of_squares square_sum squares_total", [_XS], "int",
       ["Return the sum of the squares of the numbers in `$a`.",
        "Given a list of integers `$a`, square each one and add the squares up. An empty list gives 0.",
        "Add up x * x for every x in `$a`."],
       ["return sum(x * x for x in $a)", "total = 0\nfor x in $a:\n    total += x * x\nreturn total",
        "return sum(map(lambda x: x**2, $a))"],
       lambda r, c: (_ints(r),), (([],), ([-3],))),
    _t("sum_even", "loops", 2, "sum_even sum_of_evens even_total", [_XS], "int",
       ["Return the sum of the even numbers in `$a`.",
        "Given a list of integers `$a`, add up only the even ones. With none, the answer is 0.",
        "Add together every number of `$a` that is divisible by 2."],
       ["return sum(x for x in $a if x % 2 == 0)",
        "total = 0\nfor x in $a:\n    if x % 2 == 0:\n        total += x\nreturn total"],
       lambda r, c: (_ints(r),), (([],), ([1, 3],))),
    _t("running_total", "loops", 2, "running_total prefix_sums cumulative_sum", [_XS], "list",
       ["Return the running totals of `$a`: element i is the sum of the first i + 1 numbers.",
        "Given a list of integers `$a`, build the list of cumulative sums.",
        "Walk through `$a` adding up the numbers. Return the total after each step as a list."],
       ["result = []\ntotal = 0\nfor x in $a:\n    total += x\n    result.append(total)\nreturn result",
        "return [sum($a[: i + 1]) for i in range(len($a))]"],
       lambda r, c: (_ints(r),), (([],), ([0],))),
    _t("countdown", "loops", 1, "countdown count_down numbers_down_from", [_N], "list",
       ["Return the list [`$a`, `$a` - 1, ..., 1] for a non-negative integer `$a` (0 gives []).",
        "Given a non-negative integer `$a`, list the whole numbers from `$a` down to 1.",
        "Count down from `$a` to 1. Return the numbers as a list, largest first."],
       ["return list(range($a, 0, -1))",
        "result = []\nwhile $a > 0:\n    result.append($a)\n    $a -= 1\nreturn result",
        "return [i for i in range($a, 0, -1)]"],
       lambda r, c: (r.randint(2, 8),), ((0,), (1,))),
    # ---- counting and dictionaries
    _t("char_counts", "dicts", 1, "char_counts letter_counts count_chars", [_S], "dict",
       ["Return a dictionary mapping each character of `$a` to the number of times it occurs.",
        "Given a string `$a`, count every character. Return the counts as a dict.",
        "Build a dict whose keys are the characters of `$a` and whose values are how often each appears."],
       ["return {c: $a.count(c) for c in $a}",
        "counts = {}\nfor c in $a:\n    counts[c] = counts.get(c, 0) + 1\nreturn counts",
        "counts = {}\nfor c in $a:\n    if c in counts:\n        counts[c] += 1\n    else:\n        counts[c] = 1\n"
        "return counts"],
       lambda r, c: (r.choice(_WORDS) if r.random() < 0.6 else _text(r, 2, 2),), (("",), ("aa",))),
    _t("word_counts", "dicts", 2, "word_counts count_words word_frequencies", [_SENT], "dict",
       ["Return a dictionary mapping each word of `$a` to how many times it occurs. Words are separated by "
        "spaces.",
        "Given a sentence `$a`, split it into words at the spaces and count each word. Return a dict.",
        "Count how often every space-separated word appears in `$a`, as a dict from word to count."],
       ["words = $a.split()\nreturn {w: words.count(w) for w in words}",
        "counts = {}\nfor w in $a.split():\n    counts[w] = counts.get(w, 0) + 1\nreturn counts"],
       lambda r, c: (" ".join(r.choice(_WORDS[:6]) for _ in range(r.randint(3, 6))),), (("",), ("hi",))),
    _t("lookup", "dicts", 1, "lookup get_or_default value_for",
       [("d mapping table", "dict"), ("key name word", "str")], "int",
       ["Return the value stored under `$b` in the dictionary `$a`, or $k when `$b` is not a key.",
        "Given a dictionary `$a` and a key `$b`, look `$b` up. Missing keys give $k.",
        "Look up `$b` in `$a` and return its value. If the key is absent, return $k instead."],
       ["return $a.get($b, $k)", "if $b in $a:\n    return $a[$b]\nreturn $k",
        "return $a[$b] if $b in $a else $k"],
       lambda r, c: (d := _dict(r), r.choice(list(d)) if r.random() < 0.6 else r.choice(_WORDS)),
       (({}, "cat"), ({"a": 5}, "a")), [{"k": k} for k in (0, -1)]),
    _t("invert_dict", "dicts", 1, "invert_dict swap_keys_values flip_dict", [_D], "dict",
       ["Return a new dictionary with the keys and values of `$a` swapped. The values of `$a` are all "
        "different.",
        "Given a dictionary `$a` whose values are unique, build the reverse mapping from each value to its key.",
        "Swap keys and values in `$a` and return the result."],
       ["return {v: k for k, v in $a.items()}",
        "result = {}\nfor k, v in $a.items():\n    result[v] = k\nreturn result",
        "result = {}\nfor k in $a:\n    result[$a[k]] = k\nreturn result"],
       lambda r, c: (_dict(r, distinct=True),), (({},),)),
    _t("sum_values", "dicts", 1, "sum_values total_of_values dict_total", [_D], "int",
       ["Return the sum of all values in the dictionary `$a`.",
        "Given a dictionary `$a` from names to numbers, add up its values. An empty dict gives 0.",
        "Add together the numbers stored in `$a` and return the total."],
       ["return sum($a.values())", "total = 0\nfor k in $a:\n    total += $a[k]\nreturn total",
        "total = 0\nfor _, v in $a.items():\n    total += v\nreturn total"],
       lambda r, c: (_dict(r),), (({},),)),
    _t("count_vowels", "dicts", 1, "count_vowels vowel_count number_of_vowels", [_S], "int",
       ["Return the number of vowels (a, e, i, o, u, in either case) in `$a`.",
        "Given a string `$a`, count the letters that are vowels. Upper case vowels count too.",
        "Count how many characters of `$a` are a, e, i, o or u, ignoring case."],
       ["return sum(1 for c in $a.lower() if c in 'aeiou')",
        "count = 0\nfor c in $a.lower():\n    if c in 'aeiou':\n        count += 1\nreturn count",
        "return len([c for c in $a if c in 'aeiouAEIOU'])"],
       lambda r, c: (_mixed(r, 1, 3),), (("",), ("xyz",))),
    _t("key_of_max", "dicts", 2, "key_of_max best_key top_key", [_D], "str",
       ["Return the key of `$a` with the largest value. `$a` is not empty and its values are all different.",
        "Given a non-empty dictionary `$a` with distinct numeric values, find the key whose value is biggest.",
        "Find the entry of `$a` with the highest value and return its key. No two values are equal."],
       ["return max($a, key=$a.get)",
        "best = None\nfor k in $a:\n    if best is None or $a[k] > $a[best]:\n        best = k\nreturn best"],
       lambda r, c: (_dict(r, 2, 5, distinct=True),), (({"a": 1},),)),
    # ---- string building
    _t("reverse_words", "strings", 1, "reverse_words words_backwards flip_words", [_SENT], "str",
       ["Return the words of `$a` in reverse order, separated by single spaces.",
        "Given a sentence `$a` of space-separated words, reverse the order of the words.",
        "Reverse the word order of `$a`. The result joins the words with one space."],
       ["return ' '.join($a.split()[::-1])", "return ' '.join(reversed($a.split()))",
        "result = []\nfor w in $a.split():\n    result.insert(0, w)\nreturn ' '.join(result)"],
       lambda r, c: (_text(r),), (("",), ("one",))),
    _t("initials", "strings", 1, "initials first_letters acronym", [_SENT], "str",
       ["Return the first letter of every word in `$a`, upper-cased and joined together.",
        "Given a phrase `$a`, build its initials: the first character of each word in upper case.",
        "Take the first letter of each space-separated word of `$a`. Return them as one upper-case string."],
       ["return ''.join(w[0].upper() for w in $a.split())",
        "result = ''\nfor w in $a.split():\n    result += w[0].upper()\nreturn result"],
       lambda r, c: (_mixed(r),), (("",), ("a",))),
    _t("alternate_case", "strings", 1, "alternate_case zigzag_case wave_case", [_S], "str",
       ["Return `$a` with the characters at even positions (0, 2, ...) in upper case and the others in "
        "lower case.",
        "Given a string `$a`, upper-case every character at an even index and lower-case the rest.",
        "Alternate the case of `$a`. Index 0 becomes upper case, index 1 lower case, and so on."],
       ["return ''.join(c.upper() if i % 2 == 0 else c.lower() for i, c in enumerate($a))",
        "result = ''\nfor i in range(len($a)):\n    if i % 2 == 0:\n        result += $a[i].upper()\n    else:\n"
        "        result += $a[i].lower()\nreturn result"],
       lambda r, c: (_mixed(r, 1, 2),), (("",), ("ab",))),
    _t("remove_char", "strings", 1, "remove_char strip_all delete_char", [_SENT], "str",
       ["Return `$a` with every '$k' removed.",
        "Given a string `$a`, delete all occurrences of the character '$k'.",
        "Remove each '$k' from `$a`. The other characters keep their order."],
       ["return $a.replace('$k', '')", "return ''.join(c for c in $a if c != '$k')",
        "result = ''\nfor c in $a:\n    if c != '$k':\n        result += c\nreturn result"],
       lambda r, c: (" ".join([*_words(r, 0, 2), r.choice([w for w in _WORDS if c["k"] in w])]),),
       (("",), ("xyz",)), [{"k": k} for k in ("a", "e", "o", "s")]),
    _t("reverse_string", "strings", 1, "reverse_string backwards mirror_text", [_S], "str",
       ["Return the string `$a` reversed.",
        "Given a string `$a`, return its characters in the opposite order.",
        "Write `$a` backwards. The empty string stays empty."],
       ["return $a[::-1]", "result = ''\nfor c in $a:\n    result = c + result\nreturn result",
        "return ''.join(reversed($a))"],
       lambda r, c: (_text(r, 1, 2),), (("",), ("a",))),
    _t("shout", "strings", 1, "shout exclaim make_loud", [_SENT], "str",
       ["Return `$a` in upper case followed by '$k'.",
        "Given a string `$a`, convert it to capital letters and add '$k' at the end.",
        "Make `$a` loud. Upper-case it and append '$k'."],
       ["return $a.upper() + '$k'", "return f'{$a.upper()}$k'", "loud = $a.upper()\nreturn loud + '$k'"],
       lambda r, c: (_mixed(r, 1, 3),), (("",),), [{"k": k} for k in ("!", "!!", "?")]),
    _t("capitalize_words", "strings", 1, "capitalize_words title_words capitalize_each", [_SENT], "str",
       ["Return `$a` with the first letter of every word in upper case and the rest in lower case. Words "
        "are separated by single spaces.",
        "Given a sentence `$a` of words separated by single spaces, capitalize each word.",
        "Capitalize every word of `$a`: first letter upper case, the remaining letters lower case."],
       ["return ' '.join(w.capitalize() for w in $a.split(' '))",
        "result = []\nfor w in $a.split(' '):\n    result.append(w[:1].upper() + w[1:].lower())\n"
        "return ' '.join(result)"],
       lambda r, c: (_mixed(r),), (("",), ("a",))),
    _t("join_with", "strings", 1, "join_with join_words glue",
       [("words items parts", "list"), ("sep separator delim", "str")], "str",
       ["Return the strings of `$a` joined together with `$b` between neighbours.",
        "Given a list of strings `$a` and a separator `$b`, glue the strings into one, putting `$b` "
        "between each pair.",
        "Join `$a` into one string, separated by `$b`. An empty list gives the empty string."],
       ["return $b.join($a)",
        "result = ''\nfor i, w in enumerate($a):\n    if i > 0:\n        result += $b\n    result += w\n"
        "return result"],
       lambda r, c: (_words(r, 2, 4), r.choice(("-", ", ", " ", "+", "/"))), (([], "-"), (["one"], ", "))),
    # ---- filtering by a condition
    _t("long_words", "filtering", 1, "long_words keep_long words_longer_than", [_WS], "list",
       ["Return the words of `$a` that have more than $k letters, in their original order.",
        "Given a list of words `$a`, keep only those longer than $k characters.",
        "Filter `$a`. Keep each word whose length is greater than $k."],
       ["return [w for w in $a if len(w) > $k]",
        "result = []\nfor w in $a:\n    if len(w) > $k:\n        result.append(w)\nreturn result",
        "return list(filter(lambda w: len(w) > $k, $a))"],
       lambda r, c: (_words(r, 3, 6),), (([],),), [{"k": k} for k in (2, 3, 4)]),
    _t("keep_odd", "filtering", 1, "keep_odd odd_numbers only_odd", [_XS], "list",
       ["Return the odd numbers of `$a` in their original order.",
        "Given a list of integers `$a`, keep only the odd ones.",
        "Filter out the even numbers of `$a`. Return what is left as a list."],
       ["return [x for x in $a if x % 2 != 0]",
        "result = []\nfor x in $a:\n    if x % 2 == 1:\n        result.append(x)\nreturn result",
        "return list(filter(lambda x: x % 2, $a))"],
       lambda r, c: (_ints(r),), (([],), ([2, 4],))),
    _t("unique_in_order", "filtering", 1, "unique_in_order remove_duplicates dedupe", [_XS], "list",
       ["Return `$a` without repeated values, keeping the first occurrence of each in its original order.",
        "Given a list `$a`, remove the duplicates. Keep the order in which values first appear.",
        "Drop every value of `$a` that already appeared earlier in the list."],
       ["result = []\nfor x in $a:\n    if x not in result:\n        result.append(x)\nreturn result",
        "return list(dict.fromkeys($a))",
        "return [x for i, x in enumerate($a) if x not in $a[:i]]"],
       lambda r, c: (_ints(r, 0, 5, (4, 8)),), (([],), ([2, 2],))),
    _t("remove_negatives", "filtering", 1, "remove_negatives non_negative drop_negatives", [_XS], "list",
       ["Return the numbers of `$a` that are not negative, in their original order.",
        "Given a list of integers `$a`, drop every number below zero.",
        "Remove the negative numbers from `$a`. Zero is kept."],
       ["return [x for x in $a if x >= 0]",
        "result = []\nfor x in $a:\n    if x >= 0:\n        result.append(x)\nreturn result",
        "return list(filter(lambda x: x >= 0, $a))"],
       lambda r, c: (_ints(r),), (([],), ([0, -1],))),
    _t("keep_multiples", "filtering", 1, "keep_multiples multiples_of only_multiples", [_XS], "list",
       ["Return the numbers of `$a` that are divisible by $k, in their original order.",
        "Given a list of integers `$a`, keep only the multiples of $k.",
        "Filter `$a` down to the numbers that $k divides evenly."],
       ["return [x for x in $a if x % $k == 0]",
        "result = []\nfor x in $a:\n    if x % $k == 0:\n        result.append(x)\nreturn result"],
       lambda r, c: (_ints(r, 0, 20),), (([],), ([1],)), [{"k": k} for k in (2, 3, 5)]),
    _t("starting_with", "filtering", 1, "starting_with words_beginning_with pick_by_letter",
       [("words items names", "list"), ("letter ch first", "str")], "list",
       ["Return the words of `$a` that start with the letter `$b`, in their original order.",
        "Given a list of words `$a` and a letter `$b`, keep the words whose first character is `$b`.",
        "Select from `$a` every word beginning with `$b`. The comparison is case-sensitive."],
       ["return [w for w in $a if w.startswith($b)]",
        "result = []\nfor w in $a:\n    if w[:1] == $b:\n        result.append(w)\nreturn result",
        "return list(filter(lambda w: w.startswith($b), $a))"],
       lambda r, c: (ws := _words(r, 3, 6), r.choice(ws)[0] if r.random() < 0.8 else "z"), (([], "a"),)),
    # ---- list basics
    _t("first_and_last", "lists", 1, "first_and_last ends_of end_points", [_XS], "list",
       ["Return a list holding the first and the last element of the non-empty list `$a`.",
        "Given a non-empty list `$a`, return [first element, last element].",
        "Take the first and the last item of `$a` (which is never empty). Return them as a two-element list."],
       ["return [$a[0], $a[-1]]", "first = $a[0]\nlast = $a[len($a) - 1]\nreturn [first, last]"],
       lambda r, c: (_ints(r),), (([7],),)),
    _t("swap_ends", "lists", 1, "swap_ends swap_first_last exchange_ends", [_XS], "list",
       ["Return a copy of `$a` with its first and last elements swapped.",
        "Given a list `$a`, exchange the first and the last element. Lists shorter than 2 stay the same.",
        "Swap the two ends of `$a` and return the new list. Do not change `$a` itself."],
       ["result = list($a)\nif result:\n    result[0], result[-1] = result[-1], result[0]\nreturn result",
        "if len($a) < 2:\n    return list($a)\nreturn [$a[-1]] + $a[1:-1] + [$a[0]]"],
       lambda r, c: (_ints(r),), (([],), ([1],))),
    _t("neighbour_pairs", "lists", 1, "neighbour_pairs adjacent_pairs pairs_of_neighbours", [_XS], "list",
       ["Return the list of tuples (`$a`[i], `$a`[i + 1]) for every pair of neighbouring elements.",
        "Given a list `$a`, pair each element with the one after it. Return the pairs as tuples.",
        "List all adjacent pairs of `$a` as 2-tuples, in order."],
       ["return list(zip($a, $a[1:]))", "return [($a[i], $a[i + 1]) for i in range(len($a) - 1)]",
        "result = []\nfor i in range(1, len($a)):\n    result.append(($a[i - 1], $a[i]))\nreturn result"],
       lambda r, c: (_ints(r, -9, 9, (2, 5)),), (([],), ([1],))),
    _t("flatten", "lists", 1, "flatten flatten_once join_lists", [("lists rows groups", "list")], "list",
       ["Return one list holding the elements of every inner list of `$a`, in order.",
        "Given a list of lists `$a`, flatten it by one level.",
        "Concatenate the lists inside `$a`. Return the elements as one flat list."],
       ["return [x for row in $a for x in row]",
        "result = []\nfor row in $a:\n    result.extend(row)\nreturn result",
        "result = []\nfor row in $a:\n    for x in row:\n        result.append(x)\nreturn result"],
       lambda r, c: ([_ints(r, 0, 9, (0, 3)) for _ in range(r.randint(2, 3))],), (([],), ([[], []],))),
    _t("last_n", "lists", 1, "last_n tail take_last", [_XS], "list",
       ["Return the last $k elements of `$a` (the whole list when it is shorter).",
        "Given a list `$a`, keep only its final $k items.",
        "Take the $k elements at the end of `$a`. Shorter lists are returned whole."],
       ["return $a[-$k:]",
        "result = []\nfor i in range(max(0, len($a) - $k), len($a)):\n    result.append($a[i])\nreturn result"],
       lambda r, c: (_ints(r, -9, 9, (4, 7)),), (([],), ([1],)), [{"k": k} for k in (2, 3)]),
    _t("index_of", "lists", 1, "index_of position_of find_index",
       [("xs nums items", "list"), ("x target value", "int")], "int",
       ["Return the index of the first occurrence of `$b` in `$a`, or -1 if it is absent.",
        "Given a list `$a` and a value `$b`, find where `$b` first appears. Return -1 when it does not appear.",
        "Find the position of `$b` in the list `$a`, counting from 0. If `$b` is missing, return -1."],
       ["return $a.index($b) if $b in $a else -1",
        "for i, v in enumerate($a):\n    if v == $b:\n        return i\nreturn -1",
        "i = 0\nwhile i < len($a):\n    if $a[i] == $b:\n        return i\n    i += 1\nreturn -1"],
       lambda r, c: (xs := _ints(r, 0, 9), r.choice(xs) if r.random() < 0.7 else r.randint(0, 9)),
       (([], 5), ([4, 4], 4))),
)  # fmt: skip

#: Template name -> :class:`Template`.
SPECS: dict[str, Template] = {t.name: t for t in _TABLE}
#: The template names, in table order.
TEMPLATES: tuple[str, ...] = tuple(SPECS)
#: The categories, in table order.
CATEGORIES: tuple[str, ...] = tuple(dict.fromkeys(t.category for t in _TABLE))


# ---------------------------------------------------------------- instances


def _fill(text: str, params: Sequence[str], const: dict) -> str:
    return _Sub(text).substitute({**dict(zip("abc", params, strict=False)), **const})


_COMPILED: dict[tuple[str, str], Callable] = {}


def _function(params: Sequence[str], body: str) -> Callable:
    """The reference solution as a Python function (trusted generated code, compiled once)."""
    key = (",".join(params), body)
    if key not in _COMPILED:
        ns: dict = {"__builtins__": builtins}
        exec(compile(f"def f({', '.join(params)}):\n{body}", "<beginner>", "exec"), ns)  # noqa: S102
        _COMPILED[key] = ns["f"]
    return _COMPILED[key]


def _refused(inputs: list[tuple], outputs: list) -> bool:
    """Outputs all equal, all None, or each equal to its first argument: a trivial program would pass."""
    return (
        all(o == outputs[0] for o in outputs)
        or all(o is None for o in outputs)
        or all(type(o) is type(x[0]) and o == x[0] for x, o in zip(inputs, outputs, strict=True))
    )


def _telling(args: tuple, out) -> bool:
    """A useful example: the output is not the first argument unchanged, nor empty."""
    same = type(out) is type(args[0]) and out == args[0]
    return not same and not (isinstance(out, str | list | dict | tuple) and not out)


def _args(x: tuple) -> str:
    return ", ".join(repr(v) for v in x)


def _instance(t: Template, rng: random.Random, index: int) -> dict | None:
    """One record of template ``t``, or None when 20 draws of test inputs were all refused."""
    fname = rng.choice(t.names)
    params = [rng.choice(choices) for choices, _ in t.params]
    const = rng.choice(t.consts)
    doc = _fill(rng.choice(t.docs), params, const)
    body = "".join(f"    {ln}\n" for ln in _fill(rng.choice(t.shapes), params, const).split("\n"))
    annotate = rng.random() < 0.5
    if annotate:
        sig = ", ".join(f"{p}: {ann}" for p, (_, ann) in zip(params, t.params, strict=True))
        header = f"def {fname}({sig}) -> {t.ret}:"
    else:
        header = f"def {fname}({', '.join(params)}):"
    fn = _function(params, body)
    edges = t.edge_inputs(const)
    for _attempt in range(20):
        n_edges = min(len(edges), rng.randint(1, 2))
        n_random = rng.randint(3, 4) if n_edges == 0 else rng.randint(max(1, 3 - n_edges), 5 - n_edges)
        inputs: list[tuple] = []
        for _draw in range(10 * n_random):  # bounded: a narrow input domain may not have n_random values
            x = tuple(t.gen(rng, const))
            if x not in inputs:
                inputs.append(x)
            if len(inputs) == n_random:
                break
        inputs += [e for e in rng.sample(edges, n_edges) if e not in inputs]
        if len(inputs) < 3:
            continue
        try:
            outputs = [fn(*copy.deepcopy(x)) for x in inputs]
        except Exception:
            continue
        if _refused(inputs, outputs):
            continue
        best = next((i for i in range(n_random) if _telling(inputs[i], outputs[i])), 0)
        inputs.insert(0, inputs.pop(best))  # the docstring's example shows the function doing something
        outputs.insert(0, outputs.pop(best))
        example = f"    >>> {fname}({_args(inputs[0])})\n    {outputs[0]!r}\n"
        test = "def check(candidate):\n" + "".join(
            f"    assert candidate({_args(x)}) == {y!r}\n" for x, y in zip(inputs, outputs, strict=True)
        )
        return {
            "task_id": f"Beginner/{index}",
            "prompt": f'{header}\n    """{doc}\n{example}    """\n',
            "canonical_solution": body,
            "test": test,
            "entry_point": fname,
            "aux_spec": "",
            "composition": ["beginner", t.name],
            "difficulty": t.difficulty,
        }
    return None


def beginner_problems(num: int, seed: int, templates: Sequence[str] | None = None) -> list[dict]:
    """``num`` distinct beginner problems (distinct prompts), deterministic for a seed.

    Records cycle over ``templates`` (default: all of :data:`TEMPLATES`) in a seeded order; a template that
    cannot give a new distinct instance in 50 draws leaves the cycle.

    Raises:
        GeneratorError: ``num`` < 0, an unknown or empty template list, or fewer than ``num`` distinct
            problems could be made.
    """
    if not isinstance(num, int) or num < 0:
        raise GeneratorError(f"num: must be an integer >= 0, got {num!r}")
    names = list(TEMPLATES if templates is None else templates)
    bad = [n for n in names if n not in SPECS]
    if bad:
        raise GeneratorError(f"templates: unknown {bad}; allowed: {', '.join(TEMPLATES)}")
    names = list(dict.fromkeys(names))
    if not names and num:
        raise GeneratorError("templates: give at least one template")
    rng = random.Random(seed)
    rng.shuffle(names)
    out: list[dict] = []
    prompts: set[str] = set()
    live = list(names)
    turn = 0
    while len(out) < num:
        if not live:
            raise GeneratorError(
                f"num: only {len(out)} distinct problems from templates {names!r}, asked for {num}"
            )
        t = SPECS[live[turn % len(live)]]
        for _draw in range(50):
            rec = _instance(t, rng, len(out))
            if rec is not None and rec["prompt"] not in prompts:
                prompts.add(rec["prompt"])
                out.append(rec)
                turn += 1
                break
        else:
            live.remove(t.name)
    return out


def split_templates(seed: int, test_fraction: float = 0.25) -> tuple[list[str], list[str]]:
    """``(train, test)`` template names: a seeded split, stratified by category, so test problems come from
    templates never trained on. Each category with 2+ templates gives ``round(test_fraction * size)`` (at least
    1, at most size - 1) to test. Both lists are sorted.

    Raises:
        GeneratorError: ``test_fraction`` not strictly between 0 and 1.
    """
    if not 0 < test_fraction < 1:
        raise GeneratorError(f"test_fraction: must be strictly between 0 and 1, got {test_fraction!r}")
    rng = random.Random(seed)
    train: list[str] = []
    test: list[str] = []
    for cat in CATEGORIES:
        members = [t.name for t in _TABLE if t.category == cat]
        rng.shuffle(members)
        k = min(len(members) - 1, max(1, round(test_fraction * len(members)))) if len(members) > 1 else 0
        test += members[:k]
        train += members[k:]
    return sorted(train), sorted(test)


def delegated_targets(record: dict) -> tuple[str, str]:
    """The helper/main targets of a record under plain prompts: ``aux`` computes the whole answer (the canonical
    body under ``def aux(<same params>):``) and the entry point returns ``aux(<args>)``.

    Raises:
        ValueError: the prompt defines no function named ``entry_point``.
    """
    entry = record["entry_point"]
    tree = ast.parse(record["prompt"] + "    pass\n")
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry), None)
    if fn is None:
        raise ValueError(f"prompt defines no function {entry!r}")
    params = ast.unparse(fn.args)
    names = ", ".join(a.arg for a in fn.args.args)
    return (
        f"def aux({params}):\n{record['canonical_solution']}",
        f"def {entry}({params}):\n    return aux({names})\n",
    )
