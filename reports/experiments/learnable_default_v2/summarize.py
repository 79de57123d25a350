"""Per-seed and over-seed figures of a multi-seed experiment: python summarize.py DIR [DIR ...]

Each DIR holds one seed's metrics.json (the evaluate stage's) and magrpo_steps.csv (train_magrpo's).
Over seeds: the mean of the per-seed trained - base differences with a 95 % percentile bootstrap over seeds.
"""

import csv
import json
import sys
from pathlib import Path

from orchestry.analysis.metrics import bootstrap_ci

KEYS = ("pass", "total", "coop_rate", "aux_called", "truncated")


def quarters(steps: Path) -> tuple[float, float]:
    rows = list(csv.DictReader(steps.open()))
    q = max(1, len(rows) // 4)
    first = sum(float(r["reward"]) for r in rows[:q]) / q
    last = sum(float(r["reward"]) for r in rows[-q:]) / q
    return first, last


dirs = [Path(d) for d in sys.argv[1:]]
per = {k: [] for k in KEYS}
he, quart = [], []
print(
    "| run | base pass@1 | trained pass@1 | trained - base pass@1 [95% CI] | reward diff [95% CI] |"
    " gated coop base / trained | aux called base / trained | truncated base / trained |"
    " HumanEval pass@1 base / trained | train reward 1st / last quarter |"
)
print("|---|---|---|---|---|---|---|---|---|---|")
for d in dirs:
    m = json.loads((d / "metrics.json").read_text())
    t = m["trained_minus_base"]
    for k in KEYS:
        per[k].append(t[k]["diff"])
    h = m["transfer"]["humaneval"]["trained_minus_base"]["pass"]
    he.append(h["diff"])
    first, last = quarters(d / "magrpo_steps.csv")
    quart.append(last - first)

    def ci(k, t=t):
        x = t[k]
        star = " *" if x["excludes_zero"] else ""
        return f"{x['diff']:+.3f} [{x['diff_ci_low']:+.3f}, {x['diff_ci_high']:+.3f}]{star}"

    print(
        f"| {d.name} | {t['pass']['base']:.3f} | {t['pass']['trained']:.3f} | {ci('pass')} | {ci('total')} |"
        f" {t['coop_rate']['base']:.3f} / {t['coop_rate']['trained']:.3f} |"
        f" {t['aux_called']['base']:.3f} / {t['aux_called']['trained']:.3f} |"
        f" {t['truncated']['base']:.3f} / {t['truncated']['trained']:.3f} |"
        f" {h['base']:.3f} / {h['trained']:.3f} | {first:.2f} / {last:.2f} |"
    )
print()
print("| over seeds (mean of per-seed differences) | value [95% bootstrap CI over seeds] |")
print("|---|---|")
for name, vals in [
    *((f"trained - base {k}", per[k]) for k in KEYS),
    ("HumanEval trained - base pass", he),
    ("training reward last - first quarter", quart),
]:
    lo, hi = bootstrap_ci(vals, 0.95, 10000)
    print(f"| {name} | {sum(vals) / len(vals):+.3f} [{lo:+.3f}, {hi:+.3f}] |")
