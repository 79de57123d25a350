"""What the training batches of each seed held: python training_stats.py DIR [DIR ...]

Each DIR holds one seed's magrpo_steps.csv and magrpo_samples.jsonl (train_magrpo's). Prints, per seed, first and
last quarter of the updates: the share of groups whose G joint rewards were all equal when first sampled, the
groups resampled, the training pass rate, truncation and aux-call rates; and over all training samples how often
main called `aux` and how often a sample that called it passed (the event the cooperation bonus pays).
"""

import csv
import json
import sys
from pathlib import Path


def quarter_means(rows: list[dict], key: str) -> tuple[float, float, float]:
    q = max(1, len(rows) // 4)
    vals = [float(r[key]) for r in rows]
    return sum(vals[:q]) / q, sum(vals[-q:]) / q, sum(vals) / len(vals)


def main() -> None:
    keys = ("zero_variance_groups", "pass_rate", "truncation_rate", "aux_called_rate", "reward")
    print("| seed | updates | " + " | ".join(f"{k} first / last q (all)" for k in keys) + " | resampled groups |"
          " training samples | main called aux | called and passed |")  # fmt: skip
    print("|---" * (len(keys) + 6) + "|")
    for d in map(Path, sys.argv[1:]):
        rows = list(csv.DictReader((d / "magrpo_steps.csv").open()))
        cells = [f"{a:.2f} / {b:.2f} ({c:.2f})" for a, b, c in (quarter_means(rows, k) for k in keys)]
        resampled = sum(int(float(r.get("resampled_groups") or 0)) for r in rows)
        samples = [json.loads(line) for line in (d / "magrpo_samples.jsonl").open()]
        called = sum(bool(s.get("aux_called")) for s in samples)
        both = sum(
            bool(s.get("aux_called")) and s.get("passed") == s.get("total_asserts") != 0 for s in samples
        )
        print(
            f"| {d.name} | {len(rows)} | "
            + " | ".join(cells)
            + f" | {resampled} | {len(samples)} | {called} | {both} |"
        )


if __name__ == "__main__":
    main()
