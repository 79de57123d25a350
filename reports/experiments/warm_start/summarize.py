"""Tables of the warm-start experiment: python summarize.py DIR [DIR ...] (one DIR per seed).

The best baseline (highest test pass@1 in baselines/*.json next to the seed folders) is compared with each seed's
trained pair too; ../warm_start_default/ uses this script with its own baselines/.

Each DIR holds the evaluate stage's samples (base.jsonl: adapters off; magrpo.jsonl: warm start + MAGRPO), the
warm-started pair alone (warm_start/magrpo.jsonl, same sampling seed), HumanEval transfer samples
(humaneval_base.jsonl, humaneval_magrpo.jsonl) and the 40 external MBPP problems (external/base.jsonl,
external/magrpo.jsonl); ../warm_start_default/ adds lr1e-4/magrpo.jsonl and lr1e-4/external/ (MAGRPO at lr 1e-4 from
the saved warm-started pair). Arms whose files a seed lacks are left out for that seed. Intervals: 95 % paired percentile bootstrap over problems (orchestry.reporting.compare), per seed and
pooled (each problem's mean over all seeds' samples); over seeds: the mean of the per-seed differences with a
bootstrap over seeds.
"""

import sys
from pathlib import Path

from orchestry.analysis.metrics import bootstrap_ci
from orchestry.reporting.compare import paired_comparison, read_samples

METRICS = ("pass", "total", "coop_rate", "aux_called", "truncated")
ARMS = {  # name: (reference file, other file) inside a seed's folder
    "test: trained - base": ("base.jsonl", "magrpo.jsonl"),
    "test: warm start - base": ("base.jsonl", "warm_start/magrpo.jsonl"),
    "test: trained - warm start": ("warm_start/magrpo.jsonl", "magrpo.jsonl"),
    # ../warm_start_default/: MAGRPO at lr 1e-4 from the same warm-started pair (a probe, not the pipeline)
    "test: MAGRPO lr 1e-4 - base": ("base.jsonl", "lr1e-4/magrpo.jsonl"),
    "test: MAGRPO lr 1e-4 - warm start": ("warm_start/magrpo.jsonl", "lr1e-4/magrpo.jsonl"),
    "test: MAGRPO lr 1e-4 - lr 3e-4 (trained)": ("magrpo.jsonl", "lr1e-4/magrpo.jsonl"),
    "HumanEval: trained - base": ("humaneval_base.jsonl", "humaneval_magrpo.jsonl"),
    "MBPP-easy: trained - base": ("external/base.jsonl", "external/magrpo.jsonl"),
    "MBPP-easy: MAGRPO lr 1e-4 - base": ("lr1e-4/external/base.jsonl", "lr1e-4/external/magrpo.jsonl"),
}


def fmt(row) -> str:
    star = " *" if row["excludes_zero"] else ""
    return f"{row['reference']:.3f} → {row['other']:.3f}, {row['diff']:+.3f} [{row['diff_low']:+.3f}, {row['diff_high']:+.3f}]{star}"


def best_baseline(dirs: list[Path]) -> Path:
    import json

    here = dirs[0].resolve().parent / "baselines"
    return max(here.glob("*.jsonl"), key=lambda f: json.loads(f.with_suffix(".json").read_text())["pass@1"])


def table(dirs: list[Path]) -> None:
    best = best_baseline(dirs)
    arms = {  # the module's arms stay as written; the baseline's path depends on dirs
        **ARMS,
        f"test: trained - best baseline ({best.stem})": (str(best.resolve()), "magrpo.jsonl"),
        f"test: MAGRPO lr 1e-4 - best baseline ({best.stem})": (str(best.resolve()), "lr1e-4/magrpo.jsonl"),
    }
    print("| comparison | seed | " + " | ".join(METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for arm, (ref, oth) in arms.items():
        have = [d for d in dirs if (d / ref).exists() and (d / oth).exists()]
        print_arm(arm, [(d.name, read_samples(d / ref), read_samples(d / oth)) for d in have])


def print_arm(arm: str, seeds: list[tuple[str, list[dict], list[dict]]]) -> None:
    """One comparison's table rows: ``(seed label, reference records, other records)`` per seed, then (with more
    than one seed) the pooled comparison and the mean of the per-seed differences with a bootstrap over seeds.
    ../warm_start_packing/summarize.py prints its arms with it too."""
    per_seed: dict[str, list[float]] = {m: [] for m in METRICS}
    for name, ref, oth in seeds:
        df = paired_comparison(ref, oth, METRICS).set_index("metric")
        for m in METRICS:
            if m in df.index:
                per_seed[m].append(df.loc[m, "diff"])
        print(
            f"| {arm} | {name} | "
            + " | ".join(fmt(df.loc[m]) if m in df.index else "-" for m in METRICS)
            + " |"
        )
    if len(seeds) > 1:
        pooled_ref = [r for _, ref, _ in seeds for r in ref]
        pooled_oth = [r for _, _, oth in seeds for r in oth]
        df = paired_comparison(pooled_ref, pooled_oth, METRICS).set_index("metric")
        print(
            f"| {arm} | pooled ({len(seeds)}) | "
            + " | ".join(fmt(df.loc[m]) if m in df.index else "-" for m in METRICS)
            + " |"
        )
        cells = []
        for m in METRICS:
            v = per_seed[m]
            lo, hi = bootstrap_ci(v, 0.95, 10000)
            cells.append(f"{sum(v) / len(v):+.3f} [{lo:+.3f}, {hi:+.3f}]" if v else "-")
        print(f"| {arm} | over seeds (mean of diffs) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    table([Path(a) for a in sys.argv[1:]])
