"""The worker program of :mod:`orchestry.sandbox` (private): run as a separate program, never imported by the parent.

Three roles live in this package (the design and its guarantees are documented in ``orchestry.sandbox``):

``Z`` -- the *scorer* (:mod:`.scorer`, started by :mod:`.main`). Trusted. Receives jobs from the parent over a
pipe, runs the **test** code (setup and assert units) in its own interpreter and computes every verdict. It never
executes model-written code: calls of program functions made by the tests (``candidate(...)``) are forwarded to
``A`` and only plain data comes back.

``C`` -- the *clean fork server* (:mod:`.fork_server`). Trusted. Forked by ``Z`` at start-up, before any job
exists, with the common modules pre-imported. For every (re)load of a program it forks a fresh ``A``. Because
``C`` never holds test data, no ``A`` can find the tests or their expected values in its memory.

``A`` -- the *program process* (:mod:`.program`). Untrusted. One per program load: new session, private
temporary directory, sanitised environment, output discarded, privileges dropped to the worker's own unprivileged
uid, resource limits, an audit hook refusing process spawning, sockets, ``ctypes`` and writes outside its
directory. It executes the program, then answers calls ``name(*args)`` with the return value encoded as plain data.

The other modules: :mod:`.protocol` (message framing, error text), :mod:`.codec` (plain data across the process
boundary), :mod:`.bindings` (what the tests see of a program: its functions, modules, values and exceptions),
:mod:`.plan` (calls sent to the program ahead of time), :mod:`.hardening` (seccomp filters, private mounts,
privilege drop).

How it runs: the parent compiles this package to bytecode once per process (``isolation._child_pyc``): every
module but :mod:`.boot` goes to ``<code dir>/_orchestry_sandbox_child/``, and :mod:`.boot` becomes
``<code dir>/child.pyc``, which the parent starts as ``python -s -P -B <code dir>/child.pyc`` (inside bubblewrap the
code directory is mounted read-only at ``/opt/orchestry-sandbox``). The boot file imports every module of the
package before the worker starts, so nothing is imported from the code directory afterwards. Only relative imports
between these modules, and only the Python standard library.

Parent <-> Z and Z <-> A messages are 4-byte big-endian length + JSON.
"""
