"""The tables of an API-GRPO run's outputs: the ``rewards.csv`` rows (:func:`trajectory_rows`), the human
overrides it applied (:func:`override_summary`) and the with/without-guidelines comparison of its evaluation
(:func:`compare_arms`; with a transferred library, none vs transferred vs learned: :func:`compare_transfer`),
the cost block of ``summary.json`` (:func:`cost_summary`) and the four files written (:func:`write_run_files`)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from orchestry.analysis.metrics import mean_ci

CSV_FIELDS = [
    "phase", "arm", "episode", "task_id", "trajectory", "selected", "in_final_beam", "value", "reward",
    "judge", "advantage", "structure", "syntax", "tests", "cooperation", "passed", "total_asserts", "scheme",
    "behaviors_version", "episode_usd", "episode_tokens", "cum_usd", "cum_tokens", "id", "overridden",
    "automatic_reward",
]  # fmt: skip


def trajectory_rows(episodes: Sequence[dict], parts: Sequence[str]) -> list[dict]:
    """One ``rewards.csv`` row per trajectory of every episode, with cumulative cost in episode order."""
    out, cum_usd, cum_tok = [], 0.0, 0
    for rec in episodes:
        cum_usd += rec["cost"]["usd"]
        cum_tok += rec["cost"]["tokens"]
        for t in rec["trajectories"]:
            r = t["reward"]
            out.append(
                {
                    "phase": rec["phase"], "arm": rec["arm"], "episode": rec["episode"], "task_id": rec["task_id"],
                    "trajectory": t["index"], "selected": int(t["selected"]), "in_final_beam": int(t["in_final_beam"]),
                    "value": round(t["value"], 6), "reward": r.get("total", 0.0),
                    "judge": "" if not t["judge"] else round(t["judge"]["combined"], 3),
                    "advantage": round(t["advantage"], 6), "structure": r.get("structure", 0.0),
                    "syntax": r.get("syntax", 0.0), "tests": r.get("tests", 0.0),
                    "cooperation": r.get("cooperation", 0.0), "passed": r.get("passed", 0),
                    "total_asserts": r.get("total_asserts", 0), "scheme": r.get("scheme", ""),
                    "behaviors_version": rec["behaviors_version"], "episode_usd": rec["cost"]["usd"],
                    "episode_tokens": rec["cost"]["tokens"], "cum_usd": cum_usd, "cum_tokens": cum_tok,
                    "id": t["id"], "overridden": int("override" in r),
                    "automatic_reward": r.get("automatic_total", r.get("total", 0.0)),
                    **{f"part_{k}": r.get(k, 0.0) for k in parts},
                }
            )  # fmt: skip
    return out


def override_summary(episodes: Sequence[dict], read: int, ids: Iterable[str] = ()) -> dict:
    """Human overrides met in this run: how many were read, which ids were applied, and per applied id the
    automatic and the human reward (the report lists them); ``unknown``: how many of ``ids`` (the overrides
    read) met no trajectory of this run, ``unknown_ids`` which (the stage warns about them)."""
    rows = {}
    for rec in episodes:
        for t in rec["trajectories"]:
            o = t["reward"].get("override")
            if o is not None and t["id"] not in rows:
                rows[t["id"]] = {
                    "id": t["id"], "phase": rec["phase"], "episode": rec["episode"], "task_id": rec["task_id"],
                    "automatic": t["reward"].get("automatic_total", 0.0), "human": o["score"],
                    "note": o["note"], "who": o["who"],
                }  # fmt: skip
    unknown = sorted(set(ids) - set(rows))
    return {
        "read": read,
        "applied": len(rows),
        "rows": list(rows.values()),
        "unknown": len(unknown),
        "unknown_ids": unknown,
    }


def compare_arms(
    with_: Sequence[float],
    without: Sequence[float],
    confidence: float = 0.95,
    seed: int = 0,
    n_boot: int = 1000,
) -> dict:
    """Means of both arms with percentile-bootstrap CIs, and the paired difference (with - without).

    ``with_[i]`` and ``without[i]`` are the same problem and sample number. Returns ``{"with": {mean,
    ci_low, ci_high, n}, "without": {...}, "difference": {...}}`` (NaN CIs for empty arms).
    """

    diffs = [a - b for a, b in zip(with_, without, strict=False)]
    return {"with": mean_ci(with_, confidence, n_boot, seed), "without": mean_ci(without, confidence, n_boot, seed + 1),
            "difference": mean_ci(diffs, confidence, n_boot, seed + 2), "confidence": confidence,
            "resamples": n_boot}  # fmt: skip


def compare_transfer(
    none: Sequence[float],
    transferred: Sequence[float],
    learned: Sequence[float],
    confidence: float = 0.95,
    seed: int = 0,
    n_boot: int = 1000,
) -> dict:
    """The three arms of a transfer run (``api_grpo.init_behaviors``) with percentile-bootstrap CIs, and the
    paired differences.

    Element i of each arm is the same test problem and sample number. ``learned`` and ``none`` get the seeds of
    :func:`compare_arms`'s ``with`` and ``without`` (and ``learned_minus_none`` the seed of its difference), so
    those intervals equal the summary's ``with``/``without``/``difference``. Returns ``{"arms": {"none",
    "transferred", "learned"}, "difference": {"transferred_minus_none", "learned_minus_none",
    "learned_minus_transferred"}, "confidence", "resamples"}``.
    """

    def paired(a: Sequence[float], b: Sequence[float], s: int) -> dict:
        return mean_ci([x - y for x, y in zip(a, b, strict=False)], confidence, n_boot, s)

    return {
        "arms": {
            "none": mean_ci(none, confidence, n_boot, seed + 1),
            "transferred": mean_ci(transferred, confidence, n_boot, seed + 3),
            "learned": mean_ci(learned, confidence, n_boot, seed),
        },
        "difference": {
            "transferred_minus_none": paired(transferred, none, seed + 4),
            "learned_minus_none": paired(learned, none, seed + 2),
            "learned_minus_transferred": paired(learned, transferred, seed + 5),
        },
        "confidence": confidence,
        "resamples": n_boot,
    }


def cost_summary(total: dict, by_tag: dict, train_episodes: Sequence[dict], price: Any) -> dict:
    """The ``cost`` block of ``summary.json``.

    Args:
        total: the run's cost tracker total (``CostTracker.total.to_dict()``): spent in this run, cache hits free.
        by_tag: the same per tag (agent role, judge ...).
        train_episodes: the training episodes' records (their ``cost``: ``usd``, ``tokens``, ``calls``,
            ``cached_calls``, counted at the original price also when the cache served them).
        price: the backend's :class:`orchestry.llm.cost.Price` (a free backend has both prices 0).

    Returns:
        ``total``'s fields, ``usd_total``/``tokens_total`` (spent in this run) and ``usd_per_episode``,
        ``tokens_per_episode``, ``calls_per_episode`` (consumed per training episode: the price of an episode
        without a cache; 0 without episodes), ``by_tag`` and ``free_backend``.
    """
    n = len(train_episodes)

    def per_episode(value: float) -> float:
        return value / n if n else 0.0

    return {
        **total,
        "usd_total": total["usd"],
        "tokens_total": total["tokens"],
        "usd_per_episode": per_episode(sum(r["cost"]["usd"] for r in train_episodes)),
        "tokens_per_episode": per_episode(sum(r["cost"]["tokens"] for r in train_episodes)),
        "calls_per_episode": per_episode(
            sum(r["cost"]["calls"] + r["cost"]["cached_calls"] for r in train_episodes)
        ),
        "by_tag": by_tag,
        "free_backend": price.input_usd_per_mtok == 0 and price.output_usd_per_mtok == 0,
    }


def write_run_files(
    out: Path, episodes: Sequence[dict], parts: Sequence[str], library: dict, summary: dict
) -> None:
    """Write ``episodes.jsonl``, ``rewards.csv`` (:func:`trajectory_rows`), ``learned_behaviors.json`` and
    ``summary.json`` into ``out`` (created), each atomically: written to ``<name>.tmp``, then renamed over it,
    so an interrupted run never leaves a half-written file (nor the ``.tmp``: a write that fails removes it)."""
    out.mkdir(parents=True, exist_ok=True)

    def atomic(name: str, write: Callable) -> None:
        tmp = out / (name + ".tmp")
        try:
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                write(f)
            tmp.replace(out / name)
        except BaseException:  # a full disk, an interrupt: no .tmp left behind, the old file stays whole
            tmp.unlink(missing_ok=True)
            raise

    def write_csv(f) -> None:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS + [f"part_{k}" for k in parts])
        w.writeheader()
        w.writerows(trajectory_rows(episodes, parts))

    atomic("episodes.jsonl", lambda f: f.writelines(json.dumps(r) + "\n" for r in episodes))
    atomic("rewards.csv", write_csv)
    atomic("learned_behaviors.json", lambda f: f.write(json.dumps(library, indent=2) + "\n"))
    atomic("summary.json", lambda f: f.write(json.dumps(summary, indent=2, default=str) + "\n"))
