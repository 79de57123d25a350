"""Set dotted keys of a params.yaml in place, values read as YAML (what `dvc exp run -S` does), for the experiment
scripts that run stages in a scratch copy:

    python reports/experiments/set_params.py PARAMS_YAML train_magrpo.seed=1 evaluate.seed=2 ...

Raises KeyError for a section that params.yaml lacks (the stages' own validation catches misspelt leaf keys).
"""

import sys
from pathlib import Path

import yaml


def set_params(path: str, assignments: list[str]) -> dict:
    params = yaml.safe_load(Path(path).read_text())
    for kv in assignments:
        key, value = kv.split("=", 1)
        *parents, last = key.split(".")
        d = params
        for k in parents:
            d = d[k]
        d[last] = yaml.safe_load(value)
    Path(path).write_text(yaml.safe_dump(params, sort_keys=False))
    return params


if __name__ == "__main__":
    set_params(sys.argv[1], sys.argv[2:])
