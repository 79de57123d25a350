"""Procedurally generated compositional coding problems, made for the helper/main split.

A problem is a chain of typed *primitives* (list, string and integer operations: filter, map, aggregate,
count, transform, predicate) applied one after another to the input. Its natural solution is a ``main``
function that calls a helper for the first primitive and applies the rest to the helper's result, so every
record names its intended decomposition (``aux_spec``: what ``aux`` computes). The design follows the
procedural task generators used for small-model RL (a difficulty knob, seeded, reference answers computed by
running a reference solution; reasoning-gym, TinyZero's countdown) and the MAGRPO authors' CoopHumanEval
(problems whose solution splits into a helper and a main function).
Two compositions that compute the same function (their outputs agree on fixed probe inputs, e.g. reversing
then filtering vs filtering then reversing) are one problem: only the first one drawn is kept.

The records are in HumanEval format (``task_id``, ``prompt``, ``canonical_solution``, ``test``,
``entry_point``) plus ``aux_spec``, ``composition`` and ``difficulty``; ``prepare`` reads them like any
HumanEval file and runs every canonical solution in the sandbox.

Difficulty = the number of composed primitives (1 to 4). Each problem's test holds 3 to 5 asserts whose
expected values come from the reference solution (each primitive's Python function, the same code the
canonical solution states). A problem is refused when its outputs on the test inputs are all equal, or when
leaving out any one primitive gives the same outputs (a redundant step, e.g. sorting before a sum). Test and
training problems never share a composition (the tuple of primitive names): see :func:`generate_splits`.
Documented in docs/problems.md.
"""

from __future__ import annotations

import builtins
import functools
import itertools
import keyword
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: Value types of the chain: a list of integers, an integer, a string, a list of words, a boolean.
TYPES = ("ints", "int", "str", "words", "bool")
#: Types a problem's input can have, and the parameter name and annotation the signature gives it.
INPUT_TYPES = {"ints": ("xs", "list"), "str": ("s", "str")}
_ANNOTATION = {"ints": "list", "int": "int", "str": "str", "words": "list", "bool": "bool"}
_NOUN = {"ints": "list of integers", "str": "string"}
MAX_DIFFICULTY = 4

_WORDS = [
    "apple",
    "sun",
    "tree",
    "river",
    "stone",
    "cat",
    "dog",
    "moon",
    "bird",
    "fish",
    "red",
    "blue",
    "green",
    "code",
    "data",
    "book",
    "lamp",
    "road",
    "rain",
    "snow",
    "star",
    "hill",
    "lake",
    "wind",
    "fire",
    "door",
    "map",
    "cup",
    "box",
    "pen",
    "king",
    "queen",
]


class GeneratorError(ValueError):
    """Bad generator parameters; the message names the key and the allowed values."""


@dataclass(frozen=True)
class Primitive:
    """One typed operation of a chain.

    Attributes:
        name: identifier (``composition`` lists these).
        source, target: value types (:data:`TYPES`) it reads and returns.
        phrase: the docstring's plain-English step, ``{k}`` replaced by the constant.
        slug: the word the entry point's name takes from it.
        code: one statement of the reference solution, reading and rebinding ``r``.
        fn: the same operation in Python, ``fn(value, k)``.
        ks: the constants it draws from (``(None,)`` when it takes none).
    """

    name: str
    source: str
    target: str
    phrase: str
    slug: str
    code: str
    fn: Callable
    ks: tuple = (None,)

    def describe(self, k) -> str:
        return self.phrase.format(k=k)

    def statement(self, k) -> str:
        return self.code.format(k=k)


def _vowels(s: str) -> int:
    return sum(1 for c in s.lower() if c in "aeiou")


PRIMITIVES: tuple[Primitive, ...] = (
    # list of integers -> list of integers (filter, map, reorder)
    Primitive("keep_even", "ints", "ints", "keep only the even numbers", "evens",
              "r = [x for x in r if x % 2 == 0]", lambda r, k: [x for x in r if x % 2 == 0]),
    Primitive("keep_odd", "ints", "ints", "keep only the odd numbers", "odds",
              "r = [x for x in r if x % 2 != 0]", lambda r, k: [x for x in r if x % 2 != 0]),
    Primitive("keep_positive", "ints", "ints", "keep only the numbers greater than 0", "positives",
              "r = [x for x in r if x > 0]", lambda r, k: [x for x in r if x > 0]),
    Primitive("keep_above", "ints", "ints", "keep only the numbers greater than {k}", "above",
              "r = [x for x in r if x > {k}]", lambda r, k: [x for x in r if x > k], (1, 2, 3, 4)),
    Primitive("double", "ints", "ints", "multiply every number by 2", "doubled",
              "r = [x * 2 for x in r]", lambda r, k: [x * 2 for x in r]),
    Primitive("square", "ints", "ints", "square every number", "squared",
              "r = [x * x for x in r]", lambda r, k: [x * x for x in r]),
    Primitive("add", "ints", "ints", "add {k} to every number", "shifted",
              "r = [x + {k} for x in r]", lambda r, k: [x + k for x in r], (1, 2, 3, 5, 10)),
    Primitive("absolute", "ints", "ints", "replace every number by its absolute value", "absolute",
              "r = [abs(x) for x in r]", lambda r, k: [abs(x) for x in r]),
    Primitive("sort", "ints", "ints", "sort the numbers from smallest to largest", "sorted",
              "r = sorted(r)", lambda r, k: sorted(r)),
    Primitive("reverse", "ints", "ints", "reverse the order of the numbers", "reversed",
              "r = r[::-1]", lambda r, k: r[::-1]),
    # list of integers -> integer (aggregate, count)
    Primitive("sum", "ints", "int", "add the numbers up", "sum",
              "r = sum(r)", lambda r, k: sum(r)),
    Primitive("count", "ints", "int", "count how many numbers there are", "count",
              "r = len(r)", lambda r, k: len(r)),
    Primitive("max", "ints", "int", "take the largest number (0 if there are none)", "max",
              "r = max(r) if r else 0", lambda r, k: max(r) if r else 0),
    Primitive("min", "ints", "int", "take the smallest number (0 if there are none)", "min",
              "r = min(r) if r else 0", lambda r, k: min(r) if r else 0),
    # integer -> integer / boolean (transform, predicate)
    Primitive("times", "int", "int", "multiply the result by {k}", "times",
              "r = r * {k}", lambda r, k: r * k, (2, 3, 10)),
    Primitive("is_even", "int", "bool", "return True if the result is even, otherwise False", "is_even",
              "r = r % 2 == 0", lambda r, k: r % 2 == 0),
    # string -> string / integer / words
    Primitive("lower", "str", "str", "convert it to lowercase", "lower",
              "r = r.lower()", lambda r, k: r.lower()),
    Primitive("upper", "str", "str", "convert it to uppercase", "upper",
              "r = r.upper()", lambda r, k: r.upper()),
    Primitive("reverse_text", "str", "str", "reverse it", "reversed",
              "r = r[::-1]", lambda r, k: r[::-1]),
    Primitive("drop_vowels", "str", "str", "remove every vowel (a, e, i, o, u in either case)", "no_vowels",
              "r = ''.join(c for c in r if c.lower() not in 'aeiou')",
              lambda r, k: "".join(c for c in r if c.lower() not in "aeiou")),
    Primitive("drop_spaces", "str", "str", "remove every space", "no_spaces",
              "r = r.replace(' ', '')", lambda r, k: r.replace(" ", "")),
    Primitive("count_vowels", "str", "int", "count its vowels (a, e, i, o, u in either case)", "vowels",
              "r = sum(1 for c in r.lower() if c in 'aeiou')", lambda r, k: _vowels(r)),
    Primitive("length", "str", "int", "take its length", "length",
              "r = len(r)", lambda r, k: len(r)),
    Primitive("count_upper", "str", "int", "count its uppercase letters", "uppercase",
              "r = sum(1 for c in r if c.isupper())", lambda r, k: sum(1 for c in r if c.isupper())),
    Primitive("split", "str", "words", "split it into words at the spaces", "words",
              "r = r.split()", lambda r, k: r.split()),
    # list of words -> words / string / integers / integer
    Primitive("keep_long", "words", "words", "keep only the words longer than {k} letters", "long",
              "r = [w for w in r if len(w) > {k}]", lambda r, k: [w for w in r if len(w) > k], (2, 3, 4)),
    Primitive("capitalize", "words", "words", "capitalize every word (first letter upper, rest lower)",
              "capitalized", "r = [w.capitalize() for w in r]", lambda r, k: [w.capitalize() for w in r]),
    Primitive("sort_words", "words", "words", "sort the words alphabetically", "sorted",
              "r = sorted(r)", lambda r, k: sorted(r)),
    Primitive("reverse_words", "words", "words", "reverse the order of the words", "reversed",
              "r = r[::-1]", lambda r, k: r[::-1]),
    Primitive("lengths", "words", "ints", "replace every word by its length", "lengths",
              "r = [len(w) for w in r]", lambda r, k: [len(w) for w in r]),
    Primitive("join", "words", "str", "join the words with single spaces", "joined",
              "r = ' '.join(r)", lambda r, k: " ".join(r)),
    Primitive("join_dash", "words", "str", "join the words with '-'", "dashed",
              "r = '-'.join(r)", lambda r, k: "-".join(r)),
    Primitive("count_words", "words", "int", "count the words", "word_count",
              "r = len(r)", lambda r, k: len(r)),
)  # fmt: skip
_BY_NAME = {p.name: p for p in PRIMITIVES}


def chains(depth: int, start_types: Sequence[str]) -> list[tuple[str, ...]]:
    """Every chain of ``depth`` primitives whose types connect, starting from one of ``start_types``,
    without the same primitive twice in a row. Sorted (the seed's shuffle then fixes the order)."""
    out: list[tuple[str, ...]] = []

    def walk(chain: tuple[str, ...], typ: str) -> None:
        if len(chain) == depth:
            out.append(chain)
            return
        for p in PRIMITIVES:
            if p.source == typ and (not chain or chain[-1] != p.name):
                walk((*chain, p.name), p.target)

    for t in start_types:
        walk((), t)
    return sorted(out)


def _random_input(typ: str, rng: random.Random):
    if typ == "ints":
        return [rng.randint(-9, 9) for _ in range(rng.randint(3, 7))]
    words = []
    for _ in range(rng.randint(2, 5)):
        w = rng.choice(_WORDS)
        words.append(w.capitalize() if rng.random() < 0.3 else (w.upper() if rng.random() < 0.1 else w))
    return " ".join(words)


def _run(steps: Sequence[tuple[Primitive, object]], value):
    for p, k in steps:
        value = p.fn(value, k)
    return value


@dataclass(frozen=True)
class Generated:
    """One generated problem: the HumanEval-format record and its composition key."""

    record: dict
    composition: tuple[str, ...]


def _record(index: int, steps: list[tuple[Primitive, object]], inputs: list, prefix: str) -> dict:
    first = steps[0][0]
    arg, ann = INPUT_TYPES[first.source]
    ret = _ANNOTATION[steps[-1][0].target]
    name = "_".join(p.slug for p, _ in reversed(steps))
    if len(steps) == 1 or hasattr(builtins, name) or keyword.iskeyword(name):
        name = f"{name}_of_{arg}"  # never a builtin's name (``sum``, ``sorted``): the tests would call it
    outputs = [_run(steps, x) for x in inputs]
    sentence = ", then ".join(p.describe(k) for p, k in steps)
    examples = "".join(
        f"    >>> {name}({x!r})\n    {y!r}\n" for x, y in zip(inputs[:1], outputs[:1], strict=True)
    )
    doc = f"Given a {_NOUN[first.source]} `{arg}`, {sentence}. Return the result.\n{examples}"
    prompt = f'def {name}({arg}: {ann}) -> {ret}:\n    """{doc}    """\n'
    body = f"    r = {arg}\n" + "".join(f"    {p.statement(k)}\n" for p, k in steps) + "    return r\n"
    test = "def check(candidate):\n" + "".join(
        f"    assert candidate({x!r}) == {y!r}\n" for x, y in zip(inputs, outputs, strict=True)
    )
    aux_ret = _ANNOTATION[first.target]
    aux_spec = (
        f'def aux({arg}: {ann}) -> {aux_ret}:\n    """Given a {_NOUN[first.source]} `{arg}`, '
        f'{first.describe(steps[0][1])}. Return the result."""\n'
    )
    return {
        "task_id": f"{prefix}/{index}",
        "prompt": prompt,
        "canonical_solution": body,
        "test": test,
        "entry_point": name,
        "aux_spec": aux_spec,
        "composition": [p.name for p, _ in steps],
        "difficulty": len(steps),
    }


def _valid(steps, inputs) -> bool:
    """Outputs not all equal, and no steps redundant: leaving out any of them (one step, or several that cancel,
    such as ``reverse ... reverse`` or ``split ... join``) changes some output."""
    try:
        outs = [_run(steps, x) for x in inputs]
    except Exception:
        return False
    if all(o == outs[0] for o in outs):
        return False
    for size in range(1, len(steps)):
        for keep in itertools.combinations(range(len(steps)), size):
            rest = [steps[i] for i in keep]
            if rest[0][0].source != steps[0][0].source or not _connects(rest):
                continue
            try:
                if [_run(rest, x) for x in inputs] == outs:
                    return False
            except Exception:
                continue
    return True


def _signature(steps) -> tuple:
    """The outputs on fixed probe inputs: two problems with equal signatures compute the same function
    (e.g. ``reverse, keep_positive`` and ``keep_positive, reverse``), so only the first is kept."""
    source = steps[0][0].source
    return (source, tuple(repr(_run(steps, x)) for x in _probes(source)))


@functools.cache
def _probes(source: str) -> tuple:
    """The 24 fixed probe inputs of :func:`_signature` for an input type (drawn once)."""
    rng = random.Random(12345)
    return tuple(_random_input(source, rng) for _ in range(24))


def _connects(steps) -> bool:
    return all(a[0].target == b[0].source for a, b in itertools.pairwise(steps))


def generate(
    count: int,
    difficulty: int | Sequence[int] = 2,
    seed: int = 0,
    types: Sequence[str] = ("ints", "str"),
    num_tests: int = 4,
    prefix: str = "Compositional",
    allow_fewer: bool = False,
    taken: set | None = None,
) -> list[Generated]:
    """``count`` distinct problems (one per composition), deterministic for a seed.

    Args:
        count: number of problems (at most the number of valid compositions at this difficulty).
        difficulty: primitives per problem (1-4), or a list of them (problems cycle through it).
        seed: seeds the order of compositions, the constants and the test inputs.
        types: the input types problems start from (``ints``, ``str``).
        num_tests: asserts per problem (3-5).
        prefix: task ids are ``<prefix>/<index>``.
        allow_fewer: return every valid composition when there are fewer than ``count`` (no error).
        taken: behaviour signatures already used (e.g. by another difficulty): problems computing one of these
            functions are skipped; the new problems' signatures are added to it.

    Returns:
        :class:`Generated` problems in a seeded order.

    Raises:
        GeneratorError: a parameter is out of range, or fewer than ``count`` valid compositions exist.
    """
    depths = [difficulty] if isinstance(difficulty, int) else list(difficulty)
    if not depths or any(not isinstance(d, int) or not 1 <= d <= MAX_DIFFICULTY for d in depths):
        raise GeneratorError(
            f"difficulty: each value must be an integer 1-{MAX_DIFFICULTY}, got {difficulty!r}"
        )
    bad = [t for t in types if t not in INPUT_TYPES]
    if bad or not types:
        raise GeneratorError(f"types: allowed {', '.join(INPUT_TYPES)}, got {list(types)!r}")
    if not 3 <= num_tests <= 5:
        raise GeneratorError(f"num_tests: must be 3-5, got {num_tests}")
    if count < 1:
        raise GeneratorError(f"count: must be >= 1, got {count}")
    rng = random.Random(seed)
    pools = {}
    for d in sorted(set(depths)):
        pool = chains(d, types)
        rng.shuffle(pool)
        pools[d] = pool
    out: list[Generated] = []
    seen: set[tuple[str, ...]] = set()
    behaviours: set[tuple] = taken if taken is not None else set()
    cursor = dict.fromkeys(pools, 0)
    turn = 0
    while len(out) < count:
        live = [d for d in depths if cursor[d] < len(pools[d])]
        if not live:
            if allow_fewer:
                break
            have = len(out)
            raise GeneratorError(
                f"count: only {have} valid compositions at difficulty {difficulty!r} with types "
                f"{list(types)!r}, asked for {count}"
            )
        d = live[turn % len(live)]
        turn += 1
        chain = pools[d][cursor[d]]
        cursor[d] += 1
        if chain in seen:
            continue
        for _attempt in range(8):
            steps = [(_BY_NAME[n], rng.choice(_BY_NAME[n].ks)) for n in chain]
            inputs: list = []
            while len(inputs) < num_tests:
                x = _random_input(_BY_NAME[chain[0]].source, rng)
                if x not in inputs:
                    inputs.append(x)
            if _valid(steps, inputs):
                sig = _signature(steps)
                if sig in behaviours:
                    break  # the same function as a problem already taken
                behaviours.add(sig)
                seen.add(chain)
                out.append(Generated(_record(len(out), steps, inputs, prefix), chain))
                break
    return out


SPLITS = ("test", "val", "train")


def generate_splits(
    sizes: dict[str, int],
    difficulty: int | Sequence[int] = 2,
    seed: int = 0,
    types: Sequence[str] = ("ints", "str"),
    num_tests: int = 4,
) -> dict[str, list[dict]]:
    """Problems for each split, e.g. ``{"test": 32, "val": 8, "train": 48}``.

    Each difficulty has its own seeded pool of distinct compositions (:func:`generate`), cut in order (test,
    then val, then train), so no composition (tuple of primitive names) of one split occurs in another: the
    test split measures generalisation to new combinations of known primitives, not memory. With several
    difficulties every split holds each of them: an easier difficulty, whose pool is small (difficulty 1 has
    one composition per primitive), takes at most its share of the pool in each split (split size / total
    size) and at most an even share of the split; the hardest difficulty fills the rest. Task ids name the
    split (``Compositional/test/3``); records are ordered by difficulty within a split.

    Raises:
        GeneratorError: bad parameters, or too few compositions for the sizes asked.
    """
    depths = sorted({difficulty} if isinstance(difficulty, int) else set(difficulty))
    bad = [k for k in sizes if k not in SPLITS]
    if bad:
        raise GeneratorError(f"split names: allowed {', '.join(SPLITS)}, got {bad}")
    for name, n in sizes.items():
        if not isinstance(n, int) or n < 0:
            raise GeneratorError(f"{name}: size must be an integer >= 0, got {n!r}")
    total = sum(sizes.values())
    if total < 1:
        raise GeneratorError("sizes: at least one problem is needed")
    if not depths:
        raise GeneratorError("difficulty: give at least one value")
    counts: dict[int, dict[str, int]] = {}
    left = dict(sizes)
    for d in depths[:-1]:
        pool = len(generate(10**6, d, seed, types, num_tests, allow_fewer=True))
        counts[d] = {}
        for name in SPLITS:
            n = sizes.get(name, 0)
            take = min(n // len(depths), pool * n // total)
            counts[d][name] = take
            left[name] = left.get(name, 0) - take
    counts[depths[-1]] = {name: left.get(name, 0) for name in SPLITS}
    out: dict[str, list[dict]] = {name: [] for name in SPLITS}
    taken: set[tuple] = set()  # one function never appears twice, whatever the difficulties
    for d in depths:
        need = sum(counts[d].values())
        if need == 0:
            continue
        pool_d = generate(need, d, seed, types, num_tests, taken=taken)
        at = 0
        for name in SPLITS:
            for g in pool_d[at : at + counts[d][name]]:
                out[name].append(dict(g.record))
            at += counts[d][name]
    for name in SPLITS:
        for i, r in enumerate(out[name]):
            r["task_id"] = f"Compositional/{name}/{i}"
    return {name: out[name] for name in SPLITS if name in sizes}


def delegated_decomposition(prompt: str, aux_spec: str, canonical_solution: str) -> tuple[str, str]:
    """The helper/main split of a generated problem for prompts that name no decomposition: ``aux`` does it all.

    Under a plain prompt (no ``aux`` signature shown: HumanEval, MBPP, ``--problems`` files) neither agent can know
    where :func:`reference_decomposition` would cut, so a pair trained on that cut learns to guess it: on easy
    one-step problems written by others the main re-applied the last operation to ``aux``'s answer
    (``largest``: ``r = aux(values); r = max(r)``, a ``TypeError``). The split both agents can infer from a plain
    prompt alone is the helper computing the whole answer and the main returning it::

        def aux(xs: list) -> list:            def doubled_evens(xs: list) -> list:
            r = xs                                r = aux(xs)
            r = [x for x in r if x % 2 == 0]      return r
            r = [x * 2 for x in r]
            return r

    Returns and raises as :func:`reference_decomposition` (the same record checks).
    """
    arg, steps, _, main_sig = _solution_parts(prompt, aux_spec, canonical_solution)
    aux_code = (
        "def aux(" + main_sig.split("(", 1)[1] + f"\n    r = {arg}\n" + "".join(f"{ln}\n" for ln in steps)
    )
    return aux_code + "    return r\n", f"{main_sig}\n    r = aux({arg})\n    return r\n"


def _solution_parts(prompt: str, aux_spec: str, canonical_solution: str) -> tuple[str, list[str], str, str]:
    """``(argument, step lines, aux signature, main signature)`` of a generated record's ``r = <arg>`` / one
    statement per primitive / ``return r`` solution. Raises ValueError for any other record."""
    lines = canonical_solution.rstrip("\n").split("\n")
    if not aux_spec or len(lines) < 3 or not lines[0].startswith("    r = ") or lines[-1] != "    return r":
        raise ValueError("not a generated compositional problem (aux_spec and its r = ... solution shape)")
    aux_sig = aux_spec.split("\n", 1)[0]
    main_sig = next((ln for ln in prompt.split("\n") if ln.startswith("def ")), "")
    if not aux_sig.startswith("def aux(") or not main_sig:
        raise ValueError("not a generated compositional problem (no def line in prompt or aux_spec)")
    return lines[0][len("    r = ") :], lines[1:-1], aux_sig, main_sig


def reference_decomposition(prompt: str, aux_spec: str, canonical_solution: str) -> tuple[str, str]:
    """The intended helper/main split of a generated problem, as two Python functions.

    The canonical solution is ``r = <arg>``, one statement per primitive, ``return r`` (:func:`_record`); the
    helper's ``aux`` runs the first primitive and the main function calls ``aux`` and runs the rest::

        def aux(xs: list) -> list:            def doubled_evens(xs: list) -> list:
            r = xs                                r = aux(xs)
            r = [x for x in r if x % 2 == 0]      r = [x * 2 for x in r]
            return r                              return r

    Args:
        prompt, aux_spec, canonical_solution: the record's fields.

    Returns:
        ``(aux_code, main_code)``, each a complete ``def`` without docstring, ending in a newline.

    Raises:
        ValueError: the record was not made by this generator (no ``aux_spec``, or another solution shape).
    """
    arg, steps, aux_sig, main_sig = _solution_parts(prompt, aux_spec, canonical_solution)
    aux_code = f"{aux_sig}\n    r = {arg}\n{steps[0]}\n    return r\n"
    main_code = (
        f"{main_sig}\n    r = aux({arg})\n" + "".join(f"{ln}\n" for ln in steps[1:]) + "    return r\n"
    )
    return aux_code, main_code
