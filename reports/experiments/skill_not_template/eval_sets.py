"""Evaluate one pair (the base pair, or trained adapters) on the generated test split and the external sets.

    python eval_sets.py WORKDIR OUT --pair base|magrpo [--adapters DIR] --seed S [--samples 2] [--sets NAME ...]

WORKDIR holds params.yaml and data/problems/test.jsonl; OUT gets <set>.jsonl (every sample) and summary.json
(orchestry.analysis.metrics.summarize per set). The base pair's samples depend only on the eval seed, so the
arms share them (run.sh evaluates the base pair once per seed).
"""

import argparse
import json
import random
import time
from pathlib import Path

import torch

from orchestry.evaluation.agents import evaluate_agents
from orchestry.params_file import load_params
from orchestry.problems import load_problems
from orchestry.runtime import load_policy, machine_info, open_sandbox, write_json, write_jsonl

ROOT = Path(__file__).resolve().parents[3]
SETS = {
    "test": "data/problems/test.jsonl",
    "easy40": str(ROOT / "data/external/easy40.jsonl"),
    "mbpp_easy": str(ROOT / "data/external/mbpp_easy.jsonl"),
    "others_a": str(ROOT / "data/external/others_a.jsonl"),
    "others_val": str(ROOT / "data/external/others_val.jsonl"),
    "humaneval": "data/problems/transfer/humaneval.jsonl",  # HumanEval/133-163 (prepare.transfer); not by default
}
DEFAULT_SETS = ["test", "easy40", "mbpp_easy", "others_a", "others_val"]

ap = argparse.ArgumentParser()
ap.add_argument("workdir")
ap.add_argument("out")
ap.add_argument("--pair", choices=["base", "magrpo"], required=True)
ap.add_argument("--adapters", default=None)
ap.add_argument("--seed", type=int, required=True)
ap.add_argument("--samples", type=int, default=2)
ap.add_argument("--sets", nargs="+", default=DEFAULT_SETS, choices=list(SETS))
a = ap.parse_args()
work, out = Path(a.workdir), Path(a.out)
params = load_params(work / "params.yaml")
torch.manual_seed(0)
random.seed(0)
adapters = a.adapters or (str(work / "models/adapters/magrpo") if a.pair == "magrpo" else None)
policy, tok = load_policy(params, with_adapters=adapters)
summary = {
    "pair": a.pair,
    "adapters": adapters,
    "seed": a.seed,
    "samples": a.samples,
    "machine": machine_info(),
}
with open_sandbox(params) as sb:
    for name in a.sets:
        path = SETS[name]
        t0 = time.time()
        probs = load_problems(path if Path(path).is_absolute() else work / path)
        for _pair, recs, s in evaluate_agents(
            probs,
            policy,
            tok,
            sb,
            params.sampling,
            a.samples,
            a.seed,
            params.evaluate.batch_size,
            params.intervals,
            False,
            pairs=(a.pair,),
        ):
            write_jsonl(out / f"{name}.jsonl", recs)
            summary[name] = s
        print(
            name,
            f"{time.time() - t0:.0f}s",
            json.dumps(
                {
                    k: summary[name].get(k)
                    for k in (
                        "pass@1",
                        f"pass@{a.samples}",
                        "reward",
                        "cooperation_rate",
                        "chain_form_rate",
                        "distinct_solutions",
                    )
                }
            ),
            flush=True,
        )
write_json(out / "summary.json", summary)
