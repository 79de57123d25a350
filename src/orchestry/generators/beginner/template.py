"""A beginner problem's template (:class:`Template`), how the tables write one (:func:`_t`), the random inputs
their generators draw and the parameter shorthands they share (:mod:`orchestry.generators.beginner`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

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


# ---------------------------------------------------------------- parameters the templates share

_N = ("n num number", "int")
_X = ("n x value", "int")
_XS = ("xs nums values", "list")
_S = ("s text word", "str")
_SENT = ("s text sentence", "str")
_WS = ("words items strings", "list")
_D = ("d mapping table", "dict")
