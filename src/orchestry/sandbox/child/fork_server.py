"""``C``, the clean fork server (trusted): pre-imports common modules, keeps program processes forked ahead, kills
and reaps them and removes their directories."""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import signal
import socket
import struct
import sys

from .hardening import _drop_ctypes, _prctl, _seccomp_installer
from .program import _HIDDEN_INODES, _PROGRAM_FILTER, _STDIO, _hidden_inodes, _Sink, program_main

_CTRL_PID = struct.Struct("<q")  # C <-> Z control messages (see _CleanServer)
_CTRL_FINISH = struct.Struct("<q?")
_FDS2 = struct.Struct("ii")
# Program processes C keeps forked ahead: with two, the scorer never waits for a fork between jobs.
IDLE_AHEAD = 2
# Modules pre-imported by C so that programs import them for free. Every pre-imported module makes each fork
# and exit of a program process slower, so with bubblewrap (where the rest can be imported on demand) only the
# most common ones are; in "process" isolation, where the interpreter's own files may be unreadable by the
# unprivileged uid, the larger list is.
PRELOAD_SMALL = [
    "typing",
    "math",
    "re",
    "collections",
    "itertools",
    "functools",
    "heapq",
    "string",
    "random",
    "json",
]
PRELOAD_FULL = PRELOAD_SMALL + [
    "abc",
    "array",
    "base64",
    "bisect",
    "calendar",
    "cmath",
    "collections.abc",
    "copy",
    "dataclasses",
    "datetime",
    "decimal",
    "enum",
    "fractions",
    "hashlib",
    "io",
    "numbers",
    "operator",
    "statistics",
    "struct",
    "textwrap",
    "threading",
    "time",
    "types",
    "unicodedata",
    "encodings.idna",
]


class _CleanServer:
    """C: keeps IDLE_AHEAD program processes forked ahead (idle, fully set up, waiting for their program),
    hands them to the scorer, kills and reaps program processes, removes their directories.

    Messages on the SOCK_SEQPACKET control socket, binary (C does as little as possible between forks: every
    page it touches while a forked program process shares it is copied):
      C -> Z  b"I" + pid (int64) + tmpdir (UTF-8), with 2 fds (write to A, read from A): a ready program
              process. IDLE_AHEAD are sent at start, one more after each "finish".
      Z -> C  pid (int64) + want_status (bool): SIGKILL pid's process group and remove its directory (when the
              program left files there, or want_status, after waiting for it and killing whatever else of its
              uid), then reply b"S" + wait status or -1 (int64). The scorer reads
              the reply before it starts the next program (at once when it wants the status), so one job's
              leftovers (e.g. a full /tmp) never meet the next job.
    C is a child subreaper: processes a program managed to start come back to C when the program dies; any
    such process is killed with kill(-1) issued as the job's own uid (every program process has a fresh uid).
    """

    def __init__(self, ctrl: socket.socket, cfg: dict) -> None:
        self.ctrl = ctrl
        self.cfg = cfg
        self.jobs: dict[int, tuple[int | None, str]] = {}  # live or killed program pid -> (uid, tmpdir)
        self.killed: set[int] = set()
        self.status: dict[int, int] = {}
        me = os.getpid()
        self.children_path = f"/proc/{me}/task/{me}/children"

    def serve(self) -> None:
        ctrl = self.ctrl
        for _ in range(IDLE_AHEAD):
            self.fork_idle()
        while True:
            with contextlib.suppress(Exception):  # one job's clean-up must not end the fork server
                self.reap()
            if self.killed:  # reap killed program processes promptly even when no request comes
                r, _, _ = select.select([ctrl], [], [], 0.02)
                if not r:
                    continue
            try:
                msg = ctrl.recv(1 << 16)
            except OSError:
                msg = b""
            if not msg:  # the scorer is gone: kill every program process left, then exit
                for pid in list(self.jobs):
                    uid, tmpdir = self.jobs[pid]
                    self.finish(pid, False)
                    _kill_uid(uid, [pid])
                    _rmtree(tmpdir)
                return
            try:
                pid, want_status = _CTRL_FINISH.unpack(msg)
                st = -1
                try:
                    st = self.finish(pid, want_status)  # the directory is gone when this returns
                finally:
                    ctrl.send(b"S" + _CTRL_PID.pack(st))
                self.fork_idle()
            except OSError:
                return
            except Exception:  # noqa: BLE001 - keep serving
                pass

    def fork_idle(self) -> None:
        """Fork a program process now (off the scorer's critical path) and announce it."""
        cfg = self.cfg
        tmpdir = _mkdtemp(cfg["tmp_root"])
        uid = _new_uid() if cfg.get("root") else None
        if uid is not None:
            os.chown(tmpdir, uid, uid)
        za_r, za_w = os.pipe()
        az_r, az_w = os.pipe()
        tmpdir_b = tmpdir.encode()
        fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _FDS2.pack(za_w, az_r))]
        pid = os.fork()
        if pid == 0:
            program_main(cfg, tmpdir, uid, za_r, az_w, self.ctrl.fileno())  # never returns
        self.jobs[pid] = (uid, tmpdir)
        os.close(za_r)
        os.close(az_w)
        try:
            self.ctrl.sendmsg([b"I" + _CTRL_PID.pack(pid) + tmpdir_b], fds)
        finally:
            os.close(za_w)
            os.close(az_r)

    def finish(self, pid: int, wait: bool) -> int:
        if pid not in self.jobs:
            return self.status.pop(pid, -1)
        for kill, target in ((os.killpg, pid), (os.kill, pid)):
            with contextlib.suppress(OSError):
                kill(target, signal.SIGKILL)
        self.killed.add(pid)
        if not wait:
            try:  # the usual case: the program left nothing, so its (now removed) directory is clean at once
                os.rmdir(self.jobs[pid][1])
                return -1
            except FileNotFoundError:
                return -1
            except OSError:
                pass  # files left: wait for the program, then remove everything before answering
        try:
            _, st = os.waitpid(pid, 0)
        except ChildProcessError:
            return self.status.pop(pid, -1)
        self._done(pid)
        return st

    def reap(self) -> None:
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.jobs:
                if pid not in self.killed:
                    self.status[pid] = st
                    if len(self.status) > 1000:
                        self.status.clear()
                self._done(pid)

    def _done(self, pid: int) -> None:
        """pid (a program process) is reaped: kill whatever of its job is still alive, remove its directory."""
        uid, tmpdir = self.jobs.pop(pid)
        self.killed.discard(pid)
        try:
            fd = os.open(self.children_path, os.O_RDONLY)
            try:
                others = [int(x) for x in os.read(fd, 65536).split()]
            finally:
                os.close(fd)
        except (OSError, ValueError):
            others = None  # cannot tell: assume there may be leftovers
        leftovers = others is None or any(o not in self.jobs for o in others)
        if leftovers:
            _kill_uid(uid, others or [])
            self.reap()
        _rmtree(tmpdir)


def _kill_uid(uid: int | None, pids: list[int]) -> None:
    """Kill every process of ``uid`` (fresh per job) with kill(-1) from a helper running as that uid; without
    a private uid (not root) kill the given pids and their process groups only."""
    if uid is None:
        for p in pids:
            for kill, target in ((os.killpg, p), (os.kill, p)):
                with contextlib.suppress(OSError):
                    kill(target, signal.SIGKILL)
        return
    k = os.fork()
    if k == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)  # every process of this uid, never the caller itself
        finally:
            os._exit(0)
    os.waitpid(k, 0)


def _warm_typing() -> None:
    """Fill typing's subscription caches with common annotations (``List[int]``, ``Tuple[str, ...]``...).

    Programs' annotations are evaluated when their functions are defined; a cold ``List[float]`` runs typing's
    Python code in every program process (fork microbenchmark with this warm-up: executing a program with two
    annotated functions in a fresh fork 0.46-0.50 -> 0.17-0.21 ms, page faults 115 -> 59).
    """
    t = sys.modules.get("typing")
    if t is None:
        return
    scalars = (int, float, str, bool, t.Any)
    with contextlib.suppress(Exception):
        for x in scalars:
            for alias in (t.List[x], t.Set[x], t.Tuple[x, x], t.Tuple[x, ...], t.Optional[x], t.Dict[str, x]):
                t.List[alias]
                t.Optional[alias]
            t.Dict[int, x]
            t.Tuple[x, x, x]
            t.Union[x, None]
            t.Iterable[x]
            t.Sequence[x]
            t.Callable[..., x]
            for y in scalars:
                t.Tuple[x, y]
                t.Union[x, y]
                t.Dict[x, y]
                t.List[t.Tuple[x, y]]
                t.Tuple[t.List[x], t.List[y]]


def clean_server(ctrl: socket.socket, preload: list[str], cfg: dict) -> None:
    """Entry of C: pre-import common modules, set up, serve forever."""
    # state every program process inherits (set once here rather than per fork)
    os.environ.clear()
    os.environ.update(
        {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
    )
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes fail with EFBIG instead of killing
    for sig in (
        signal.SIGTERM,
        signal.SIGALRM,
        signal.SIGCHLD,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGHUP,
    ):
        signal.signal(sig, signal.SIG_DFL)
    for name in preload:
        with contextlib.suppress(Exception):
            __import__(name)
    _HIDDEN_INODES.update(_hidden_inodes(cfg.get("hidden")))
    with contextlib.suppress(Exception):
        install = _seccomp_installer(program=True)
        if install is not None:
            _PROGRAM_FILTER.append(install)
    _drop_ctypes()
    _prctl(36)  # PR_SET_CHILD_SUBREAPER: orphans of program processes come back to C
    # The first compile() in an interpreter builds the ~120 AST node classes (PyAST_Check -> init_types):
    # done here once, it was a third of each program process's CPU time.
    compile("pass", "<warm-up>", "exec")
    _warm_typing()
    _STDIO.update(out=_Sink(), err=_Sink(), **{"in": open(0, closefd=False)})  # noqa: SIM115 - fd 0 is /dev/null
    # C keeps its own stdio objects alive, so that replacing them in A does not finalize them there (flush,
    # close: that alone was ~50 page faults per program process)
    _STDIO["c"] = (sys.stdout, sys.stderr, sys.stdin, sys.__stdout__, sys.__stderr__, sys.__stdin__)
    import gc

    gc.collect()
    gc.freeze()  # keep the pre-imported heap shared copy-on-write with every A
    _CleanServer(ctrl, cfg).serve()


_DIR_SEQ = itertools.count(1)


def _mkdtemp(root: str) -> str:
    """A new private (0700) directory under ``root``: ``job-<pid>-<n>``, unique per fork server."""
    while True:
        path = f"{root}/job-{os.getpid()}-{next(_DIR_SEQ)}"
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue


def _rmtree(path: str) -> None:
    """Remove a program's directory whatever it left there (any depth, modes, symlinks, fifos). Never raises.

    The usual case (nothing left) is one rmdir. Otherwise ``rm -rf --one-file-system`` does it: it neither
    follows symlinks nor recurses on the C stack (a 1,500-level tree made Python's ``shutil.rmtree`` raise
    RecursionError); Python's rmtree is the fallback where there is no ``rm``."""
    try:
        os.rmdir(path)
        return
    except FileNotFoundError:
        return
    except OSError:
        pass
    try:
        for rm in ("/bin/rm", "/usr/bin/rm"):
            if os.path.exists(rm):
                pid = os.posix_spawn(rm, ["rm", "-rf", "--one-file-system", "--", path], {"PATH": "/bin"})
                os.waitpid(pid, 0)
                break
        if os.path.lexists(path):
            import shutil

            shutil.rmtree(path, ignore_errors=True)
    except BaseException:  # noqa: BLE001 - the fork server must survive any tree
        pass


def _new_uid() -> int:
    """A fresh unprivileged uid (also used as gid) for one program process."""
    return 1_000_000 + int.from_bytes(os.urandom(4), "big") % 2_000_000_000
