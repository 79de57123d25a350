"""Set ``train_magrpo.seed: S`` and ``evaluate.seed: S + 1`` in ./params.yaml, keeping its comments and layout:
``python set_seeds.py S``. run_seed.sh and run_external.sh call it in the arm's worktree before each seed."""

import re
import sys


def set_seeds(text: str, seed: int) -> str:
    """``text`` (a params.yaml) with the first ``  seed:`` line after each section's header replaced."""
    for section, value in (("train_magrpo", seed), ("evaluate", seed + 1)):
        head = text.index(f"\n{section}:\n")
        m = re.compile(r"\n  seed: \d+").search(text, head)
        text = text[: m.start()] + f"\n  seed: {value}" + text[m.end() :]
    return text


if __name__ == "__main__":
    with open("params.yaml") as f:
        text = f.read()
    with open("params.yaml", "w") as f:
        f.write(set_seeds(text, int(sys.argv[1])))
