"""Least privilege for the worker's processes: seccomp filters, private mounts (process isolation as root), the
scorer's privilege drop, and ``prctl``/``ctypes`` helpers (``ctypes`` never stays loaded)."""

from __future__ import annotations

import contextlib
import os
import resource
import sys


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
