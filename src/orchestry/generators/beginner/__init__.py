"""Procedurally generated beginner Python problems in HumanEval format: a wider training distribution.

The compositional generator (:mod:`orchestry.generators.compositional`) makes chains of list and string
primitives, all written ``r = ...; r = ...; return r`` with one phrasing. Problems written by people look
different: integer arguments, predicates, two arguments, dictionaries, loops with accumulators, each phrased in
its own words. This generator covers what a first Python course asks in its first weeks, each problem solvable
in one to four lines. Every *template* (:data:`TEMPLATES`, one table row each,
:class:`~orchestry.generators.beginner.template.Template`) varies per instance:

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

The table is written in :mod:`orchestry.generators.beginner.templates_arithmetic` (digit arithmetic, predicates,
two-argument functions, conditionals) and :mod:`orchestry.generators.beginner.templates_collections` (loops,
dictionaries, strings, filtering, lists), with the helpers of :mod:`orchestry.generators.beginner.template`; this
module makes the instances.
"""

from __future__ import annotations

import ast
import builtins
import copy
import random
from collections.abc import Callable, Sequence
from string import Template as _Sub

from orchestry.generators.beginner.template import Template
from orchestry.generators.beginner.templates_arithmetic import ARITHMETIC_TEMPLATES
from orchestry.generators.beginner.templates_collections import COLLECTION_TEMPLATES
from orchestry.generators.compositional import GeneratorError

_TABLE: tuple[Template, ...] = (*ARITHMETIC_TEMPLATES, *COLLECTION_TEMPLATES)

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
