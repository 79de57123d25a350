"""The ``orchestry`` command line (console script ``orchestry = "orchestry.cli:app"``; ``orchestry --help``).

Commands: ``score`` (level reward of completions in a file), ``evaluate`` (base vs trained agents on any
HumanEval-format file, the ``evaluate`` stage's metrics), ``compare`` (pipeline executions and their key metrics
from MLflow), ``show-best`` (best and worst transcripts), ``ui`` (the MLflow UI on the project's store),
``smoke`` (the whole pipeline with micro params in a temporary copy), ``report`` (``reports/index.html``),
``seeds`` (DVC experiments aggregated over seeds), ``paired`` (two methods' evaluation samples, paired by
problem, with bootstrap intervals), ``calibrate`` (the base model's pass rates on generated problems per
difficulty, ``reports/calibration.{json,md}``), ``override`` and ``review`` (a person's reward for an API-GRPO
trajectory or orchestrator episode, ``data/overrides.jsonl``; :mod:`orchestry.overrides`), ``tune``
(hyper-parameter search on Optuna, one DVC experiment per trial; ``tune --show``: the best trials and the
parameter importances).

Errors are one line on stderr (``error: --option: what is wrong``), whatever ``--quiet`` says: exit code 2
for a bad option value or an unusable file, 1 for anything else; ``--debug`` (global, ``orchestry --debug CMD``,
or after a command) also prints the traceback.
"""

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


app = typer.Typer(
    name="orchestry",
    cls=_OneLineErrors,
    help="Multi-agent RL for collaborating LLM agents (MAGRPO, API-GRPO, a learned orchestrator); the pipeline runs with `dvc repro`.",
    no_args_is_help=True,
    add_completion=False,
)


_STATE = {"debug": False}  # the global --debug of this invocation (set by the callback on every invocation)
Debug = Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")]


@app.callback()
def _root(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback of an error (any command).")
    ] = False,
) -> None:
    """Orchestry: reproducible multi-agent RL experiments on HumanEval."""
    _STATE["debug"] = debug


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
    :class:`orchestry.scoring.FileOptionError`, names ``--<option>`` when ``prefix`` is empty), any other
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

    from orchestry.experiments import collect, seed_table

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


def _load_params(path: Path | None):
    """``path`` validated (``params.yaml`` when ``None`` and it exists; else every default)."""
    from orchestry.config import Params, load_params

    if path is None:
        path = Path("params.yaml")
        if not path.exists():
            return Params()
    return load_params(path)


def _out_file(path: Path | None, option: str) -> None:
    from orchestry.scoring import FileOptionError

    if path is not None and (path.is_dir() or (path.exists() and not path.is_file())):
        raise FileOptionError(option.removeprefix("--"), f"{path} is not a regular file")


@app.command()
def evaluate(
    problems: Annotated[
        str,
        typer.Option(
            help="Problems: a HumanEval-format JSON list or JSONL file (.gz ok), or 'humaneval' (164)."
        ),
    ],
    adapters: Annotated[
        Path,
        typer.Option(help="Folder with the trained peft adapters helper/ and main/ (train_magrpo's output)."),
    ] = Path("models/adapters/magrpo"),
    model: Annotated[
        str | None, typer.Option(help="Base model folder (default: model.path of the params).")
    ] = None,
    params: Annotated[
        Path | None,
        typer.Option(
            help="params.yaml for sampling, sandbox, intervals and evaluate's seed/batch size "
            "(default: ./params.yaml if present, else the defaults)."
        ),  # fmt: skip
    ] = None,
    num_samples: Annotated[
        int | None,
        typer.Option(min=1, max=1000, help="Samples per problem, the k of pass@k (default: evaluate's)."),
    ] = None,
    max_problems: Annotated[
        int | None, typer.Option(min=1, help="Only the first N problems of the file (default: all).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Write the metrics as JSON (metrics.json's layout).")
    ] = None,
    samples: Annotated[
        Path | None, typer.Option(help="Folder for the per-sample records base.jsonl and magrpo.jsonl.")
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress or table (errors are always shown).")
    ] = False,
    debug: Debug = False,
) -> None:
    """Score the base agents and the trained agents (the evaluate stage's metrics) on a HumanEval-format file.

    Both pairs share one base model and the same sampling seed; the base pair runs with the adapters disabled.
    Metrics per pair: pass@1 and pass@k, accuracy@k, mean reward (max 4.0) with its bootstrap interval over
    problems, each reward level, cooperation rate, aux-call rates, tokens. Exit code 2 on a missing or invalid
    problems file, an adapters folder without helper/main adapters, a missing model or invalid params.
    """
    import random

    from rich.console import Console

    from orchestry.config import ParamsError
    from orchestry.evaluation import AdaptersError, check_adapters, evaluate_agents
    from orchestry.problems import ProblemFormatError, load_problems
    from orchestry.runtime import load_policy, open_sandbox, write_json, write_jsonl
    from orchestry.sandbox import SandboxError
    from orchestry.scoring import FileOptionError

    console = Console(stderr=True, quiet=quiet)
    with _errors(
        debug,
        (ProblemFormatError, "--problems: "),
        (AdaptersError, "--adapters: "),
        (ParamsError, "--params: "),
        (FileOptionError, ""),
    ):
        _out_file(out, "--out")
        if out is not None and Path(problems).exists() and out.resolve() == Path(problems).resolve():
            raise FileOptionError("out", f"{out} is the problems file (the inputs are never written)")
        if samples is not None and samples.exists() and not samples.is_dir():
            raise FileOptionError("samples", f"{samples} is not a folder")
        probs = load_problems(problems)[:max_problems]
        cfg = _load_params(params)
        if model is not None:
            cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": model})})
        if not (Path(cfg.model.path) / "config.json").is_file():
            raise FileOptionError("model", f"no model at {cfg.model.path} (a folder with config.json and weights; "
                                  "`dvc repro prepare` writes models/base)")  # fmt: skip
        check_adapters(adapters)
        k = num_samples or cfg.evaluate.num_samples
        console.print(f"{len(probs)} problems x {k} samples, base vs {adapters}", highlight=False)
        import torch

        torch.manual_seed(0)  # as orchestry.runtime.start_stage (sampling itself is seeded per call)
        random.seed(0)
        policy, tok = load_policy(cfg, with_adapters=str(adapters))
        methods: dict[str, dict] = {}
        try:
            with open_sandbox(cfg) as sb:
                e = cfg.evaluate
                for name, recs, summary in evaluate_agents(
                    probs, policy, tok, sb, cfg.sampling, k, e.seed, e.batch_size, cfg.intervals, not quiet
                ):
                    methods[name] = summary
                    if samples is not None:
                        write_jsonl(samples / f"{name}.jsonl", recs)
        except SandboxError as err:
            raise RuntimeError(f"sandbox: {err}") from err
        report = {
            "problems_file": str(problems),
            "adapters": str(adapters),
            "model": cfg.model.path,
            "test_problems": len(probs),
            "samples_per_problem": k,
            "intervals": cfg.intervals.model_dump(),
            "methods": methods,
        }
        if out is not None:
            write_json(out, report)
    if not quiet:
        _print_methods(methods, k, cfg.intervals.confidence, out)


def _print_methods(methods: dict[str, dict], k: int, confidence: float, out: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="orchestry evaluate" + (f" -> {out}" if out else ""))
    table.add_column("metric")
    for name in methods:
        table.add_column(name, justify="right")
    rows = [("problems", "n_problems", "{:.0f}"), ("samples", "n_samples", "{:.0f}")]
    rows += [(f"pass@{j}", f"pass@{j}", "{:.3f}") for j in sorted({1, k})]
    rows += [(f"accuracy@{j}", f"accuracy@{j}", "{:.3f}") for j in sorted({1, k})]
    rows += [(lv, lv, "{:.3f}") for lv in ("structure", "syntax", "tests", "cooperation")]
    rows += [("cooperation rate", "cooperation_rate", "{:.3f}"), ("main calls aux", "aux_called_rate", "{:.3f}"),
             ("completion tokens / sample", "completion_tokens", "{:.0f}"), ("seconds", "seconds", "{:.1f}")]  # fmt: skip
    cells = []
    for m in methods.values():
        lo, hi = m.get("reward_ci_low"), m.get("reward_ci_high")
        ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
        cells.append(f"{m.get('reward', float('nan')):.3f}{ci}")
    table.add_row(f"reward (max 4.0, {confidence:.0%} CI)", *cells)
    for label, key, fmt in rows:
        table.add_row(
            label, *(fmt.format(m[key]) if m.get(key) is not None else "-" for m in methods.values())
        )
    Console().print(table)


def _difficulties(value: str) -> list[int]:
    """A comma-separated list of distinct difficulties 1-4 (``"1,2,3"``)."""
    try:
        out = [int(v) for v in str(value).split(",") if v.strip()]
    except ValueError:
        out = []
    if not out or any(not 1 <= d <= 4 for d in out) or len(set(out)) != len(out):
        raise typer.BadParameter(f"{value!r} is not a comma-separated list of distinct difficulties 1-4.")
    return out


def _difficulties_option(value: str) -> str:
    """``--difficulties`` checked and normalised (``"1, 2"`` -> ``"1,2"``)."""
    return ",".join(map(str, _difficulties(value)))


@app.command()
def calibrate(
    difficulties: Annotated[
        str,
        typer.Option(
            callback=_difficulties_option,
            metavar="D1,D2,...",
            help="Difficulties (primitives per problem, 1-4), comma-separated.",
        ),
    ] = "1,2,3",
    problems: Annotated[
        int,
        typer.Option(
            min=1, max=100_000, help="Problems per difficulty (capped at its pool of compositions)."
        ),
    ] = 24,
    samples: Annotated[int, typer.Option(min=1, max=1000, help="Samples per problem and method.")] = 2,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the generated problems and of the sampling.")] = 0,
    params: Annotated[
        Path | None,
        typer.Option(
            help="params.yaml for sampling, sandbox, intervals and evaluate's batch size "
            "(default: ./params.yaml if present, else the defaults)."
        ),  # fmt: skip
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Base model folder (default: model.path of the params).")
    ] = None,
    out_dir: Annotated[Path, typer.Option(help="Folder of calibration.json and .md.")] = Path("reports"),
    debug: Debug = False,
) -> None:
    """Calibrate the generated problems' difficulty: the base pair and the single agent on each difficulty.

    For each difficulty, generates --problems problems (orchestry.generators.compositional.generate, seed
    --seed), samples the base pair (concat: helper and main independent) and the single agent --samples times
    each with the sampling params of params.yaml, and writes a table (pass@1 of the pair with its bootstrap
    interval over problems, single-agent pass@1, mean reward, truncation rate, tokens per completion, aux-call
    rate) to OUT_DIR/calibration.json and OUT_DIR/calibration.md. One progress line per difficulty (stderr).
    """
    import random

    from orchestry.calibration import calibrate as run_calibration
    from orchestry.calibration import markdown_table, progress_line, write_reports
    from orchestry.config import ParamsError
    from orchestry.generators.compositional import GeneratorError
    from orchestry.runtime import load_policy, open_sandbox
    from orchestry.sandbox import SandboxError
    from orchestry.scoring import FileOptionError

    levels = _difficulties(difficulties)
    command = (
        f"orchestry calibrate --difficulties {difficulties} --problems {problems} "
        f"--samples {samples} --seed {seed}"
        + (f" --params {params}" if params is not None else "")
        + (f" --model {model}" if model is not None else "")
        + (f" --out-dir {out_dir}" if out_dir != Path("reports") else "")
    )
    with _errors(debug, (ParamsError, "--params: "), (FileOptionError, ""), (GeneratorError, "")):
        if out_dir.exists() and not out_dir.is_dir():
            raise FileOptionError("out-dir", f"{out_dir} is not a folder")
        cfg = _load_params(params)
        if model is not None:
            cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": model})})
        if not (Path(cfg.model.path) / "config.json").is_file():
            raise FileOptionError("model", f"no model at {cfg.model.path} (a folder with config.json and weights; "
                                  "`dvc repro prepare` writes models/base)")  # fmt: skip
        typer.echo(f"calibrate: difficulties {difficulties}, {problems} problems x {samples} samples, "
                   f"model {cfg.model.path}", err=True)  # fmt: skip
        import torch

        torch.manual_seed(0)  # as orchestry.runtime.start_stage (sampling itself is seeded per call)
        random.seed(0)
        policy, tok = load_policy(cfg)
        types, num_tests = ("ints", "str"), 4
        try:
            with open_sandbox(cfg) as sb:
                rows, summaries = run_calibration(
                    levels, problems, samples, seed, policy, tok, sb, cfg.sampling,
                    cfg.evaluate.batch_size, cfg.intervals, types, num_tests,
                    on_row=lambda row: typer.echo(progress_line(row), err=True),
                )  # fmt: skip
        except SandboxError as err:
            raise RuntimeError(f"sandbox: {err}") from err
        meta = {
            "model": cfg.model.path,
            "sampling": cfg.sampling.model_dump(),
            "samples": samples,
            "seed": seed,
            "types": list(types),
            "num_tests": num_tests,
            "batch_size": cfg.evaluate.batch_size,
            "confidence": cfg.intervals.confidence,
            "resamples": cfg.intervals.resamples,
        }
        paths = write_reports(rows, summaries, out_dir, command, meta, cfg.intervals.confidence)
    typer.echo(markdown_table(rows, cfg.intervals.confidence), nl=False)
    typer.echo(f"wrote {paths[0]} and {paths[1]}", err=True)


@app.command()
def compare(
    experiment: Annotated[str, typer.Option(help="MLflow experiment.")] = "orchestry",
    metric: Annotated[
        list[str] | None,
        typer.Option(
            help="Metric as stage:name (e.g. evaluate:magrpo/reward) or name; repeatable. Default: "
            "trained and base test reward, cooperation rate, pass@1, MAGRPO's training reward."
        ),  # fmt: skip
    ] = None,
    tracking_uri: Annotated[
        str | None, typer.Option(help="MLflow store (default: sqlite:///<repo root>/mlflow.db).")
    ] = None,
    csv: Annotated[Path | None, typer.Option(help="Also write the table as CSV.")] = None,
    limit: Annotated[
        int, typer.Option(min=1, help="Newest N executions in the table (the CSV has all).")
    ] = 20,
    debug: Debug = False,
) -> None:
    """One row per pipeline execution (DVC experiment / parent run) from MLflow, with its key metrics."""
    from rich.console import Console
    from rich.table import Table

    from orchestry.compare import DEFAULT_METRICS, CompareError, executions, load_runs
    from orchestry.scoring import FileOptionError
    from orchestry.tracking import tracking_uri as default_uri

    with _errors(debug, (CompareError, ""), (FileOptionError, "")):
        _out_file(csv, "--csv")
        runs = load_runs(experiment, tracking_uri or default_uri())
        table = executions(runs, metric or DEFAULT_METRICS, strict=bool(metric))
        if csv is not None:
            csv.parent.mkdir(parents=True, exist_ok=True)
            table.to_csv(csv, index=False)
    shown = table.head(limit)
    if not shown.empty and (shown["params_hash"] == "").all():
        shown = shown.drop(columns="params_hash")
    t = Table(
        title=f"{experiment}: {len(table)} pipeline executions, newest first", caption=_compare_caption(table)
    )
    for c in shown.columns:
        header = c.split(":", 1)[-1].replace("/", "/\n", 1).replace("summary/\n", "")
        t.add_column(header, justify="left" if c in ("execution", "git_revision", "status") else "right")
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
    console = Console()
    if not console.is_terminal:  # piped: wide enough for every column instead of rich's 80
        console = Console(width=200)
    console.print(t)


@app.command()
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
    from rich.console import Console
    from rich.table import Table

    from orchestry.compare import SAMPLE_METRICS, CompareError, paired_comparison, plot_paired, read_samples
    from orchestry.scoring import FileOptionError

    tables = []
    with _errors(debug, (CompareError, ""), (FileOptionError, "")):
        _out_file(csv, "--csv")
        _out_file(plot, "--plot")
        ref = read_samples(reference)
        for other in others:
            t = paired_comparison(ref, read_samples(other), metric or SAMPLE_METRICS, confidence, resamples)
            tables.append(t.assign(file=str(other)))
        if csv is not None:
            csv.parent.mkdir(parents=True, exist_ok=True)
            pd.concat(tables).to_csv(csv, index=False)
        if plot is not None:
            if label and len(label) != len(others):
                raise CompareError(f"--label: {len(label)} labels for {len(others)} compared files")
            plot_paired(tables, label or [o.stem for o in others], plot)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
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
    metrics = [c for c in table.columns[7:] if ":" in c]
    return "metric columns by stage: " + "; ".join(
        f"{c.split(':', 1)[1]} from {c.split(':', 1)[0]}" for c in metrics
    )


@app.command("show-best")
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

    from orchestry.transcripts import TranscriptError, best_and_worst

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


def _can_open_browser() -> bool:
    """A graphical web browser can be opened without taking the terminal: ``BROWSER`` is set (the user's
    choice), or macOS/Windows, or a Linux/BSD graphical session (``DISPLAY`` or ``WAYLAND_DISPLAY``). Python's
    ``webbrowser`` would otherwise fall back to a text browser (lynx, w3m) in this terminal."""
    import os

    if os.environ.get("BROWSER"):
        return True
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _open_when_ready(base: str, url: str, proc: Any, timeout_s: float, browser: bool) -> None:
    """Wait (at most ``timeout_s``) for the server at ``base`` to answer ``/health``, say so on stderr and, if
    ``browser``, open ``url`` in a web browser. Runs in a daemon thread: it never holds the command up."""
    import time
    import urllib.request
    import webbrowser

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    else:
        return
    typer.echo(f"MLflow UI ready: {url}", err=True)
    if browser:
        try:
            webbrowser.open(url, new=2)
        except Exception as e:  # a browser that fails to start must not stop the server
            typer.echo(f"could not open a browser ({e}); open the address above", err=True)


@app.command()
def ui(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 5000,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    tracking_uri: Annotated[
        str | None, typer.Option(help="MLflow store (default: sqlite:///<repo root>/mlflow.db).")
    ] = None,
    experiment: Annotated[
        str, typer.Option(help="MLflow experiment whose runs table is opened.")
    ] = "orchestry",
    browser: Annotated[
        bool,
        typer.Option(
            "--browser/--no-browser",
            help="Open the runs table in a web browser once the server answers (only in a graphical session "
            "or with BROWSER set).",
        ),
    ] = True,
    debug: Debug = False,
) -> None:
    """Start the MLflow UI (mlflow server) on the project's store; artifacts from <repo root>/mlartifacts.

    Prints the address of the experiment's runs table on stdout (MLflow 3's "Model training" mode with the
    columns stage, DVC experiment, git revision, execution and the key test metrics; orchestry.tracking.
    runs_table_url) and, when a graphical browser exists, opens it once the server answers (never waiting for
    the browser). The command runs until the server stops: Ctrl-C or SIGTERM stops both. Exit code 2 when the
    store does not exist; otherwise the server's exit code.
    """
    import os
    import signal
    import subprocess
    import threading

    from orchestry.scoring import FileOptionError
    from orchestry.tracking import repo_root, runs_table_url, set_runs_view, ui_base
    from orchestry.tracking import tracking_uri as default_uri

    with _errors(debug, (FileOptionError, "")):
        uri = tracking_uri or default_uri()
        if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
            raise FileOptionError("tracking-uri", f"no MLflow store at {uri.removeprefix('sqlite:///')} "
                                  "(run the pipeline first, or pass --tracking-uri)")  # fmt: skip
        import mlflow

        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name(experiment)
        base = ui_base(host, port)
        if exp is None:
            url = f"{base}/#/experiments"
            typer.echo(f"no MLflow experiment {experiment!r} in {uri}: opening the experiment list", err=True)
        else:
            set_runs_view(client, exp.experiment_id)  # stores made before the view existed get it too
            url = runs_table_url(exp.experiment_id, base)
        artifacts = repo_root() / "mlartifacts"
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
               "--default-artifact-root", artifacts.as_uri(), "--artifacts-destination", str(artifacts),
               "--host", host, "--port", str(port)]  # fmt: skip
        typer.echo(url)
        typer.echo(f"MLflow UI starting on {base} ({uri}); Ctrl-C stops it", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # its own process group: the server's workers (uvicorn) are stopped with it, whoever signals this command
        proc = subprocess.Popen(cmd, start_new_session=True)
    opener = threading.Thread(
        target=_open_when_ready,
        args=(base, url, proc, 300.0, browser and _can_open_browser()),
        daemon=True,
    )
    opener.start()

    def stop_server(*_: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, stop_server)
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # Ctrl-C: stop the server (another process group), then wait for it
                stop_server()
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_server()  # workers left behind by a server that exited on its own
    raise typer.Exit(0 if code in (0, -signal.SIGTERM, -signal.SIGINT) else code)


@app.command()
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


@app.command()
def report(
    root: Annotated[Path, typer.Option(help="The project's root (its reports/ folder is read).")] = Path("."),
    out: Annotated[Path, typer.Option(help="The HTML page (relative to --root).")] = Path(
        "reports/index.html"
    ),
    debug: Debug = False,
) -> None:
    """(Re)build the HTML report (reports/index.html) from the current reports.

    Metrics with confidence intervals, training gain, API-GRPO, orchestrator, costs, figures, schemes, best and
    worst transcripts (orchestry.report.write_report).
    """
    from orchestry.report import ReportError, write_report

    with _errors(debug, (ReportError, "")):
        path = write_report(root, out)
    typer.echo(str(path))


@app.command()
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


if __name__ == "__main__":  # pragma: no cover
    app()


# ---------------------------------------------------------------- human reward override

OverridesFile = Annotated[
    Path, typer.Option("--file", help="The overrides file (relative to --root), tracked by git.")
]
ReviewRoot = Annotated[
    Path, typer.Option(help="The project's root (its reports/ are read, its data/overrides.jsonl written).")
]


@app.command()
def override(
    item_id: Annotated[
        str, typer.Argument(metavar="ID", help="A trajectory (ag-...) or episode (oe-...) id.")
    ],
    score: Annotated[
        str,
        typer.Argument(metavar="SCORE", help="0..max reward of the row, or a verdict: good (max) / bad (0)."),
    ],
    note: Annotated[str, typer.Option(help="Why (kept with the score).")] = "",
    who: Annotated[
        str | None, typer.Option(help="Reviewer (default: $ORCHESTRY_REVIEWER, git user.name).")
    ] = None,
    root: ReviewRoot = Path("."),
    file: OverridesFile = Path("data/overrides.jsonl"),
    debug: Debug = False,
) -> None:
    """Set a human reward for one API-GRPO trajectory or orchestrator episode (data/overrides.jsonl).

    The next `dvc repro` re-runs train_api_grpo: its behaviour library and reported rewards use the human score
    (orchestry.overrides). An unknown id or a score out of range is refused (exit 2) and the file is unchanged.
    """
    from orchestry.overrides import OverrideError, set_override

    with _errors(debug, (OverrideError, "")):
        o = set_override(root / file, item_id, score, note, root=root, who=who)
    typer.echo(f"{o.id}: score {o.score:g} ({o.who}, {o.when}) -> {root / file}")


def _review_page(item: Any, current: Any, pos: int, total: int, width: int) -> str:
    """One screen of ``orchestry review``: header, the automatic reward parts, each turn (cut at ``width``)."""
    parts = ", ".join(
        f"{k} {v:g}" if isinstance(v, int | float) and not isinstance(v, bool) else f"{k} {v}"
        for k, v in item.parts.items()
        if k not in ("reasons", "override") and not isinstance(v, list | dict)
    )
    lines = [
        f"[{pos + 1}/{total}] {item.id}  {item.title}",
        f"problem {item.task_id}; automatic reward {item.automatic:g} of {item.max_score:g}",
        f"parts: {parts}" if parts else "parts: -",
    ]
    for reason in (item.parts.get("reasons") or [])[:3]:
        lines.append(f"  - {reason}")
    if current is not None:
        lines.append(f"HUMAN OVERRIDE: {current.score:g} by {current.who} at {current.when}: {current.note}")
    for role, text in item.turns:
        body = text.strip()
        if len(body) > width:
            body = body[:width] + f" ... ({len(text) - width} more characters)"
        lines.append(f"--- {role} ---\n{body}")
    return "\n".join(lines)


@app.command()
def review(
    root: ReviewRoot = Path("."),
    file: OverridesFile = Path("data/overrides.jsonl"),
    kind: Annotated[str, typer.Option(help="What to page through: api_grpo, orchestrator or all.")] = "all",
    selected_only: Annotated[
        bool, typer.Option("--selected-only", help="API-GRPO: only each episode's selected trajectory.")
    ] = False,
    width: Annotated[
        int, typer.Option(min=40, max=100_000, help="Characters shown per agent answer.")
    ] = 1200,
    who: Annotated[
        str | None, typer.Option(help="Reviewer (default: $ORCHESTRY_REVIEWER, git user.name).")
    ] = None,
    debug: Debug = False,
) -> None:
    """Page through API-GRPO trajectories and orchestrator episodes; set a score or a verdict with a note.

    Keys (then Enter): n or empty = next, p = previous, a number = that score, g = good (max), b = bad (0),
    q = quit. After a score you are asked for a note. Each score is written at once (atomically) to
    data/overrides.jsonl, as `orchestry override` does.
    """
    from orchestry.overrides import OverrideError, load_reviewables, read_overrides, set_override

    if kind not in ("api_grpo", "orchestrator", "all"):
        _fail(f"--kind: {kind!r} is not one of api_grpo, orchestrator, all", 2, debug)
    with _errors(debug, (OverrideError, "")):
        items = load_reviewables(root)
        current = read_overrides(root / file)
    shown = [
        it
        for it in items.values()
        if kind in ("all", it.kind)
        and (not selected_only or it.kind != "api_grpo" or "(selected)" in it.title)
    ]
    if not shown:
        _fail(
            f"nothing to review under {root}: no reports/api_grpo/episodes.jsonl or "
            "reports/orchestrator/transcripts.jsonl (run dvc repro or dvc pull first)",
            2,
            debug,
        )
    pos, changed = 0, 0
    while 0 <= pos < len(shown):
        item = shown[pos]
        typer.echo("\n" + _review_page(item, current.get(item.id), pos, len(shown), width))
        try:
            key = typer.prompt("[n]ext [p]rev <score> [g]ood [b]ad [q]uit", default="n", show_default=False)
        except typer.Abort:
            break
        key = key.strip().lower()
        if key in ("n", ""):
            pos += 1
        elif key == "p":
            pos = max(0, pos - 1)
        elif key == "q":
            break
        else:
            try:
                note = typer.prompt("note", default="", show_default=False)
            except typer.Abort:
                break
            try:
                o = set_override(root / file, item.id, key, note, root=root, who=who, items=items)
            except OverrideError as e:
                typer.echo(f"error: {e}", err=True)
                continue
            current[o.id] = o
            changed += 1
            typer.echo(f"recorded: {o.id} score {o.score:g}")
            pos += 1
    typer.echo(f"{changed} override(s) written to {root / file}")
