"""Progress bars for the long stages: tqdm on stderr with ETA and a live metric, quiet when not a terminal.

Every long loop of the pipeline (the prepare stage's sandbox check, baselines/evaluate generation and
scoring, MAGRPO steps, API-GRPO episodes, the orchestrator's training and evaluation) shows its bar through
:func:`progress_bar`, so one switch governs them all:

- by default a bar is drawn only when its stream (stderr) is a terminal: ``dvc repro > log`` and CI logs get
  no carriage-return noise;
- ``ORCHESTRY_PROGRESS=1`` forces bars on (e.g. to follow a run through ``tail -f``), ``ORCHESTRY_PROGRESS=0``
  forces them off; any other value is an error naming the variable.

The live metric is shown with tqdm's ``set_postfix`` (e.g. ``bar.set_postfix(reward=f"{mean:.2f}")``); the ETA
is tqdm's (remaining units at the mean rate so far).
"""

from __future__ import annotations

import os
import sys
from typing import IO

from tqdm import tqdm

ENV_VAR = "ORCHESTRY_PROGRESS"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def progress_enabled(stream: IO[str] | None = None) -> bool:
    """Whether bars are drawn: ``ORCHESTRY_PROGRESS`` if set, else whether ``stream`` (stderr) is a terminal.

    Raises:
        ValueError: ``ORCHESTRY_PROGRESS`` is set to something other than 1/0, true/false, yes/no, on/off.
    """
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    if value:
        raise ValueError(
            f"{ENV_VAR}={os.environ[ENV_VAR]!r}: expected 1 or 0 (true/false, yes/no, on/off); "
            "unset: bars only when stderr is a terminal"
        )
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def progress_bar(
    total: int | None,
    desc: str,
    unit: str = "it",
    *,
    initial: int = 0,
    enable: bool = True,
    file: IO[str] | None = None,
) -> tqdm:
    """A tqdm bar over ``total`` units (ETA from the mean rate) written to ``file`` (default: ``sys.stderr``).

    Args:
        total: number of units (``None``: unknown, no ETA). desc: label, e.g. ``"baselines concat: generate"``.
        unit: unit name shown in the rate (``"batch"``, ``"episode"``, ...). initial: units already done
            (a resumed run).
        enable: the caller's own switch (e.g. ``progress=False`` in tests); ``False`` always disables the bar.
        file: the stream; the bar is drawn only if :func:`progress_enabled` says so for it.

    Returns:
        The bar; when disabled, ``update``/``set_postfix``/``close`` are no-ops, so callers never branch.

    Raises:
        ValueError: a bad ``ORCHESTRY_PROGRESS`` (see :func:`progress_enabled`).
    """
    stream = sys.stderr if file is None else file
    on = enable and progress_enabled(stream)
    # the width is read once from the stream (tqdm's default); dynamic_ncols would draw nothing on a terminal that
    # reports 0 columns (a pseudo-terminal without a window size)
    return tqdm(total=total, desc=desc, unit=unit, initial=initial, file=stream, disable=not on)
