"""Best and worst transcripts of a method's per-sample records (``orchestry show-best``).

Records are the JSONL lines the ``evaluate`` and ``baselines`` stages write (``reports/eval/*.jsonl``,
``reports/baselines/*.jsonl``): ``task_id``, ``total`` (the level reward, max 4.0), ``helper`` and ``main`` code,
each level, ``passed``/``total_asserts``, ``scheme``, ...
"""

from __future__ import annotations

import json
import math
from pathlib import Path

REQUIRED = ("task_id", "total")


class TranscriptError(ValueError):
    """The records file is missing, empty or has a malformed line; the message names the file and line."""


def read_records(path: str | Path) -> list[dict]:
    """The records of a JSONL file, each checked for ``task_id`` and a finite numeric ``total``.

    Raises:
        TranscriptError: missing/unreadable file, invalid JSON, a line that is not an object or lacks a field.
    """
    path = Path(path)
    if not path.is_file():
        raise TranscriptError(f"{path} not found (run the evaluate stage, or pass a records file)")
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TranscriptError(f"{path} cannot be read: {e}") from None
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise TranscriptError(f"{path} line {lineno}: not valid JSON: {e}") from None
        if not isinstance(r, dict) or any(k not in r for k in REQUIRED):
            raise TranscriptError(f"{path} line {lineno}: expected an object with {', '.join(REQUIRED)}")
        t = r["total"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise TranscriptError(f"{path} line {lineno}: 'total' must be a finite number, got {t!r}")
        out.append(r)
    if not out:
        raise TranscriptError(f"{path} has no records")
    return out


def best_and_worst(path: str | Path, n: int = 1) -> tuple[list[dict], list[dict]]:
    """``(best, worst)``: the ``n`` records with the highest ``total`` (highest first) and the ``n`` with the
    lowest (lowest first); ties keep file order. With fewer than ``2 n`` records the two lists overlap.

    Raises:
        TranscriptError: see :func:`read_records`; ``n < 1``.
    """
    if n < 1:
        raise TranscriptError(f"n must be >= 1, got {n}")
    recs = read_records(path)
    order = sorted(range(len(recs)), key=lambda i: (-recs[i]["total"], i))
    best = [recs[i] for i in order[:n]]
    worst = [recs[i] for i in sorted(range(len(recs)), key=lambda i: (recs[i]["total"], i))[:n]]
    return best, worst
