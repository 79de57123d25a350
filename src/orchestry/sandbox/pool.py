"""The :class:`Sandbox`: a pool of worker slots, the dispatch of jobs to them, and retries."""

from __future__ import annotations

import logging
import os
import select
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence

from . import worker as _worker_module  # its _LOGGED: one set per process, also when a test replaces it
from .isolation import _is_root, _probe_bwrap
from .jobs import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S, AssertOutcome, ExecutionResult, Job, SandboxError
from .worker import _read_msg, _shutdown, _Worker, _write_msg

log = logging.getLogger("orchestry.sandbox")


def _failed(n: int, reason: str, seconds: float = 0.0) -> ExecutionResult:
    return ExecutionResult(tuple(AssertOutcome(False, reason) for _ in range(n)), reason, seconds)


# ------------------------------------------------------------------------------------------- sandbox
class Sandbox:
    """Pool of isolated workers that execute :class:`Job` s (see the ``orchestry.sandbox`` docstring).

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
        if self._layer not in _worker_module._LOGGED:
            _worker_module._LOGGED.add(self._layer)
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
