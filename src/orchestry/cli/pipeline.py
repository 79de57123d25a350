"""``orchestry smoke`` (the whole pipeline with micro params in a temporary copy) and ``orchestry report``
(``reports/index.html``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestry.cli.common import (
    _STATE,
    Debug,
    _errors,
)


def smoke(
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the temporary copy (its path is printed).")
    ] = False,
    root: Annotated[
        Path, typer.Option(help="The project's root (dvc.yaml, params.yaml, stages, src).")
    ] = Path("."),
    debug: Debug = False,
) -> None:
    """Run the whole pipeline with micro params (2 problems, 2 MAGRPO updates) in a temporary copy.

    dvc repro runs in a copy of dvc.yaml, params.yaml, stages/ and src/ (own git, DVC and MLflow store), then each
    stage's seconds and the key metrics are printed. The project itself is never written. A few minutes on 2 cores.
    """
    import shutil
    import tempfile
    import time

    from rich.console import Console
    from rich.table import Table

    from orchestry.smoke import SmokeError, key_metrics, make_micro_repo, run_repro, stage_seconds

    console = Console(stderr=True)
    tmp = Path(tempfile.mkdtemp(prefix="orchestry-smoke-"))
    repo = tmp / "repo"
    try:
        with _errors(debug, (FileNotFoundError, "--root: ")):
            try:
                make_micro_repo(root, repo)
                console.print(f"micro copy of {root.resolve()} in {repo}; dvc repro ...", highlight=False)
                t0 = time.time()
                run_repro(repo, capture=False)
                seconds = stage_seconds(repo)
                results = key_metrics(repo)
            except SmokeError as e:
                if debug or _STATE["debug"]:
                    typer.echo(e.output, err=True)
                raise
    finally:
        if keep:
            console.print(f"copy kept: {repo}", highlight=False)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    t = Table(title=f"smoke: dvc repro with micro params, {time.time() - t0:.0f} s")
    for c in ("stage", "status", "seconds"):
        t.add_column(c, justify="right" if c == "seconds" else "left")
    for _, row in seconds.iterrows():
        t.add_row(str(row["stage"]), str(row["status"]), f"{row['seconds']:.1f}")
    Console().print(t)
    m = Table(title="key metrics (micro params: checks that it runs)")
    m.add_column("metric")
    m.add_column("value", justify="right")
    for k, v in results.items():
        m.add_row(k, f"{v:.3f}")
    Console().print(m)


def report(
    root: Annotated[Path, typer.Option(help="The project's root (its reports/ folder is read).")] = Path("."),
    out: Annotated[Path, typer.Option(help="The HTML page (relative to --root).")] = Path(
        "reports/index.html"
    ),
    debug: Debug = False,
) -> None:
    """(Re)build the HTML report (reports/index.html) from the current reports.

    Metrics with confidence intervals, training gain, API-GRPO, orchestrator, costs, figures, schemes, best and
    worst transcripts (orchestry.reporting.report.write_report).
    """
    from orchestry.reporting.report import ReportError, write_report

    with _errors(debug, (ReportError, "")):
        path = write_report(root, out)
    typer.echo(str(path))
