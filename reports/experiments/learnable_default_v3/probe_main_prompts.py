"""Probe: does the base pair's main call `aux` more with another main prompt? Inference only, no training.

    python probe_main_prompts.py VARIANT [SPLIT] [SAMPLES]     # from the repository root after `dvc repro prepare`

VARIANT: base (the committed prompt) | fewshot (one worked example whose answer calls `aux`, before the task) |
template (the committed prompt plus "Begin your function with the line `r = aux(<arg>)`."). The base pair (no
adapters) samples SAMPLES answers per problem of data/problems/SPLIT.jsonl (seed 7) and the sandbox scores them;
one JSON line of rates is printed. The variants replace ``Problem.main_prompt`` in this process only.
"""

import json
import sys
import time

from orchestry.evaluation.baselines import run_method
from orchestry.llm.loading import load_model
from orchestry.params_file import load_params
from orchestry.problems import Problem, read_problems
from orchestry.runtime import open_sandbox

EXAMPLE = (
    "Example. Task:\n```python\ndef total_of_doubled(xs: list) -> int:\n"
    '    """Given a list of integers `xs`, double every number, then add the numbers up. Return the result."""\n```\n'
    "Helper already defined:\n```python\ndef aux(xs: list) -> list:\n"
    '    """Given a list of integers `xs`, double every number. Return the result."""\n```\n'
    "Answer:\n```python\ndef total_of_doubled(xs: list) -> int:\n    r = aux(xs)\n    return sum(r)\n```\n\n"
    "Now your task.\n"
)
committed = Problem.main_prompt


def few_shot(self, helper_code=None, behaviors=""):
    return EXAMPLE + committed(self, helper_code, behaviors)


def template(self, helper_code=None, behaviors=""):
    arg = self.prompt.split("(", 1)[1].split(":", 1)[0].split(")", 1)[0].strip()
    return committed(self, helper_code, behaviors) + f"\nBegin your function with the line `r = aux({arg})`."


def main() -> None:
    variant = sys.argv[1]
    split = sys.argv[2] if len(sys.argv) > 2 else "train"
    n_samples = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    if variant == "fewshot":
        Problem.main_prompt = few_shot
    elif variant == "template":
        Problem.main_prompt = template
    elif variant != "base":
        sys.exit(f"unknown variant {variant!r} (base | fewshot | template)")
    params = load_params()
    problems = read_problems(f"data/problems/{split}.jsonl")
    model, tokenizer = load_model(params.model.path)
    t0 = time.time()
    recs = run_method("concat", problems, model, tokenizer, open_sandbox(params), params.sampling, n_samples, 7, 64,
                      progress=False)  # fmt: skip
    n = len(recs)

    def rate(key):
        return sum(bool(r[key]) for r in recs) / n

    print(json.dumps({
        "variant": variant, "split": split, "n": n, "pass": rate("pass"), "aux_called": rate("aux_called"),
        "aux_used": rate("aux_used"), "coop": sum(r["cooperation"] > 0 for r in recs) / n,
        "truncated": rate("truncated"), "pass_and_called": sum(bool(r["pass"] and r["aux_called"]) for r in recs) / n,
        "mean_total": sum(r["total"] for r in recs) / n, "seconds": time.time() - t0,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
