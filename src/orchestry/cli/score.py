"""``orchestry score``: the level reward of completions in a file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestry.cli.common import (
    MAX_MEMORY_MB,
    MAX_TIMEOUT_S,
    MAX_WORKERS,
    IsolationMode,
    _fail,
    _seconds,
)


def score(
    problems: Annotated[
        str,
        typer.Option(
            help="Problems: a HumanEval-format JSON list or JSONL file (.gz ok), or 'humaneval' (164)."
        ),
    ],
    completions: Annotated[
        Path, typer.Option(help="JSONL of {task_id, helper, main, ...}; other keys are carried through.")
    ],
    out: Annotated[
        Path,
        typer.Option(help="Output JSONL: one line per completion, in input order (never one of the inputs)."),
    ],
    timeout_s: Annotated[
        float,
        typer.Option(
            parser=_seconds, help=f"Time limit per assert, in seconds (0 < s <= {MAX_TIMEOUT_S:g})."
        ),
    ] = 3.0,
    workers: Annotated[
        int | None,
        typer.Option(min=1, max=MAX_WORKERS, help="Parallel sandbox workers (default: the sandbox's)."),
    ] = None,
    memory_mb: Annotated[
        int, typer.Option(min=64, max=MAX_MEMORY_MB, help="Memory limit per sandboxed run, in MiB.")
    ] = 1024,
    isolation: Annotated[
        IsolationMode,
        typer.Option(help="Sandbox isolation: auto (bubblewrap if usable), bwrap (required) or process."),
    ] = "auto",
    chunk_size: Annotated[
        int, typer.Option(min=1, max=1_000_000, help="Lines scored per sandbox batch.")
    ] = 256,
    single: Annotated[
        bool,
        typer.Option("--single", help="Single-agent completions {task_id, main}: no helper, no cooperation."),
    ] = False,
    keep_code: Annotated[
        bool, typer.Option("--keep-code", help="Copy 'helper'/'main' into the output.")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress or summary (errors are always shown).")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")] = False,
) -> None:
    """Score completions with the level reward (structure, syntax, tests, cooperation; max 4.0).

    Bad lines (invalid JSON, unknown task_id, missing/non-string helper or main) get a zero-score line with
    the reason; the run never stops on them. Exit code 2 on a bad option value, a missing/unreadable/malformed
    problems or completions file, or an --out that is one of the inputs (the inputs are never written).
    """
    from rich.console import Console

    from orchestry.evaluation.scoring import FileOptionError, check_paths, problem_index, score_file
    from orchestry.problems import ProblemFormatError
    from orchestry.sandbox import Sandbox, SandboxError

    progress = Console(stderr=True, quiet=quiet)
    try:
        check_paths(problems, completions, out)
        index = problem_index(problems)
        with Sandbox(
            timeout_s=timeout_s, memory_mb=memory_mb, max_workers=workers, isolation=isolation
        ) as sandbox:
            summary = score_file(
                index,
                completions,
                out,
                sandbox,
                chunk_size=chunk_size,
                single=single,
                keep_code=keep_code,
                on_chunk=lambda n: progress.print(f"scored {n} lines", highlight=False),
            )
    except FileOptionError as e:
        _fail(f"--{e.option}: {e}", 2, debug)
    except ProblemFormatError as e:
        _fail(f"--problems: {e}", 2, debug)
    except SandboxError as e:
        _fail(f"sandbox: {e}", 1, debug)
    except Exception as e:  # a bug: one line, the traceback with --debug
        _fail(f"{type(e).__name__}: {e} (run with --debug for the traceback)", 1, debug)
    if not quiet:
        _print_summary(summary.to_dict(), out, single)


def _print_summary(d: dict, out: Path, single: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"orchestry score -> {out}", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("completions", str(d["count"]))
    table.add_row("invalid lines", str(d["invalid"]))
    table.add_row("mean total (max 4.0)" if not single else "mean total (max 2.1)", f"{d['mean_total']:.3f}")
    table.add_row("pass@1", f"{d['pass@1']:.3f}")
    for key in ("structure", "syntax", "tests", "cooperation"):
        table.add_row(f"mean {key}", f"{d[f'mean_{key}']:.3f}")
    if not single:
        table.add_row("cooperation rate", f"{d['cooperation_rate']:.3f}")
        shares = ", ".join(f"{k} {v:.2f}" for k, v in d["schemes"].items() if v)
        table.add_row("schemes", shares or "-")
    Console().print(table)
