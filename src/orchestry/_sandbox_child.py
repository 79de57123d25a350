"""Worker processes of :mod:`orchestry.sandbox` (private; started as a script, never imported by the parent).

Three roles live in this file (the design and its guarantees are documented in ``sandbox.py``):

``Z`` -- the *scorer*. Trusted. Receives jobs from the parent over a pipe, runs the **test** code (setup and
assert units) in its own interpreter and computes every verdict. It never executes model-written code: calls of
program functions made by the tests (``candidate(...)``) are forwarded to ``A`` and only plain data comes back.

``C`` -- the *clean fork server*. Trusted. Forked by ``Z`` at start-up, before any job exists, with the common
modules pre-imported. For every (re)load of a program it forks a fresh ``A``. Because ``C`` never holds test
data, no ``A`` can find the tests or their expected values in its memory.

``A`` -- the *program process*. Untrusted. One per program load: new session, private temporary directory,
sanitised environment, output discarded, privileges dropped to the worker's own unprivileged uid, resource
limits, an audit hook refusing process spawning, sockets, ``ctypes`` and writes outside its directory. It
executes the program, then answers calls ``name(*args)`` with the return value encoded as plain data.

Parent <-> Z and Z <-> A messages are 4-byte big-endian length + JSON. Only Python standard library here.
"""

from __future__ import annotations

import builtins
import contextlib
import itertools
import json
import marshal
import os
import random
import resource
import select
import signal
import socket
import struct
import sys
import time
from collections import deque
from keyword import iskeyword as _iskeyword

_LEN = struct.Struct(">I")
_CTRL_PID = struct.Struct("<q")  # C <-> Z control messages (see _CleanServer)
_CTRL_FINISH = struct.Struct("<q?")
_FDS2 = struct.Struct("ii")
# Program processes C keeps forked ahead: with two, the scorer never waits for a fork between jobs.
IDLE_AHEAD = 2
_BUILTIN_NAMES = frozenset(dir(builtins))
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
# Modules a program's globals may bind in the tests' namespace (``import math`` in a HumanEval prompt, used by its
# test). The scorer imports exactly these itself, once, before any job; a program's load report only *names* one
# of them and the scorer looks the name up in this fixed table: it never imports (or evaluates) anything a program
# names or writes. Any other module global is left out of the test namespace.
TEST_MODULES = (
    "bisect",
    "cmath",
    "collections",
    "copy",
    "datetime",
    "decimal",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "itertools",
    "json",
    "math",
    "operator",
    "random",
    "re",
    "statistics",
    "string",
    "typing",
)
_SIGNAMES = {int(s): s.name for s in signal.Signals}
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_CPU_READ_AFTER = 0.002  # seconds into a unit after which the program's CPU time is read (see _read_exact)
_EXIT_SETUP, _EXIT_CHANNEL = 70, 72  # exit codes of a program process that could not talk to the scorer
_TIMEOUT = "timeout after"  # reason of a unit (or load) that ran out of time: f"{_TIMEOUT} {limit}s"
# Programs up to this size (characters) are compiled by the scorer, which sends the program process the code
# object (marshal) instead of the source; a program that does not compile never needs a program process.
# Larger ones are compiled by the program process itself, under its limits.
COMPILE_IN_SCORER_MAX = 1 << 20


# ----------------------------------------------------------------------------------------- framing
class ChannelClosed(Exception):
    """The other end of a pipe closed (EOF) or broke."""


class ChannelProtocolError(Exception):
    """A message was malformed or too large."""


def write_msg_blocking(fd: int, obj) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8", "surrogatepass")
    data = _LEN.pack(len(data)) + data
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact_blocking(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            raise ChannelClosed("EOF")
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def read_msg_blocking(fd: int, max_bytes: int = 1 << 30):
    (n,) = _LEN.unpack(read_exact_blocking(fd, 4))
    if n > max_bytes:
        raise ChannelProtocolError(f"message of {n} bytes exceeds the limit of {max_bytes}")
    return json.loads(read_exact_blocking(fd, n).decode("utf-8", "surrogatepass"))


# ------------------------------------------------------------------------------- plain-data codec
class Unplain(TypeError):
    """A value that is not made of built-in data types (cannot cross the process boundary)."""


_INT_LIMIT = 1 << 62


def encode(x, liberal: bool = False):
    """Encode built-in data (None, bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set,
    frozenset; nested) as JSON-able values. ``liberal`` (program side only) also converts subclasses of those
    types, numpy scalars and dict key views. Raises :class:`Unplain` for anything else."""
    t = type(x)
    if t is str or t is bool or t is float or x is None:
        return x
    if t is int:
        return x if -_INT_LIMIT < x < _INT_LIMIT else {"i": format(x, "x")}
    if t is list:
        return [encode(e, liberal) for e in x]
    if t is tuple:
        return {"t": [encode(e, liberal) for e in x]}
    if t is dict:
        return {"d": [[encode(k, liberal), encode(v, liberal)] for k, v in x.items()]}
    if t is set:
        return {"s": [encode(e, liberal) for e in x]}
    if t is frozenset:
        return {"f": [encode(e, liberal) for e in x]}
    if t is complex:
        return {"c": [x.real, x.imag]}
    if t is bytes:
        return {"b": x.hex()}
    if t is bytearray:
        return {"y": x.hex()}
    if liberal:
        return _encode_liberal(x, t)
    raise Unplain(t.__name__)


def _encode_liberal(x, t):
    for base, conv in (
        (bool, bool),
        (int, int),
        (float, float),
        (str, str.__str__),
        (complex, complex),
        (bytes, bytes),
        (bytearray, bytearray),
        (list, list),
        (tuple, tuple),
        (dict, dict),
        (set, set),
        (frozenset, frozenset),
    ):
        if isinstance(x, base):
            return encode(base(conv(x)) if conv is not base else base(x), True)
    mod = getattr(t, "__module__", "") or ""
    if mod.split(".")[0] == "numpy" and hasattr(x, "item") and getattr(x, "ndim", None) == 0:
        return encode(x.item(), True)
    if t is type({}.keys()):
        return encode(set(x), True)
    raise Unplain(getattr(t, "__name__", "?"))


def decode(v):
    """Inverse of :func:`encode`; accepts only what ``encode`` produces (ValueError otherwise)."""
    t = type(v)
    if t is list:
        return [decode(e) for e in v]
    if t is dict:
        if len(v) != 1:
            raise ValueError("bad tagged value")
        ((tag, p),) = v.items()
        if tag == "i" and type(p) is str:
            return int(p, 16)
        if tag == "t" and type(p) is list:
            return tuple(decode(e) for e in p)
        if tag == "d" and type(p) is list:
            out = {}
            for kv in p:
                if type(kv) is not list or len(kv) != 2:
                    raise ValueError("bad dict item")
                out[decode(kv[0])] = decode(kv[1])
            return out
        if tag == "s" and type(p) is list:
            return {decode(e) for e in p}
        if tag == "f" and type(p) is list:
            return frozenset(decode(e) for e in p)
        if tag == "c" and type(p) is list and len(p) == 2 and all(type(e) in (int, float) for e in p):
            return complex(p[0], p[1])
        if tag == "b" and type(p) is str:
            return bytes.fromhex(p)
        if tag == "y" and type(p) is str:
            return bytearray.fromhex(p)
        raise ValueError(f"bad tag {tag!r}")
    if t is str or t is int or t is float or t is bool or v is None:
        return v
    raise ValueError(f"bad value type {t.__name__}")


class _Decoder:
    """Scorer-side :func:`decode` for values a program sent: at most ``max_nodes`` values in all, and the
    clock is checked while decoding (raises ``_UnitTimeout`` past ``deadline``, a ``time.monotonic()`` value).
    Sets and dict keys are inserted one at a time with a clock check each, so that values built to collide in
    a hash table (quadratic insertion) cannot hold the scorer past the unit's time. Raises ValueError for
    anything :func:`encode` does not produce or a value over the node budget."""

    __slots__ = ("deadline", "left", "n", "by_hash", "collisions")

    #: distinct values sharing one hash that a reply may hold: a test that builds a set of a program's result
    #: (``len(set(candidate(...)))``) does so in one C call the unit's timer cannot interrupt, so values built
    #: to collide are refused here instead
    MAX_COLLISIONS = 64

    def __init__(self, deadline: float, max_nodes: int) -> None:
        self.deadline = deadline
        self.left = max_nodes
        self.n = 0
        self.by_hash: dict = {}
        self.collisions = 0

    def _check_hash(self, v) -> None:
        try:
            h = hash(v)
        except TypeError:  # holds a list, dict or set somewhere
            return
        first = self.by_hash.setdefault(h, v)
        if first is not v and first != v:
            self.collisions += 1
            if self.collisions > self.MAX_COLLISIONS:
                raise ValueError("values built to collide in a hash table")

    def _tick(self, clock: bool = False) -> None:
        self.left -= 1
        if self.left < 0:
            raise ValueError("value has too many parts")
        self.n += 1
        if (clock or not self.n & 255) and time.monotonic() > self.deadline:
            raise _UnitTimeout()

    def decode(self, v):
        self._tick()
        t = type(v)
        if t is str or t is int or t is float:
            self._check_hash(v)
            return v
        if t is bool or v is None:
            return v
        if t is list:
            return [self.decode(e) for e in v]
        if t is not dict or len(v) != 1:
            raise ValueError("bad value")
        ((tag, p),) = v.items()
        if tag in ("i", "b", "y") and type(p) is str:
            if len(p) > 1 << 22:
                raise ValueError("value too large")
            x = int(p, 16) if tag == "i" else bytes.fromhex(p) if tag == "b" else bytearray.fromhex(p)
            if tag != "y":
                self._check_hash(x)
            return x
        if type(p) is not list:
            raise ValueError("bad tagged value")
        if tag == "t":
            tup = tuple(self.decode(e) for e in p)
            self._check_hash(tup)  # every level: hashing costs its size, bounded by the budget and the clock
            return tup
        if tag == "d":
            out: dict = {}
            self.fill_dict(out, p)
            return out
        if tag in ("s", "f"):
            out_s: set = set()
            self.fill_set(out_s, p)
            if tag == "s":
                return out_s
            fs = frozenset(out_s)
            self._check_hash(fs)
            return fs
        if tag == "c" and len(p) == 2 and all(type(e) in (int, float) for e in p):
            c = complex(p[0], p[1])
            self._check_hash(c)
            return c
        raise ValueError(f"bad tag {str(tag)[:20]!r}")

    def fill_set(self, out: set, items: list, decoded: bool = False) -> None:
        add = out.add
        for e in items:
            self._tick(True)
            add(e if decoded else self.decode(e))

    def fill_dict(self, out: dict, items, decoded: bool = False) -> None:
        for kv in items:
            self._tick(True)
            if decoded:
                k, val = kv
            else:
                if type(kv) is not list or len(kv) != 2:
                    raise ValueError("bad dict item")
                k, val = self.decode(kv[0]), self.decode(kv[1])
            out[k] = val


def _short(text: str, n: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


# =================================================================================== A: the program
class _Sink:
    """Replacement for sys.stdout/sys.stderr in A: accepts and discards everything (no size, no error)."""

    encoding = "utf-8"
    errors = "strict"
    closed = False

    def write(self, s):
        return len(s)

    def writelines(self, lines):
        for _ in lines:
            pass

    def flush(self):
        pass

    def isatty(self):
        return False

    def readable(self):
        return False

    def writable(self):
        return True

    def seekable(self):
        return False

    def fileno(self):
        import io

        raise io.UnsupportedOperation("sandboxed output has no file descriptor")


# stdio objects of every A, made once in C (fresh, never used there): out/err discard, in reads /dev/null
_STDIO: dict = {}


_PROGRAM_FILTER: list = []  # the program processes' seccomp installer, made once by C (see _seccomp_installer)
_HIDDEN_INODES: set[tuple[int, int]] = set()  # (st_dev, st_ino) of hidden files and directories, filled by C


def _hidden_inodes(paths) -> set[tuple[int, int]]:
    """(device, inode) of each hidden directory and of every file under it (as seen by C at start-up)."""
    out = set()
    for top in paths or ():
        with contextlib.suppress(OSError):
            for d, _dirs, files in os.walk(top):
                for x in (d, *(f"{d}/{f}" for f in files)):
                    st = os.stat(x)
                    out.add((st.st_dev, st.st_ino))
    return out


def _make_audit_hook(tmpdir: str):
    """Audit hook for A (PEP 578; cannot be removed once added). Refuses: process creation, sockets, ctypes,
    symlinks/hard links, file-system writes outside ``tmpdir`` (plain paths only; anything else is refused),
    relative ``os.open`` (its ``dir_fd`` is not part of the event) and opening a hidden file or directory
    (:data:`_HIDDEN_INODES`: compared by inode, so no spelling or symlink of the path gets through).
    Everything it uses is bound here, so later monkeypatching by the program cannot change it."""
    getcwd = os.getcwd
    stat = os.stat
    hidden = frozenset(_HIDDEN_INODES)
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    root = tmpdir.rstrip("/")
    blocked = frozenset(
        {
            "os.fork",
            "os.forkpty",
            "os.system",
            "os.exec",
            "os.posix_spawn",
            "os.spawn",
            "subprocess.Popen",
            "pty.spawn",
            "socket.__new__",
            "socket.bind",
            "socket.connect",
            "socket.getaddrinfo",
            "socket.gethostbyname",
            "socket.sethostname",
            "os.symlink",
            "os.link",
            "sys.addaudithook",
            "os.chroot",
            "os.setuid",
            "os.setgid",
        }
    )
    blocked_imports = frozenset(
        {
            "ctypes",
            "_ctypes",
            "_posixsubprocess",
            "cffi",
            "_cffi_backend",
            "_xxsubinterpreters",
            "_xxinterpchannels",
        }
    )  # a subinterpreter would run without this hook
    # event -> (positions of path arguments, positions of dir_fd arguments)
    writes = {
        "os.mkdir": ((0,), (2,)),
        "os.chmod": ((0,), (2,)),
        "os.chown": ((0,), (3,)),
        "os.rename": ((0, 1), (2, 3)),
        "os.rmdir": ((0,), (1,)),
        "os.remove": ((0,), (1,)),
        "os.truncate": ((0,), ()),
        "os.utime": ((0,), (3,)),
        "shutil.rmtree": ((0,), (1,)),
    }
    PermissionErr, ImportErr = PermissionError, ImportError
    _str, _bytes, _int = str, bytes, int

    def inside(p) -> bool:
        tp = type(p)
        if tp is _int:
            return True  # an already-open descriptor (its opening was checked)
        if tp is _bytes:
            p = p.decode("utf-8", "surrogateescape")
        elif tp is not _str:
            return False
        if not p.startswith("/"):
            p = getcwd() + "/" + p
        parts: list = []
        for seg in p.split("/"):
            if seg == "" or seg == ".":
                continue
            if seg == "..":
                if parts:
                    parts.pop()
                continue
            parts.append(seg)
        norm = "/" + "/".join(parts)
        return norm == root or norm.startswith(root + "/")

    def hook(event, args):
        if event in blocked or event.startswith("ctypes."):
            raise PermissionErr(f"blocked by sandbox: {event}")
        if event == "import":
            if args and type(args[0]) is _str and args[0].split(".")[0] in blocked_imports:
                raise ImportErr(f"blocked by sandbox: import {args[0]}")  # ImportError: optional users cope
            return
        if event == "open":
            p = args[0] if args else None
            tp = type(p)
            if tp is _str or tp is _bytes:
                if len(args) >= 2 and args[1] is None and not p.startswith("/" if tp is _str else b"/"):
                    raise PermissionErr("blocked by sandbox: relative os.open")
                if hidden:
                    try:
                        st = stat(p)
                    except (OSError, ValueError):
                        st = None
                    if st is not None and (st.st_dev, st.st_ino) in hidden:
                        raise PermissionErr("blocked by sandbox: hidden file")
            if len(args) >= 3 and type(args[2]) is _int and args[2] & wflags and not inside(p):
                raise PermissionErr("blocked by sandbox: write outside the sandbox directory")
            return
        spec = writes.get(event)
        if spec is not None:
            for i in spec[1]:
                if len(args) > i and args[i] is not None and args[i] != -1:
                    raise PermissionErr(f"blocked by sandbox: {event} with dir_fd")
            for i in spec[0]:
                if len(args) > i and not inside(args[i]):
                    raise PermissionErr(f"blocked by sandbox: {event} outside the sandbox directory")

    return hook


def _describe(e: BaseException) -> str:
    try:
        name = type(e).__name__
        if isinstance(e, SyntaxError):
            msg = f"{e.msg} (line {e.lineno})" if e.lineno is not None else str(e.msg)
        else:
            msg = str(e)
    except BaseException:  # noqa: BLE001 - a hostile exception may break str()
        return "exception (undescribable)"
    return _short(f"{name}: {msg}" if msg else name)


def program_main(req: dict, tmpdir: str, uid: int | None, za_r: int, az_w: int, ctrl_fd: int) -> None:
    """Entry of A (forked by C's helper). Never returns: ends with os._exit."""
    try:
        os.setsid()
        os.close(ctrl_fd)
        # descriptors: 0 <- /dev/null, 1/2 -> /dev/null, 3 <- scorer, 4 -> scorer; close everything else
        os.dup2(za_r, 1000)
        os.dup2(az_w, 1001)
        null = os.open(os.devnull, os.O_RDWR)
        for target in (0, 1, 2):
            os.dup2(null, target)
        os.dup2(1000, 3)
        os.dup2(1001, 4)
        os.closerange(5, 1 << 16)
        za_r, az_w = 3, 4
        os.chdir(tmpdir)
        os.environ["HOME"] = os.environ["TMPDIR"] = tmpdir  # the rest was set once in C (_clean_process_env)
        mem = int(req["memory_mb"]) * 1024 * 1024
        fsize = int(req["fsize"])
        for lim, val in (
            (resource.RLIMIT_AS, mem),
            (resource.RLIMIT_FSIZE, fsize),
            (resource.RLIMIT_NOFILE, int(req["nofile"])),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_MEMLOCK, 0),
            (resource.RLIMIT_MSGQUEUE, 0),
        ):
            resource.setrlimit(lim, val if isinstance(val, tuple) else (val, val))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            resource.setrlimit(resource.RLIMIT_NPROC, (int(req["nproc"]), int(req["nproc"])))
        sys.stdout = sys.__stdout__ = _STDIO["out"]
        sys.stderr = sys.__stderr__ = _STDIO["err"]
        sys.stdin = sys.__stdin__ = _STDIO["in"]
        if "random" in sys.modules:
            sys.modules["random"].seed(0)
        if "tempfile" in sys.modules:
            sys.modules["tempfile"].tempdir = tmpdir
        if _PROGRAM_FILTER:
            _PROGRAM_FILTER[0]()
        sys.addaudithook(_make_audit_hook(tmpdir))
        # ready: wait (pre-forked, idle) for the job; then CPU seconds for the whole job (soft: SIGXCPU)
        first = read_msg_blocking(za_r)
        if "code_bytes" in first:  # the program, compiled by the scorer (marshal), follows the message
            first["code"] = read_exact_blocking(za_r, int(first["code_bytes"]))
        cpu = max(1, int(first["cpu_s"]))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    except BaseException:  # noqa: BLE001 - set-up failure: nothing model-written has run yet
        os._exit(_EXIT_SETUP)
    _serve(first, za_r, az_w)


def _serve(first: dict, za_r: int, az_w: int) -> None:
    """Load the program, report, then answer calls until EOF. Runs model code: nothing here is trusted."""
    _exit = os._exit
    pristine = dict(builtins.__dict__)
    restore = builtins.__dict__.update  # the harness below needs working builtins after model code ran
    ns: dict = {}
    try:
        if "code" in first:
            code = marshal.loads(first["code"])
        else:
            code = compile(first["program"], "<program>", "exec", dont_inherit=True)
        exec(code, ns)  # noqa: S102 - this is the sandboxed program
    except BaseException as e:  # noqa: BLE001
        restore(pristine)
        try:
            write_msg_blocking(az_w, {"load_error": _describe(e)})
        finally:
            _exit(0)
    restore(pristine)
    try:
        import types

        funcs, mods, vals = [], [], []
        for k, v in list(ns.items()):
            if type(k) is not str or k.startswith("__"):
                continue
            if isinstance(v, types.ModuleType):
                mods.append([k, str(getattr(v, "__name__", ""))])
            elif callable(v):
                funcs.append(k)
            else:
                try:
                    e = encode(v)
                    if len(json.dumps(e)) <= 65536:
                        vals.append([k, e])
                except BaseException:  # noqa: BLE001
                    pass
        write_msg_blocking(az_w, {"loaded": {"f": funcs, "m": mods, "v": vals}})
    except BaseException:  # noqa: BLE001
        _exit(_EXIT_CHANNEL)
    pending = deque(first.get("calls") or ())
    while True:
        if not pending:
            try:
                msg = read_msg_blocking(za_r)
            except BaseException:  # noqa: BLE001 - EOF: the scorer is done with us
                _exit(0)
            pending.extend(msg["calls"] if "calls" in msg else [[msg["call"], msg["args"], msg["kwargs"]]])
        name, enc_args, enc_kwargs = pending.popleft()
        restore(pristine)
        try:
            fn = ns[name]
            args = [decode(a) for a in enc_args]
            kwargs = {k: decode(v) for k, v in enc_kwargs}
            result = fn(*args, **kwargs)
            restore(pristine)
            out = encode(result, liberal=True)
            post = []
            for i, a in enumerate(args):
                if type(a) in (list, dict, set, bytearray):
                    after = encode(a, liberal=True)
                    if after != enc_args[i]:
                        post.append([i, after])
            reply = {"ok": out, "post": post}
        except Unplain as e:
            reply = {"unplain": _short(str(e), 100)}
        except BaseException as e:  # noqa: BLE001 - includes SystemExit, KeyboardInterrupt, MemoryError
            restore(pristine)
            try:
                reply = {"exc": [_short(type(e).__name__, 100), _short(str(e))]}
            except BaseException:  # noqa: BLE001
                reply = {"exc": ["Exception", "undescribable exception"]}
        try:
            write_msg_blocking(az_w, reply)
        except BaseException:  # noqa: BLE001
            _exit(_EXIT_CHANNEL)


# ============================================================================ C: clean fork server
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


# ======================================================================================= Z: scorer
class _UnitTimeout(Exception):
    pass


class _Desync(Exception):
    """The test made a call other than the one planned and sent ahead."""


class _ProgramGone(Exception):
    """The program process died, closed its channel or broke the protocol; message = reason."""


class RemoteError(Exception):
    """An exception raised by program code that has no built-in counterpart (message ``Type: text``)."""


# Program exceptions re-raised in the tests as the built-in type of the same name, except those that act as
# control flow in the harness: StopIteration would end a test's ``map``/``filter``/``zip`` early (``all(map(
# candidate, xs))`` would pass for a function that raises it); they come back as RemoteError.
_CONTROL_FLOW = frozenset({"StopIteration", "StopAsyncIteration", "GeneratorExit"})
_REMOTE_OK = {
    name: cls
    for name, cls in vars(builtins).items()
    if isinstance(cls, type)
    and issubclass(cls, Exception)
    and cls.__module__ == "builtins"
    and name not in _CONTROL_FLOW
}


class _Remote:
    """Stand-in, in the test namespace, for a function defined by the program."""

    __slots__ = ("_name", "_scorer")

    def __init__(self, name: str, scorer: Scorer) -> None:
        self._name = name
        self._scorer = scorer

    def __call__(self, *args, **kwargs):
        return self._scorer.call(self._name, args, kwargs)

    def __repr__(self) -> str:
        return f"<sandboxed function {self._name}>"


class _Program:
    """Scorer-side handle of one program process (A)."""

    def __init__(self, pid: int, w: int, r: int, tmpdir: str) -> None:
        self.pid, self.w, self.r, self.tmpdir = pid, w, r, tmpdir
        try:
            self.stat_fd = os.open(f"/proc/{pid}/schedstat", os.O_RDONLY)
        except OSError:
            self.stat_fd = -1
        try:
            self.cpu_fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        except OSError:
            self.cpu_fd = -1
        self.status: int | None = None

    def run_delay(self) -> float:
        return _run_delay(self.stat_fd)

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) of all the program process's threads so far (/proc/<pid>/stat)."""
        if self.cpu_fd < 0:
            return 0.0
        try:
            fields = os.pread(self.cpu_fd, 1024, 0).rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _CLK_TCK
        except (OSError, ValueError, IndexError):
            return 0.0


def _run_delay(fd: int) -> float:
    """Seconds the task has spent runnable but waiting for a CPU (from /proc/<pid>/schedstat)."""
    if fd < 0:
        return 0.0
    try:
        return int(os.pread(fd, 128, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class Scorer:
    """Z: runs jobs; see the module docstring."""

    def __init__(self, cfg: dict, ctrl: socket.socket) -> None:
        self.cfg = cfg
        self.ctrl = ctrl
        self.self_stat = (
            os.open("/proc/self/schedstat", os.O_RDONLY) if os.path.exists("/proc/self/schedstat") else -1
        )
        self.prog: _Program | None = None
        self.unit_clock: tuple[float, float, float] | None = None  # (t0, wait0, timeout)
        self.unit_cpu0: float | None = None  # program CPU seconds when the unit's clock started
        self.wall_factor = float(cfg.get("wall_factor", 10.0))
        self.max_msg = int(cfg.get("max_message_bytes", 32 << 20))
        self.max_nodes = int(cfg.get("max_value_nodes", 1 << 20))
        self.compiled: dict[str, object] = {}
        self.inflight: deque = deque()  # planned calls sent ahead to A, replies pending, in order
        self.idle: deque = deque()  # program processes announced by C, not yet used: (pid, tmpdir, fds)
        self.unacked = 0  # program processes handed back to C whose clean-up C has not confirmed yet
        self.rbuf = bytearray()
        self.in_unit = False
        signal.signal(signal.SIGALRM, self._on_alarm)

    # ------------------------------------------------------------------ timing
    def _on_alarm(self, signum, frame):
        if self.in_unit:
            raise _UnitTimeout()

    def _waits(self) -> float:
        w = _run_delay(self.self_stat)
        if self.prog is not None:
            w += self.prog.run_delay()
        return w

    def _remaining(self) -> float:
        """Effective seconds left in the current unit: wall time minus time A and Z spent waiting for a CPU
        (so a loaded machine does not turn slow-but-correct code into timeouts); capped at wall_factor x."""
        t0, w0, limit = self.unit_clock
        now = time.monotonic()
        wall = now - t0
        if wall >= limit * self.wall_factor:
            return 0.0
        if wall < limit:
            return limit - wall
        return limit - self._effective(wall, w0)

    def _effective(self, wall: float, w0: float) -> float:
        """Wall time minus time spent waiting for a CPU, but never less than the CPU time the program process
        used in the unit (all its threads: a program cannot pass work off as "waiting" by keeping its main
        thread runnable behind its own threads)."""
        eff = wall - max(0.0, self._waits() - w0)
        p = self.prog
        if p is not None and self.unit_cpu0 is not None:
            eff = max(eff, p.cpu_seconds() - self.unit_cpu0)
        return max(0.0, eff)

    def _deadline(self) -> float:
        """``time.monotonic()`` value at which the current unit runs out of (effective) time."""
        return time.monotonic() + max(0.0, self._remaining())

    def _start_clock(self, limit: float) -> None:
        self.unit_clock = (time.monotonic(), self._waits(), limit)
        self.unit_cpu0 = None  # read lazily in _read_exact

    def _effective_elapsed(self) -> float:
        t0, w0, _ = self.unit_clock
        wall = time.monotonic() - t0
        if wall < 0.002:  # not worth the /proc reads
            return wall
        return self._effective(wall, w0)

    # ------------------------------------------------------------------ program process management
    def _ctrl_next(self, kind: bytes) -> tuple[int, bytes, list[int]]:
        """Next message of ``kind`` from C: b"I" (an idle program process: pid, tmpdir, its 2 fds; announced
        ones are queued in ``self.idle``) or b"S" (a wait status: status, b"", []; idle announcements that
        arrive first are queued)."""
        if kind == b"I" and self.idle:
            return self.idle.popleft()
        while True:
            got, value, rest, fds = self._ctrl_recv()
            if got == kind:
                return value, rest, fds
            if got != b"I" or len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                raise SystemExit(f"clean fork server sent {got!r} with {len(fds)} fds, expected {kind!r}")
            self.idle.append((value, rest, fds))

    def _ctrl_recv(self) -> tuple[bytes, int, bytes, list[int]]:
        """Next message from C (blocking: C answers at once): (kind b"I" or b"S", pid or status, rest, fds)."""
        try:
            msg, fds, _flags, _addr = socket.recv_fds(self.ctrl, 1 << 16, 2)
        except OSError as e:
            raise SystemExit(f"clean fork server is gone: {e}") from e
        if len(msg) < 9:
            for fd in fds:
                os.close(fd)
            raise SystemExit("clean fork server is gone" if not msg else f"clean fork server sent {msg!r}")
        return msg[:1], _CTRL_PID.unpack_from(msg, 1)[0], msg[9:], fds

    def _spawn(self, first: dict, calls: list, code: bytes = b"") -> None:
        """Take the program process C forked ahead and send it the job (program or its marshalled ``code``,
        CPU limit, planned calls)."""
        self._drain_finished()
        pid, tmpdir, fds = self._ctrl_next(b"I")
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            raise SystemExit(f"clean fork server announced a program process with {len(fds)} fds")
        za_w, az_r = fds
        os.set_blocking(za_w, False)
        os.set_blocking(az_r, False)
        self.prog = _Program(pid, za_w, az_r, tmpdir.decode())
        self._send({**first, "calls": [c[:3] for c in calls]}, code)
        self.inflight.extend(calls)

    def kill_program(self, want_status: bool = False) -> int | None:
        """Have C kill the program process (and anything of its uid) and remove its directory.
        Returns the program process's wait status when ``want_status`` (None if unknown)."""
        p = self.prog
        if p is None:
            return None
        self.prog = None
        self.inflight.clear()
        self.rbuf.clear()
        self.in_unit = False  # no timer exception in the middle of the clean-up
        for fd in (p.w, p.r, p.stat_fd, p.cpu_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        try:
            self.ctrl.send(_CTRL_FINISH.pack(p.pid, want_status))
        except OSError as e:
            raise SystemExit(f"clean fork server is gone: {e}") from e
        self.unacked += 1
        if not want_status:
            return None
        st = self._drain_finished()
        return st if st >= 0 else None

    def _drain_finished(self) -> int:
        """Wait until C has finished (killed, reaped, cleaned up) every program process handed back to it;
        returns the last one's wait status (-1 if unknown or none)."""
        st = -1
        while self.unacked:
            st, _, fds = self._ctrl_next(b"S")
            for fd in fds:
                os.close(fd)
            self.unacked -= 1
        return st

    # ------------------------------------------------------------------ channel to A
    def _send(self, obj, raw: bytes = b"") -> None:
        """Send ``obj`` (framed JSON), then ``raw`` bytes as they are, to A (within the unit's time)."""
        p = self.prog
        data = json.dumps(obj, separators=(",", ":")).encode("utf-8", "surrogatepass")
        view = memoryview(_LEN.pack(len(data)) + data + raw)
        while view:
            rem = self._remaining()
            if rem <= 0:
                raise _UnitTimeout()
            _, w, _ = select.select([], [p.w], [], rem)
            if not w:
                continue
            try:
                n = os.write(p.w, view)
            except BlockingIOError:
                continue
            except OSError as e:
                raise _ProgramGone(self._gone_reason()) from e
            view = view[n:]

    def _read_exact(self, n: int) -> bytes:
        """n bytes from A (buffered: several pipelined replies are usually read with one system call)."""
        p = self.prog
        buf = self.rbuf
        while len(buf) < n:
            try:
                b = os.read(p.r, max(n - len(buf), 1 << 16))
            except BlockingIOError:
                rem = self._remaining()
                if rem <= 0:
                    raise _UnitTimeout() from None
                if self.unit_cpu0 is None and self.unit_clock is not None:
                    # the program's CPU time is read once the unit has waited _CPU_READ_AFTER for it, not at
                    # every unit's start (most units end well before; the floor misses at most that much)
                    due = self.unit_clock[0] + _CPU_READ_AFTER - time.monotonic()
                    ready = due > 0 and select.select([p.r], [], [], min(rem, due))[0]
                    if not ready:
                        self.unit_cpu0 = p.cpu_seconds()
                    continue
                select.select([p.r], [], [], rem)
                continue
            except OSError as e:
                raise _ProgramGone(self._gone_reason()) from e
            if not b:
                raise _ProgramGone(self._gone_reason())
            buf += b
        out = bytes(buf[:n])
        del buf[:n]
        return out

    def _recv(self):
        (n,) = _LEN.unpack(self._read_exact(4))
        if n > self.max_msg:
            raise _ProgramGone(f"program sent {n} bytes (limit {self.max_msg})")
        try:
            return json.loads(self._read_exact(n).decode("utf-8", "surrogatepass"))
        except (ValueError, RecursionError) as e:
            raise _ProgramGone(f"malformed message from the program ({type(e).__name__})") from e

    def _gone_reason(self) -> str:
        status = self.kill_program(want_status=True)
        if status is None:
            return "program process vanished"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = _SIGNAMES.get(sig, str(sig))
            if sig == signal.SIGKILL:
                return "program process was killed (SIGKILL) or closed its channel to the scorer"
            if sig == signal.SIGXCPU:
                return "killed: CPU time limit (SIGXCPU)"
            if sig == signal.SIGSEGV:
                return "crashed: SIGSEGV (stack overflow or memory limit)"
            return f"crashed: killed by signal {name}"
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
            if code in (_EXIT_SETUP, _EXIT_CHANNEL):
                return f"program broke its channel to the scorer (exit code {code})"
            return f"program exited (code {code}) instead of returning"
        return "program process died"

    def call(self, name: str, args: tuple, kwargs: dict):
        """Forward ``name(*args, **kwargs)`` to A; return its plain-data result (or raise its exception)."""
        if self.prog is None:
            raise _ProgramGone("program process is gone")
        try:
            enc_args = [encode(a) for a in args]
            enc_kwargs = [[k, encode(v)] for k, v in kwargs.items()]
        except Unplain as e:
            raise TypeError(f"test passed a {e} that cannot be sent into the sandbox") from None
        if self.inflight:  # this call was planned and sent ahead (see _plan): its reply is next in the pipe
            planned = self.inflight.popleft()
            if planned[:3] != [name, enc_args, enc_kwargs]:
                raise _Desync()
        else:
            self._send({"call": name, "args": enc_args, "kwargs": enc_kwargs})
        reply = self._recv()
        try:
            if type(reply) is not dict:
                raise ValueError("reply is not an object")
            if "ok" in reply:
                dec = _Decoder(self._deadline(), self.max_nodes)
                value = dec.decode(reply["ok"])
                post = reply.get("post", [])
                if type(post) is not list or len(post) > len(args):
                    raise ValueError("bad mutation list")
                for item in post:
                    i, after = item
                    _apply_mutation(args[i], dec.decode(after), dec)
                return value
            if "unplain" in reply:
                what = reply["unplain"]
                err = TypeError(
                    f"{name}() returned a value of type {str(what)[:80]!r}; only built-in data types "
                    "(None, bool, int, float, complex, str, bytes, list, tuple, dict, set) leave the sandbox"
                )
            elif "exc" in reply:
                tname, msg = (str(x) for x in reply["exc"])
                err = _remote_exception(tname[:100], msg[:300])
            else:
                raise ValueError("unknown reply")
        except _UnitTimeout:
            raise
        except Exception as e:  # noqa: BLE001 - anything a forged reply provokes (OverflowError, MemoryError...)
            raise _ProgramGone(f"malformed reply from the program ({type(e).__name__})") from e
        raise err

    # ------------------------------------------------------------------ jobs
    def _code(self, src: str, kind: str):
        code = self.compiled.get(src)
        if code is None:
            code = compile(src, f"<{kind}>", "exec")
            if len(self.compiled) > 4096:
                self.compiled.clear()
            self.compiled[src] = code
        return code

    def _load(self, job: dict, calls: list, code: bytes | None) -> tuple[dict | None, str]:
        """Start A with the job's program (``code``: compiled and marshalled by :meth:`_compile`; None: A
        compiles the source) and the calls planned for the next units. Returns (base namespace for tests, "")
        or (None, reason)."""
        timeout = float(job["timeout"])
        n_units = max(1, len(job["asserts"]))
        first: dict = {"cpu_s": int(2 * timeout * (n_units + 1)) + 2}
        if code is None:
            first["program"] = job["program"]
        else:
            first["code_bytes"] = len(code)
        self._drain_finished()  # the previous program's clean-up is not this program's time
        self._start_clock(timeout)
        try:
            self._spawn(first, calls, code or b"")
            reply = self._recv()
        except _UnitTimeout:
            self.kill_program()
            return None, f"{_TIMEOUT} {timeout}s"
        except _ProgramGone as e:
            self.kill_program()
            return None, str(e)
        if type(reply) is dict and "load_error" in reply:
            self.kill_program()
            return None, _short(str(reply["load_error"]))
        try:
            info = reply["loaded"]
            dec = _Decoder(self._deadline(), self.max_nodes)
            base: dict = {}
            if len(info["f"]) + len(info["m"]) + len(info["v"]) > _MAX_GLOBALS:
                raise ValueError("too many globals")
            for name in info["f"]:
                dec._tick(True)
                if _bindable(name):
                    base[name] = _Remote(name, self)
            for name, modname in info["m"]:
                dec._tick(True)
                mod = _test_module(modname)
                if mod is not None and _bindable(name):
                    base[name] = mod
            for name, e in info["v"]:
                dec._tick(True)
                if _bindable(name):
                    base[name] = dec.decode(e)
            # the scorer's own builtins and module name, whatever the report said
            base["__builtins__"] = builtins
            base["__name__"] = "__sandbox_test__"
        except _UnitTimeout:
            self.kill_program()
            return None, f"{_TIMEOUT} {timeout}s (decoding the program's globals)"
        except Exception:  # noqa: BLE001 - anything a forged report provokes (OverflowError, MemoryError...)
            self.kill_program()
            return None, "program sent a malformed load report"
        return base, ""

    @staticmethod
    def _compile(program: str) -> tuple[bytes | None, str]:
        """(marshalled code object, "") for a program up to COMPILE_IN_SCORER_MAX characters; (None, reason)
        when it does not compile; (None, "") when it is larger (A compiles it). Compiling runs no program code."""
        if len(program) > COMPILE_IN_SCORER_MAX:
            return None, ""
        try:
            return marshal.dumps(compile(program, "<program>", "exec", dont_inherit=True)), ""
        except Exception as e:  # noqa: BLE001 - SyntaxError, ValueError (null bytes), RecursionError, MemoryError
            return None, _describe(e)

    def run_job(self, job: dict) -> dict:
        units_src = job["asserts"]
        setup_src = job.get("setup", "")
        timeout = float(job["timeout"])
        outcomes: list[list] = []
        try:
            setup_code = self._code(setup_src, "setup")
        except SyntaxError as e:
            return {
                "o": [[False, f"test setup does not compile: {_describe(e)}", 0.0]] * len(units_src),
                "e": "",
            }
        codes: list = []
        for src in units_src:
            try:
                codes.append(self._code(src, "assert"))
            except SyntaxError as e:
                codes.append(f"assert does not compile: {_describe(e)}")
        plans = [
            None if isinstance(c, str) else _plan(setup_src, src)
            for src, c in zip(units_src, codes, strict=True)
        ]
        program_code, err = self._compile(job["program"])
        base = None
        if not err:
            base, err = self._load(job, self._calls_from(plans, 0), program_code)
        if base is None:
            reason = f"program failed to load: {err}"
            return {"o": [[False, reason, 0.0] for _ in units_src], "e": reason}
        # the setup must run against the loaded program (e.g. ``candidate = entry_point``)
        ok, reason, _ = self._unit(base, setup_code, None, timeout)
        if not ok:
            self.kill_program()
            reason = f"program failed to load: {reason} (in test setup)"
            return {"o": [[False, reason, 0.0] for _ in units_src], "e": reason}
        i, unplanned, timeouts = 0, -1, 0
        max_timeouts = job.get("max_timeouts")
        while i < len(units_src):
            if max_timeouts is not None and timeouts >= max_timeouts:
                skipped = f"not run: the job stopped after {timeouts} timed-out assert(s)"
                outcomes.extend([False, skipped, 0.0] for _ in range(i, len(units_src)))
                break
            code = codes[i]
            if isinstance(code, str):
                outcomes.append([False, code, 0.0])
                i += 1
                continue
            if self.prog is None:
                base, err = self._load(
                    job, self._calls_from(plans, i) if i != unplanned else [], program_code
                )
                if base is None:
                    outcomes.append([False, f"program failed to load: {err}", 0.0])
                    timeouts += err.startswith(_TIMEOUT)
                    i += 1
                    continue
            elif not self.inflight and i != unplanned:
                calls = self._calls_from(plans, i)
                if calls:
                    self._start_clock(timeout)
                    try:
                        self._send({"calls": [c[:3] for c in calls]})
                        self.inflight.extend(calls)
                    except (_UnitTimeout, _ProgramGone):
                        self.kill_program()
                        continue
            try:
                outcome = self._unit(base, setup_code, code, timeout)
            except _Desync:  # cannot happen with the planning rules; to be safe, redo the unit unplanned
                self.kill_program()
                unplanned = i
                continue
            if (
                self.inflight and self.inflight[0][3] == i
            ):  # planned calls the unit did not make: start afresh
                self.kill_program()
            outcomes.append(list(outcome))
            timeouts += outcome[1].startswith(_TIMEOUT)
            i += 1
        self.kill_program()
        return {"o": outcomes, "e": ""}

    @staticmethod
    def _calls_from(plans: list, start: int, limit: int = 256) -> list:
        """Planned calls of the consecutive plannable units from ``start``: [name, args, kwargs, unit index]."""
        out: list = []
        for i in range(start, len(plans)):
            plan = plans[i]
            if plan is None or len(out) + len(plan) > limit:
                break
            out.extend([name, args, kwargs, i] for name, args, kwargs in plan)
        return out

    def _unit(self, base: dict, setup_code, code, timeout: float) -> tuple[bool, str, float]:
        """Run setup (+ one assert unit) in a fresh namespace. Returns (passed, reason, effective seconds)."""
        ns = dict(base)
        random.seed(0)
        self._start_clock(timeout)
        self.in_unit = True
        signal.setitimer(signal.ITIMER_REAL, timeout * self.wall_factor + 0.05)
        passed, reason, restart = False, "", False
        try:
            exec(setup_code, ns)  # noqa: S102 - trusted test code
            if code is not None:
                exec(code, ns)  # noqa: S102 - trusted test code
            passed = True
        except _Desync:
            raise
        except _UnitTimeout:
            reason, restart = f"{_TIMEOUT} {timeout}s", True
        except _ProgramGone as e:
            reason, restart = str(e), True
        except AssertionError as e:
            msg = _short(str(e), 200)
            reason = f"AssertionError: {msg}" if msg else "AssertionError"
        except RemoteError as e:
            reason = _short(str(e))
        except RecursionError as e:  # in the scorer: e.g. a deeply nested value from the program
            reason = _describe(e)
        except BaseException as e:  # noqa: BLE001 - test code raised (e.g. the program's exception, re-raised)
            reason = _describe(e)
        finally:
            self.in_unit = False
            signal.setitimer(signal.ITIMER_REAL, 0)
        elapsed = self._effective_elapsed()
        if restart:
            self.kill_program()
        return passed, reason, round(elapsed, 6)


_PLANS: dict[tuple[str, str], list | None] = {}


def _plan(setup: str, unit: str) -> list | None:
    """The program calls an assert unit is certain to make, in order, when that is known before running it.

    Plannable: the unit is imports/no-op names followed by one ``assert`` without a message; every call in its
    test is to a builtin or to a name the setup binds to another name (``candidate = f``), the latter with
    literal arguments only; nothing is evaluated conditionally (and/or, if-else, chained comparisons,
    comprehensions, lambdas). Returns [[function name, encoded args, encoded kwargs], ...] or None. The scorer
    sends planned calls ahead so that the program process runs them back to back (one round trip instead of
    one per call); the verdict is still computed by running the unit, which must make exactly these calls.
    """
    key = (setup, unit)
    if key in _PLANS:
        return _PLANS[key]
    import ast  # imported by the scorer at start-up, after forking the fork server (which need not carry it)

    conditional = (
        ast.BoolOp,
        ast.IfExp,
        ast.Lambda,
        ast.ListComp,
        ast.SetComp,
        ast.DictComp,
        ast.GeneratorExp,
        ast.NamedExpr,
        ast.Await,
        ast.Yield,
        ast.YieldFrom,
        ast.Starred,
    )
    plan = None
    try:
        aliases = {}
        for node in ast.parse(setup).body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Name)
            ):
                aliases[node.targets[0].id] = node.value.id
        body = ast.parse(unit).body
        ok = bool(body) and isinstance(body[-1], ast.Assert) and body[-1].msg is None
        ok = ok and all(
            isinstance(st, (ast.Import, ast.ImportFrom, ast.Pass))
            or (isinstance(st, ast.Expr) and isinstance(st.value, ast.Name))
            for st in body[:-1]
        )
        bound = {
            a.asname or a.name.split(".")[0]
            for st in body[:-1]
            if isinstance(st, (ast.Import, ast.ImportFrom))
            for a in st.names
        }
        calls: list = []
        if ok:
            for n in ast.walk(body[-1].test):
                if isinstance(n, conditional) or (isinstance(n, ast.Compare) and len(n.ops) > 1):
                    ok = False
                    break
                if not isinstance(n, ast.Call):
                    continue
                f = n.func
                if not isinstance(f, ast.Name) or f.id in bound or any(k.arg is None for k in n.keywords):
                    ok = False
                    break
                if f.id in aliases:
                    args = [encode(ast.literal_eval(x)) for x in n.args]
                    kwargs = [[k.arg, encode(ast.literal_eval(k.value))] for k in n.keywords]
                    calls.append(((n.lineno, n.col_offset), [aliases[f.id], args, kwargs]))
                elif f.id not in _BUILTIN_NAMES or f.id in aliases.values():
                    ok = False
                    break
        if ok:
            plan = [c for _, c in sorted(calls, key=lambda c: c[0])]
    except (SyntaxError, ValueError, TypeError, Unplain, RecursionError, MemoryError):
        plan = None
    if len(_PLANS) > 8192:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def _remote_exception(tname: str, msg: str) -> BaseException:
    cls = _REMOTE_OK.get(tname)
    if cls is not None:
        try:
            return cls(msg)
        except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError needs 5 arguments
            pass
    return RemoteError(f"{tname}: {msg}" if msg else tname)


def _apply_mutation(arg, after, dec: _Decoder) -> None:
    """Reflect, on the scorer's argument object, an in-place change the program made to its copy (the new
    value must have the argument's type; sets and dicts are refilled one item at a time under the clock)."""
    t = type(arg)
    if type(after) is not t:
        raise ValueError("mutation changes the argument's type")
    if t is list or t is bytearray:
        arg[:] = after
    elif t is dict:
        arg.clear()
        dec.fill_dict(arg, list(after.items()), decoded=True)
    elif t is set:
        arg.clear()
        dec.fill_set(arg, list(after), decoded=True)


_TEST_MODULE_OBJECTS: dict[str, object] = {}
_MAX_GLOBALS = 10_000  # names in a load report


def _import_test_modules() -> None:
    """Import :data:`TEST_MODULES` in the scorer (at start-up, before any job: no program exists yet)."""
    import importlib

    for name in TEST_MODULES:
        with contextlib.suppress(Exception):
            _TEST_MODULE_OBJECTS[name] = importlib.import_module(name)


def _test_module(name: str):
    """The scorer's own module object for ``name`` if it is in the fixed allow-list, else None. No import."""
    return _TEST_MODULE_OBJECTS.get(name) if type(name) is str else None


def _bindable(name) -> bool:
    """May a program's global named ``name`` be bound in the tests' namespace? Not a builtin's name, not a
    keyword, not a dunder (``__builtins__``, ``__name__``...): the tests always run under the scorer's own
    builtins."""
    return (
        type(name) is str
        and name.isidentifier()
        and not (name.startswith("__") and name.endswith("__"))
        and name not in _BUILTIN_NAMES
        and not _iskeyword(name)
    )


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


def _prctl(option: int, arg: int = 1) -> bool:
    """prctl(2) through ctypes, which is then dropped from sys.modules (A must not find it loaded)."""
    ok = False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.prctl(option, arg, 0, 0, 0) == 0
        del libc
    except Exception:  # noqa: BLE001
        pass
    _drop_ctypes()
    return ok


# ------------------------------------------------------------------------------ least privilege
#: uid/gid the scorer runs as after forking the fork server (programs get fresh uids from 1,000,000 up).
SCORER_UID = 999_999
# System calls refused (EPERM) to the scorer, the fork server and every program process, by a seccomp filter
# the scorer installs on itself before forking (inherited, cannot be removed): anonymous memory files
# (``memfd_create`` buffers are not counted by RLIMIT_AS) and System V shared memory, semaphores and message
# queues (they outlive the process), ``socket`` (no network and no host services even if a program disables
# the audit hook; the scorer's own channels are socketpairs and pipes), device/fifo nodes (``mknod`` leaves
# files the audit hook cannot see), tracing and reading other processes, mounting and namespaces, keyrings,
# BPF, io_uring, userfaultfd. ``clone3`` answers ENOSYS (the C library then uses ``clone``, whose namespace flags are refused).
_SECCOMP_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SECCOMP_DENY = {
    "x86_64": (29, 30, 31, 41, 64, 68, 101, 133, 155, 161, 165, 166, 175, 246, 248, 249, 250, 259, 272, 298,
               303, 304, 308, 310, 311, 313, 319, 320, 321, 323, 425, 426, 427, 428, 429, 430, 431, 432, 433,
               438, 447),
    "aarch64": (33, 39, 40, 41, 51, 97, 104, 105, 117, 186, 190, 194, 195, 196, 198, 217, 218, 219, 241, 264,
                265, 268, 270, 271, 273, 279, 280, 282, 294, 425, 426, 427, 428, 429, 430, 431, 432, 433, 438,
                447),
}  # fmt: skip
_SECCOMP_CLONE = {"x86_64": (56, 435), "aarch64": (220, 435)}
_CLONE_NS_FLAGS = 0x7E020080  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME


# Program processes add a second filter (installed by each one on itself before running the program): no new
# processes and no exec at all (``fork``, ``vfork``, ``execve``, ``execveat``; ``clone`` only with
# CLONE_THREAD, i.e. threads), so work cannot be hidden in, or outlive the job as, a child process even with
# the audit hook switched off.
_SECCOMP_PROGRAM_DENY = {"x86_64": (57, 58, 59, 322), "aarch64": (221, 281)}
_CLONE_THREAD = 0x00010000


def _seccomp_program(machine: str, program: bool = False) -> list[tuple[int, int, int, int]]:
    """Classic BPF for ``seccomp(SECCOMP_MODE_FILTER)``: (code, jt, jf, k) per instruction. ``program``: the
    program processes' filter (no fork/exec, clone for threads only) instead of the worker's."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    clone, clone3 = _SECCOMP_CLONE[machine]
    deny = _SECCOMP_PROGRAM_DENY[machine] if program else _SECCOMP_DENY[machine]
    # labels resolved below: "deny", "enosys", "clone" (classic BPF jumps only forward)
    body: list = [(ld, 0, 0, 4), (jeq, 1, 0, _SECCOMP_ARCH[machine]), (ret, 0, 0, eperm), (ld, 0, 0, 0)]
    if machine == "x86_64":
        body.append((jge, "deny", 0, 0x40000000))  # the x32 ABI
    body.append((jeq, "enosys", 0, clone3))
    body.append((jeq, "clone", 0, clone))
    body.extend((jeq, "deny", 0, nr) for nr in deny)
    body.append((ret, 0, 0, allow))
    labels = {"clone": len(body)}
    body.extend([(ld, 0, 0, 16), (jset, "deny", 0, _CLONE_NS_FLAGS)])
    if program:  # threads only: CLONE_THREAD set -> the next instruction allows; else skip it to "deny"
        body.extend([(jset, 0, 1, _CLONE_THREAD), (ret, 0, 0, allow)])
    else:
        body.append((ret, 0, 0, allow))
    labels["deny"] = len(body)
    body.append((ret, 0, 0, eperm))
    labels["enosys"] = len(body)
    body.append((ret, 0, 0, enosys))
    out = []
    for i, (code, jt, jf, k) in enumerate(body):
        if isinstance(jt, str):
            jt = labels[jt] - i - 1
        out.append((code, jt, jf, k))
    return out


def _seccomp_installer(program: bool = False):
    """A zero-argument function that installs the filter on the calling process and returns "" or why not;
    built ahead (ctypes structures and ``prctl``), so that the fork server prepares the program processes'
    filter once and each program process only calls it. None when the architecture is not supported."""
    machine = os.uname().machine
    if machine not in _SECCOMP_ARCH:
        return None
    import ctypes

    class Filter(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_ushort),
            ("jt", ctypes.c_ubyte),
            ("jf", ctypes.c_ubyte),
            ("k", ctypes.c_uint32),
        ]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    ins = _seccomp_program(machine, program)
    arr = (Filter * len(ins))(*[Filter(*x) for x in ins])
    prog = Prog(len(ins), ctypes.cast(arr, ctypes.POINTER(Filter)))
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    ref = ctypes.byref(prog)
    get_errno = ctypes.get_errno

    def install() -> str:
        keep = arr  # noqa: F841 - the filter array must outlive this call
        if prctl(22, 2, ref, 0, 0) == 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
            return ""
        return f"no seccomp filter: prctl failed (errno {get_errno()})"

    return install


def _install_seccomp() -> str:
    """Install the worker's filter on this process (inherited by every later child). Returns "" or why not."""
    try:
        install = _seccomp_installer()
        return install() if install else f"no seccomp filter: architecture {os.uname().machine} not supported"
    except Exception as e:  # noqa: BLE001
        return f"no seccomp filter: {e}"
    finally:
        _drop_ctypes()


def _drop_ctypes() -> None:
    for mod in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[mod]


def _cover(libc, ctypes, d: str, keep: set[str]) -> list[str]:
    """Cover directory ``d`` (e.g. the project checkout, holding the problems files) with an empty read-only
    tmpfs, bind-mounting back the paths in ``keep`` that lie under it (the interpreter, its virtualenv)."""
    d = os.path.realpath(d)
    system = ("/usr", "/bin", "/lib", "/lib64", "/etc", "/proc", "/dev", "/sys")
    if d == "/" or not os.path.isdir(d) or any(x == d or x.startswith(d + "/") for x in system):
        return [f"cannot cover {d}: it holds system directories"]
    if any(d == k or d.startswith(k + "/") for k in keep):
        return []  # d lies inside the interpreter's own tree
    inside = sorted(k for k in keep if k.startswith(d + "/") and os.path.isdir(k))
    fds = [os.open(k, os.O_PATH | os.O_DIRECTORY) for k in inside]
    try:
        if libc.mount(b"tmpfs", d.encode(), b"tmpfs", 0x2 | 0x4, b"size=64k,mode=0755") != 0:
            return [f"cannot cover {d} (errno {ctypes.get_errno()})"]
        for k, fd in zip(inside, fds, strict=True):
            os.makedirs(k, exist_ok=True)
            if (
                libc.mount(f"/proc/self/fd/{fd}".encode(), k.encode(), None, 4096 | 16384, None) != 0
            ):  # MS_BIND|REC
                return [f"cannot keep {k} visible under {d} (errno {ctypes.get_errno()})"]
        libc.mount(None, d.encode(), None, 32 | 1 | 0x2 | 0x4, None)  # MS_REMOUNT | MS_RDONLY
        return []
    finally:
        for fd in fds:
            os.close(fd)


def _private_mounts(hidden: list[str], tmp_root: str, cover: list[str] = ()) -> str:
    """Process isolation as root (no bubblewrap): a private mount namespace for the scorer, its fork server
    and every program process, in which ``hidden`` directories (reference solutions shipped with packages) are
    covered by empty read-only tmpfs mounts, world-writable directories (/dev/shm, /tmp, /var/tmp, /run/lock)
    by private 512 MiB tmpfs mounts (``tmp_root``, the jobs' directory, is made again inside), and /proc is a
    new procfs with ``hidepid=2`` (a program sees only its own processes: not the command lines naming the
    problems file), and each ``cover`` directory (the project checkout) is hidden by :func:`_cover`. Returns ""
    or why not."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = [
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_ulong,
            ctypes.c_char_p,
        ]
        if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
            return f"no private mounts: unshare failed (errno {ctypes.get_errno()})"
        if libc.mount(b"none", b"/", None, 0x40000 | 0x4000, None) != 0:  # MS_PRIVATE | MS_REC
            return f"no private mounts: cannot make / private (errno {ctypes.get_errno()})"
        notes = []
        for h in hidden:
            if libc.mount(b"tmpfs", h.encode(), b"tmpfs", 0x1 | 0x2 | 0x4 | 0x8, b"size=4k,mode=0555") != 0:
                notes.append(f"cannot hide {h} (errno {ctypes.get_errno()})")
        # world-writable directories get a fresh, size-limited tmpfs that only root may write (mode 0711: a
        # program writes only in its own job directory, so no file reaches the host or a later program, and the
        # host's RAM-backed /dev/shm cannot be filled), unless the interpreter lives there
        prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.executable)}
        for d in ("/dev/shm", "/tmp", "/var/tmp", "/run/lock"):
            if not os.path.isdir(d) or any(p == d or p.startswith(d + "/") for p in prefixes):
                continue
            if libc.mount(b"tmpfs", d.encode(), b"tmpfs", 0x2 | 0x4, b"size=512m,mode=0711") != 0:
                notes.append(f"cannot mount a private {d} (errno {ctypes.get_errno()})")
            elif tmp_root == d or tmp_root.startswith(d + "/"):
                os.makedirs(tmp_root, mode=0o711, exist_ok=True)
                os.chmod(tmp_root, 0o711)
        for d in cover:
            notes.extend(_cover(libc, ctypes, d, prefixes | {os.path.realpath(tmp_root)}))
        opts = f"hidepid=2,gid={SCORER_UID}".encode()
        if libc.mount(b"proc", b"/proc", b"proc", 0x2 | 0x4 | 0x8, opts) != 0:  # nosuid,nodev,noexec
            notes.append(f"cannot mount /proc with hidepid (errno {ctypes.get_errno()})")
        del libc
        return "; ".join(notes)
    except Exception as e:  # noqa: BLE001
        return f"no private mounts: {e}"
    finally:
        _drop_ctypes()


def _drop_scorer_privileges(memory_mb: int) -> str:
    """The scorer gives up root (all capabilities) for :data:`SCORER_UID` and limits its own address space.
    Returns "" or why not."""
    notes = ""
    if os.geteuid() == 0:
        try:
            os.setgroups([])
            os.setgid(SCORER_UID)
            os.setuid(SCORER_UID)
        except OSError as e:
            notes = f"scorer kept its uid: {e}"
    with contextlib.suppress(ValueError, OSError):
        lim = int(memory_mb) << 20
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    return notes


def main() -> None:
    """Entry of Z. fd 0: jobs from the parent; fd 1: results to the parent."""
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    try:
        cfg = read_msg_blocking(rfd)
    except ChannelClosed:
        return
    os.chdir("/")  # the scorer's working directory: nothing a program can write
    _prctl(38)  # PR_SET_NO_NEW_PRIVS, inherited by C and every A: no setuid binary can regain privileges
    notes = []
    if cfg.get("root") and cfg.get("private_mounts"):
        notes.append(
            _private_mounts(
                list(cfg.get("hidden", ())), str(cfg.get("tmp_root", "")), list(cfg.get("cover", ()))
            )
        )
    notes.append(_install_seccomp())
    ctrl_z, ctrl_c = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    c_pid = os.fork()
    if c_pid == 0:
        try:
            os.close(rfd)
            os.close(wfd)
            ctrl_z.close()
            a_cfg = {
                k: cfg[k] for k in ("root", "tmp_root", "memory_mb", "fsize", "nofile", "nproc", "hidden")
            }
            clean_server(ctrl_c, PRELOAD_FULL if cfg.get("preload") == "full" else PRELOAD_SMALL, a_cfg)
        finally:
            os._exit(0)
    ctrl_c.close()
    import ast  # noqa: F401 - everything the scorer uses is imported before the first job

    _import_test_modules()
    scorer = Scorer(cfg, ctrl_z)
    notes.append(_drop_scorer_privileges(int(cfg.get("scorer_memory_mb", 2048))))
    write_msg_blocking(wfd, {"ready": True, "pid": os.getpid(), "notes": [n for n in notes if n]})
    while True:
        try:
            job = read_msg_blocking(rfd)
        except (ChannelClosed, OSError):
            break
        try:
            result = scorer.run_job(job)
        except SystemExit as e:
            write_msg_blocking(wfd, {"fatal": f"sandbox failure: {e}"})
            break
        except BaseException as e:  # noqa: BLE001 - report, keep serving
            scorer.kill_program()
            n = len(job.get("asserts", ()))
            reason = f"sandbox failure: {_describe(e)}"
            result = {"o": [[False, reason, 0.0]] * n, "e": reason}
        write_msg_blocking(wfd, result)
    scorer.kill_program()
    ctrl_z.close()  # C cleans up and exits on EOF
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            if os.waitpid(c_pid, os.WNOHANG)[0] == c_pid:
                return
        except ChildProcessError:
            return
        time.sleep(0.01)
    try:
        os.kill(c_pid, signal.SIGKILL)
        os.waitpid(c_pid, 0)
    except OSError:
        pass


if __name__ == "__main__":
    main()
