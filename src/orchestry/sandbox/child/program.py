"""``A``, the program process (untrusted): set-up after the fork (descriptors, limits, uid, seccomp filter, audit
hook), then loading the program and answering the scorer's calls."""

from __future__ import annotations

import builtins
import contextlib
import json
import marshal
import os
import resource
import sys
from collections import deque

from .codec import Unplain, decode, encode
from .protocol import _describe, _short, read_exact_blocking, read_msg_blocking, write_msg_blocking

_EXIT_SETUP, _EXIT_CHANNEL = 70, 72  # exit codes of a program process that could not talk to the scorer


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
