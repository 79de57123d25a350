"""A job for the sandbox (:class:`Job`), its results and the sandbox's defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Default per-assert (and load) effective time limit in seconds; see the ``orchestry.sandbox`` docstring.
DEFAULT_TIMEOUT_S = 1.0
#: Default address-space limit of a program process, in MiB.
DEFAULT_MEMORY_MB = 1024


class SandboxError(RuntimeError):
    """The sandbox itself cannot run: requested isolation unavailable or worker processes cannot start."""


@dataclass(frozen=True)
class AssertOutcome:
    """Verdict of one assert unit.

    Attributes:
        passed: True when the unit ran to completion without an exception.
        reason: "" when passed; otherwise short, e.g. "AssertionError", "timeout after 3.0s",
            "MemoryError", "program failed to load: NameError: ...".
        seconds: effective seconds the unit took (see the ``orchestry.sandbox`` docstring); not part of equality.
    """

    passed: bool
    reason: str = ""
    seconds: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class ExecutionResult:
    """Result of one :class:`Job`.

    Attributes:
        outcomes: exactly one :class:`AssertOutcome` per assert of the job, in order.
        error: program-level failure -- the program did not load (including a failing test setup, e.g. the
            entry point is undefined) or the sandbox failed ("sandbox failure: ..."); "" otherwise. Crashes and
            timeouts *during* an assert appear only in that assert's reason.
        seconds: wall seconds for the job (dispatch to result).
    """

    outcomes: tuple[AssertOutcome, ...]
    error: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> int:
        """Number of passed asserts."""
        return sum(1 for o in self.outcomes if o.passed)

    @property
    def total(self) -> int:
        """Number of asserts (``len(outcomes)``)."""
        return len(self.outcomes)


@dataclass(frozen=True)
class Job:
    """One program and its tests.

    Attributes:
        program: full source under test (problem context + helper code + main code).
        asserts: self-contained assert units, each scored on its own.
        setup: test code run after the program and before each assert (e.g. ``candidate = f``).
    """

    program: str
    asserts: tuple[str, ...]
    setup: str = ""
