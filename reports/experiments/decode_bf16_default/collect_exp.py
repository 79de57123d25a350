"""Copy a finished DVC experiment's evaluation samples and reports into a folder, from git and the local DVC cache:
python collect_exp.py EXPERIMENT_NAME OUT_DIR (at the repository root).

Writes base.jsonl and magrpo.jsonl (the evaluate stage's generated-test samples), humaneval_base.jsonl and
humaneval_magrpo.jsonl (its HumanEval transfer samples), metrics.json, magrpo.json, magrpo_steps.csv and
params.yaml: the layout ../easy_external/summarize.py and ../warm_start/summarize.py read.
"""

import json
import subprocess
import sys
from pathlib import Path

import yaml

CACHE = Path(".dvc/cache/files/md5")
FROM_DIR = {  # out file: (DVC directory output, file inside it)
    "base.jsonl": ("reports/eval", "base.jsonl"),
    "magrpo.jsonl": ("reports/eval", "magrpo.jsonl"),
    "humaneval_base.jsonl": ("reports/eval", "transfer/humaneval_base.jsonl"),
    "humaneval_magrpo.jsonl": ("reports/eval", "transfer/humaneval_magrpo.jsonl"),
}
FROM_GIT = {"metrics.json": "reports/metrics.json", "magrpo.json": "reports/train/magrpo.json",
            "magrpo_steps.csv": "reports/train/magrpo_steps.csv", "params.yaml": "params.yaml"}  # fmt: skip


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def cached(md5: str) -> Path:
    return CACHE / md5[:2] / md5[2:]


def main() -> None:
    name, out = sys.argv[1], Path(sys.argv[2])
    refs = [
        line.split()
        for line in git("for-each-ref", "refs/exps", "--format=%(objectname) %(refname)").splitlines()
    ]
    shas = [sha for sha, ref in refs if ref.rsplit("/", 1)[-1] == name]
    if len(shas) != 1:
        sys.exit(f"error: {len(shas)} experiments named {name!r}")
    sha = shas[0]
    lock = yaml.safe_load(git("show", f"{sha}:dvc.lock"))
    outs = {o["path"]: o["md5"] for st in lock["stages"].values() for o in st.get("outs", [])}
    out.mkdir(parents=True, exist_ok=True)
    manifests: dict[str, dict[str, str]] = {}
    for target, (directory, inner) in FROM_DIR.items():
        if directory not in manifests:
            entries = json.loads(cached(outs[directory]).read_text())
            manifests[directory] = {e["relpath"]: e["md5"] for e in entries}
        (out / target).write_bytes(cached(manifests[directory][inner]).read_bytes())
    for target, path in FROM_GIT.items():
        if (
            path in outs and cached(outs[path]).exists()
        ):  # a cached output (or the same bytes cached elsewhere)
            (out / target).write_bytes(cached(outs[path]).read_bytes())
        else:
            (out / target).write_text(git("show", f"{sha}:{path}"))
    print(f"{name} ({sha[:7]}) -> {out}")


if __name__ == "__main__":
    main()
