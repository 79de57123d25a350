"""What the report page is made of: its inputs read (a missing or malformed one is a :class:`ReportError` naming
the file) and its values formatted (numbers, intervals, USD, tables, code, method labels)."""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from orchestry.reporting.plots import METHOD_LABELS


class ReportError(ValueError):
    """An input of the report is missing or malformed; the message (one line) names the file."""


def _read(path: Path, parse: Callable[[str], Any]) -> Any:
    try:
        return parse(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"missing input {path}") from None
    except (OSError, ValueError) as e:
        raise ReportError(
            f"cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from e


def _json(path: Path) -> Any:
    return _read(path, json.loads)


def _jsonl(path: Path) -> list[dict]:
    return _read(path, lambda text: [json.loads(line) for line in text.splitlines() if line.strip()])


def _get(obj: Any, *keys: str, source: Path) -> Any:
    """``obj[k1][k2]...``, or a ReportError naming the missing key and the file."""
    for i, k in enumerate(keys):
        if not isinstance(obj, dict) or k not in obj:
            raise ReportError(f"{source}: missing key {'.'.join(keys[: i + 1])}")
        obj = obj[k]
    return obj


def _num(v: Any, digits: int = 2) -> str:
    """A number with thousands separators and ``digits`` decimals (integers as they are); "—" when
    missing or not finite; anything else as its text."""
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "—" if v is None else str(v)
    return f"{x:,.{digits}f}" if math.isfinite(x) else "—"


def _ci(mean: Any, low: Any, high: Any, digits: int = 2) -> str:
    """``mean [low, high]``; just the mean when the interval is unknown."""
    if low is None or high is None:
        return _num(mean, digits)
    return f"{_num(mean, digits)} [{_num(low, digits)}, {_num(high, digits)}]"


def _ci_of(stats: dict, key: str, digits: int = 2) -> str:
    """From a flat dict with ``key``, ``key_ci_low`` and ``key_ci_high`` (``reports/metrics.json`` style)."""
    return _ci(stats.get(key), stats.get(f"{key}_ci_low"), stats.get(f"{key}_ci_high"), digits)


def _ci_dict(stats: dict | None, digits: int = 2) -> str:
    """From ``{"mean", "ci_low", "ci_high"}`` (the API-GRPO and orchestrator summaries)."""
    if not stats:
        return "—"
    return _ci(stats.get("mean"), stats.get("ci_low"), stats.get("ci_high"), digits)


def _usd(v: Any) -> str:
    text = _num(v, 4)
    return text if text == "—" or not text[-1].isdigit() else f"${text}"


#: A cell ``<mean> [<low>, <high>]`` (after escaping): the interval is kept on one line, the cell may break before it.
_INTERVAL_CELL = re.compile(r"<td>([^<\[]*?) (\[[^\]<]*\])</td>")


def _table(rows: list[dict], kind: str = "") -> str:
    """An HTML table (pandas) of ``rows``, one column per key, the first naming the row; cells are escaped.

    Cells wrap at spaces so that a table fits the page (1200 px) instead of scrolling sideways; an interval
    (``[low, high]``) stays on one line (``<span class="ci">``), so a cell breaks only between mean and interval.
    ``kind``: an extra class of the table (``kv``: name/value rows, values aligned left)."""
    classes = ["data", kind] if kind else "data"
    table = pd.DataFrame(rows).fillna("—").to_html(classes=classes, border=0, escape=True, index=False)
    table = _INTERVAL_CELL.sub(r'<td>\1 <span class="ci">\2</span></td>', table)
    return f'<div class="table">{table}</div>'


def _code(text: Any) -> str:
    return f"<pre><code>{html.escape(str(text or ''))}</code></pre>"


def _label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


def _k_keys(methods: dict, prefix: str) -> list[str]:
    """``pass@1``, ``pass@2``, ... present in any method, sorted by k."""
    pat = re.compile(rf"^{re.escape(prefix)}@(\d+)$")
    ks = {int(m.group(1)) for stats in methods.values() for k in stats if (m := pat.match(k))}
    return [f"{prefix}@{k}" for k in sorted(ks)]
