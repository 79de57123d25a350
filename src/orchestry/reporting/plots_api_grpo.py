"""Figure of the API-GRPO stage: reward against spend, and test reward with vs without learned behaviours."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_api_grpo(reports_dir: str | Path, out_png: str | Path, dpi: int = 120) -> None:
    """Two panels from ``reports_dir/rewards.csv`` and ``summary.json`` (the ``train_api_grpo`` outputs).

    Left: per training episode, the selected trajectory's executable reward and the group mean value,
    against cumulative USD -- or against cumulative tokens when the backend is free (the local model), as the
    axis label says. Vertical dotted lines mark behaviour-library updates. Right: mean test reward per
    episode WITH and WITHOUT the learned behaviours, with the bootstrap CI (at the level ``summary.json``
    records, ``eval.confidence``) and n.

    Raises:
        FileNotFoundError: the stage's outputs are missing.
    """
    reports_dir = Path(reports_dir)
    summary = json.loads((reports_dir / "summary.json").read_text())
    with open(reports_dir / "rewards.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["phase"] == "train"]
    free = bool(summary.get("cost", {}).get("free_backend"))
    xkey = "cum_tokens" if free else "cum_usd"
    xlabel = (
        "cumulative tokens, prompt + completion (local model: free, so tokens instead of USD)"
        if free
        else "cumulative spend (USD)"
    )
    episodes: dict[str, dict] = {}
    for r in rows:
        e = episodes.setdefault(
            r["episode"], {"x": float(r[xkey]), "values": [], "selected": 0.0, "v": r["behaviors_version"]}
        )
        e["values"].append(float(r["value"]))
        if r["selected"] == "1":
            e["selected"] = float(r["reward"])
    order = sorted(episodes, key=lambda k: int(k))
    xs = [episodes[k]["x"] for k in order]
    max_reward = summary.get("max_reward", 4.0)

    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.6), gridspec_kw={"width_ratios": [1.6, 1]})
    ax = axes[0]
    if order:
        ax.plot(xs, [episodes[k]["selected"] for k in order], "o-", color="#c44e52",
                label="selected trajectory (argmax advantage): executable reward")  # fmt: skip
        ax.plot(xs, [sum(episodes[k]["values"]) / len(episodes[k]["values"]) for k in order], "s--", color="#4c72b0",
                label="mean value of the episode's group (N·k trajectories)")  # fmt: skip
        prev, updated = episodes[order[0]]["v"], False
        for k in order[1:]:
            if episodes[k]["v"] != prev:
                ax.axvline(episodes[k]["x"], color="grey", ls=":", lw=1)
                prev, updated = episodes[k]["v"], True
        if updated:
            ax.plot([], [], color="grey", ls=":", label="new learned behaviours in use from here")
    else:
        ax.text(0.5, 0.5, "no completed training episode", ha="center", va="center", transform=ax.transAxes)
    status = summary.get("budget", {}).get("status", "")
    ax.set(
        title=f"API-GRPO training ({summary.get('task', '')}, {summary.get('model', '')})"
        + ("\nstopped by the budget" if status == "exhausted" else ""),
        xlabel=xlabel,
        ylabel=f"reward (max {max_reward:g})",
        ylim=(-0.05 * max_reward, 1.05 * max_reward),
    )
    ax.legend(loc="best", fontsize=8)

    ax = axes[1]
    ev = summary.get("eval", {})
    arms = [("without", "without behaviours", "#8c8c8c"), ("with", "with learned behaviours", "#55a868")]
    # error bars: percentile-bootstrap CI of the mean over test episodes, at the level the summary records
    if ev.get("status") == "done":
        for i, (key, _label, color) in enumerate(arms):
            s = ev[key]
            m, lo, hi = s["mean"], s["ci_low"], s["ci_high"]
            err = [[max(0.0, m - lo)], [max(0.0, hi - m)]] if not (math.isnan(lo) or math.isnan(hi)) else None
            ax.bar(i, m, yerr=err, color=color, capsize=6)
            ax.text(i + 0.05, m + 0.02 * max_reward, f"{m:.2f}", ha="left", va="bottom", fontsize=9)
        d = ev["difference"]
        ax.set_title(
            f"Test episodes: reward with vs without behaviours\n{ev['confidence'] * 100:g}% bootstrap CI; "
            f"paired difference "
            f"{d['mean']:+.2f} [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}]",
            fontsize=10,
        )
        ax.set_xticks([0, 1], [f"{a[1]}\n(n={ev[a[0]]['n']} test episodes)" for a in arms])
    else:
        ax.text(0.5, 0.5, f"evaluation {ev.get('status', 'not run')}", ha="center", va="center",
                transform=ax.transAxes, wrap=True)  # fmt: skip
        ax.set_title("Test episodes: reward with vs without behaviours", fontsize=10)
        ax.set_xticks([])
    ax.set(ylabel=f"mean executable reward per episode (max {max_reward:g})", ylim=(0, 1.1 * max_reward))
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=dpi)
    plt.close(fig)
