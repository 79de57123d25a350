"""Tables of the easy-external experiment: python summarize.py SEED_DIR [SEED_DIR ...] [--set NAME].

Each SEED_DIR holds ``<set>/base.jsonl`` (the pair with its adapters off) and ``<set>/magrpo.jsonl`` (the trained
pair, same sampling seed), as written by ``orchestry evaluate --problems FILE --samples SEED_DIR/<set>``. ``--set``
names the sub-folder (default ``easy40``). Rows: every problem, then the problems whose computation the generator's
primitives also express (``vocabulary.json``, written before any evaluation) and the others.

Intervals: 95 % paired percentile bootstrap over problems (``orchestry.reporting.compare.paired_comparison``), per
seed and pooled (each problem's mean over all seeds' samples); "over seeds": the mean of the per-seed differences
with a bootstrap over seeds. ``*``: the interval excludes 0.
"""

import argparse
import json
from pathlib import Path

from orchestry.analysis.metrics import bootstrap_ci
from orchestry.reporting.compare import paired_comparison, read_samples

HERE = Path(__file__).resolve().parent
METRICS = ("pass", "total", "aux_called", "truncated")


def fmt(row) -> str:
    star = " *" if row["excludes_zero"] else ""
    return f"{row['reference']:.3f} → {row['other']:.3f}, {row['diff']:+.3f} [{row['diff_low']:+.3f}, {row['diff_high']:+.3f}]{star}"


def rows(name: str, runs: list[tuple[str, list[dict], list[dict]]]) -> None:
    per_seed: dict[str, list[float]] = {m: [] for m in METRICS}
    for seed, base, trained in runs:
        df = paired_comparison(base, trained, METRICS).set_index("metric")
        for m in METRICS:
            per_seed[m].append(df.loc[m, "diff"])
        print(
            f"| {name} | {seed} | {df.loc['pass', 'n_problems']} | "
            + " | ".join(fmt(df.loc[m]) for m in METRICS)
            + " |"
        )
    if len(runs) > 1:
        base = [r for _, b, _ in runs for r in b]
        trained = [r for _, _, t in runs for r in t]
        df = paired_comparison(base, trained, METRICS).set_index("metric")
        n = df.loc["pass", "n_problems"]
        print(
            f"| {name} | pooled ({len(runs)}) | {n} | " + " | ".join(fmt(df.loc[m]) for m in METRICS) + " |"
        )
        cells = []
        for m in METRICS:
            lo, hi = bootstrap_ci(per_seed[m], 0.95, 10000)
            cells.append(f"{sum(per_seed[m]) / len(per_seed[m]):+.3f} [{lo:+.3f}, {hi:+.3f}]")
        print(f"| {name} | over seeds (mean of diffs) | {n} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--set", default="easy40")
    args = ap.parse_args()
    vocab = {k for k in json.loads((HERE / "vocabulary.json").read_text()) if not k.startswith("_")}
    runs = [
        (d.name, read_samples(d / args.set / "base.jsonl"), read_samples(d / args.set / "magrpo.jsonl"))
        for d in args.dirs
    ]
    print(
        "| problems | seed | n | " + " | ".join(f"{m}: base → trained, diff [95 %]" for m in METRICS) + " |"
    )
    print("|---|---|---|" + "---|" * len(METRICS))
    rows("all", runs)
    if args.set == "easy40":
        rows(
            "in the generator's vocabulary",
            [
                (s, [r for r in b if r["task_id"] in vocab], [r for r in t if r["task_id"] in vocab])
                for s, b, t in runs
            ],
        )
        rows(
            "outside it",
            [
                (s, [r for r in b if r["task_id"] not in vocab], [r for r in t if r["task_id"] not in vocab])
                for s, b, t in runs
            ],
        )


if __name__ == "__main__":
    main()
