"""``orchestry doctor``: this machine's numerics fingerprint, its update dtype (measured once, recorded) and whether
``dvc repro`` here is expected to reproduce the committed outputs (:mod:`orchestry.doctor`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from orchestry.cli.common import Debug, _errors, _load_params

#: exit codes: 0 the committed outputs are expected to reproduce here, 1 they are not (or partly), 2 bad input
EXIT = {"match": 0, "untrained-match": 1, "differs": 1, "other-settings": 1, "no-reference": 1}


def doctor(
    params: Annotated[
        Path | None,
        typer.Option(help="params.yaml (model.numerics, train_magrpo.bf16_update; default ./params.yaml)."),
    ] = None,
    model: Annotated[
        Path | None, typer.Option(help="The embedded model's folder (default: params' model.path).")
    ] = None,
    reference: Annotated[Path, typer.Option(help="The committed fingerprint lines (JSON Lines).")] = Path(
        "reports/numerics_fingerprints.jsonl"
    ),
    record: Annotated[
        bool, typer.Option("--record", help="Append this machine's line to --reference (after a repro here).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print this machine's line as JSON only.")] = False,
    debug: Debug = False,
) -> None:
    """Print this machine (CPU, flags, kernels, MKL branch, threads), the training update's dtype and why
    (train_magrpo.bf16_update: auto is measured once per machine and recorded), the numerics fingerprint (logits /
    adapters / tokens of fixed work with the embedded model, about 30 s) and whether it matches a committed line:
    exit code 0 when `dvc repro` here is expected to reproduce the committed outputs, 1 when not, 2 on bad input."""
    from orchestry import doctor as D
    from orchestry.numerics import apply_numerics, cpu_line
    from orchestry.params_file import ParamsError

    with _errors(
        debug, (ParamsError, "--params: "), (FileNotFoundError, "--model: "), (ValueError, "--reference: ")
    ):
        cfg = _load_params(params)
        refs = D.read_reference(reference)
        apply_numerics(cfg.model.numerics)  # before torch computes anything in this process
        line = D.fingerprint(model or Path(cfg.model.path), cfg.train_magrpo.bf16_update)
        kind, closest = D.verdict(line, refs)
        line["verdict"] = kind
    if as_json:
        typer.echo(json.dumps(line))
    else:
        m = line["machine"]
        typer.echo(f"machine:     {cpu_line()}")
        typer.echo(f"             torch {m['torch']}, kernels {m['kernels']}, MKL branch {m['mkl_cbwr']}, "
                   f"{m['threads']} threads, numerics {line['numerics']}, decode {line['decode_dtype']}")  # fmt: skip
        typer.echo(f"update:      {line['update_dtype']} ({line['update_reason']})")
        typer.echo(f"fingerprint: {D.line_text(line)} (loss {line['loss_after']}, {line['seconds']} s)")
        if closest is not None:
            typer.echo(f"committed:   {D.line_text(closest)} ({closest['machine'].get('cpu', '?')}, "
                       f"{closest['machine'].get('cpu_flags', '?')}, {closest.get('date', '?')})")  # fmt: skip
        typer.echo(f"verdict:     {D.MEANING[kind]}")
    if record:
        reference.parent.mkdir(parents=True, exist_ok=True)
        kept = {k: v for k, v in line.items() if k not in ("verdict", "seconds")}
        with reference.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(kept) + "\n")
        if not as_json:
            typer.echo(f"recorded:    {reference}")
    raise typer.Exit(EXIT[kind])
