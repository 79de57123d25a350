"""Tables of the warm-start packing experiment: python summarize.py [OTHER] (OTHER: B, the default, C, D or F).

Arm A: the warm start before 414ca75 (examples shuffled one by one, 8 padded rows per step); arm B: 414ca75 (a
step's examples are whole problems, both prompt forms of a problem in one packed row); arm C: A's code with
``warm_start_epochs: 1`` (half the warm start's compute); arm D: A's code with ``warm_start_epochs: 1`` and
``warm_start_batch: 4`` (A's number of steps, half its examples); arm F: D at ``warm_start_lr: 0.001``. For A and
F the seeds' trained pairs were also evaluated on two sets written by others (easy40, MBPP). Each arm's ``seedS/`` holds the evaluate stage's samples
with train_magrpo.seed S and evaluate.seed S+1 (base.jsonl, magrpo.jsonl: warm start + MAGRPO; humaneval_*.jsonl:
the HumanEval transfer set), the warm-started pair alone (warm_start/magrpo.jsonl, the same sampling seed) and the
stage's figures (magrpo.json). OTHER minus A, paired by problem, printed by ../warm_start/summarize.py's
``print_arm``: 95 % percentile bootstrap over problems (orchestry.reporting.compare) per seed and pooled (each
problem's mean over all seeds' samples); "over seeds": the mean of the per-seed differences with a bootstrap over
the seeds.
"""

import importlib.util
import json
import sys
from pathlib import Path

from orchestry.reporting.compare import read_samples

HERE = Path(__file__).resolve().parent
FILES = {
    "test: trained pair": "magrpo.jsonl",
    "test: warm-started pair alone": "warm_start/magrpo.jsonl",
    "HumanEval (16 problems): trained pair": "humaneval_magrpo.jsonl",
    # written by others (arm F's check; ../easy_external/easy40.jsonl, ../learnable_default_v3/external/mbpp_easy.jsonl)
    "easy40 (40 problems): trained pair": "easy40/magrpo.jsonl",
    "MBPP (40 problems): trained pair": "external/magrpo.jsonl",
}


def _warm_start_summarize():
    """../warm_start/summarize.py as a module (an experiment folder, not a package)."""
    spec = importlib.util.spec_from_file_location(
        "warm_start_summarize", HERE.parent / "warm_start" / "summarize.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(root: Path = HERE, other: str = "B") -> None:
    shared = _warm_start_summarize()
    seeds = sorted(
        d.name for d in (root / "A").glob("seed*") if (root / other / d.name / "magrpo.jsonl").exists()
    )
    print(f"{other} − A, {len(seeds)} seeds ({', '.join(seeds)}); * = the interval excludes 0\n")
    print("| samples | seed | " + " | ".join(shared.METRICS) + " |")
    print("|---|---|" + "---|" * len(shared.METRICS))
    for name, f in FILES.items():
        if not all((root / arm / s / f).exists() for arm in ("A", other) for s in seeds):
            continue  # the sets written by others: evaluated for arm F (and A) only
        shared.print_arm(
            name, [(s, read_samples(root / "A" / s / f), read_samples(root / other / s / f)) for s in seeds]
        )
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
