"""Shared by every command: one-line errors and exit codes (:func:`_errors`, :func:`_fail`), the global
``--debug``, option checks and limits."""

from __future__ import annotations

import contextlib
import math
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, get_args

import typer
from typer.core import TyperGroup

IsolationMode = Literal["auto", "bwrap", "process"]  # orchestry.sandbox.Sandbox(isolation=...)


ISOLATION_MODES: tuple[str, ...] = get_args(IsolationMode)


MAX_TIMEOUT_S = 3600.0


MAX_MEMORY_MB = 1 << 20  # 1 TiB


MAX_WORKERS = 1024


class _OneLineErrors(TyperGroup):
    """Usage errors (bad value, missing or unknown option) as one ``error: ...`` line on stderr, exit code 2."""

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as e:  # typer's (vendored) click usage errors derive from it
            if type(e).__name__ != "NoArgsIsHelpError":  # the help was printed already
                typer.echo(f"error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _seconds(value: str | float) -> float:
    """A finite number of seconds in ``(0, MAX_TIMEOUT_S]`` (``nan``, ``inf``, ``1e400`` rejected)."""
    try:
        rv = float(value)
    except ValueError:
        rv = math.nan
    if not (math.isfinite(rv) and 0 < rv <= MAX_TIMEOUT_S):
        raise typer.BadParameter(f"{value!r} is not a number of seconds in (0, {MAX_TIMEOUT_S:g}].")
    return rv


_STATE = {"debug": False}  # the global --debug of this invocation (set by the callback on every invocation)


#: ``--experiment`` and ``--tracking-uri`` of the commands that read the project's MLflow store.
Experiment = Annotated[str, typer.Option(help="MLflow experiment.")]
TrackingUri = Annotated[
    str | None, typer.Option(help="MLflow store (default: sqlite:///<repo root>/mlflow.db).")
]


Debug = Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")]


def _fail(message: str, code: int, debug: bool) -> NoReturn:
    """One ``error:`` line on stderr (after the traceback with ``--debug``), then exit ``code``.

    A multi-line message (e.g. one line per bad key of params.yaml) is joined into one line with ``; ``.
    """
    if debug or _STATE["debug"]:
        traceback.print_exc(file=sys.stderr)
    first, *rest = [line.strip() for line in message.splitlines() if line.strip()] or [""]
    typer.echo(f"error: {first}" + (" " + "; ".join(rest) if rest else ""), err=True)
    raise typer.Exit(code=code)


@contextlib.contextmanager
def _errors(
    debug: bool, *bad_input: tuple[type[BaseException] | tuple[type[BaseException], ...], str]
) -> Iterator:
    """Turn exceptions into one ``error:`` line: ``(types, prefix)`` pairs are bad input (exit code 2, the
    message after ``prefix``, e.g. ``"--problems: "``; an exception with an ``option`` attribute, such as
    :class:`orchestry.evaluation.scoring.FileOptionError`, names ``--<option>`` when ``prefix`` is empty), any other
    exception exit code 1."""
    try:
        yield
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as e:
        for types, prefix in bad_input:
            if isinstance(e, types):
                if not prefix and getattr(e, "option", None):
                    prefix = f"--{e.option}: "
                _fail(f"{prefix}{e}", 2, debug)
        _fail(f"{type(e).__name__}: {e} (run with --debug for the traceback)", 1, debug)


def _load_params(path: Path | None):
    """``path`` validated (``params.yaml`` when ``None`` and it exists; else every default)."""
    from orchestry.config import Params
    from orchestry.params_file import load_params

    if path is None:
        path = Path("params.yaml")
        if not path.exists():
            return Params()
    return load_params(path)


def _out_file(path: Path | None, option: str) -> None:
    from orchestry.evaluation.scoring import FileOptionError

    if path is not None and (path.is_dir() or (path.exists() and not path.is_file())):
        raise FileOptionError(option.removeprefix("--"), f"{path} is not a regular file")


def _write_csv(table: Any, path: Path | None) -> None:
    """Write ``table`` (a pandas DataFrame) to ``path`` as CSV without its index, making the folder; nothing when
    ``path`` is None (check it first with :func:`_out_file`)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(path, index=False)


def _console(piped_width: int) -> Any:
    """A rich ``Console`` for a table on stdout; when stdout is not a terminal (piped, redirected), ``piped_width``
    columns wide, so that every column is printed instead of rich's default 80."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=piped_width)
