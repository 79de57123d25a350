""" "What the default run shows": base pair, best baseline and trained pair on each test set, as a table.

Read from ``reports/metrics.json`` (the ``evaluate`` stage): the test split of the training source and every
transfer set (``prepare.transfer``, e.g. HumanEval's test problems). Each cell is a mean with its bootstrap
interval over problems; the last row of each set is the trained pair minus the base pair on the same problems
(paired bootstrap, :func:`orchestry.evaluation.agents.trained_minus_base`). The ``plot`` stage writes it to
``reports/results.md``; README.md carries a copy that a test keeps equal to it. Beside pass@1: pass@k at the largest
k evaluated and the collapse figures (``chain_form_rate``, ``distinct_solutions``, docs/metrics.md), shown as
:data:`ABSENT` when the ``metrics.json`` predates them.
"""

from __future__ import annotations

import math
import re

COLUMNS = (
    "pass@1",
    "pass@k",
    "chain form",
    "distinct",
    "mean reward (0-4)",
    "cooperation rate (gated)",
    "main calls aux",
    "truncated",
)
#: a cell of a figure that the ``metrics.json`` read does not hold (one written before the figure existed)
ABSENT = "—"
#: the collapse columns (docs/metrics.md) after pass@1 and pass@k: summary key of each
_COLLAPSE = ("chain_form_rate", "distinct_solutions")
#: ``metrics.json`` method keys -> (sample metric of the paired table, summary key, its interval keys' stem)
_CELLS = (
    ("pass", "pass_rate", "pass_rate"),
    ("total", "reward", "reward"),
    ("coop_rate", "cooperation_rate", None),
    ("aux_called", "aux_called_rate", "aux_called_rate"),
    ("truncated", "truncation_rate", None),
)


def _fmt(x, digits: int = 2, sign: bool = False) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "-"
    if not math.isfinite(v):
        return "-"
    return f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"


def _cell(stats: dict, key: str, stem: str | None) -> str:
    text = _fmt(stats.get(key))
    if stem and stats.get(f"{stem}_ci_low") is not None:
        text += f" [{_fmt(stats[f'{stem}_ci_low'])}, {_fmt(stats[f'{stem}_ci_high'])}]"
    return text


def pass_at_largest_k(stats: dict) -> str:
    """``"<pass@k> (k=<k>)"`` at the largest k the summary holds (:func:`orchestry.analysis.metrics.summarize`
    computes pass@k for each k that fits the samples per problem), :data:`ABSENT` when it holds none."""
    ks = [int(m.group(1)) for key in stats if (m := re.fullmatch(r"pass@(\d+)", key))]
    if not ks:
        return ABSENT
    k = max(ks)
    return f"{_fmt(stats[f'pass@{k}'])} (k={k})"


def _new_cells(stats: dict) -> list[str]:
    """pass@k and the collapse figures; :data:`ABSENT` for a key an older ``metrics.json`` lacks (or None)."""
    return [
        pass_at_largest_k(stats),
        *(ABSENT if stats.get(k) is None else _fmt(stats[k]) for k in _COLLAPSE),
    ]


def best_baseline(methods: dict) -> str | None:
    """The ``baseline_*`` method with the highest pass rate (then mean reward), or None."""
    names = [m for m in methods if m.startswith("baseline_")]
    if not names:
        return None
    return max(names, key=lambda m: (methods[m].get("pass_rate") or 0.0, methods[m].get("reward") or 0.0))


def _rows(title: str, methods: dict, paired: dict | None) -> list[list[str]]:
    rows = []
    order = [("base", "base pair")]
    best = best_baseline(methods)
    if best:
        order.append((best, f"best baseline ({best.removeprefix('baseline_')})"))
    order.append(("magrpo", "trained pair (MAGRPO)"))
    for key, label in order:
        if key in methods:
            s = methods[key]
            cells = [_cell(s, k, stem) for _, k, stem in _CELLS]
            rows.append([title, label, cells[0], *_new_cells(s), *cells[1:]])
    if paired:
        cells = []
        for metric, _, _ in _CELLS:
            d = paired.get(metric)
            cells.append(
                "-"
                if not d
                else f"{_fmt(d['diff'], sign=True)} [{_fmt(d['diff_ci_low'], sign=True)}, "
                f"{_fmt(d['diff_ci_high'], sign=True)}]"
            )
        # pass@k and the collapse figures have no paired difference
        rows.append([title, "trained - base (paired)", cells[0], *["-"] * (1 + len(_COLLAPSE)), *cells[1:]])
    return rows


def results_rows(metrics: dict) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)`` of the table: per test set, base pair, best baseline, trained pair, trained - base.

    Raises:
        KeyError: ``metrics`` has no ``methods``.
    """
    header = ["test set", "pair", *COLUMNS]
    rows = _rows(
        f"generated test split ({metrics.get('test_problems', '?')} problems)",
        metrics["methods"],
        metrics.get("trained_minus_base"),
    )
    for name, t in (metrics.get("transfer") or {}).items():
        rows += _rows(
            f"transfer: {name} ({t.get('problems', '?')} problems)",
            t.get("methods") or {},
            t.get("trained_minus_base"),
        )
    return header, rows


def results_note(metrics: dict) -> str:
    """What the brackets and columns mean."""
    level = (metrics.get("intervals") or {}).get("confidence", 0.95)
    return (
        f"Means over samples; brackets: {level:.0%} bootstrap intervals over problems (the paired difference "
        "resamples problems for both pairs at once). Cooperation rate: samples earning the cooperation bonus "
        "(it needs a passing assert); main calls aux: ungated; truncated: a completion hit the token limit. "
        "pass@k: unbiased pass@k at the largest k evaluated (k samples per problem). Chain form: share of samples "
        "whose main function is the problem generator's one shape (r = ...; r = ...; return r); distinct: distinct "
        "programs (up to names and formatting) / samples, per problem: 1/n when all n samples of a problem are one "
        f"program (docs/metrics.md). {ABSENT}: not in this metrics.json."
    )


def results_markdown(metrics: dict) -> str:
    """The markdown table of ``metrics`` (a parsed ``reports/metrics.json``) and its note.

    Raises:
        KeyError: ``metrics`` has no ``methods``.
    """
    header, rows = results_rows(metrics)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n\n" + results_note(metrics) + "\n"


__all__ = [
    "ABSENT",
    "COLUMNS",
    "best_baseline",
    "pass_at_largest_k",
    "results_markdown",
    "results_note",
    "results_rows",
]
