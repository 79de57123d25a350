"""``orchestry tune``: hyper-parameter search on Optuna, one DVC experiment per trial."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestry.cli.common import (
    Debug,
    _errors,
    _fail,
)


def tune(
    space: Annotated[
        Path | None,
        typer.Argument(
            help="Space file: objective, direction, seed, fixed and searched params (docs/tuning.md)."
        ),
    ] = None,
    trials: Annotated[
        int,
        typer.Option(min=1, max=100_000, help="Finished trials the study should hold; a re-run tops it up."),
    ] = 10,
    study: Annotated[
        str | None, typer.Option(help="Study name (default: the space file's `study`, else its file name).")
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            help="Optuna storage URL (default sqlite:///<repo>/.orchestry/optuna.db); a shared database "
            "(postgresql://..., mysql+pymysql://...) lets several machines work on one study."
        ),
    ] = None,
    allow_test: Annotated[
        bool,
        typer.Option(
            "--allow-test",
            help="Allow an objective measured on test problems (its results become optimistic).",
        ),
    ] = False,
    show: Annotated[
        bool,
        typer.Option("--show", help="Print the study's best trials and parameter importances; run nothing."),
    ] = False,
    top: Annotated[int, typer.Option(min=1, max=1000, help="Trials listed by --show.")] = 5,
    repo: Annotated[Path, typer.Option(help="The git + DVC repository the trials run in.")] = Path("."),
    debug: Debug = False,
) -> None:
    """Hyper-parameter search on Optuna (TPE, seeded): each trial is a DVC experiment `<study>-t<N>`.

    Each trial runs `dvc exp run --temp -n <study>-t<N> -S key=value ...` in --repo, so it is listed by `dvc exp
    show` and its MLflow runs are tagged optuna_study and optuna_trial; the objective is read from the
    experiment's reports/metrics.json. Only val.* metrics unless --allow-test. The space file is checked against
    params.yaml's schema first: an unknown key, an empty range or a refused value exits 2 before any trial.
    """
    from rich.console import Console
    from rich.table import Table

    from orchestry.tune import SpaceError, TrialFailed, check_study_name, load_space, storage_url
    from orchestry.tune import show as show_study
    from orchestry.tune import tune as run_tune

    console = Console()
    if show:
        with _errors(debug, (SpaceError, "")):
            name = study
            if name is None and space is not None:
                spec = load_space(space, repo / "params.yaml", allow_test=True)
                name = spec.study or space.stem
            if name is not None:
                check_study_name(name)
            result = show_study(storage_url(repo, storage), name, top)
        counts = ", ".join(f"{n} {k}" for k, n in sorted(result["states"].items())) or "no trials"
        console.print(f"study {result['study']}: {result['direction']} {result['objective']} ({counts})",
                      highlight=False)  # fmt: skip
        t = Table(title="best trials")
        for c in ("trial", "value", "DVC experiment", "params"):
            t.add_column(c, justify="right" if c in ("trial", "value") else "left")
        for b in result["best"]:
            params = " ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in b["params"].items()
            )
            t.add_row(str(b["number"]), f"{b['value']:.6g}", str(b["experiment"]), params)
        console.print(t)
        imp = result["importances"]
        if isinstance(imp, str):
            console.print(f"parameter importances: {imp}", highlight=False)
        else:
            i = Table(title="parameter importances (Optuna's default evaluator, sum 1)")
            i.add_column("param")
            i.add_column("importance", justify="right")
            for k, v in imp.items():
                i.add_row(k, f"{v:.3f}")
            console.print(i)
        return
    if space is None:
        _fail("SPACE: a space file is needed (or --show)", 2, debug)
    with _errors(debug, (SpaceError, "")):
        spec = load_space(space, repo / "params.yaml", allow_test=allow_test)
        if study is not None:
            check_study_name(study)
        if not (repo / "dvc.yaml").is_file() or not (repo / ".dvc").is_dir():
            raise SpaceError(f"--repo: {repo} is not a DVC repository (no dvc.yaml or .dvc/)")
        result = run_tune(spec, trials, repo, study, storage,
                          echo=lambda m: typer.echo(m, err=True))  # fmt: skip
    best = result["best"]
    summary = (f"study {result['study']} ({result['storage']}): {result['complete']} finished trial(s), "
               f"{result['ran']} run now, {result['failed']} failed")  # fmt: skip
    typer.echo(summary)
    if best is not None:
        typer.echo(f"best: trial {best['number']} ({best['experiment']}) {spec.objective} = {best['value']:.6g} "
                   f"{best['params']}")  # fmt: skip
    if result["ran"] and result["failed"] == result["ran"]:
        _fail(f"every trial run now failed ({TrialFailed.__name__}; see the lines above)", 1, debug)
