"""What a cheaper evaluation would show: trained - base pass@1 (paired bootstrap over problems, 10,000 resamples)
with every sample, with sample 0 only, and with the first 20 problems of each set; on a default run's samples
(``reports/eval``: seed 0, 2 samples per problem) and on the 3-seed ``mean`` arm of ``estimators/`` (each seed's
base pair from ``skill_not_template/base``; the seeds' samples pooled per problem).

"1 sample" keeps sample 0 of the 2 drawn: an evaluation that draws 1 batches its rows otherwise, so it would draw
other, equally likely samples. Usage::

    python reports/experiments/eval_budget.py [EVAL_DIR]     # EVAL_DIR: a default run's reports/eval
"""

from __future__ import annotations

import sys
from pathlib import Path

from orchestry.reporting.compare import paired_comparison
from orchestry.runtime import read_jsonl

HERE = Path(__file__).resolve().parent
EXTERNAL = ("easy40", "mbpp_easy", "others_a")


def read(path: Path, prefix: str = "", seed: int = 0) -> list[dict]:
    """Records of ``path``; ``prefix`` makes task ids unique across sets, ``seed`` the sample numbers across seeds."""
    return [dict(r, task_id=prefix + r["task_id"], sample=r["sample"] + 100 * seed) for r in read_jsonl(path)]


def cheaper(records: list[dict], how: str) -> list[dict]:
    """``records`` as an evaluation of ``how`` would hold them: ``all``, ``1 sample``, ``20 per set``."""
    if how == "1 sample":
        return [r for r in records if r["sample"] % 100 == 0]
    if how == "20 per set":
        firsts: dict[str, list[str]] = {}
        for r in records:
            ids = firsts.setdefault(r["task_id"].split(":")[0], [])
            if r["task_id"] not in ids:
                ids.append(r["task_id"])
        keep = {i for ids in firsts.values() for i in ids[:20]}
        return [r for r in records if r["task_id"] in keep]
    return records


def show(name: str, base: list[dict], trained: list[dict]) -> None:
    for how in ("all", "1 sample", "20 per set"):
        b, t = cheaper(base, how), cheaper(trained, how)
        row = paired_comparison(b, t, ["pass"], 0.95, 10_000).iloc[0].to_dict()
        print(
            f"{name:26s} {how:10s} problems {row['n_problems']:3d} samples {len(t):4d}  base {row['reference']:.3f}"
            f"  trained {row['other']:.3f}  diff {row['diff']:+.3f} [{row['diff_low']:+.3f}, {row['diff_high']:+.3f}]"
        )


def main() -> None:
    run = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("reports/eval")
    print(f"default run ({run}: seed 0, 2 samples per problem)")
    show("test", read(run / "base.jsonl", "test:"), read(run / "magrpo.jsonl", "test:"))
    pooled_b, pooled_t = [], []
    for s in EXTERNAL:
        b = read(run / "transfer" / f"{s}_base.jsonl", f"{s}:")
        t = read(run / "transfer" / f"{s}_magrpo.jsonl", f"{s}:")
        show(s, b, t)
        pooled_b, pooled_t = pooled_b + b, pooled_t + t
    show("external (120)", pooled_b, pooled_t)

    print("\n3 seeds, estimators/mean (2 samples per problem and seed), seeds pooled per problem")
    pooled_b, pooled_t = [], []
    for seed in (0, 1, 2):
        for s in EXTERNAL:
            pooled_b += read(
                HERE / "skill_not_template" / "base" / f"seed{seed}" / f"{s}.jsonl", f"{s}:", seed
            )
            pooled_t += read(
                HERE / "estimators" / "mean" / f"seed{seed}" / "trained" / f"{s}.jsonl", f"{s}:", seed
            )
    show("external (120), 3 seeds", pooled_b, pooled_t)


if __name__ == "__main__":
    main()
