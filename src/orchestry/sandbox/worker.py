"""One worker slot seen from the parent: the scorer process (optionally inside bubblewrap), its pipes and the
framing of the messages on them."""

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
import time

from .isolation import (
    _CHILD_IN_BWRAP,
    _bwrap_command,
    _child_pyc,
    _clean_env,
    _hidden_paths,
    _is_root,
    _project_dirs,
    _python_argv,
)
from .jobs import SandboxError

log = logging.getLogger("orchestry.sandbox")

_LEN = struct.Struct(">I")
_LOGGED: set[str] = set()  # isolation layers and worker notes already logged by this process


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
