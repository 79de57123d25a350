"""The ``orchestry`` command line (console script ``orchestry = "orchestry.cli:app"``).

A multi-command typer app: ``orchestry score ...`` today; later stages add their commands to ``app``.

Errors are one line on stderr (``error: --option: what is wrong``), whatever ``--quiet`` says: exit code 2
for a bad option value or an unusable file, 1 for anything else; ``--debug`` also prints the traceback.
"""

from __future__ import annotations

import math
import sys
import traceback
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


app = typer.Typer(
    name="orchestry",
    cls=_OneLineErrors,
    help="Multi-agent RL for collaborating LLM agents (MAGRPO, API-GRPO, a learned orchestrator); the pipeline runs with `dvc repro`.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Orchestry: reproducible multi-agent RL experiments on HumanEval."""


def _fail(message: str, code: int, debug: bool) -> NoReturn:
    """One ``error:`` line on stderr (after the traceback with ``--debug``), then exit ``code``."""
    if debug:
        traceback.print_exc(file=sys.stderr)
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


@app.command()
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

    from orchestry.problems import ProblemFormatError
    from orchestry.sandbox import Sandbox, SandboxError
    from orchestry.scoring import FileOptionError, check_paths, problem_index, score_file

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


@app.command()
def seeds(
    seed_param: Annotated[
        str, typer.Option(help="Params key that varies between experiments.")
    ] = "train_magrpo.seed",
    metric: Annotated[
        list[str] | None,
        typer.Option(
            help="Metric as file:key (nested keys with dots); 'A - B' for a difference. Repeatable. Default: "
            "trained-minus-base test reward and last-minus-first-quarter training reward."
        ),
    ] = None,
    confidence: Annotated[float, typer.Option(min=0.5, max=0.999, help="Interval level.")] = 0.95,
    repo: Annotated[Path, typer.Option(help="DVC repository.")] = Path("."),
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")] = False,
) -> None:
    """Aggregate DVC experiments over seeds: per-seed values and the mean with a bootstrap interval over seeds.

    Run the seeds first, e.g. ``for s in 1 2 3; do dvc exp run --queue -S train_magrpo.seed=$s; done`` then
    ``dvc exp run --run-all``.
    """
    from rich.console import Console
    from rich.table import Table

    from orchestry.experiments import collect, seed_table

    metrics = metric or [
        "reports/metrics.json:methods.magrpo.reward - reports/metrics.json:methods.base.reward",
        "reports/train/magrpo.json:difference",
    ]
    keys = [" - ".join(f"metric:{part.strip()}" for part in m.split(" - ")) for m in metrics]
    try:
        df = collect(repo)
        per_seed, summary = seed_table(df, f"param:params.yaml:{seed_param}", keys, confidence)
    except (RuntimeError, KeyError) as e:
        _fail(str(e), 2, debug)
    console = Console()
    t = Table(title=f"per seed ({seed_param})")
    t.add_column("seed")
    for k in keys:
        t.add_column(k.replace("metric:", ""), justify="right")
    for seed, row in per_seed.iterrows():
        t.add_row(str(seed), *(f"{row[k]:.3f}" for k in keys))
    console.print(t)
    s = Table(title=f"over seeds ({confidence:.0%} bootstrap interval)")
    for c in ("metric", "n_seeds", "mean", "interval", "excludes 0"):
        s.add_column(c)
    for k, row in summary.iterrows():
        s.add_row(k.replace("metric:", ""), str(row["n_seeds"]), f"{row['mean']:.3f}",
                  f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]", "yes" if row["excludes_zero"] else "no")  # fmt: skip
    console.print(s)


if __name__ == "__main__":  # pragma: no cover
    app()
