"""The ``orchestry`` command line (console script ``orchestry = "orchestry.cli:app"``).

A multi-command typer app: ``orchestry score ...`` today; later stages add their commands to ``app``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from orchestry.problems import ProblemFormatError

app = typer.Typer(
    name="orchestry",
    help="Train LLM agents to collaborate with multi-agent RL (MAGRPO, API-GRPO, orchestrator, REINFORCE++).",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Orchestry: reproducible multi-agent RL experiments on HumanEval."""


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
    out: Annotated[Path, typer.Option(help="Output JSONL: one line per completion, in input order.")],
    timeout_s: Annotated[float, typer.Option(help="Time limit per assert, in seconds.")] = 3.0,
    workers: Annotated[
        int | None, typer.Option(help="Parallel sandbox workers (default: the sandbox's).")
    ] = None,
    memory_mb: Annotated[int, typer.Option(help="Memory limit per sandboxed run, in MiB.")] = 1024,
    isolation: Annotated[str, typer.Option(help="Sandbox isolation mode (see orchestry.sandbox).")] = "auto",
    chunk_size: Annotated[int, typer.Option(help="Lines scored per sandbox batch.")] = 256,
    single: Annotated[
        bool,
        typer.Option("--single", help="Single-agent completions {task_id, main}: no helper, no cooperation."),
    ] = False,
    keep_code: Annotated[
        bool, typer.Option("--keep-code", help="Copy 'helper'/'main' into the output.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress or summary.")] = False,
) -> None:
    """Score completions with the level reward (structure, syntax, tests, cooperation; max 4.0).

    Bad lines (invalid JSON, unknown task_id, missing/non-string helper or main) get a zero-score line with
    the reason; the run never stops on them. Exit code 2 on a missing/malformed problems or completions file.
    """
    from orchestry.sandbox import Sandbox
    from orchestry.scoring import score_file

    console = Console(stderr=True, quiet=quiet)
    if not completions.is_file():
        console.print(f"[red]error:[/red] completions file not found: {completions}", markup=True)
        raise typer.Exit(code=2)
    try:
        with Sandbox(
            timeout_s=timeout_s, memory_mb=memory_mb, max_workers=workers, isolation=isolation
        ) as sandbox:
            summary = score_file(
                problems,
                completions,
                out,
                sandbox,
                chunk_size=chunk_size,
                single=single,
                keep_code=keep_code,
                on_chunk=lambda n: console.print(f"scored {n} lines", highlight=False),
            )
    except ProblemFormatError as e:
        console.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
        raise typer.Exit(code=2) from e
    if quiet:
        return
    out_console = Console()
    table = Table(title=f"orchestry score -> {out}", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    d = summary.to_dict()
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
    out_console.print(table)


if __name__ == "__main__":  # pragma: no cover
    app()
