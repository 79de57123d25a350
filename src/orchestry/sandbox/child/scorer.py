"""``Z``, the scorer (trusted): runs a job's setup and assert units in its own interpreter, forwards the tests'
calls of program functions to the program process, and times every unit."""

from __future__ import annotations

import builtins
import contextlib
import json
import marshal
import os
import random
import select
import signal
import socket
import time
from collections import deque

from .bindings import _MAX_GLOBALS, RemoteError, _apply_mutation, _bindable, _remote_exception, _test_module
from .codec import Unplain, _Decoder, encode
from .fork_server import _CTRL_FINISH, _CTRL_PID
from .plan import _plan
from .program import _EXIT_CHANNEL, _EXIT_SETUP
from .protocol import _LEN, _describe, _short, _UnitTimeout

_SIGNAMES = {int(s): s.name for s in signal.Signals}
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_CPU_READ_AFTER = 0.002  # seconds into a unit after which the program's CPU time is read (see _read_exact)
_TIMEOUT = "timeout after"  # reason of a unit (or load) that ran out of time: f"{_TIMEOUT} {limit}s"
# Programs up to this size (characters) are compiled by the scorer, which sends the program process the code
# object (marshal) instead of the source; a program that does not compile never needs a program process.
# Larger ones are compiled by the program process itself, under its limits.
COMPILE_IN_SCORER_MAX = 1 << 20


class _Desync(Exception):
    """The test made a call other than the one planned and sent ahead."""


class _ProgramGone(Exception):
    """The program process died, closed its channel or broke the protocol; message = reason."""


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
    """Z: runs jobs; see the package docstring."""

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
