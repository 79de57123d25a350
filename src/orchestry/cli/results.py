"""Commands that read results: ``seeds`` (DVC experiments aggregated over seeds), ``compare`` (pipeline
executions from MLflow), ``times`` (seconds per stage of the newest executions, from MLflow), ``paired`` (two methods' samples paired by problem), ``show-best`` (transcripts)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from orchestry.cli.common import (
    Debug,
    Experiment,
    TrackingUri,
    _console,
    _errors,
    _fail,
    _out_file,
    _write_csv,
)


def seeds(
    seed_param: Annotated[
        str, typer.Option(help="Params key that varies between experiments.")
    ] = "train_magrpo.seed",
    metric: Annotated[
        list[str] | None,
        typer.Option(
            help="Metric as file:key (nested keys with dots); 'A - B' for a difference. Repeatable. Default: "
            "trained minus base on the test split (pass@1, reward, gated cooperation rate, aux calls) and on "
            "HumanEval (pass@1), and last-minus-first-quarter training reward."
        ),
    ] = None,
    confidence: Annotated[float, typer.Option(min=0.5, max=0.999, help="Interval level.")] = 0.95,
    vary: Annotated[
        list[str] | None,
        typer.Option(
            help="Params key that may differ besides the seed (repeatable; default evaluate.seed). Every other "
            "param must equal the workspace's, so swept variants do not mix into the seeds."
        ),
    ] = None,
    any_params: Annotated[
        bool, typer.Option("--any-params", help="Aggregate every experiment, whatever its other params.")
    ] = False,
    like: Annotated[
        str | None,
        typer.Option(
            help="Aggregate the configuration of this named experiment (e.g. a swept variant's seed 0)."
        ),
    ] = None,
    repo: Annotated[Path, typer.Option(help="DVC repository.")] = Path("."),
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")] = False,
) -> None:
    """Aggregate DVC experiments over seeds: per-seed values and the mean with a bootstrap interval over seeds.

    Run the seeds first, e.g. ``for s in 1 2 3; do dvc exp run --queue -S train_magrpo.seed=$s; done`` then
    ``dvc exp run --run-all``.
    """
    from rich.console import Console
    from rich.table import Table

    from orchestry.reporting.experiments import collect, seed_table

    metrics = metric or [
        "reports/metrics.json:trained_minus_base.pass.diff",
        "reports/metrics.json:trained_minus_base.total.diff",
        "reports/metrics.json:trained_minus_base.coop_rate.diff",
        "reports/metrics.json:trained_minus_base.aux_called.diff",
        "reports/metrics.json:transfer.humaneval.trained_minus_base.pass.diff",
        "reports/train/magrpo.json:difference",
    ]
    keys = [" - ".join(f"metric:{part.strip()}" for part in m.split(" - ")) for m in metrics]
    try:
        df = collect(repo)
        free = None if any_params else [f"param:params.yaml:{k}" for k in (vary or ["evaluate.seed"])]
        per_seed, summary = seed_table(
            df, f"param:params.yaml:{seed_param}", keys, confidence, vary=free, like=like
        )
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
    if per_seed.attrs.get("left_out"):
        left = per_seed.attrs["left_out"]
        shown = ", ".join(left[:12]) + (f" and {len(left) - 12} more" if len(left) > 12 else "")
        console.print(f"left out {len(left)} experiment(s) with other params (--vary KEY or --any-params to "
                      f"include them): {shown}")  # fmt: skip


def compare(
    experiment: Experiment = "orchestry",
    metric: Annotated[
        list[str] | None,
        typer.Option(
            help="Metric as stage:name (e.g. evaluate:test/magrpo/reward; docs/metrics.md) or name; repeatable. Default: "
            "trained and base test reward, cooperation rate, pass@1, MAGRPO's training reward."
        ),  # fmt: skip
    ] = None,
    tracking_uri: TrackingUri = None,
    csv: Annotated[Path | None, typer.Option(help="Also write the table as CSV.")] = None,
    limit: Annotated[
        int, typer.Option(min=1, help="Newest N executions in the table (the CSV has all).")
    ] = 20,
    details: Annotated[
        bool,
        typer.Option(
            "--details",
            help="Also show git revision, params hash, stage count, seconds and cached stages (the CSV has them).",
        ),
    ] = False,
    debug: Debug = False,
) -> None:
    """One row per pipeline execution (DVC experiment / parent run) from MLflow: its name, its key metrics (trained
    and base pass@1 and reward, cooperation, MAGRPO's training reward), then when it started and its status;
    --details adds the bookkeeping columns."""
    from rich import box
    from rich.table import Table

    from orchestry.evaluation.scoring import FileOptionError
    from orchestry.reporting.compare import (
        BOOKKEEPING,
        DEFAULT_METRICS,
        CompareError,
        executions,
        load_runs,
        metric_header,
    )
    from orchestry.tracking.runs import tracking_uri as default_uri

    with _errors(debug, (CompareError, ""), (FileOptionError, "")):
        _out_file(csv, "--csv")
        runs = load_runs(experiment, tracking_uri or default_uri())
        table = executions(runs, metric or DEFAULT_METRICS, strict=bool(metric))
        _write_csv(table, csv)
    # the metrics right after the execution's name, its bookkeeping after them (most of it with --details)
    after = BOOKKEEPING[1:] if details else ("started", "status")
    shown = table.head(limit)[["execution", *[c for c in table.columns if c not in BOOKKEEPING], *after]]
    if "params_hash" in shown and not shown.empty and (shown["params_hash"] == "").all():
        shown = shown.drop(columns="params_hash")
    t = Table(
        title=f"{experiment}: {len(table)} pipeline executions, newest first",
        caption=_compare_caption(table),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for c in shown.columns:
        header = metric_header(c) if c not in BOOKKEEPING else c.replace("_", " ")
        t.add_column(
            header,
            justify="left" if c in ("execution", "git_revision", "status") else "right",
            overflow="fold",  # a long execution name wraps instead of being cut
            no_wrap=c in ("started", "status"),
            min_width=9
            if c == "execution"
            else 7
            if c not in BOOKKEEPING
            else None,  # "workspace", "trained"
        )
    for _, row in shown.iterrows():
        cells = []
        for c, v in row.items():
            if c == "started":
                cells.append(v.strftime("%m-%d %H:%M") if hasattr(v, "strftime") else str(v))
            elif c in ("git_revision", "params_hash"):
                cells.append(str(v)[:8] + ("+dirty" if str(v).endswith("+dirty") else ""))
            elif isinstance(v, float):
                cells.append("-" if math.isnan(v) else f"{v:.0f}" if c == "seconds" else f"{v:.3f}")
            else:
                cells.append(str(v))
        t.add_row(*cells)
    _console(piped_width=200).print(t)


def times(
    last: Annotated[int, typer.Option(min=1, help="The newest N pipeline executions, one column each.")] = 3,
    markdown: Annotated[
        bool, typer.Option(help="Print a GitHub Markdown table (for a README) instead of the terminal table.")
    ] = False,
    experiment: Experiment = "orchestry",
    tracking_uri: TrackingUri = None,
    csv: Annotated[
        Path | None, typer.Option(help="Also write one row per execution and stage as CSV.")
    ] = None,
    debug: Debug = False,
) -> None:
    """Seconds of each pipeline stage in the newest executions (MLflow's cost/wall_seconds), with the CPU."""
    from orchestry.evaluation.scoring import FileOptionError
    from orchestry.reporting.compare import CompareError, load_runs, stage_times
    from orchestry.tracking.runs import tracking_uri as default_uri

    with _errors(debug, (CompareError, ""), (FileOptionError, "")):
        _out_file(csv, "--csv")
        table = stage_times(load_runs(experiment, tracking_uri or default_uri()), last)
        _write_csv(table, csv)
    if table.empty:
        _fail(f"no stage runs in MLflow experiment {experiment!r} (run the pipeline: dvc repro)", 1, debug)
    header, rows = _times_grid(table)
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    from rich.table import Table

    t = Table(title=f"{experiment}: seconds per stage, newest execution first")
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*r)
    _console(piped_width=200).print(t)


def _seconds(s: float) -> str:
    """Seconds as a table shows them: whole seconds from 10 s up, one decimal below."""
    return f"{s:.0f}" if abs(s) >= 10 else f"{s:.1f}"


def _times_grid(table) -> tuple[list[str], list[list[str]]]:
    """:func:`orchestry.reporting.compare.stage_times`' rows as a grid: a row per stage (then the stages' sum,
    the execution's wall time, the time outside the stages and the CPU), a column per execution."""
    execs = list(dict.fromkeys(zip(table["started"], table["execution"], strict=True)))
    stages = list(dict.fromkeys(table["stage"]))
    header = ["stage"]
    cells: dict[tuple, str] = {}
    footer: list[list[str]] = [["stages' own seconds (sum)"], ["wall: first stage start to last stage end"],
                               ["outside the stages (DVC, process start-up)"], ["CPU"]]  # fmt: skip
    for started, name in execs:
        rows = table[(table["started"] == started) & (table["execution"] == name)]
        rev = str(rows["git_revision"].iloc[0])[:8]
        when = started.strftime("%m-%d %H:%M") if hasattr(started, "strftime") else str(started)
        header.append(" ".join(x for x in (name, rev, when) if x))
        for _, r in rows.iterrows():
            if r["cached"]:
                text = "cached"
            elif math.isnan(r["seconds"]):
                text = "-"
            else:
                text = _seconds(r["seconds"])
                if not math.isnan(r["warm_start_seconds"]):
                    text += f" (warm start {_seconds(r['warm_start_seconds'])})"
            cells[(started, name, r["stage"])] = text
        total = rows["seconds"].sum()  # NaN (cached, not logged) counts 0
        wall = rows["wall_seconds"].iloc[0]
        footer[0].append(_seconds(total))
        footer[1].append("running" if math.isnan(wall) else _seconds(wall))
        footer[2].append("-" if math.isnan(wall) else _seconds(wall - total))
        footer[3].append(str(rows["cpu"].iloc[-1]) or "-")
    grid = [[s] + [cells.get((st, n, s), "") for st, n in execs] for s in stages]
    return header, grid + footer


def paired(
    reference: Annotated[Path, typer.Argument(help="Sample file of the reference method (JSONL).")],
    others: Annotated[list[Path], typer.Argument(help="Sample file(s) of the method(s) compared with it.")],
    metric: Annotated[
        list[str] | None,
        typer.Option(
            help="Per-sample metric; repeatable. Default: every level, pass, cooperation and aux facts."
        ),
    ] = None,
    confidence: Annotated[float, typer.Option(min=0.5, max=0.999, help="Interval level.")] = 0.95,
    resamples: Annotated[int, typer.Option(min=100, help="Bootstrap resamples.")] = 10_000,
    csv: Annotated[
        Path | None, typer.Option(help="Also write every table as one CSV (column 'file').")
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(help="Also draw every difference with its interval (PNG), one panel per metric."),
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option(help="Name of each OTHER in the figure (default: its file name).")
    ] = None,
    debug: Debug = False,
) -> None:
    """Each OTHER minus REFERENCE, paired by problem, with percentile-bootstrap intervals over problems.

    Inputs are evaluation samples, e.g. ``reports/eval/base.jsonl`` and ``reports/eval/magrpo.jsonl``, or
    another experiment's copy of them (``dvc exp apply NAME`` then copy, or ``git show`` of a committed copy).
    """
    import pandas as pd
    from rich.table import Table

    from orchestry.evaluation.scoring import FileOptionError
    from orchestry.reporting.compare import (
        SAMPLE_METRICS,
        CompareError,
        paired_comparison,
        plot_paired,
        read_samples,
    )

    tables = []
    with _errors(debug, (CompareError, ""), (FileOptionError, "")):
        _out_file(csv, "--csv")
        _out_file(plot, "--plot")
        ref = read_samples(reference)
        for other in others:
            t = paired_comparison(ref, read_samples(other), metric or SAMPLE_METRICS, confidence, resamples)
            tables.append(t.assign(file=str(other)))
        if csv is not None:
            _write_csv(pd.concat(tables), csv)
        if plot is not None:
            if label and len(label) != len(others):
                raise CompareError(f"--label: {len(label)} labels for {len(others)} compared files")
            plot_paired(tables, label or [o.stem for o in others], plot)
    console = _console(piped_width=160)
    for other, t in zip(others, tables, strict=True):
        n = int(t["n_problems"].max()) if len(t) else 0
        tab = Table(title=f"{other} - {reference} ({n} problems, {confidence:.0%} bootstrap intervals)")
        for c in ("metric", str(reference), str(other), "difference", "excludes 0"):
            tab.add_column(c, justify="left" if c == "metric" else "right")
        for _, r in t.iterrows():
            tab.add_row(
                r["metric"],
                f"{r['reference']:.3f} [{r['reference_low']:.3f}, {r['reference_high']:.3f}]",
                f"{r['other']:.3f} [{r['other_low']:.3f}, {r['other_high']:.3f}]",
                f"{r['diff']:+.3f} [{r['diff_low']:+.3f}, {r['diff_high']:+.3f}]",
                "yes" if r["excludes_zero"] else "no",
            )
        console.print(tab)


def _compare_caption(table) -> str:
    metrics = [c for c in table.columns if ":" in c]
    return "metric columns by stage: " + "; ".join(
        f"{c.split(':', 1)[1]} from {c.split(':', 1)[0]}" for c in metrics
    )


def show_best(
    file: Annotated[
        Path, typer.Option(help="Per-sample records (JSONL of {task_id, helper, main, total, ...}).")
    ] = Path("reports/eval/magrpo.jsonl"),
    n: Annotated[
        int, typer.Option("-n", "--n", min=1, max=1000, help="How many best and how many worst.")
    ] = 1,
    debug: Debug = False,
) -> None:
    """The best and the worst transcripts of a method by total reward: helper and main code, highlighted."""
    from rich.console import Console, Group
    from rich.panel import Panel
    from rich.syntax import Syntax

    from orchestry.reporting.transcripts import TranscriptError, best_and_worst

    with _errors(debug, (TranscriptError, "--file: ")):
        best, worst = best_and_worst(file, n)
    console = Console()
    for title, recs in (("best", best), ("worst", worst)):
        for i, r in enumerate(recs, start=1):
            levels = ", ".join(
                f"{lv} {r[lv]:.2f}" for lv in ("structure", "syntax", "tests", "cooperation") if lv in r
            )
            asserts = f", {r['passed']}/{r['total_asserts']} asserts" if "total_asserts" in r else ""
            scheme = f", scheme {r['scheme']}" if r.get("scheme") else ""
            parts = []
            for agent in ("helper", "main"):
                code = r.get(agent)
                if isinstance(code, str) and code.strip():
                    parts += [
                        f"[bold]{agent}[/bold]",
                        Syntax(code, "python", line_numbers=True, word_wrap=True),
                    ]
            sample = f" sample {r['sample']}" if "sample" in r else ""
            console.print(Panel(
                Group(f"total {r['total']:.3f} / 4.0 ({levels}{asserts}{scheme})", *parts),
                title=f"{title} {i}: {r['task_id']}{sample}", title_align="left",
            ))  # fmt: skip
