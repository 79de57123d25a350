"""The tables of an API-GRPO run's outputs: the ``rewards.csv`` rows (:func:`trajectory_rows`), the human
overrides it applied (:func:`override_summary`) and the with/without-guidelines comparison of its evaluation
(:func:`compare_arms`; with a transferred library, none vs transferred vs learned: :func:`compare_transfer`)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestry.metrics import mean_ci

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


def override_summary(episodes: Sequence[dict], read: int) -> dict:
    """Human overrides met in this run: how many were read, which ids were applied, and per applied id the
    automatic and the human reward (the report lists them)."""
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
    return {"read": read, "applied": len(rows), "rows": list(rows.values())}


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
