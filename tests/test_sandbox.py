"""Semantics of orchestry.sandbox: verdicts, load failures, independence, order, batching, determinism, HumanEval."""

from __future__ import annotations

import logging
import shutil

import pytest

from orchestry.problems import load_problems
from orchestry.sandbox import AssertOutcome, ExecutionResult, Job, Sandbox, SandboxError, isolation, worker

ADD = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def sb():
    with Sandbox(timeout_s=1.0, max_workers=2) as s:
        yield s


@pytest.fixture(scope="module")
def sb_all():
    """A sandbox that runs every assert, also after timeouts."""
    with Sandbox(timeout_s=1.0, max_workers=1, max_timeouts=None) as s:
        yield s


@pytest.fixture(scope="module")
def problems():
    return load_problems()


def reasons(res: ExecutionResult) -> list[str]:
    return [o.reason for o in res.outcomes]


def test_pass_and_fail_in_order(sb):
    res = sb.run(Job(ADD, ("assert add(1, 2) == 3", "assert add(1, 2) == 4", "assert add(2, 2) == 4")))
    assert [o.passed for o in res.outcomes] == [True, False, True]
    assert reasons(res) == ["", "AssertionError", ""]
    assert (res.passed, res.total, res.error) == (2, 3, "")
    assert res.seconds > 0


def test_setup_runs_before_each_assert_in_fresh_namespace(sb):
    setup = "candidate = add\nseen = []"
    asserts = (
        "seen.append(1)\nassert seen == [1]",
        "seen.append(2)\nassert seen == [2]",
        "assert candidate(2, 3) == 5",
    )
    res = sb.run(Job(ADD, asserts, setup))
    assert res.passed == 3, reasons(res)


def test_assert_message_and_program_exception_reasons(sb):
    prog = ADD + "def boom(x):\n    raise ValueError('bad input ' + str(x))\n"
    res = sb.run(
        Job(prog, ("assert add(1, 1) == 3, 'sum is wrong'", "assert boom(7) == 1", "assert missing(1)"))
    )
    assert reasons(res) == [
        "AssertionError: sum is wrong",
        "ValueError: bad input 7",
        "NameError: name 'missing' is not defined",
    ]


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        ("def add(a, b) return a", "program failed to load: SyntaxError: expected ':' (line 1)"),
        ("x = 1 / 0\n" + ADD, "program failed to load: ZeroDivisionError: division by zero"),
        ("import no_such_module_xyz\n" + ADD, "program failed to load: ModuleNotFoundError: No module named"),
        ("while True:\n    pass\n", "program failed to load: timeout after 1.0s"),
        ("import os\nos._exit(3)\n", "program failed to load: program exited (code 3) instead of returning"),
        ("import sys\nsys.exit(0)\n", "program failed to load: SystemExit: 0"),
        (
            "x = 1\0\n" + ADD,
            "program failed to load: SyntaxError: source code string cannot contain null bytes",
        ),
        # annotations are evaluated as in plain Python (no future import leaks from the sandbox's own code)
        (
            "def f(x: Undefined) -> int:\n    return x\n" + ADD,
            "program failed to load: NameError: name 'Undefined'",
        ),
        # programs over 1 MiB are compiled by the program process itself (same verdicts)
        (
            "s = '" + "a" * (1 << 20) + "'\ndef add(a, b) return a",
            "program failed to load: SyntaxError: expected ':'",
        ),
    ],
)
def test_load_failures_fail_every_assert(sb, program, expected):
    res = sb.run(Job(program, ("assert add(1, 2) == 3", "assert True")))
    assert res.passed == 0 and res.total == 2
    assert res.error.startswith(expected), res.error
    assert all(r == res.error for r in reasons(res))


@pytest.mark.parametrize(
    ("program", "reason"),
    [
        ("x = " + "(" * 10000 + "1" + ")" * 10000, "SyntaxError: too many nested parentheses"),
        ("x = " + "-" * 200000 + "1", "MemoryError"),
        (
            "x = " + "+".join(["1"] * 200000),
            "RecursionError: maximum recursion depth exceeded during compilation",
        ),
    ],
    ids=["nested_parentheses", "deep_unary", "long_sum"],
)
def test_programs_that_break_the_compiler_fail_to_load_and_the_scorer_survives(sb, program, reason):
    assert sb.run(Job(ADD, ("assert add(1, 2) == 3",))).passed == 1  # the pool is up
    scorers = [w.proc.pid for w in sb._workers]
    res = sb.run(Job(program + "\n" + ADD, ("assert add(1, 2) == 3",)))
    assert res.error.startswith("program failed to load: " + reason), res.error
    assert [w.proc.pid for w in sb._workers] == scorers  # compiled in the scorer, which was not replaced
    assert sb.run(Job(ADD, ("assert add(1, 2) == 3",))).passed == 1


def test_a_large_program_compiled_by_the_program_process_runs(sb):
    prog = "s = '" + "a" * (1 << 20) + "'\ndef size():\n    return len(s)\n"
    res = sb.run(Job(prog, ("assert size() == 2**20",)))
    assert res.passed == 1, reasons(res)


def test_missing_entry_point_is_a_load_failure(sb):
    res = sb.run(Job("def other():\n    return 1\n", ("assert candidate() == 1",), "candidate = add"))
    assert res.passed == 0
    assert res.error == "program failed to load: NameError: name 'add' is not defined (in test setup)"


def test_failing_hanging_crashing_asserts_are_independent(sb_all):
    sb = sb_all
    prog = (
        ADD
        + "import os, sys\n"
        + "def hang():\n    while True:\n        pass\n"
        + "def crash():\n    os._exit(0)\n"
        + "def deep(n):\n    return deep(n + 1) + 1\n"
        + "def segv():\n    import json\n    sys.setrecursionlimit(10**8)\n    return json.loads('[' * 10**6 + ']' * 10**6)\n"
    )
    asserts = (
        "assert add(1, 1) == 2",
        "assert hang() == 1",
        "assert add(2, 2) == 4",
        "assert crash() == 1",
        "assert add(3, 3) == 6",
        "assert segv() == 1",
        "assert add(4, 4) == 8",
        "assert deep(0) == 1",
        "assert add(5, 5) == 11",
        "assert add(6, 6) == 12",
    )
    res = sb.run(Job(prog, asserts))
    assert [o.passed for o in res.outcomes] == [
        True,
        False,
        True,
        False,
        True,
        False,
        True,
        False,
        False,
        True,
    ]
    r = reasons(res)
    assert r[1] == "timeout after 1.0s"
    assert r[3] == "program exited (code 0) instead of returning"
    assert r[5].startswith("crashed: SIGSEGV")
    assert r[7].startswith("RecursionError: maximum recursion depth exceeded")
    assert r[8] == "AssertionError"
    assert res.error == ""


HANG_ON_ODD = "def f(x):\n    while x % 2:\n        pass\n    return x\n"


@pytest.mark.parametrize(
    ("max_timeouts", "expect"),
    [(1, [True, False] + [False] * 4), (2, [True, False, True, False, False, False])],
)
def test_a_job_stops_after_max_timeouts(max_timeouts, expect):
    asserts = tuple(f"assert candidate({x}) == {x}" for x in (0, 1, 2, 3, 4, 6))
    with Sandbox(timeout_s=0.3, max_workers=1, max_timeouts=max_timeouts) as s:
        res = s.run(Job(HANG_ON_ODD, asserts, "candidate = f"))
        after = s.run(
            Job(HANG_ON_ODD, ("assert candidate(8) == 8",), "candidate = f")
        )  # next job: fresh count
    assert [o.passed for o in res.outcomes] == expect, reasons(res)
    r = reasons(res)
    assert [x for x in r if x.startswith("timeout")] == ["timeout after 0.3s"] * max_timeouts
    skipped = f"not run: the job stopped after {max_timeouts} timed-out assert(s)"
    assert r[2 * max_timeouts :] == [skipped] * (6 - 2 * max_timeouts)
    assert res.error == ""
    assert after.passed == 1


def test_max_timeouts_must_be_none_or_positive():
    for bad in (0, -1, 1.5, "1"):
        with pytest.raises(ValueError, match="max_timeouts"):
            Sandbox(max_timeouts=bad)


def test_state_persists_between_asserts_like_one_module_until_a_restart(sb):
    prog = "calls = []\ndef f():\n    calls.append(1)\n    return len(calls)\n"
    res = sb.run(Job(prog, ("assert f() == 1", "assert f() == 2")))
    assert res.passed == 2, reasons(res)


STATEFUL = (
    "calls = []\n"
    "def f(x):\n"
    "    calls.append(x)\n"
    "    if x == 'hang':\n        while True:\n            pass\n"
    "    if x == 'boom':\n        raise ValueError('boom')\n"
    "    if x == 'exit':\n        import os\n        os._exit(0)\n"
    "    return len(calls)\n"
)


def test_calls_sent_ahead_keep_sequential_semantics(sb_all):
    sb = sb_all
    # most units are planned (their literal-argument calls are sent to the program ahead of time); verdicts
    # must be those of running every unit in order, one call at a time, where a timeout, a crash or a failure
    # before a planned call restarts the program process (later asserts see a freshly loaded program)
    asserts = (
        "assert candidate(1) == 1",
        "assert candidate(2) == 2",
        "assert candidate('boom') == 0",
        "assert candidate(3) == 4",
        "assert candidate('hang') == 0",
        "assert candidate(4) == 1",  # a timeout restarts the program process: fresh state
        "assert [1][5] == candidate(5)",  # fails before its planned call: restart, the call never counts
        "assert candidate(6) == 1",
        "assert candidate('exit') == 1",
        "assert candidate(7) == 1",
        "x = [3]\nassert candidate(x) == 2",  # not plannable (a statement before the assert)
        "assert candidate(8) == 3 and candidate(9) == 4",  # not plannable (conditional evaluation)
        "assert sum([candidate(10)]) == 5",
    )
    res = sb.run(Job(STATEFUL, asserts, "candidate = f"))
    expect = [True, True, False, True, False, True, False, True, False, True, True, True, True]
    assert [o.passed for o in res.outcomes] == expect, reasons(res)
    r = reasons(res)
    assert (r[2], r[4], r[6], r[8]) == (
        "ValueError: boom",
        "timeout after 1.0s",
        "IndexError: list index out of range",
        "program exited (code 0) instead of returning",
    )


def test_a_call_hidden_from_the_planner_is_still_scored_correctly(sb):
    setup = "candidate = f\ndef len(x):\n    return candidate(x)"  # a builtin name that calls the program
    res = sb.run(Job(STATEFUL, ("assert candidate(1) == len(2)", "assert candidate(3) == 3"), setup))
    assert [o.passed for o in res.outcomes] == [False, True], reasons(res)


def test_in_place_mutation_of_arguments_is_visible_to_the_test(sb):
    prog = "def f(xs, d):\n    xs.sort()\n    d['k'] = 1\n    return None\n"
    res = sb.run(
        Job(
            prog,
            ("xs = [3, 1, 2]\nd = {}\nassert f(xs, d) is None\nassert xs == [1, 2, 3] and d == {'k': 1}",),
        )
    )
    assert res.passed == 1, reasons(res)


def test_plain_values_round_trip_exactly(sb):
    value = "[None, True, 1, -2**200, 1.5, float('inf'), 2j, 'é\\ud800', b'\\x00', bytearray(b'x'), (1, (2,)), {1: [2]}, {3}, frozenset({4})]"
    prog = f"def f():\n    return {value}\n"
    res = sb.run(
        Job(
            prog,
            (f"r = f()\nassert r == {value}\nassert [type(x) for x in r] == [type(x) for x in {value}]",),
        )
    )
    assert res.passed == 1, reasons(res)


def test_subclasses_and_numpy_scalars_are_converted_to_builtins(sb):
    prog = (
        "import collections, numpy as np\n"
        "class I(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
        "def counter():\n    return collections.Counter('aab')\n"
        "def npint():\n    return np.int64(5)\n"
        "def sub():\n    return I(3)\n"
    )
    asserts = (
        "assert counter() == {'a': 2, 'b': 1}",
        "assert npint() == 5",
        "assert sub() == 3",
        "assert sub() == 4",
    )
    res = sb.run(Job(prog, asserts))
    assert [o.passed for o in res.outcomes] == [True, True, True, False], reasons(res)


def test_zero_asserts_gives_empty_outcomes(sb):
    res = sb.run(Job(ADD, ()))
    assert (res.outcomes, res.error, res.passed, res.total) == ((), "", 0, 0)
    res = sb.run(Job("def broken(:", ()))
    assert res.outcomes == () and res.error.startswith("program failed to load: SyntaxError")


def test_run_batch_matches_run_and_keeps_order(sb):
    jobs = [Job(ADD, (f"assert add({i}, 1) == {i + 1 if i % 3 else 0}",)) for i in range(12)]
    jobs.append(Job("def add(:", ("assert True",)))
    batch = sb.run_batch(jobs)
    single = [sb.run(j) for j in jobs]
    assert [r.outcomes for r in batch] == [r.outcomes for r in single]
    assert [r.error for r in batch] == [r.error for r in single]
    assert [r.passed for r in batch] == [0 if i % 3 == 0 else 1 for i in range(12)] + [0]
    assert sb.run_batch([]) == []


def test_verdicts_are_deterministic(sb):
    prog = (
        "import random\n"
        "def f(words):\n    return list(set(words))\n"
        "def g():\n    return random.random()\n"
        "def h(x):\n    return hash(x) % 7\n"
    )
    first_g = sb.run(Job(prog, ("assert g() == 0",))).outcomes[0].reason
    asserts = (
        "assert f(['a', 'b', 'c', 'd', 'e']) == ['a', 'b', 'c', 'd', 'e']",
        "assert g() < 0.5",
        "assert h('abc') == 3",
        "import random\nassert random.random() < 0.5",
    )
    runs = [tuple(o.passed for o in sb.run(Job(prog, asserts)).outcomes) for _ in range(3)]
    runs += [tuple(o.passed for o in r.outcomes) for r in sb.run_batch([Job(prog, asserts)] * 4)]
    assert len(set(runs)) == 1, runs
    assert first_g == "AssertionError"


def test_all_canonical_solutions_pass(sb, problems):
    jobs = [
        Job(p.context + "\n" + p.prompt + p.canonical_solution, p.asserts, p.test_setup) for p in problems
    ]
    results = sb.run_batch(jobs)
    failing = {
        p.task_id: (r.error, reasons(r))
        for p, r in zip(problems, results, strict=True)
        if r.passed != r.total
    }
    assert not failing
    assert sum(r.total for r in results) == sum(len(p.asserts) for p in problems)


def test_wrong_solutions_fail(sb, problems):
    p = problems[0]
    res = sb.run(Job(p.context + "\n" + p.prompt + "    return True\n", p.asserts, p.test_setup))
    assert 0 < res.passed < res.total


def test_outcome_equality_ignores_seconds():
    assert AssertOutcome(True, "", 0.5) == AssertOutcome(True)
    assert ExecutionResult((AssertOutcome(True), AssertOutcome(False, "x"))).passed == 1


def test_invalid_arguments():
    with pytest.raises(ValueError):
        Sandbox(isolation="docker")
    with pytest.raises(ValueError):
        Sandbox(timeout_s=0)
    with pytest.raises(ValueError):
        Sandbox(memory_mb=1)


def test_type_errors_and_closed_sandbox():
    s = Sandbox(max_workers=1)
    with pytest.raises(TypeError):
        s.run_batch(["print(1)"])  # type: ignore[list-item]
    s.close()
    s.close()
    with pytest.raises(SandboxError):
        s.run(Job(ADD, ()))


def test_process_isolation_and_layer_logging(caplog):
    worker._LOGGED.discard("rlimits")
    with (
        caplog.at_level(logging.INFO, logger="orchestry.sandbox"),
        Sandbox(isolation="process", max_workers=1) as s,
    ):
        assert s.isolation_layer == "rlimits"
        assert s.run(Job(ADD, ("assert add(1, 2) == 3",))).passed == 1
    msgs = [r.getMessage() for r in caplog.records if r.name == "orchestry.sandbox"]
    # the layer is named once; other lines may follow (a checkout under /tmp adds "cannot cover /tmp/...")
    layers = [m for m in msgs if m.startswith("sandbox isolation:")]
    assert len(layers) == 1 and "WITHOUT bubblewrap" in layers[0]


def test_without_bubblewrap_auto_falls_back_and_says_so(monkeypatch, caplog):
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap on PATH
    monkeypatch.setattr(isolation, "_PROBES", {})
    monkeypatch.setattr(worker, "_LOGGED", set())
    with pytest.raises(SandboxError, match="bubblewrap"):
        Sandbox(isolation="bwrap")
    with caplog.at_level(logging.INFO, logger="orchestry.sandbox"), Sandbox(max_workers=1) as s:
        assert s.isolation_layer == "rlimits"
        assert s.run(Job(ADD, ("assert add(1, 2) == 3",))).passed == 1
    assert any("WITHOUT bubblewrap" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed on this machine"
)
def test_bwrap_isolation_layer():
    with Sandbox(isolation="bwrap", max_workers=1) as s:
        assert s.isolation_layer == "bwrap+rlimits"
        assert s.run(Job(ADD, ("assert add(1, 2) == 3",))).passed == 1


def test_auto_reports_the_layer_it_uses():
    with Sandbox(max_workers=1) as s:
        usable, _ = isolation._probe_bwrap()
        assert s.isolation_layer == ("bwrap+rlimits" if usable else "rlimits")
