"""The ``orchestry`` command line (console script ``orchestry = "orchestry.cli:app"``; ``orchestry --help``;
``python -m orchestry.cli``).

Commands: ``score`` (level reward of completions in a file), ``score-text`` (the checked reward of one
story, documentation or research-synthesis answer, each part and the reasons), ``evaluate`` (base vs trained agents on any
HumanEval-format file, the ``evaluate`` stage's metrics), ``compare`` (pipeline executions and their key metrics
from MLflow), ``times`` (seconds per stage of the newest executions, from MLflow), ``show-best`` (best and worst transcripts), ``ui`` (the MLflow UI on the project's store),
``smoke`` (the whole pipeline with micro params in a temporary copy), ``report`` (``reports/index.html``),
``seeds`` (DVC experiments aggregated over seeds), ``paired`` (two methods' evaluation samples, paired by
problem, with bootstrap intervals), ``calibrate`` (the base model's pass rates on generated problems per
difficulty, ``reports/calibration.{json,md}``), ``override`` and ``review`` (a person's reward for an API-GRPO
trajectory or orchestrator episode, ``data/overrides.jsonl``; :mod:`orchestry.overrides`), ``tune``
(hyper-parameter search on Optuna, one DVC experiment per trial; ``tune --show``: the best trials and the
parameter importances), ``budget`` (what each API experiment spent across runs; ``--reset SCOPE`` forgets one), ``doctor`` (this machine's
numerics fingerprint and update dtype: whether ``dvc repro`` here reproduces the committed outputs).

Errors are one line on stderr (``error: --option: what is wrong``), whatever ``--quiet`` says: exit code 2
for a bad option value or an unusable file, 1 for anything else; ``--debug`` (global, ``orchestry --debug CMD``,
or after a command) also prints the traceback.

The commands live in one module per group (``common`` holds what they share); this module makes the app and
registers them, in the order ``--help`` lists them.
"""

from __future__ import annotations

from typing import Annotated

import typer

from orchestry.cli.budget import budget
from orchestry.cli.common import _STATE, _OneLineErrors
from orchestry.cli.doctor import doctor
from orchestry.cli.evaluate import calibrate, evaluate
from orchestry.cli.pipeline import report, smoke
from orchestry.cli.results import compare, paired, seeds, show_best, times
from orchestry.cli.review import override, review
from orchestry.cli.score import score
from orchestry.cli.score_text import score_text
from orchestry.cli.tune import tune
from orchestry.cli.ui import ui

app = typer.Typer(
    name="orchestry",
    cls=_OneLineErrors,
    help="Multi-agent RL for collaborating LLM agents (MAGRPO, API-GRPO, a learned orchestrator); the pipeline runs with `dvc repro`.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
@app.callback()
def _root(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback of an error (any command).")
    ] = False,
) -> None:
    """Orchestry: reproducible multi-agent RL experiments on HumanEval."""
    _STATE["debug"] = debug


app.command()(score)
app.command("score-text")(score_text)
for _command in (seeds, evaluate, calibrate, compare, times, paired):
    app.command()(_command)
app.command("show-best")(show_best)
for _command in (ui, smoke, report, tune, override, review, budget, doctor):
    app.command()(_command)
