"""One arm's trained pair against another's, per set: pass@1 of each and the difference with a 95 % bootstrap.

    python compare_arms.py ARM_A ARM_B [--seeds 0 1 2]

Reads ARM/seedS/trained/<set>.jsonl. Each arm's pass@1 on a problem is the mean over all of its samples of the
given seeds (2 per seed); ARM_B - ARM_A is orchestry.reporting.compare.paired_comparison's: a percentile bootstrap
over problems (10,000 resamples, seed 0), both arms' values of a problem resampled together. The arms' samples come
from their own training runs and draws, so the pairing is by problem only. "external" pools easy40, mbpp_easy and
others_a (120 problems).
"""

import argparse
from pathlib import Path

from orchestry.reporting.compare import paired_comparison, read_samples

HERE = Path(__file__).resolve().parent
EXTERNAL = ["easy40", "mbpp_easy", "others_a"]
SETS = ["test", "easy40", "mbpp_easy", "others_a", "external", "others_val"]


def samples(arm: str, seeds: list[int], name: str) -> list[dict]:
    """Every trained-pair sample of ``arm``'s seeds on set ``name``, task ids prefixed by their set."""
    return [
        {**r, "task_id": f"{set_name}:{r['task_id']}"}
        for s in seeds
        for set_name in (EXTERNAL if name == "external" else [name])
        for r in read_samples(HERE / arm / f"seed{s}" / "trained" / f"{set_name}.jsonl")
    ]


ap = argparse.ArgumentParser()
ap.add_argument("arm_a")
ap.add_argument("arm_b")
ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
a = ap.parse_args()
print(f"{a.arm_b} - {a.arm_a}, seeds {a.seeds} pooled per problem, 95 % bootstrap over problems")
for name in SETS:
    table = paired_comparison(samples(a.arm_a, a.seeds, name), samples(a.arm_b, a.seeds, name), ["pass"])
    row = table.iloc[0]
    print(
        f"{name:11s} ({row.n_problems:3d}) {a.arm_a} {row.reference:.3f}  {a.arm_b} {row.other:.3f}  "
        f"difference {row['diff']:+.3f} [{row.diff_low:+.3f}, {row.diff_high:+.3f}]"
    )
