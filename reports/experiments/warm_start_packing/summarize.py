"""Tables of the warm-start packing experiment: python summarize.py [OTHER] (OTHER: B, the default, or C).

Arm A: the warm start before 414ca75 (examples shuffled one by one, 8 padded rows per step); arm B: 414ca75 (a
step's examples are whole problems, both prompt forms of a problem in one packed row). Each arm's ``seedS/`` holds
the evaluate stage's samples with train_magrpo.seed S and evaluate.seed S+1 (base.jsonl, magrpo.jsonl: warm start +
MAGRPO; humaneval_*.jsonl: the HumanEval transfer set); arm C: A's code with ``warm_start_epochs: 1`` (half the
warm start's compute), the warm-started pair alone (warm_start/magrpo.jsonl, the
same sampling seed) and the stage's figures (magrpo.json). B minus A, paired by problem: 95 % percentile bootstrap
over problems (orchestry.reporting.compare) per seed and pooled (each problem's mean over all seeds' samples);
"over seeds": the mean of the per-seed differences with a bootstrap over the seeds.
"""

import json
import sys
from pathlib import Path

from orchestry.analysis.metrics import bootstrap_ci
from orchestry.reporting.compare import paired_comparison, read_samples

HERE = Path(__file__).resolve().parent
METRICS = ("pass", "total", "coop_rate", "aux_called", "truncated")
FILES = {
    "test: trained pair": "magrpo.jsonl",
    "test: warm-started pair alone": "warm_start/magrpo.jsonl",
    "HumanEval (16 problems): trained pair": "humaneval_magrpo.jsonl",
}


def fmt(row) -> str:
    star = " *" if row["excludes_zero"] else ""
    return (
        f"{row['reference']:.3f} → {row['other']:.3f}, {row['diff']:+.3f} "
        f"[{row['diff_low']:+.3f}, {row['diff_high']:+.3f}]{star}"
    )


def main(root: Path = HERE, other: str = "B") -> None:
    seeds = sorted(
        d.name for d in (root / "A").glob("seed*") if (root / other / d.name / "magrpo.jsonl").exists()
    )
    print(f"{other} − A, {len(seeds)} seeds ({', '.join(seeds)}); * = the interval excludes 0\n")
    print("| samples | seed | " + " | ".join(METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for name, f in FILES.items():
        per_seed: dict[str, list[float]] = {m: [] for m in METRICS}
        pooled_a, pooled_b = [], []
        for s in seeds:
            a, b = read_samples(root / "A" / s / f), read_samples(root / other / s / f)
            pooled_a += a
            pooled_b += b
            df = paired_comparison(a, b, METRICS).set_index("metric")
            for m in METRICS:
                if m in df.index:
                    per_seed[m].append(df.loc[m, "diff"])
            print(
                f"| {name} | {s} | "
                + " | ".join(fmt(df.loc[m]) if m in df.index else "-" for m in METRICS)
                + " |"
            )
        if len(seeds) > 1:
            df = paired_comparison(pooled_a, pooled_b, METRICS).set_index("metric")
            print(
                f"| {name} | pooled | "
                + " | ".join(fmt(df.loc[m]) if m in df.index else "-" for m in METRICS)
                + " |"
            )
            cells = []
            for m in METRICS:
                v = per_seed[m]
                lo, hi = bootstrap_ci(v, 0.95, 10000)
                cells.append(f"{sum(v) / len(v):+.3f} [{lo:+.3f}, {hi:+.3f}]" if v else "-")
            print(f"| {name} | over seeds | " + " | ".join(cells) + " |")
    print(
        "\n| arm | seed | warm start s | warm start + updates s | warm-start loss helper / main (last epoch) | "
        "mean training reward |"
    )
    print("|---|---|---|---|---|---|")
    for arm in ("A", other):
        for s in seeds:
            m = json.loads((root / arm / s / "magrpo.json").read_text())
            steps = (root / arm / s / "magrpo_steps.csv").read_text().splitlines()
            col = steps[0].split(",").index("reward")
            rewards = [float(r.split(",")[col]) for r in steps[1:]]
            total = m["seconds_per_step"] * m["steps"] + m["warm_start_seconds"]
            print(
                f"| {arm} | {s} | {m['warm_start_seconds']:.0f} | {total:.0f} | "
                f"{m['warm_start_loss_helper_last']:.3f} / {m['warm_start_loss_main_last']:.3f} | "
                f"{sum(rewards) / len(rewards):.3f} |"
            )


if __name__ == "__main__":
    main(HERE, sys.argv[1] if len(sys.argv) > 1 else "B")
