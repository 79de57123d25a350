"""``orchestry override`` and ``orchestry review``: a person's reward for an API-GRPO trajectory or
orchestrator episode (``data/overrides.jsonl``; :mod:`orchestry.overrides`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from orchestry.cli.common import (
    Debug,
    _errors,
    _fail,
)

OverridesFile = Annotated[
    Path, typer.Option("--file", help="The overrides file (relative to --root), tracked by git.")
]


ReviewRoot = Annotated[
    Path, typer.Option(help="The project's root (its reports/ are read, its data/overrides.jsonl written).")
]


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
    """Set a human reward for one API-GRPO trajectory or orchestrator training episode (data/overrides.jsonl).

    The next `dvc repro` re-runs train_api_grpo (its behaviour library and reported rewards use the human score)
    and train_orchestrator (the episode's task reward is the score; orchestry.overrides). An unknown id, an
    orchestrator evaluation episode or a score out of range is refused (exit 2) and the file is unchanged.
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
