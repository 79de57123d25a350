"""bf16 decoding against fp32 decoding, pooled over seeds: python compare_arms.py --fp32 DIR ... --bf16 DIR ...

Each DIR is one seed's folder (base.jsonl, magrpo.jsonl, humaneval_*.jsonl; easy40/ and external/: the 40 easy
problems written by others and the 40 easy MBPP problems). For the trained pairs and the base pairs on each set: each arm's per-problem pass rate over all its seeds' samples,
and bf16 - fp32 with a 95 % percentile bootstrap over problems (orchestry.reporting.compare.paired_comparison,
paired by problem). Also each seed's trained and base pass@1.
"""

import argparse
from pathlib import Path

from orchestry.reporting.compare import paired_comparison, read_samples

SETS = {  # set: (base pair's file, trained pair's file) in a seed's folder
    "generated test": ("base.jsonl", "magrpo.jsonl"),
    "HumanEval": ("humaneval_base.jsonl", "humaneval_magrpo.jsonl"),
    "easy40": ("easy40/base.jsonl", "easy40/magrpo.jsonl"),
    "MBPP easy": ("external/base.jsonl", "external/magrpo.jsonl"),
}


def pooled(dirs: list[Path], name: str) -> list[dict]:
    return [r for d in dirs for r in read_samples(d / name)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp32", type=Path, nargs="+", required=True)
    ap.add_argument("--bf16", type=Path, nargs="+", required=True)
    args = ap.parse_args()
    print("| set | pair | fp32 | bf16 | bf16 - fp32 [95 %] |\n|---|---|---|---|---|")
    for set_name, (base, trained) in SETS.items():
        for pair, name in (("trained", trained), ("base", base)):
            df = paired_comparison(pooled(args.fp32, name), pooled(args.bf16, name), ["pass"]).iloc[0]
            star = " *" if df["excludes_zero"] else ""
            print(f"| {set_name} | {pair} | {df['reference']:.3f} | {df['other']:.3f} | "
                  f"{df['diff']:+.3f} [{df['diff_low']:+.3f}, {df['diff_high']:+.3f}]{star} |")  # fmt: skip
    print("\nper seed, generated test pass@1 (trained / base):")
    for arm, dirs in (("fp32", args.fp32), ("bf16", args.bf16)):
        cells = []
        for d in dirs:
            t, b = read_samples(d / "magrpo.jsonl"), read_samples(d / "base.jsonl")
            cells.append(
                f"{d.name} {sum(r['pass'] for r in t) / len(t):.3f} / {sum(r['pass'] for r in b) / len(b):.3f}"
            )
        print(f"  {arm}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
