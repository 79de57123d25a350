"""Evaluation metrics over per-sample records (MAGRPO paper / CoMLRL evaluation, HumanEval's pass@k).

A record is a dict with at least ``task_id``, ``passed``, ``total_asserts``, ``total``, ``structure``,
``syntax``, ``tests``, ``cooperation``, ``prompt_tokens``, ``completion_tokens``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from scipy import stats

from orchestry.analysis.code_forms import chain_form, normalized_solution
from orchestry.analysis.extract import extract_code

LEVELS = ("structure", "syntax", "tests", "cooperation")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, HumanEval), n samples, c correct."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def bootstrap_ci(
    values: Sequence[float], confidence: float = 0.95, n_boot: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean (``scipy.stats.bootstrap``, ``method="percentile"``,
    ``n_boot`` resamples, generator seeded with ``seed``); ``(nan, nan)`` for an empty input, ``(v, v)`` when every
    value is ``v`` (one value included: no resample can differ)."""
    vals = np.asarray(list(values), dtype=float)
    if vals.size == 0:
        return (float("nan"), float("nan"))
    if np.all(vals == vals[0]):
        return (float(vals[0]), float(vals[0]))
    res = stats.bootstrap((vals,), np.mean, confidence_level=confidence, n_resamples=n_boot, method="percentile",
                          rng=np.random.default_rng(seed))  # fmt: skip
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def difference_ci(
    before: Sequence[float],
    after: Sequence[float],
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 1,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(after) - mean(before)`` for two independent samples (each resampled
    on its own: ``scipy.stats.bootstrap(paired=False)``); ``(nan, nan)`` when either is empty."""
    a, b = np.asarray(list(before), dtype=float), np.asarray(list(after), dtype=float)
    if a.size == 0 or b.size == 0:
        return (float("nan"), float("nan"))
    if np.all(a == a[0]) and np.all(b == b[0]):
        return (float(b[0] - a[0]), float(b[0] - a[0]))

    def diff(x, y, axis=-1):
        return np.mean(y, axis=axis) - np.mean(x, axis=axis)

    res = stats.bootstrap((a, b), diff, confidence_level=confidence, n_resamples=n_boot, method="percentile",
                          paired=False, rng=np.random.default_rng(seed))  # fmt: skip
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def mean_ci(values: Sequence[float], confidence: float, n_boot: int, seed: int) -> dict:
    """``{mean, ci_low, ci_high, n}`` (percentile bootstrap over the values; NaN when empty)."""
    lo, hi = bootstrap_ci(list(values), confidence, n_boot, seed)
    return {
        "mean": sum(values) / len(values) if values else float("nan"),
        "ci_low": lo,
        "ci_high": hi,
        "n": len(values),
    }


def flat_numbers(d: dict, prefix: str = "") -> dict:
    """The numbers of a nested dict by ``a/b/c`` path (bools and other values left out), for MLflow metrics."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_numbers(v, f"{prefix}{k}/"))
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = v
    return out


def is_pass(r: dict) -> bool:
    return r.get("total_asserts", 0) > 0 and r.get("passed", 0) == r.get("total_asserts", 0)


def _code(text: object) -> str:
    """The code of one answer (:func:`orchestry.analysis.extract.extract_code`, as the reward reads it); "" when none."""
    return extract_code(text)[0] if isinstance(text, str) else ""


def _has_texts(records: Iterable[dict]) -> bool:
    return any(isinstance(r.get("main"), str) for r in records)


def chain_form_rate(records: Sequence[dict], entry_points: Mapping[str, str] | None = None) -> float | None:
    """Share of ``records`` whose main answer is in chain form (:func:`orchestry.analysis.code_forms.chain_form`),
    judged on the code extracted from the record's ``main`` text: main's answer for a helper/main pair, the one
    answer of a single-agent baseline, the fixer's code of the writer/tester/fixer workflow.

    Args:
        entry_points: ``task_id -> entry point``; a task not in it (or no mapping) takes the last top-level
            function of main's code not named ``aux``.

    Returns:
        The share in [0, 1]; None when no record holds a ``main`` text (records without answers).
    """
    if not records or not _has_texts(records):
        return None
    eps = entry_points or {}
    hits = sum(chain_form(_code(r.get("main")), eps.get(r.get("task_id"))) for r in records)
    return hits / len(records)


def joint_program(record: dict) -> str:
    """The sample's normalised joint program (:func:`orchestry.analysis.code_forms.normalized_solution` of the
    helper's code, then of main's): equal for two samples that differ only by local names, comments, docstrings
    or formatting."""
    return (
        normalized_solution(_code(record.get("helper")))
        + "\n# main\n"
        + normalized_solution(_code(record.get("main")))
    )


def distinct_solutions(groups: Iterable[Sequence[dict]]) -> float | None:
    """Mean over groups (the samples of one problem) of ``distinct normalised joint programs / samples``
    (:func:`joint_program`), in (0, 1]: 1 when every sample of a problem is a different program, ``1/n`` when
    all n samples are one program up to names and formatting. None when there is no group or no record holds
    a ``main`` text."""
    groups = [list(g) for g in groups if len(g)]
    if not groups or not _has_texts(r for g in groups for r in g):
        return None
    return sum(len({joint_program(r) for r in g}) / len(g) for g in groups) / len(groups)


def summarize(
    records: Sequence[dict],
    ks: Sequence[int] = (1,),
    confidence: float = 0.95,
    n_boot: int = 1000,
    entry_points: Mapping[str, str] | None = None,
) -> dict:
    """Aggregate metrics of one method; intervals at level ``confidence`` over ``n_boot`` bootstrap resamples.

    Returns:
        ``n_problems``, ``n_samples``, ``pass@k`` and ``accuracy@k`` for each k that fits the per-problem
        sample count, ``reward`` (mean total, max 4.0) with ``reward_ci_low/high`` (bootstrap over problems),
        mean of each level, ``cooperation_rate`` (share with cooperation > 0), ``structure_rate``
        (structure = 1.0), ``syntax_rate``, ``pass_rate``; ungated ``aux_defined_rate``, ``aux_called_rate``,
        ``aux_used_rate`` (each with ``_ci_low/_ci_high`` over problems) and ``truncation_rate`` (share of
        samples with a completion that hit ``max_completion_length``; None when not recorded); the collapse
        metrics ``chain_form_rate`` (:func:`chain_form_rate`; ``entry_points``: ``task_id -> entry point``) and
        ``distinct_solutions`` (:func:`distinct_solutions` over the problems), None for records without texts;
        mean ``prompt_tokens``/``completion_tokens`` per sample.
    """
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_task[r["task_id"]].append(r)
    n = len(records)
    out: dict = {"n_problems": len(by_task), "n_samples": n}
    if not n:
        return out
    min_samples = min(len(v) for v in by_task.values())
    for k in ks:
        if k > min_samples:
            continue
        out[f"pass@{k}"] = sum(pass_at_k(len(v), sum(map(is_pass, v)), k) for v in by_task.values()) / len(
            by_task
        )
        acc = []
        for v in by_task.values():
            fr = [r["passed"] / r["total_asserts"] if r.get("total_asserts") else 0.0 for r in v[:k]]
            acc.append(max(fr))
        out[f"accuracy@{k}"] = sum(acc) / len(acc)
    out["reward"] = sum(r["total"] for r in records) / n
    per_problem = [sum(r["total"] for r in v) / len(v) for v in by_task.values()]
    lo, hi = bootstrap_ci(per_problem, confidence, n_boot)
    out["reward_ci_low"], out["reward_ci_high"] = lo, hi
    for lv in LEVELS:
        out[lv] = sum(r[lv] for r in records) / n
    out["cooperation_rate"] = sum(r["cooperation"] > 0 for r in records) / n
    # full structure credit: 1.0 for helper+main; 0.6 (entry point only) for single-agent records
    full = 0.6 if all(r.get("method") == "single" for r in records) else 1.0
    out["structure_rate"] = sum(r["structure"] >= full - 1e-9 for r in records) / n
    out["syntax_rate"] = sum(r["syntax"] > 0 for r in records) / n
    out["pass_rate"] = sum(map(is_pass, records)) / n
    pass_per_problem = [sum(map(is_pass, v)) / len(v) for v in by_task.values()]
    out["pass_rate_ci_low"], out["pass_rate_ci_high"] = bootstrap_ci(pass_per_problem, confidence, n_boot)
    # ungated collaboration facts (they can move before any assert passes); intervals over problems
    for key in ("aux_defined", "aux_called", "aux_used"):
        out[f"{key}_rate"] = sum(bool(r.get(key)) for r in records) / n
        per = [sum(bool(r.get(key)) for r in v) / len(v) for v in by_task.values()]
        out[f"{key}_rate_ci_low"], out[f"{key}_rate_ci_high"] = bootstrap_ci(per, confidence, n_boot)
    flags = [r["truncated"] for r in records if r.get("truncated") is not None]
    out["truncation_rate"] = sum(map(bool, flags)) / len(flags) if flags else None
    # collapse: one template written on every task (docs/metrics.md)
    out["chain_form_rate"] = chain_form_rate(records, entry_points)
    out["distinct_solutions"] = distinct_solutions(by_task.values())
    out["prompt_tokens"] = sum(r.get("prompt_tokens", 0) for r in records) / n
    out["completion_tokens"] = sum(r.get("completion_tokens", 0) for r in records) / n
    return out


#: The figures users compare, ``(column, method, figure)`` of ``reports/metrics.json``'s ``methods``, in the order
#: ``dvc exp show`` shows them (:func:`key_metrics`): ``pass@1`` the trained pair's, ``base@1`` the base pair's,
#: on the test split; each transfer set adds ``<set>@1`` (the trained pair's pass@1 there). Few, with short flat
#: names: the experiment and these fit an 80-column terminal, with the changed params a 120-column one (README,
#: "Experiments"), and ``--keep '[^.]*(@1|reward|coop)$'`` keeps them when ``--only-changed`` would hide them
#: (every params column has a dot).
KEY_METRICS = (
    ("pass@1", "magrpo", "pass@1"),
    ("base@1", "base", "pass@1"),
    ("reward", "magrpo", "reward"),
    ("coop", "magrpo", "cooperation_rate"),
)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def key_metrics(report: dict) -> dict[str, float]:
    """The figures users compare, from a ``reports/metrics.json`` report: ``reports/key_metrics.json``, the only
    DVC metrics file, so ``dvc exp show`` lists these numbers and nothing else as metrics.

    Flat ``{column: number}`` in :data:`KEY_METRICS`'s order (the trained pair's pass@1 on the test split, the base
    pair's, the trained pair's mean reward and cooperation rate), then ``ext@1``: the trained pair's pass@1 pooled
    over the transfer sets other than HumanEval (the problems written outside the generator; each set weighted by
    its problems). Five numbers, so that ``dvc exp show`` fits them beside an experiment's name and a changed param
    in 80-120 columns; per-set figures (HumanEval's, the base pair's), each method's and the intervals stay in
    ``reports/metrics.json``. A figure that is missing or not a number (``None``, NaN, text) is left out.
    """
    out: dict[str, float] = {}

    def figure(methods: object, method: str, name: str) -> float | None:
        summary = methods.get(method) if isinstance(methods, dict) else None
        value = summary.get(name) if isinstance(summary, dict) else None
        return value if _number(value) else None

    for column, method, name in KEY_METRICS:
        value = figure(report.get("methods"), method, name)
        if value is not None:
            out[column] = value
    pooled = {"magrpo": [0.0, 0]}
    for set_name, extra in (report.get("transfer") or {}).items():
        methods = extra.get("methods") if isinstance(extra, dict) else None
        if set_name == "humaneval":
            continue
        for method, acc in pooled.items():
            value, n = figure(methods, method, "pass@1"), figure(methods, method, "n_problems")
            if value is not None and n:
                acc[0] += value * n
                acc[1] += int(n)
    for column, method in (("ext@1", "magrpo"),):
        if pooled[method][1]:
            out[column] = pooled[method][0] / pooled[method][1]
    return out


def quarter_comparison(
    step_rewards: Sequence[Sequence[float]], confidence: float = 0.95, n_boot: int = 1000
) -> dict:
    """Mean training reward of the first vs last quarter of steps, with bootstrap CIs over samples (level
    ``confidence``, ``n_boot`` resamples), the difference's included.

    Args:
        step_rewards: per step, the joint rewards of its samples.
    """
    S = len(step_rewards)
    q = max(1, S // 4)
    first = [x for s in step_rewards[:q] for x in s]
    last = [x for s in step_rewards[S - q :] for x in s]
    res = {"quarter_steps": q}
    for name, vals in (("first_quarter", first), ("last_quarter", last)):
        lo, hi = bootstrap_ci(vals, confidence, n_boot)
        res[f"{name}_reward"] = sum(vals) / len(vals) if vals else float("nan")
        res[f"{name}_ci_low"], res[f"{name}_ci_high"] = lo, hi
    res["difference"] = res["last_quarter_reward"] - res["first_quarter_reward"]
    res["difference_ci_low"], res["difference_ci_high"] = difference_ci(first, last, confidence, n_boot)
    return res
