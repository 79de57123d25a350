"""The MLflow metric vocabulary (``docs/metrics.md``): one name per quantity, prefixed by split and kind.

* ``train/<name>``: a training curve, one point per step (MAGRPO step, API-GRPO episode, orchestrator episode;
  ``train/update/...`` per orchestrator update); ``train/summary/<name>``: one value per run that summarises
  the curve (first/last quarter, totals of the search);
* ``test/<method>/<name>``: a method's result on the test split; ``transfer/<set>/<method>/<name>`` on a
  transfer set; ``val/<method>/<name>`` on the val split;
* ``cost/<name>``: a run's tokens, dollars and seconds (``cost/<method>/<name>``: one evaluated method's);
* ``schemes/<method>/<scheme>``: share of a method's samples in a cooperation scheme;
* ``prepare/<name>``: the data preparation's counts.

These functions map the stages' records and report dicts (whose keys other code reads and which stay as they are)
to those names; ``tests/test_metric_names.py`` reads the table of ``docs/metrics.md`` and checks that every stage
logs only names in it. :func:`legacy_name` maps the names stages logged before
(runs without the tag :data:`VOCABULARY_TAG`) to the new ones, so ``orchestry compare`` reads old runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: Tag of every stage run that logs this vocabulary (``orchestry compare`` upgrades runs without it).
VOCABULARY_TAG = "metric_vocabulary"
VOCABULARY_VERSION = "2"

#: Keys of an evaluation summary (:func:`orchestry.analysis.metrics.summarize`) that are costs, and their names under
#: ``cost/<method>/``: mean tokens per sample and the method's wall seconds.
_COST_KEYS = {
    "prompt_tokens": "prompt_tokens_per_sample",
    "completion_tokens": "completion_tokens_per_sample",
    "seconds": "seconds",
}

#: MAGRPO step-record keys renamed on their way to MLflow (the rest is ``train/<key>``).
_STEP_RENAMES = {
    "tokens/prompt": "prompt_tokens",
    "tokens/completion": "completion_tokens",
    "tokens/prompt/greedy": "greedy_prompt_tokens",  # advantage remax: the greedy rollout's share of the two above
    "tokens/completion/greedy": "greedy_completion_tokens",
}


def metric_name(key: str) -> str:
    """MLflow-safe metric name: ``pass@k`` becomes ``pass_at_k`` (MLflow rejects ``@``)."""
    return key.replace("@", "_at_")


def _seg(name: str) -> str:
    """One name segment: agent, pipeline and set names may hold characters MLflow rejects."""
    return re.sub(r"[^A-Za-z0-9_\-. :]", "_", name)


# ---------------------------------------------------------------------------------------------- train_magrpo


def magrpo_step_metrics(rec: Mapping[str, object]) -> dict[str, object]:
    """A MAGRPO step record (``orchestry.training.magrpo.step_log.step_record``; its keys are the steps CSV's columns)
    as MLflow metrics: ``train/<key>``, with ``tokens/prompt`` -> ``train/prompt_tokens``,
    ``tokens/completion`` -> ``train/completion_tokens`` and ``scheme/<s>`` -> ``train/schemes/<s>``."""
    out = {}
    for k, v in rec.items():
        if k in ("step", "problems"):
            continue
        k = _STEP_RENAMES.get(k, k)
        if k.startswith("scheme/"):
            k = "schemes/" + k.removeprefix("scheme/")
        out[f"train/{k}"] = v
    return out


def magrpo_summary_metrics(summary: Mapping[str, object]) -> dict[str, object]:
    """``reports/train/magrpo.json`` as MLflow metrics: the run's totals under ``cost/`` (``prompt_tokens``,
    ``completion_tokens``, ``coach_usd``), everything else (the quarters of the reward curve, ``steps``,
    ``seconds_per_step``, warm start and coach counters) under ``train/summary/``."""
    out: dict[str, object] = {}
    for k, v in summary.items():
        if k in ("prompt_tokens", "completion_tokens", "coach_usd"):
            out[f"cost/{k}"] = v
        else:
            out[f"train/summary/{k}"] = v
    return out


# ---------------------------------------------------------------------------------------- evaluate, baselines


def method_metrics(split: str, method: str, summary: Mapping[str, object]) -> dict[str, object]:
    """One method's evaluation summary (:func:`orchestry.analysis.metrics.summarize`) on ``split`` (``test``,
    ``transfer/<set>`` or ``val``): quality under ``<split>/<method>/<key>``, the cost keys (mean tokens per
    sample, seconds) under ``cost/<method>/`` on the test split and ``cost/<split>/<method>/`` otherwise."""
    cost = f"cost/{method}" if split == "test" else f"cost/{split}/{method}"
    out: dict[str, object] = {}
    for k, v in summary.items():
        if k in _COST_KEYS:
            out[f"{cost}/{_COST_KEYS[k]}"] = v
        else:
            out[f"{split}/{method}/{k}"] = v
    return out


def scheme_metrics(method: str, distribution: Mapping[str, float]) -> dict[str, float]:
    """``detect_schemes``: ``schemes/<method>/<scheme>`` = share of the method's samples in that scheme."""
    return {f"schemes/{method}/{s}": v for s, v in distribution.items()}


def prepare_metrics(report: Mapping) -> dict[str, object]:
    """``prepare``'s counts: ``prepare/problems``, ``prepare/asserts``, ``prepare/canonical_passed``,
    ``prepare/canonical_checked``, ``prepare/split/<split>`` and ``prepare/transfer/<set>`` (problems)."""
    out: dict[str, object] = {
        f"prepare/{k}": report[k] for k in ("problems", "asserts", "canonical_passed", "canonical_checked")
    }
    out |= {f"prepare/split/{k}": v for k, v in report.get("split_sizes", {}).items()}
    out |= {f"prepare/transfer/{k}": v for k, v in report.get("transfer_sizes", {}).items()}
    return out


# ------------------------------------------------------------------------------------------------- summaries


def _interval(path: str) -> str | None:
    """``a/b/mean`` -> ``a/b``, ``a/b/ci_low`` -> ``a/b_ci_low``, ``a/b/ci_high`` -> ``a/b_ci_high``; the count
    ``a/b/n`` -> None (not logged); any other path unchanged."""
    head, _, last = path.rpartition("/")
    if not head:
        return path
    if last == "mean":
        return head
    if last in ("ci_low", "ci_high"):
        return f"{head}_{last}"
    if last == "n":
        return None
    return path


_API_ARMS = {"with": "with_behaviors", "without": "without_behaviors", "difference": "with_minus_without"}


def _api_grpo_eval_name(name: str) -> str | None:
    """``eval/<name>`` of the API-GRPO summary (intervals already folded by :func:`_interval`): each arm's mean
    reward (or reward part) under ``test/api_grpo/<arm>/``, a transfer run's under ``test/api_grpo/transfer/``."""
    m = re.match(r"(.*?)(_ci_low|_ci_high)?$", name)
    base, ci = m.group(1), m.group(2) or ""
    parts = base.split("/")
    if parts[-1] in ("confidence", "resamples", "max_reward"):
        return None
    transfer = parts[0] == "transfer" and len(parts) > 1
    parts = parts[1:] if transfer else parts
    leaf = "reward"
    if parts[0] == "parts" and len(parts) >= 3:
        leaf, parts = parts[1], parts[2:]
    if parts[0] in ("arms", "difference") and len(parts) == 2:
        parts = parts[1:]
    where = "test/api_grpo/transfer" if transfer else "test/api_grpo"
    if len(parts) == 1 and (transfer or parts[0] in _API_ARMS):
        return f"{where}/{_API_ARMS.get(parts[0], _seg(parts[0]))}/{leaf}{ci}"
    return f"{where}/" + "_".join(_seg(p) for p in parts) + ci


def api_grpo_summary_name(key: str) -> str | None:
    """The MLflow name of one flattened key (``orchestry.analysis.metrics.flat_numbers``) of
    ``reports/api_grpo/summary.json``, or None when it is not logged (constants, per-tag cost breakdown)."""
    if key.startswith("cost/by_tag") or key in ("max_reward", "eval/max_reward", "eval/confidence",
                                                 "eval/resamples"):  # fmt: skip
        return None
    name = _interval(key)
    if name is None:
        return None
    if name.startswith("eval/"):
        return _api_grpo_eval_name(name.removeprefix("eval/"))
    if name.startswith("train/"):
        return "train/summary/" + name.removeprefix("train/")
    if name.startswith("cost/"):
        return name
    renames = {
        "episodes_planned": "train/summary/episodes_planned",
        "episodes_completed": "train/summary/episodes",
        "behaviors/version": "train/summary/behaviors_version",
        "cache/hit_rate": "cost/cache/hit_rate",
        "cache/entries": "cost/cache/entries",
        "budget/budget_usd": "cost/budget_usd",
        "budget/spent_usd": "cost/spent_usd",
        "budget/spent_this_run_usd": "cost/spent_this_run_usd",
        "budget/spent_before_usd": "cost/spent_before_usd",
        "budget/fraction": "cost/budget_fraction",
        "budget/eval_budget_fraction": "cost/eval_budget_fraction",
        "judge/calls": "cost/judge_calls",
        "judge/neutral_fallbacks": "train/summary/judge_neutral_fallbacks",
        "seconds/train": "cost/train_seconds",
        "seconds/eval": "cost/eval_seconds",
    }
    return renames.get(name, "train/summary/" + name.replace("/", "_"))


def orchestrator_summary_name(key: str) -> str | None:
    """The MLflow name of one flattened key of ``reports/orchestrator/summary.json`` (sections ``train``,
    ``eval``, ``cost``, ``cache``), or None when it is not logged (``learned/*`` repeats
    ``eval/methods/learned``; transitions and sequences stay in the JSON)."""
    if key.startswith("learned/") or "transitions" in key or "sequences" in key:
        return None
    name = _interval(key)
    if name is None:
        return None
    if name.startswith("train/"):
        return "train/summary/" + name.removeprefix("train/")
    if name.startswith("eval/methods/"):
        policy, _, rest = name.removeprefix("eval/methods/").partition("/")
        return f"test/orchestrator/{_seg(policy)}/{rest}"
    if name.startswith("eval/learned_minus/"):
        policy, _, rest = name.removeprefix("eval/learned_minus/").partition("/")
        return f"test/orchestrator/learned-{_seg(policy)}/{rest}"  # learned minus <policy>
    if name.startswith("eval/"):
        return "test/orchestrator/" + name.removeprefix("eval/").replace("/", "_")
    if name.startswith("cost/"):
        return name
    if name.startswith("cache/"):
        return "cost/cache/" + name.removeprefix("cache/")
    return "train/summary/" + name.replace("/", "_")


def renamed(flat: Mapping[str, object], rename) -> dict[str, object]:
    """``{rename(k): v}`` over ``flat``, leaving out keys ``rename`` maps to None."""
    out = {}
    for k, v in flat.items():
        new = rename(k)
        if new is not None:
            out[new] = v
    return out


# ------------------------------------------------------------------------------------------------ vocabulary


PREFIXES = ("train/", "test/", "transfer/", "val/", "cost/", "schemes/", "prepare/", "system/")


def legacy_name(stage: str | None, name: str) -> str:
    """The current name of metric ``name`` that a run of ``stage`` logged before this vocabulary (a run without
    the tag :data:`VOCABULARY_TAG`); ``name`` itself when it did not change. ``@`` is written ``_at_``."""
    stage = stage or ""
    if name == "cost/wall_seconds" or name.startswith("system/"):
        return name
    if stage == "train_magrpo":
        if name.startswith("summary/"):
            return next(iter(magrpo_summary_metrics({name.removeprefix("summary/"): 0})))
        if name.startswith("cost/"):
            return name
        return next(iter(magrpo_step_metrics({name: 0})))
    if stage == "train_api_grpo":
        if name.startswith("summary/"):
            return api_grpo_summary_name(name.removeprefix("summary/")) or name
        if name.startswith("judge/"):
            return "train/" + name
        if name == "cache/hit_rate" or name.startswith("cost/"):  # the per-episode (cumulative) curves
            return "train/" + name.removeprefix("cost/").replace("/", "_")
        return name
    if stage == "train_orchestrator":
        if name.startswith("summary/"):
            return orchestrator_summary_name(name.removeprefix("summary/")) or name
        if name.startswith("update/"):
            return "train/" + name
        return name
    if stage.startswith("baselines@"):
        if name.startswith("cost/"):
            return name
        return next(iter(method_metrics("test", "baseline_" + stage.removeprefix("baselines@"), {name: 0})))
    if stage == "evaluate":
        if name.startswith(("transfer/", "val/")):
            split, method, key = name.rsplit("/", 2)
            return next(iter(method_metrics(split, method, {key: 0})))
        method, sep, key = name.partition("/")
        if sep and not name.startswith(PREFIXES):
            return next(iter(method_metrics("test", method, {key: 0})))
        return name
    if stage == "detect_schemes":
        return name if name.startswith("schemes/") else f"schemes/{name}"
    if stage == "prepare":
        return name if name.startswith("prepare/") else f"prepare/{name}"
    return name
