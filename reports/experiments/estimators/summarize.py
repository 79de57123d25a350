"""Estimator arms against the base pair and against the default estimator (mean), per set.

    python summarize.py ARM [ARM ...] [--seeds 0 1 2] [--out summary.md]

Reads ARM/seedS/trained/<set>.jsonl and mean/seedS/trained/<set>.jsonl (the default estimator, run the same way:
from the same warm start through train_magrpo.init_adapters); the base pair's samples are the skill-not-template
experiment's (../skill_not_template/base/seedS/: they depend on the evaluate seed S + 1 only). Per set: pass@1 of
the arm, arm - base and arm - mean with a 95 % paired bootstrap over problems (each problem's samples of all seeds
pooled; 2,000 resamples, seed 0), gated cooperation. Then per seed: the points on test and external, the run's tokens and training seconds.
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from orchestry.analysis.metrics import is_pass

HERE = Path(__file__).resolve().parent
SNT = HERE.parent / "skill_not_template"
SETS = ["test", "easy40", "mbpp_easy", "others_a", "external"]
EXTERNAL = ["easy40", "mbpp_easy", "others_a"]


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def load(folder: Path, name: str) -> dict[str, list[dict]]:
    recs = (
        [{**r, "task_id": f"{s}:{r['task_id']}"} for s in EXTERNAL for r in records(folder / f"{s}.jsonl")]
        if name == "external"
        else records(folder / f"{name}.jsonl")
    )
    out = defaultdict(list)
    for r in recs:
        out[r["task_id"]].append(r)
    return out


def paired(a: dict, b: dict, n_boot: int = 2000, seed: int = 0) -> str:
    ids = sorted(a)
    d = np.array([np.mean([is_pass(r) for r in b[t]]) - np.mean([is_pass(r) for r in a[t]]) for t in ids])
    boots = d[np.random.default_rng(seed).integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    lo, hi = np.percentile(boots, 2.5), np.percentile(boots, 97.5)
    return f"{d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]" + (" *" if lo > 0 or hi < 0 else "")


ap = argparse.ArgumentParser()
ap.add_argument("arms", nargs="+")
ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
ap.add_argument("--out", default=None)
a = ap.parse_args()
lines = [
    "| arm | seeds | set (problems) | pass@1 | arm − base [95 % CI] | arm − mean [95 % CI] | gated cooperation |",
    "|---|---|---|---|---|---|---|",
]
for arm in a.arms:
    for name in SETS:
        base, mean, tr = defaultdict(list), defaultdict(list), defaultdict(list)
        for s in a.seeds:
            for dst, folder in (
                (base, SNT / "base" / f"seed{s}"),
                (mean, HERE / "mean" / f"seed{s}" / "trained"),
                (tr, HERE / arm / f"seed{s}" / "trained"),
            ):
                for k, v in load(folder, name).items():
                    dst[k] += v
        recs = [r for v in tr.values() for r in v]
        p1 = np.mean([is_pass(r) for r in recs])
        coop = np.mean([r.get("cooperation", 0) > 0 for r in recs])
        seeds = ", ".join(map(str, a.seeds))
        lines.append(
            f"| {arm} | {seeds} | {name} ({len(tr)}) | {p1:.3f} | {paired(base, tr)} | {paired(mean, tr)} | {coop:.3f} |"
        )
lines += [
    "",
    "Per seed (points; the interval above pools the seeds), and what training cost (magrpo.json, times.json):",
    "",
    "| arm | seed | test pass@1 | − base | − mean | external pass@1 | − base | − mean | prompt / completion tokens | train s |",
    "|---|---|---|---|---|---|---|---|---|---|",
]


def rate(folder: Path, name: str) -> float:
    return float(np.mean([is_pass(r) for v in load(folder, name).values() for r in v]))


for arm in a.arms:
    for s in a.seeds:
        cells = []
        for name in ("test", "external"):
            own = rate(HERE / arm / f"seed{s}" / "trained", name)
            base = rate(SNT / "base" / f"seed{s}", name)
            mean = rate(HERE / "mean" / f"seed{s}" / "trained", name)
            cells += [f"{own:.3f}", f"{own - base:+.3f}", f"{own - mean:+.3f}"]
        run = json.loads((HERE / arm / f"seed{s}" / "magrpo.json").read_text())
        times = json.loads((HERE / arm / f"seed{s}" / "times.json").read_text())
        tokens = f"{run['prompt_tokens']:,} / {run['completion_tokens']:,}"
        lines.append(f"| {arm} | {s} | " + " | ".join(cells) + f" | {tokens} | {times['train_s']} |")
text = "\n".join(lines) + "\n"
print(text)
if a.out:
    Path(a.out).write_text(text)
