"""The beginner problem generator (orchestry.generators.beginner).

Records are read back independently: the asserts are parsed and run against the canonical solution, against
trivial programs (``return None``, returning the first argument) and against every other reference shape of the
template; the ``>>>`` example is evaluated; the project's loader (``make_problem``) and sandbox accept them.
Generated code is trusted, so most checks ``exec`` it in-process.
"""

from __future__ import annotations

import ast
import builtins
import collections
import keyword
import re

import pytest

from orchestry.generators.beginner import (
    CATEGORIES,
    SPECS,
    TEMPLATES,
    GeneratorError,
    _fill,
    beginner_problems,
    delegated_targets,
    split_templates,
)
from orchestry.generators.beginner.template import Template
from orchestry.problems import Problem, check_canonical_solutions, make_problem

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def records() -> list[dict]:
    """200 records for each of three seeds."""
    return [r for s in SEEDS for r in beginner_problems(200, s)]


def run(code: str, entry: str):
    ns: dict = {}
    exec(code, ns)  # noqa: S102 - generated reference code
    return ns[entry]


def passes(program: str, record: dict) -> bool:
    """Whether ``program`` (defining the entry point) passes the record's whole ``check``."""
    ns: dict = {}
    try:
        exec(program, ns)  # noqa: S102
        exec(record["test"], ns)  # noqa: S102
        ns["check"](ns[record["entry_point"]])
    except Exception:
        return False
    return True


def asserted(record: dict) -> list[tuple[tuple, object]]:
    """``(args, expected)`` of each ``assert candidate(<args>) == <expected>``."""
    check = ast.parse(record["test"]).body[0]
    assert isinstance(check, ast.FunctionDef) and check.name == "check"
    out = []
    for stmt in check.body:
        assert isinstance(stmt, ast.Assert), ast.unparse(stmt)
        cmp = stmt.test
        assert isinstance(cmp, ast.Compare) and isinstance(cmp.ops[0], ast.Eq)
        call = cmp.left
        assert isinstance(call, ast.Call) and call.func.id == "candidate"
        out.append((tuple(ast.literal_eval(a) for a in call.args), ast.literal_eval(cmp.comparators[0])))
    return out


def signature(record: dict) -> ast.FunctionDef:
    return ast.parse(record["prompt"] + "    pass\n").body[0]


def params_of(record: dict) -> list[str]:
    return [a.arg for a in signature(record).args.args]


def shape_of(record: dict) -> tuple[int, dict]:
    """``(shape index, constant)`` of the template that reproduce the record's canonical solution."""
    t = SPECS[record["composition"][1]]
    ps = params_of(record)
    found = [
        (i, c)
        for i, shape in enumerate(t.shapes)
        for c in t.consts
        if "".join(f"    {ln}\n" for ln in _fill(shape, ps, c).split("\n")) == record["canonical_solution"]
    ]
    assert found, record
    return found[0]


def trivial(record: dict, body: str) -> str:
    return f"def {record['entry_point']}({', '.join(params_of(record))}):\n    {body}\n"


# ---------------------------------------------------------------- the table


def test_at_least_45_templates_over_every_category_with_12_two_argument_ones():
    assert len(TEMPLATES) >= 45
    per = collections.Counter(SPECS[n].category for n in TEMPLATES)
    assert set(per) == set(CATEGORIES) and len(CATEGORIES) == 9
    assert min(per.values()) >= 5, per
    assert sum(len(SPECS[n].params) == 2 for n in TEMPLATES) >= 12


def test_each_template_varies_names_arguments_phrasings_and_shapes():
    for t in SPECS.values():
        assert 2 <= len(t.names) <= 3, t.name
        assert all(2 <= len(choices) <= 3 for choices, _ in t.params), t.name
        assert len(t.docs) >= 3 and len(t.shapes) >= 2, t.name
        assert t.difficulty in (1, 2)
        openings = {d.split()[0] for d in t.docs}
        assert len(openings) >= 2, t.name
        for n in t.names:
            assert n.isidentifier() and not keyword.iskeyword(n) and not hasattr(builtins, n), n
        choices = [set(c) for c, _ in t.params]
        flat = [p for c in choices for p in c]
        assert len(flat) == len(set(flat)), t.name  # two parameters never get the same name
        assert not set(flat) & set(t.names), t.name


def test_no_shape_rebinds_a_parameter_name_as_a_local_of_its_own():
    """Loop variables and accumulators never shadow a parameter (whichever name choice is drawn)."""
    for t in SPECS.values():
        flat = {p for c, _ in t.params for p in c}
        for shape in t.shapes:
            for c in t.consts:
                code = _fill(shape, ["PARAM_A", "PARAM_B"][: len(t.params)], c)
                tree = ast.parse(
                    f"def f({', '.join(['PARAM_A', 'PARAM_B'][: len(t.params)])}):\n"
                    + "".join(f"    {ln}\n" for ln in code.split("\n"))
                )
                bound = {
                    n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                }
                bound |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.Lambda) for a in n.args.args}
                assert not bound & flat, (t.name, shape)


# ---------------------------------------------------------------- records


def test_record_fields_and_format(records):
    ids = set()
    for r in records:
        assert set(r) == {
            "task_id",
            "prompt",
            "canonical_solution",
            "test",
            "entry_point",
            "aux_spec",
            "composition",
            "difficulty",
        }
        assert re.fullmatch(r"Beginner/\d+", r["task_id"])
        ids.add(r["task_id"])
        assert r["aux_spec"] == "" and r["composition"][0] == "beginner" and r["composition"][1] in SPECS
        assert r["difficulty"] == SPECS[r["composition"][1]].difficulty
        assert r["prompt"].endswith('    """\n') and r["prompt"].count(">>>") == 1
        assert signature(r).name == r["entry_point"]
        assert 3 <= len(asserted(r)) <= 5
        assert r["canonical_solution"].endswith("\n") and r["canonical_solution"].startswith("    ")
    assert len(ids) == 200


def test_canonical_solutions_pass_and_trivial_programs_fail(records):
    for r in records:
        assert passes(r["prompt"] + r["canonical_solution"], r), r["task_id"]
        assert not passes(trivial(r, "return None"), r), r
        assert not passes(trivial(r, f"return {params_of(r)[0]}"), r), r
        outs = [y for _, y in asserted(r)]
        assert any(repr(o) != repr(outs[0]) for o in outs), r


def test_the_tests_include_edge_cases_and_distinct_inputs(records):
    with_edge = 0
    for r in records:
        args = [a for a, _ in asserted(r)]
        assert len({repr(a) for a in args}) == len(args)
        edges = {
            repr(e)
            for c in SPECS[r["composition"][1]].consts
            for e in SPECS[r["composition"][1]].edge_inputs(c)
        }
        with_edge += any(repr(a) in edges for a in args)
    assert with_edge == len(records)


def test_every_reference_shape_computes_the_asserted_values(records):
    """Expected values, recomputed by each of the template's other shapes: two independent renderings agree."""
    for r in records:
        t = SPECS[r["composition"][1]]
        ps = params_of(r)
        _, const = shape_of(r)
        for shape in t.shapes:
            body = "".join(f"    {ln}\n" for ln in _fill(shape, ps, const).split("\n"))
            fn = run(f"def f({', '.join(ps)}):\n{body}", "f")
            for args, expected in asserted(r):
                got = fn(*args)
                assert got == expected and type(got) is type(expected), (t.name, shape, args)


def test_the_docstring_example_agrees_with_the_solution_and_is_the_first_assert(records):
    telling = 0
    for r in records:
        lines = r["prompt"].split("\n")
        at = next(i for i, ln in enumerate(lines) if ln.strip().startswith(">>>"))
        call = lines[at].strip()[len(">>> ") :]
        shown = ast.literal_eval(lines[at + 1].strip())
        fn = run(r["prompt"] + r["canonical_solution"], r["entry_point"])
        assert eval(call, {r["entry_point"]: fn}) == shown  # noqa: S307 - generated example
        node = ast.parse(call, mode="eval").body
        first_args, first_out = asserted(r)[0]
        assert tuple(ast.literal_eval(a) for a in node.args) == first_args and shown == first_out
        telling += shown != first_args[0] and shown not in ("", [], {})
    assert telling >= 0.9 * len(records)  # the example shows the function doing something


def test_no_solution_is_in_the_compositional_chain_form(records):
    for r in records:
        body = ast.parse(r["prompt"] + r["canonical_solution"]).body[0].body[1:]
        last = body[-1]
        chain = (
            len(body) >= 2
            and isinstance(last, ast.Return)
            and isinstance(last.value, ast.Name)
            and all(
                isinstance(s, ast.Assign)
                and len(s.targets) == 1
                and isinstance(s.targets[0], ast.Name)
                and s.targets[0].id == last.value.id
                for s in body[:-1]
            )
        )
        assert not chain, r["canonical_solution"]
    for t in SPECS.values():
        assert not any(s.startswith("r = ") for s in t.shapes), t.name


def test_phrasings_annotations_and_shapes_vary_over_seeds():
    many = [r for s in range(4) for r in beginner_problems(3 * len(TEMPLATES), s)]
    shapes: dict[str, set] = collections.defaultdict(set)
    names: dict[str, set] = collections.defaultdict(set)
    for r in many:
        shapes[r["composition"][1]].add(shape_of(r)[0])
        names[r["composition"][1]].add(r["entry_point"])
    assert set(shapes) == set(TEMPLATES)
    assert all(len(s) >= 2 for s in shapes.values()), {k: v for k, v in shapes.items() if len(v) < 2}
    assert sum(len(v) >= 2 for v in names.values()) >= len(TEMPLATES) - 3
    annotated = sum(signature(r).returns is not None for r in many)
    assert 0.3 < annotated / len(many) < 0.7
    openings = collections.Counter(r["prompt"].split('"""')[1].split()[0] for r in many)
    assert {"Return", "Given", "Check"} <= set(openings)


def test_same_seed_same_records_another_seed_others():
    a = beginner_problems(80, 3)
    assert a == beginner_problems(80, 3)
    b = beginner_problems(80, 4)
    assert [r["prompt"] for r in a] != [r["prompt"] for r in b]
    assert len({r["prompt"] for r in a}) == 80


def test_records_cycle_over_the_chosen_templates():
    some = ["digit_sum", "larger", "word_counts"]
    rs = beginner_problems(9, 0, some)
    assert collections.Counter(r["composition"][1] for r in rs) == dict.fromkeys(some, 3)
    every = beginner_problems(len(TEMPLATES), 5)
    assert {r["composition"][1] for r in every} == set(TEMPLATES)
    assert beginner_problems(0, 0) == []


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"num": -1}, "num"),
        ({"num": 3, "templates": ["nope"]}, "templates"),
        ({"num": 2, "templates": []}, "templates"),
    ],
)
def test_bad_arguments_raise_a_value_error_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        beginner_problems(seed=0, **kwargs)


def test_too_few_distinct_problems_raise(monkeypatch):
    """A template with one name, one argument name, one phrasing and one input has two prompts (annotated or
    not): a third cannot be made."""
    tiny = Template(
        "tiny",
        "digits",
        1,
        ("tiny_fn",),
        ((("n",), "int"),),
        "int",
        ("Return `$a` plus 1.",),
        ("return $a + 1",),
        lambda r, c: (4,),
        ((0,), (9,)),
    )
    monkeypatch.setitem(SPECS, "tiny", tiny)
    assert len(beginner_problems(2, 0, ["tiny"])) == 2
    with pytest.raises(GeneratorError, match="only 2 distinct problems"):
        beginner_problems(3, 0, ["tiny"])


# ---------------------------------------------------------------- template split


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_split_templates_is_disjoint_covering_and_stratified(seed):
    train, test = split_templates(seed)
    assert not set(train) & set(test) and set(train) | set(test) == set(TEMPLATES)
    assert split_templates(seed) == (train, test)
    assert 0.15 < len(test) / len(TEMPLATES) < 0.35
    for cat in CATEGORIES:
        assert any(SPECS[n].category == cat for n in test) and any(SPECS[n].category == cat for n in train)
    rs = beginner_problems(40, seed, test)
    assert {r["composition"][1] for r in rs} <= set(test)


def test_split_templates_depends_on_the_seed_and_checks_the_fraction():
    assert len({tuple(split_templates(s)[1]) for s in range(5)}) > 1
    with pytest.raises(ValueError, match="test_fraction"):
        split_templates(0, 1.0)


# ---------------------------------------------------------------- helper/main targets and the loader


def test_delegated_targets_compile_and_pass_together(records):
    for r in records[::3]:
        aux, main = delegated_targets(r)
        assert aux.startswith("def aux(") and main.startswith(f"def {r['entry_point']}(")
        assert "```" not in aux + main
        compile(aux, "aux", "exec"), compile(main, "main", "exec")
        assert main.rstrip().endswith(f"return aux({', '.join(params_of(r))})")
        assert passes(aux + "\n" + main, r), (aux, main)
        assert not passes(trivial(r, "return None").replace(r["entry_point"], "aux", 1) + main, r)


def test_the_project_loader_accepts_the_records_with_plain_prompts(records):
    for r in records[:100]:
        p = make_problem(r, r["task_id"])
        assert isinstance(p, Problem) and len(p.asserts) == len(asserted(r)) and p.aux_spec == ""
        assert "Write a helper function named `aux`" in p.helper_prompt()
        assert r["prompt"] in p.main_prompt() and "calling `aux` where useful" in p.main_prompt()
        assert Problem.from_dict(p.to_dict()) == p


def test_canonical_solutions_pass_in_the_sandbox():
    from orchestry.sandbox import Sandbox

    problems = [make_problem(r, r["task_id"]) for r in beginner_problems(len(TEMPLATES), 11)]
    with Sandbox(timeout_s=3.0) as sb:
        checked, failed = check_canonical_solutions(problems, sb, progress=False)
    assert (checked, failed) == (len(TEMPLATES), [])
