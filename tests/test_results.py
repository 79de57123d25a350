"""The "What the default run shows" table (orchestry.reporting.results) and README's copy of it."""

import re
from pathlib import Path

from orchestry.reporting.results import ABSENT, best_baseline, results_markdown, results_rows

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
        "base": {
            **_summary(0.1, 1.0),
            "pass@1": 0.1,
            "pass@4": 0.3,
            "chain_form_rate": 0.05,
            "distinct_solutions": 0.9,
        },  # fmt: skip
        "magrpo": {
            **_summary(0.2, 1.5),
            "pass@1": 0.2,
            "pass@2": 0.25,
            "pass@4": 0.35,
            "chain_form_rate": 0.97,
            "distinct_solutions": 0.25,
        },  # fmt: skip
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
    assert header[:6] == ["test set", "pair", "pass@1", "pass@k", "chain form", "distinct"]
    assert all(len(r) == len(header) for r in rows)
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
    assert rows[0][2] == "0.10 [0.05, 0.20]" and rows[2][6] == "1.50 [1.40, 1.60]"
    assert rows[3][2] == "+0.10 [+0.02, +0.18]" and rows[3][7] == "-"  # no paired cooperation given
    # pass@k at the largest k evaluated, the collapse figures beside pass@1; none of them is paired
    assert rows[0][3:6] == ["0.30 (k=4)", "0.05", "0.90"]
    assert rows[2][3:6] == ["0.35 (k=4)", "0.97", "0.25"]
    assert rows[3][3:6] == ["-", "-", "-"]
    assert best_baseline(METRICS["methods"]) == "baseline_concat"
    assert best_baseline({"base": {}}) is None


def test_an_older_metrics_file_without_the_new_figures_shows_a_dash() -> None:
    """A metrics.json written before pass@k, chain form and distinct were in the table (the committed one until
    the next `dvc repro`) still makes the table: those cells read "—", the others are unchanged."""
    _, rows = results_rows(METRICS)
    concat = rows[1]  # baseline_concat: no pass@k, no collapse keys
    assert concat[3:6] == [ABSENT, ABSENT, ABSENT] and concat[2] == "0.15 [0.07, 0.30]"
    humaneval = rows[4]
    assert humaneval[3:6] == [ABSENT, ABSENT, ABSENT]
    none = {**METRICS, "methods": {"base": {**_summary(0.1, 1.0), "pass@1": 0.1, "chain_form_rate": None}}}
    assert results_rows(none)[1][0][3:6] == ["0.10 (k=1)", ABSENT, ABSENT]


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
