"""Figures of the ``train_orchestrator`` stage: reward vs cost (Pareto), agent utilisation, transition matrix."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {
    "learned": "#c44e52",
    "helper_main": "#4c72b0",
    "all_in_order": "#8172b2",
    "test_fix_loop": "#55a868",
}


def _pareto(points: list[tuple[float, float, str]]) -> list[str]:
    """Methods not dominated (no other method has lower-or-equal cost and higher-or-equal reward, one strictly)."""
    front = []
    for c, r, m in points:
        if not any((c2 <= c and r2 >= r) and (c2 < c or r2 > r) for c2, r2, _ in points):
            front.append(m)
    return front


def _err(s: dict) -> list[list[float]] | None:
    lo, hi, m = s["ci_low"], s["ci_high"], s["mean"]
    if any(isinstance(v, float) and math.isnan(v) for v in (lo, hi, m)):
        return None
    return [[max(0.0, m - lo)], [max(0.0, hi - m)]]


def plot_orchestrator(reports_dir: str | Path, out_dir: str | Path, dpi: int = 120) -> list[Path]:
    """Three PNGs from ``reports_dir/summary.json`` (the stage's summary) into ``out_dir``:

    * ``orchestrator_pareto.png``: mean task reward (level reward, max 4.0) against mean cost per episode
      (cost unit of the run) on the test problems, the learned orchestrator and each fixed pipeline, with the
      CI recorded in the summary (percentile bootstrap over problems) on both axes; the Pareto front dashed;
    * ``orchestrator_agents.png``: each agent's share of the actions of every method (agent utilisation);
    * ``orchestrator_transitions.png``: the learned policy's agent-transition matrix on the test problems
      (row-normalised heat map, counts in the cells; ``start`` row, ``terminate`` column), titled with the share
      of episodes containing a cycle (an agent acting twice); beside it the same matrix over the last quarter of
      training episodes.

    Returns:
        The three paths. Raises: FileNotFoundError: the summary is missing.
    """
    reports_dir, out_dir = Path(reports_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    s = json.loads((reports_dir / "summary.json").read_text())
    methods = s["eval"].get("methods", {})
    level = round(100 * s.get("confidence", 0.95))
    unit = "tokens" if s.get("cost_unit") == "tokens" else "USD"
    paths = [
        out_dir / n
        for n in ("orchestrator_pareto.png", "orchestrator_agents.png", "orchestrator_transitions.png")
    ]

    # 1. reward vs cost
    fig, ax = plt.subplots(figsize=(7.5, 5))
    pts = []
    for m, st in methods.items():
        c, r = st["cost"]["mean"], st["reward"]["mean"]
        pts.append((c, r, m))
        learned = m == "learned"  # drawn on top as a star: it may sit on a pipeline's point
        ax.errorbar(c, r, xerr=_err(st["cost"]), yerr=_err(st["reward"]), fmt="*" if learned else "o",
                    ms=16 if learned else 9, capsize=4, zorder=5 if learned else 3, mfc="none" if learned else None,
                    mew=2 if learned else 1, color=COLORS.get(m, "#333333"),
                    label=f"{m} (n={st['reward']['n']}, {st['length']:.1f} agents)")  # fmt: skip
    front = sorted((p for p in pts if p[2] in _pareto(pts)), key=lambda p: p[0])
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=1, label="Pareto front")
    if not pts:
        ax.text(0.5, 0.5, f"evaluation {s['eval'].get('status')}", ha="center", transform=ax.transAxes)
    ax.set(
        xlabel=f"mean cost per episode ({unit}, cached answers counted at their size)",
        ylabel="mean task reward on test problems (level reward, max 4.0)",
        title=f"Learned orchestrator vs fixed pipelines ({s.get('model', '')})\n"
        f"{level}% bootstrap CIs over problems; lambda = {s.get('cost_lambda')} per {unit[:-1] if unit == 'tokens' else unit}",
    )
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(paths[0], dpi=dpi)
    plt.close(fig)

    # 2. agent utilisation
    agents = s.get("agents", [])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(methods))
    for i, (m, st) in enumerate(methods.items()):
        shares = [st["agent_share"].get(a, 0.0) for a in agents]
        ax.bar([j + i * width for j in range(len(agents))], shares, width, label=m, color=COLORS.get(m))
    train_share = s.get("train", {}).get("last_quarter_agent_share", {})
    if train_share:
        ax.plot([j + 0.4 - width / 2 for j in range(len(agents))], [train_share.get(a, 0.0) for a in agents],
                "kx", ms=9, label="learned, last quarter of training")  # fmt: skip
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(agents))], agents)
    ax.set(ylabel="share of agent actions", title="Agent utilisation (test problems)", ylim=(0, 1.05))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=dpi)
    plt.close(fig)

    # 3. transition matrices
    learned = s.get("learned", {})
    mats = [("learned, test problems", learned.get("transitions", {})),
            ("learned, last quarter of training", learned.get("train_transitions", {}))]  # fmt: skip
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, (title, mat) in zip(axes, mats, strict=True):
        rows = list(mat)
        cols = list(next(iter(mat.values()))) if mat else []
        counts = [[mat[r][c] for c in cols] for r in rows]
        norm = [[v / sum(row) if sum(row) else 0.0 for v in row] for row in counts]
        ax.imshow(norm or [[0.0]], cmap="Blues", vmin=0, vmax=1, aspect="auto")
        for i, row in enumerate(counts):
            for j, v in enumerate(row):
                if v:
                    ax.text(j, i, str(v), ha="center", va="center", fontsize=8,
                            color="white" if norm[i][j] > 0.6 else "black")  # fmt: skip
        ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right")
        ax.set_yticks(range(len(rows)), rows)
        ax.set(xlabel="next action", ylabel="previous action", title=title)
    cyc = learned.get("cycle_share", 0.0)
    train_cyc = s.get("train", {}).get("last_quarter_cycle_share", 0.0)
    fig.suptitle(
        f"Agent transitions (row-normalised; counts in cells). Episodes with a cycle (an agent acting twice): "
        f"test {100 * cyc:.0f}%, last training quarter {100 * train_cyc:.0f}%",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(paths[2], dpi=dpi)
    plt.close(fig)
    return paths
