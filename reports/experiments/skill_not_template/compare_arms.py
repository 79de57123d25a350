"""One arm's trained pair against another's, per set: pass@1 of each and the difference with a 95 % bootstrap.

    python compare_arms.py ARM_A ARM_B [--seeds 0 1 2]

Reads ARM/seedS/trained/<set>.jsonl. Per problem, each arm's pass@1 is the mean over all of its samples of the
given seeds (2 per seed); the difference ARM_B - ARM_A is bootstrapped over problems (2,000 resamples, seed 0),
both arms' values of a problem resampled together. The arms' samples come from their own training runs and draws,
so the pairing is by problem only. "external" pools easy40, mbpp_easy and others_a (120 problems).
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from orchestry.analysis.metrics import is_pass

HERE = Path(__file__).resolve().parent
EXTERNAL = ["easy40", "mbpp_easy", "others_a"]
SETS = ["test", "easy40", "mbpp_easy", "others_a", "external", "others_val"]


def pass_by_problem(arm: str, seeds: list[int], name: str) -> dict[str, float]:
    samples = defaultdict(list)
    for s in seeds:
        for set_name in EXTERNAL if name == "external" else [name]:
            path = HERE / arm / f"seed{s}" / "trained" / f"{set_name}.jsonl"
            for line in path.read_text().splitlines():
                r = json.loads(line)
                samples[f"{set_name}:{r['task_id']}"].append(float(is_pass(r)))
    return {t: float(np.mean(v)) for t, v in samples.items()}


ap = argparse.ArgumentParser()
ap.add_argument("arm_a")
ap.add_argument("arm_b")
ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
a = ap.parse_args()
print(f"{a.arm_b} - {a.arm_a}, seeds {a.seeds} pooled per problem, 95 % bootstrap over problems")
for name in SETS:
    pa, pb = pass_by_problem(a.arm_a, a.seeds, name), pass_by_problem(a.arm_b, a.seeds, name)
    ids = sorted(pa)
    if sorted(pb) != ids:
        raise SystemExit(f"{name}: the arms hold different problems")
    diff = np.array([pb[t] - pa[t] for t in ids])
    rng = np.random.default_rng(0)
    means = [diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(2000)]
    lo, hi = np.percentile(means, [2.5, 97.5])
    print(
        f"{name:11s} ({len(ids):3d}) {a.arm_a} {np.mean([pa[t] for t in ids]):.3f}  {a.arm_b} "
        f"{np.mean([pb[t] for t in ids]):.3f}  difference {diff.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]"
    )
