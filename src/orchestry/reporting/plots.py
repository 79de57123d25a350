"""Figures: MAGRPO learning curves, methods compared with confidence intervals, cooperation schemes."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LEVEL_COLORS = {"structure": "#4c72b0", "syntax": "#55a868", "tests": "#c44e52", "cooperation": "#8172b2"}
METHOD_LABELS = {
    "base": "base agents (no training)",
    "magrpo": "MAGRPO-trained agents",
    "baseline_single": "single agent",
    "baseline_concat": "naive concatenation",
    "baseline_sequential": "sequential",
    "baseline_discussion": "one-round discussion",
}


def _moving_average(xs: list[float], w: int) -> list[float]:
    out = []
    for i in range(len(xs)):
        window = xs[max(0, i - w + 1) : i + 1]
        out.append(sum(window) / len(window))
    return out


def plot_learning_curves(steps_csv: str | Path, out_png: str | Path, dpi: int = 120) -> None:
    """Mean joint reward and each reward level per MAGRPO step (raw and moving average)."""
    with open(steps_csv) as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    reward = [float(r["reward"]) for r in rows]
    w = max(1, len(rows) // 8)
    axes[0].plot(steps, reward, "o-", alpha=0.35, color="black", label="mean joint reward per step")
    axes[0].plot(
        steps, _moving_average(reward, w), "-", color="black", lw=2, label=f"moving average ({w} steps)"
    )
    axes[0].set(
        title="MAGRPO training reward (max 4.0)", xlabel="policy update (step)", ylabel="joint reward"
    )
    axes[0].legend(loc="best", fontsize=8)
    for lv, c in LEVEL_COLORS.items():
        vals = [float(r[lv]) for r in rows]
        axes[1].plot(steps, _moving_average(vals, w), "-", color=c, label=lv)
    axes[1].set(
        title="Reward levels (moving average)", xlabel="policy update (step)", ylabel="mean level reward"
    )
    axes[1].legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=dpi)
    plt.close(fig)


def plot_methods(metrics: dict, out_png: str | Path, dpi: int = 120) -> None:
    """Mean reward and pass rate per method on the test split, with bootstrap CIs over problems.

    The CIs are ``metrics``'s own (``reports/metrics.json``); the title states the level they were computed at
    (``metrics["intervals"]["confidence"]``, the ``intervals`` params of ``evaluate``).
    """
    methods = metrics["methods"]
    confidence = metrics["intervals"]["confidence"]
    names = list(methods)
    labels = [METHOD_LABELS.get(n, n) for n in names]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, title in (
        (axes[0], "reward", "Mean joint reward (max 4.0)"),
        (axes[1], "pass_rate", "Share of samples passing all tests"),
    ):
        vals = [methods[n].get(key, 0.0) for n in names]
        lo = [methods[n].get(f"{key}_ci_low", v) for n, v in zip(names, vals, strict=True)]
        hi = [methods[n].get(f"{key}_ci_high", v) for n, v in zip(names, vals, strict=True)]
        err = [
            [max(0, v - a) for v, a in zip(vals, lo, strict=True)],
            [max(0, b - v) for v, b in zip(vals, hi, strict=True)],
        ]
        colors = ["#c44e52" if n == "magrpo" else "#8c8c8c" if n == "base" else "#4c72b0" for n in names]
        ax.barh(labels, vals, xerr=err, color=colors, capsize=4)
        ax.set(
            title=f"{title}\n{confidence * 100:g}% bootstrap CI over problems",
            xlabel=key.replace("_", " "),
        )
        ax.invert_yaxis()
    n = metrics.get("test_problems")
    fig.suptitle(f"Test split ({n} problems): methods compared", fontsize=11)
    fig.tight_layout()
    fig.savefig(out_png, dpi=dpi)
    plt.close(fig)


def plot_schemes(schemes: dict, out_png: str | Path, dpi: int = 120) -> None:
    """Stacked shares of cooperation schemes per method."""
    dist = schemes["distribution"]
    names = list(dist)
    fig, ax = plt.subplots(figsize=(10, 4))
    left = [0.0] * len(names)
    cmap = plt.get_cmap("tab10")
    for i, s in enumerate(schemes["schemes"]):
        vals = [dist[m].get(s, 0.0) for m in names]
        ax.barh([METHOD_LABELS.get(m, m) for m in names], vals, left=left, color=cmap(i), label=s)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set(title="Cooperation scheme of main's code (AST analysis)", xlabel="share of samples", xlim=(0, 1))
    ax.invert_yaxis()
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, title="scheme")
    fig.tight_layout()
    fig.savefig(out_png, dpi=dpi)
    plt.close(fig)


COLLAB_RATES = {
    "aux_called_rate": "main calls aux (ungated)",
    "aux_used_rate": "main uses aux's value (ungated)",
    "cooperation_rate": "cooperation level > 0 (gated on a passing assert)",
}


def plot_collaboration(metrics: dict, out_png: str | Path, dpi: int = 120) -> None:
    """Per method: share of samples whose main calls ``aux``, uses its value (both ungated, with the
    bootstrap intervals over problems recorded in ``metrics``) and reaches the gated cooperation level."""
    methods = [m for m in metrics["methods"] if "aux_called_rate" in metrics["methods"][m]]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(methods) + 2), 4))
    width = 0.8 / len(COLLAB_RATES)
    for j, (key, label) in enumerate(COLLAB_RATES.items()):
        xs = [i + (j - 1) * width for i in range(len(methods))]
        ys = [metrics["methods"][m].get(key, 0.0) for m in methods]
        lo = [metrics["methods"][m].get(f"{key}_ci_low") for m in methods]
        hi = [metrics["methods"][m].get(f"{key}_ci_high") for m in methods]
        err = None
        if all(v is not None for v in lo + hi):
            err = [
                [max(0.0, y - v) for y, v in zip(ys, lo, strict=True)],
                [max(0.0, v - y) for y, v in zip(ys, hi, strict=True)],
            ]
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=label)
    level = metrics.get("intervals", {}).get("confidence")
    ax.set_xticks(
        range(len(methods)), [METHOD_LABELS.get(m, m) for m in methods], rotation=20, ha="right", fontsize=8
    )
    title = "Collaboration on the test split"
    ax.set(title=title + (f" ({level:.0%} bootstrap intervals)" if level else ""), ylabel="share of samples")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=dpi)
    plt.close(fig)


def scheme_first_steps(rows: list[dict]) -> dict[str, int]:
    """First training step at which each scheme of main's code appears (``scheme/<name>`` share > 0)."""
    first: dict[str, int] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("scheme/") and v not in ("", None) and float(v) > 0 and k[7:] not in first:
                first[k[7:]] = int(r["step"])
    return first


def plot_scheme_evolution(steps_csv: str | Path, out_png: str | Path, dpi: int = 120) -> dict[str, int]:
    """Scheme distribution of main's code per MAGRPO step (stacked shares of the step's samples), the
    ungated aux-call rate and the share of zero-variance groups; returns each scheme's first step."""
    with open(steps_csv) as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows]
    schemes = sorted({k[7:] for r in rows for k in r if k.startswith("scheme/")})
    first = scheme_first_steps(rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    if schemes:
        shares = [[float(r.get(f"scheme/{s}") or 0.0) for r in rows] for s in schemes]
        labels = [f"{s} (first at step {first[s]})" if s in first else f"{s} (never)" for s in schemes]
        axes[0].stackplot(steps, shares, labels=labels, alpha=0.85)
        axes[0].legend(loc="upper left", fontsize=7)
    axes[0].set(
        title="Scheme of main's code per step", xlabel="policy update (step)", ylabel="share of samples"
    )
    for key, label in (("aux_called_rate", "main calls aux"), ("aux_used_rate", "main uses aux's value"),
                       ("zero_variance_groups", "zero-variance groups")):  # fmt: skip
        if rows and key in rows[0]:
            axes[1].plot(steps, [float(r[key] or 0.0) for r in rows], "o-", ms=3, label=label)
    axes[1].set(title="Ungated collaboration and flat groups", xlabel="policy update (step)", ylabel="share")
    axes[1].legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=dpi)
    plt.close(fig)
    return first
