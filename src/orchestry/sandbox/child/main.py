"""Entry of the worker program (``Z``): read the configuration, harden, fork the clean fork server, serve jobs."""

from __future__ import annotations

import os
import signal
import socket
import time

from .bindings import _import_test_modules
from .fork_server import PRELOAD_FULL, PRELOAD_SMALL, clean_server
from .hardening import _drop_scorer_privileges, _install_seccomp, _prctl, _private_mounts
from .protocol import ChannelClosed, _describe, read_msg_blocking, write_msg_blocking
from .scorer import Scorer


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
