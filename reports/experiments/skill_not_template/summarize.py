"""Tables of the skill-not-template experiment: each arm's trained pair against the base pair, per set.

    python summarize.py ARM [ARM ...] [--seeds 0 1 2] [--out summary.md] [--pass4]

Reads ARM/seedS/trained/<set>.jsonl and base/seedS/<set>.jsonl (the same evaluate seed S + 1 for both pairs).
Per set: pass@1 of each pair, trained - base with a 95 % paired bootstrap over problems (each problem's samples of
all seeds pooled; 2,000 resamples, seed 0), the per-seed differences, pass@2, the gated cooperation rate (samples
earning the cooperation level), the chain-form share and distinct solutions of the trained pair
(orchestry.analysis.metrics). "external" pools easy40, mbpp_easy and others_a (120 problems: the reported sets);
others_val is the validation set. --pass4: pass@1 and pass@4 from 4 samples per problem and seed (the first 2 and
more_samples.sh's 2), trained - base with the same bootstrap, the per-seed pass@4 differences.
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from orchestry.analysis.metrics import chain_form_rate, distinct_solutions, is_pass, pass_at_k

HERE = Path(__file__).resolve().parent
SETS = ["test", "easy40", "mbpp_easy", "others_a", "external", "others_val"]
EXTERNAL = ["easy40", "mbpp_easy", "others_a"]


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def load(folder: Path, name: str) -> list[dict]:
    if name == "external":
        return [
            {**r, "task_id": f"{s}:{r['task_id']}"} for s in EXTERNAL for r in records(folder / f"{s}.jsonl")
        ]
    return records(folder / f"{name}.jsonl")


def by_problem(recs: list[dict]) -> dict[str, list[dict]]:
    out = defaultdict(list)
    for r in recs:
        out[r["task_id"]].append(r)
    return out


def rate(recs, key):
    return float(np.mean([key(r) for r in recs])) if recs else float("nan")


def paired_ci(base: dict, trained: dict, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    ids = sorted(base)
    d = np.array(
        [np.mean([is_pass(r) for r in trained[t]]) - np.mean([is_pass(r) for r in base[t]]) for t in ids]
    )
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    return float(d.mean()), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def pass_k(groups: dict, k: int) -> float:
    return float(np.mean([pass_at_k(len(v), sum(map(is_pass, v)), k) for v in groups.values()]))


def coop(r):
    return r.get("cooperation", 0) > 0


def arm_rows(arm: str, seeds: list[int]) -> list[str]:
    rows = []
    for name in SETS:
        base_all, trained_all, per_seed = defaultdict(list), defaultdict(list), []
        tr_seed_groups = []
        for s in seeds:
            b = by_problem(load(HERE / "base" / f"seed{s}", name))
            t = by_problem(load(HERE / arm / f"seed{s}" / "trained", name))
            per_seed.append(paired_ci(b, t)[0])
            tr_seed_groups.append(t)
            for k, v in b.items():
                base_all[k] += v
            for k, v in t.items():
                trained_all[k] += v
        mean, lo, hi = paired_ci(base_all, trained_all)
        b_recs = [r for v in base_all.values() for r in v]
        t_recs = [r for v in trained_all.values() for r in v]
        star = " *" if lo > 0 or hi < 0 else ""
        chain = chain_form_rate(t_recs)
        distinct = float(np.mean([distinct_solutions(g.values()) for g in tr_seed_groups]))
        rows.append(
            f"| {arm} | {name} ({len(base_all)}) | {rate(b_recs, is_pass):.3f} | {rate(t_recs, is_pass):.3f} | "
            f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]{star} | {', '.join(f'{x:+.3f}' for x in per_seed)} | "
            f"{pass_k(base_all, 2):.3f} → {pass_k(trained_all, 2):.3f} | {rate(b_recs, coop):.3f} → "
            f"{rate(t_recs, coop):.3f} | {chain_form_rate(b_recs):.2f} → {chain:.2f} | {distinct:.2f} |"
        )
    return rows


def four_samples(folder: Path, extra: str, name: str) -> dict[str, list[dict]]:
    """A pair's 4 samples per problem for one seed: the first 2 (evaluate seed S + 1) and the 2 of more_samples.sh
    (seed S + 101, in folder/extra)."""
    groups = by_problem(load(folder, name))
    for k, v in by_problem(load(folder / extra, name)).items():
        groups[k] += v
    return groups


def per_problem(groups: list[dict], fn) -> dict[str, float]:
    """fn of each problem's samples, averaged over the seeds."""
    return {t: float(np.mean([fn(g[t]) for g in groups])) for t in groups[0]}


def diff_ci(base: dict, trained: dict, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    d = np.array([trained[t] - base[t] for t in sorted(base)])
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    return float(d.mean()), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def pass4_rows(arm: str, seeds: list[int]) -> list[str]:
    """pass@1 and pass@4 from 4 samples per problem and seed (the seeds' estimates averaged per problem), trained
    - base with a paired bootstrap over problems, and the per-seed differences of pass@4."""
    rows = []
    p1 = lambda v: float(np.mean([is_pass(r) for r in v]))  # noqa: E731
    p4 = lambda v: pass_at_k(len(v), sum(map(is_pass, v)), 4)  # noqa: E731
    for name in [n for n in SETS if n != "others_val"]:
        b = [four_samples(HERE / "base" / f"seed{s}", "more", name) for s in seeds]
        t = [four_samples(HERE / arm / f"seed{s}" / "trained", "../trained_more", name) for s in seeds]
        if any(len(v) != 4 for g in b + t for v in g.values()):
            raise SystemExit(f"{name}: not 4 samples per problem in every seed (run more_samples.sh)")
        cells = []
        for fn in (p1, p4):
            pb, pt = per_problem(b, fn), per_problem(t, fn)
            m, lo, hi = diff_ci(pb, pt)
            star = " *" if lo > 0 or hi < 0 else ""
            cells.append(f"{np.mean(list(pb.values())):.3f} → {np.mean(list(pt.values())):.3f} | "
                         f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]{star}")  # fmt: skip
        seeds_p4 = [
            diff_ci(per_problem([bb], p4), per_problem([tt], p4))[0] for bb, tt in zip(b, t, strict=True)
        ]
        rows.append(f"| {arm} | {name} ({len(b[0])}) | {cells[0]} | {cells[1]} | "
                    f"{', '.join(f'{x:+.3f}' for x in seeds_p4)} |")  # fmt: skip
    return rows


ap = argparse.ArgumentParser()
ap.add_argument("arms", nargs="+")
ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
ap.add_argument("--out", default=None)
ap.add_argument("--pass4", action="store_true", help="the 4-sample table (pass@1, pass@4) instead")
a = ap.parse_args()
if a.pass4:
    head4 = [
        "| arm | set (problems) | pass@1 base → trained (4 samples) | trained − base [95 % CI] | pass@4 base → "
        "trained | trained − base [95 % CI] | pass@4 difference per seed |",
        "|---|---|---|---|---|---|---|",
    ]
    text = "\n".join(head4 + [row for arm in a.arms for row in pass4_rows(arm, a.seeds)]) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    raise SystemExit(0)
head = [
    "| arm | set (problems) | base pass@1 | trained pass@1 | trained − base, seeds pooled [95 % CI] | per seed | "
    "pass@k (k = 2 per seed; pooled n) base → trained | gated cooperation base → trained | chain form base → "
    "trained | distinct (trained) |",
    "|---|---|---|---|---|---|---|---|---|---|",
]
lines = head + [row for arm in a.arms for row in arm_rows(arm, a.seeds)]
text = "\n".join(lines) + "\n"
print(text)
if a.out:
    Path(a.out).write_text(text)
