"""``orchestry budget``: the spend ledgers of the API stages (what each experiment spent, across runs), and
``--reset SCOPE`` to forget one on purpose (:mod:`orchestry.llm.cache`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestry.cli.common import Debug, _errors


def _default_caches(params: Path | None) -> list[Path]:
    """The response caches named in params (``api_grpo.cache_path``, ``train_orchestrator.cache_path``)."""
    from orchestry.cli.common import _load_params
    from orchestry.paths import resolve_path

    cfg = _load_params(params)
    return list(
        dict.fromkeys(resolve_path(p) for p in (cfg.api_grpo.cache_path, cfg.train_orchestrator.cache_path))
    )


def budget(
    cache: Annotated[
        list[Path] | None,
        typer.Option(help="A response cache file (default: api_grpo's and train_orchestrator's cache_path)."),
    ] = None,
    reset: Annotated[
        str | None,
        typer.Option(metavar="SCOPE", help="Forget this scope's spend: its next run starts a fresh budget."),
    ] = None,
    params: Annotated[
        Path | None, typer.Option(help="params.yaml naming the caches (default: ./params.yaml if present).")
    ] = None,
    debug: Debug = False,
) -> None:
    """What each API experiment spent, across runs: the budget of train_api_grpo and train_orchestrator covers an
    experiment (the stage and its params, the budget itself excluded), not one process, so a rerun after a budget
    stop, a crash or a kill continues the same budget. Raising budget_usd is the way to spend more; --reset SCOPE
    forgets a scope's spend on purpose. Exit code 2 on an unknown scope or a cache that is not a sqlite database.
    """
    from orchestry.evaluation.scoring import FileOptionError
    from orchestry.llm.cache import CacheFileError, ResponseCache
    from orchestry.params_file import ParamsError

    with _errors(debug, (ParamsError, "--params: "), (CacheFileError, "--cache: "), (FileOptionError, "")):
        paths = cache or _default_caches(params)
        missing = [p for p in paths if not p.is_file()]
        if cache and missing:
            raise FileOptionError("cache", f"no such file: {missing[0]}")
        rows = []
        for path in (p for p in paths if p.is_file()):
            store = ResponseCache(path)
            try:
                if reset is not None:
                    if store.reset_spend(reset):
                        typer.echo(f"{reset}: spend forgotten in {path}; its next run starts a fresh budget")
                        return
                    continue
                rows += [(path, r) for r in store.spends()]
            finally:
                store.close()
        if reset is not None:
            raise FileOptionError(
                "reset", f"no scope {reset!r} in {', '.join(map(str, paths)) or 'no cache'}"
            )
    if not rows:
        typer.echo("no spend recorded")
        return
    for path, r in rows:
        typer.echo(
            f"{r['scope']}  {r['usd']:.4f} USD  {r['calls']} calls  "
            f"{r['prompt_tokens'] + r['completion_tokens']} tokens  {r['runs']} runs  {path}"
        )
