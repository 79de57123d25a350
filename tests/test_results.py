"""The "What the default run shows" table (orchestry.reporting.results) and README's copy of it."""

import re
from pathlib import Path

from orchestry.reporting.results import best_baseline, results_markdown, results_rows

ROOT = Path(__file__).resolve().parents[1]


def _summary(pass_rate: float, reward: float) -> dict:
    return {
        "pass_rate": pass_rate,
        "pass_rate_ci_low": pass_rate / 2,
        "pass_rate_ci_high": pass_rate * 2,
        "reward": reward,
        "reward_ci_low": reward - 0.1,
        "reward_ci_high": reward + 0.1,
        "cooperation_rate": 0.0,
        "aux_called_rate": 0.05,
        "truncation_rate": 0.25,
    }


def _diff(d: float, lo: float, hi: float) -> dict:
    return {
        "base": 0,
        "trained": d,
        "diff": d,
        "diff_ci_low": lo,
        "diff_ci_high": hi,
        "excludes_zero": lo > 0,
    }


METRICS = {
    "test_problems": 32,
    "intervals": {"confidence": 0.9},
    "methods": {
        "base": _summary(0.1, 1.0),
        "magrpo": _summary(0.2, 1.5),
        "baseline_single": _summary(0.15, 1.1),
        "baseline_concat": _summary(0.15, 1.2),  # same pass rate as single: the higher reward wins
    },
    "trained_minus_base": {"pass": _diff(0.1, 0.02, 0.18), "total": _diff(0.5, -0.1, 1.1)},
    "transfer": {
        "humaneval": {
            "problems": 16,
            "methods": {"base": _summary(0.0, 0.5), "magrpo": _summary(0.0, 0.4)},
            "trained_minus_base": {"pass": _diff(0.0, 0.0, 0.0)},
        }
    },
}


def test_rows_per_test_set_with_paired_difference() -> None:
    header, rows = results_rows(METRICS)
    assert header[:3] == ["test set", "pair", "pass@1"]
    labels = [(r[0].split(" (")[0], r[1]) for r in rows]
    assert labels == [
        ("generated test split", "base pair"),
        ("generated test split", "best baseline (concat)"),
        ("generated test split", "trained pair (MAGRPO)"),
        ("generated test split", "trained - base (paired)"),
        ("transfer: humaneval", "base pair"),
        ("transfer: humaneval", "trained pair (MAGRPO)"),
        ("transfer: humaneval", "trained - base (paired)"),
    ]
    assert rows[0][2] == "0.10 [0.05, 0.20]" and rows[2][3] == "1.50 [1.40, 1.60]"
    assert rows[3][2] == "+0.10 [+0.02, +0.18]" and rows[3][4] == "-"  # no paired cooperation given
    assert best_baseline(METRICS["methods"]) == "baseline_concat"
    assert best_baseline({"base": {}}) is None


def test_markdown_states_the_interval_level() -> None:
    text = results_markdown(METRICS)
    assert text.count("\n|") == 8  # header separator + 7 rows (the header is the first line)
    assert "90% bootstrap intervals" in text


def _table(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_readme_carries_the_committed_results_table() -> None:
    """README's "What the default run shows" table is the one `dvc repro` last wrote (reports/results.md)."""
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"## What the default run shows\n(.*?)(?=\n## )", readme, re.S)
    assert section, "README.md has no '## What the default run shows' section"
    committed = (ROOT / "reports/results.md").read_text()
    assert _table(section.group(1)) == _table(committed)
