"""Stage `check_overrides`: the human scores of ``data/overrides.jsonl`` checked before `train_api_grpo` runs.

DVC removes a stage's outputs before it runs its command, so a malformed overrides file found by
`train_api_grpo` itself would cost its last ``summary.json`` and ``learned_behaviors.json``. This stage runs
first (`train_api_grpo` depends on its output): it reads the file and checks it for ``api_grpo.task``
(:func:`orchestry.overrides.check_for_stage`: ``ag-`` ids, scores in ``[0, max_reward]``; orchestrator ids
refused); on a bad file it prints one ``error:`` line and exits 2, and `train_api_grpo` does not run, its outputs
untouched. Output: ``reports/overrides_check.json`` (the task, its maximum, how many overrides apply).
"""

import json
import sys
from pathlib import Path

from orchestry.overrides import OverrideError, check_for_stage, read_overrides
from orchestry.runtime import run_stage, start_stage
from orchestry.training.api_grpo.setup import make_task

OVERRIDES = "data/overrides.jsonl"
OUT = Path("reports/overrides_check.json")


def main() -> None:
    params = start_stage("check_overrides")
    cfg = params.api_grpo
    max_reward = make_task(cfg).max_reward
    try:
        every = read_overrides(OVERRIDES)
        mine = check_for_stage(every, cfg.task, max_reward)
    except OverrideError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    summary = {"task": cfg.task, "max_reward": max_reward, "read": len(every), "for_task": len(mine)}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    run_stage(main)
