"""``orchestry evaluate`` (base vs trained agents on a HumanEval-format file) and ``orchestry calibrate`` (the
base model's pass rates per difficulty)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from orchestry.cli.common import (
    Debug,
    _errors,
    _load_params,
    _out_file,
)


def _params_with_model(params: Path | None, model: str | None):
    """The params (``--params``) with ``--model`` replacing ``model.path``; a folder without ``config.json`` is a
    :class:`FileOptionError` on ``--model``."""
    from orchestry.evaluation.scoring import FileOptionError

    cfg = _load_params(params)
    if model is not None:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": model})})
    if not (Path(cfg.model.path) / "config.json").is_file():
        raise FileOptionError("model", f"no model at {cfg.model.path} (a folder with config.json and weights; "
                              "`dvc repro prepare` writes models/base)")  # fmt: skip
    return cfg


def _check_context(probs, cfg, source: str) -> None:
    """Every problem's prompts and ``sampling.max_completion_length`` fit the model's context (its config.json's
    ``max_position_embeddings``; the tokenizer is read, not the weights).

    Raises:
        ProblemFormatError: see :func:`orchestry.problems.check_context`.
    """
    from orchestry.llm.loading import load_tokenizer
    from orchestry.problems import check_context

    config = json.loads((Path(cfg.model.path) / "config.json").read_text())
    context = config.get("max_position_embeddings") or config.get("n_positions")
    if context:
        tok = load_tokenizer(cfg.model.path)
        check_context(probs, tok, int(context), cfg.sampling.max_completion_length, source)


def _apply_model_numerics(cfg) -> None:
    """Put ``model.numerics`` into effect in this process as every stage does (``runtime.start_stage``), before
    torch computes anything: ``native`` MKL's strict mode, ``portable`` the pinned kernel paths
    (:func:`orchestry.numerics.apply_numerics`), so that a command's samples come from the kernels the stages use.

    Raises:
        FileOptionError: (on ``--params``) ``portable`` could not take effect because torch already chose its
            kernels in this process.
    """
    from orchestry.evaluation.scoring import FileOptionError
    from orchestry.numerics import apply_numerics

    try:
        apply_numerics(cfg.model.numerics)
    except RuntimeError as err:
        raise FileOptionError("params", str(err)) from None


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

    from orchestry.evaluation.agents import AdaptersError, check_adapters, evaluate_agents
    from orchestry.evaluation.scoring import FileOptionError
    from orchestry.params_file import ParamsError
    from orchestry.problems import ProblemFormatError, load_problems
    from orchestry.runtime import OutputNotWritable, check_writable, load_policy, machine_info, open_sandbox
    from orchestry.sandbox import SandboxError

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
        cfg = _params_with_model(params, model)
        check_adapters(adapters)
        _check_context(probs, cfg, str(problems))  # before the weights are loaded
        for path, option in ((out, "out"), (samples, "samples")):  # before the work, not after it
            if path is not None:
                try:
                    check_writable(path.parent, f"--{option}")
                except OutputNotWritable as err:
                    raise FileOptionError(option, str(err)) from None
        k = num_samples or cfg.evaluate.num_samples
        console.print(f"{len(probs)} problems x {k} samples, base vs {adapters}", highlight=False)
        _apply_model_numerics(cfg)
        import torch

        torch.manual_seed(0)  # as orchestry.runtime.start_stage (sampling itself is seeded per call)
        random.seed(0)
        policy, tok = load_policy(cfg, with_adapters=str(adapters))
        methods: dict[str, dict] = {}
        records: dict[str, list[dict]] = {}
        try:
            with open_sandbox(cfg) as sb:
                e = cfg.evaluate
                for name, recs, summary in evaluate_agents(
                    probs, policy, tok, sb, cfg.sampling, k, e.seed, e.batch_size, cfg.intervals, not quiet
                ):
                    methods[name] = summary
                    records[name] = recs
        except SandboxError as err:
            raise RuntimeError(f"sandbox: {err}") from err
        report = {
            "problems_file": str(problems),
            "adapters": str(adapters),
            "model": cfg.model.path,
            "test_problems": len(probs),
            "samples_per_problem": k,
            "intervals": cfg.intervals.model_dump(),
            "machine": machine_info(),
            "methods": methods,
        }
        # written at the end, as a set: an interrupt or an error before this leaves --samples and --out as they were
        if samples is not None:
            _replace_folder(samples, {f"{name}.jsonl": recs for name, recs in records.items()})
        if out is not None:
            _replace_file(out, json.dumps(report, indent=2, sort_keys=True) + "\n")
    if not quiet:
        _print_methods(methods, k, cfg.intervals.confidence, out)


def _replace_file(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (a temporary file beside it, renamed over it; removed on failure)."""
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _replace_folder(folder: Path, files: dict[str, list[dict]]) -> None:
    """Replace ``folder``'s evaluation files as a set: the JSONL ``files`` are written to a temporary folder beside it,
    then the old folder is moved aside and the new one renamed into place (other files the old folder held are
    kept). A failure or an interrupt before the rename leaves ``folder`` as it was and no temporary folder."""
    import shutil
    import tempfile

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    old = None
    try:
        if folder.is_dir():  # keep what else the folder holds
            for item in folder.iterdir():
                if item.name not in files and item.is_file():
                    shutil.copy2(item, tmp / item.name)
        for name, rows in files.items():
            with open(tmp / name, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        if folder.exists():
            old = folder.with_name(f".{folder.name}.old-{tmp.name.split('.')[-2]}")
            folder.rename(old)
        tmp.rename(folder)
    except BaseException:
        if old is not None and not folder.exists():
            old.rename(folder)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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

    from orchestry.evaluation.calibration import calibrate as run_calibration
    from orchestry.evaluation.calibration import markdown_table, progress_line, write_reports
    from orchestry.evaluation.scoring import FileOptionError
    from orchestry.generators.compositional import GeneratorError
    from orchestry.params_file import ParamsError
    from orchestry.runtime import load_policy, machine_info, open_sandbox
    from orchestry.sandbox import SandboxError

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
        cfg = _params_with_model(params, model)
        typer.echo(f"calibrate: difficulties {difficulties}, {problems} problems x {samples} samples, "
                   f"model {cfg.model.path}", err=True)  # fmt: skip
        _apply_model_numerics(cfg)
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
            "machine": machine_info(),
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
