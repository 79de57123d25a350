"""Did a speed change keep every result? Compare the DVC outputs of two ``dvc.lock`` revisions record by record.

For every ``.jsonl`` output (files, and the ``.jsonl`` files inside directory outputs) that the two lock files
record, reads both versions from the local DVC cache and counts the records that are equal once every field whose
name contains ``seconds`` is left out. Exit code 1 if any record differs or is missing.

Usage (at the repository root, after ``dvc repro`` of the change, before committing dvc.lock)::

    python benchmarks/same_outputs.py            # HEAD's dvc.lock vs the working tree's
    python benchmarks/same_outputs.py --old HEAD~2 --new HEAD
    python benchmarks/same_outputs.py --old /tmp/before.lock   # a copy of an earlier run's dvc.lock
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml


def _lock(rev: str | None) -> dict:
    """``{output path: md5}`` of the working tree's dvc.lock (``rev`` None), of a lock file at path ``rev``, or of
    git revision ``rev``'s."""
    if rev is None:
        text = Path("dvc.lock").read_text()
    elif Path(rev).is_file():
        text = Path(rev).read_text()
    else:
        text = subprocess.run(
            ["git", "show", f"{rev}:dvc.lock"], capture_output=True, text=True, check=True
        ).stdout
    return {o["path"]: o["md5"] for st in yaml.safe_load(text)["stages"].values() for o in st.get("outs", [])}


def _cached(md5: str) -> Path:
    return Path(".dvc/cache/files/md5") / md5[:2] / md5[2:]


def _jsonl_files(outs: dict) -> tuple[dict[str, str], list[str]]:
    """``({path: md5}, uncached)``: the .jsonl files among the outputs, directory outputs expanded from their
    manifests, and the directory outputs whose manifest is not in the local cache."""
    files, uncached = {}, []
    for path, md5 in outs.items():
        if not md5.endswith(".dir"):
            if path.endswith(".jsonl"):
                files[path] = md5
        elif _cached(md5).exists():
            for entry in json.loads(_cached(md5).read_text()):
                if entry["relpath"].endswith(".jsonl"):
                    files[f"{path}/{entry['relpath']}"] = entry["md5"]
        else:
            uncached.append(path)
    return files, uncached


def _records(md5: str) -> list[dict]:
    lines = _cached(md5).read_text().splitlines()
    return [
        {k: v for k, v in json.loads(line).items() if "seconds" not in k} for line in lines if line.strip()
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", default="HEAD", help="git revision of the reference dvc.lock, or a lock file")
    ap.add_argument(
        "--new", default=None, help="git revision or lock file of the other (default: the working tree's)"
    )
    args = ap.parse_args()
    (old, old_uncached), (new, new_uncached) = _jsonl_files(_lock(args.old)), _jsonl_files(_lock(args.new))
    bad = 0
    for path in sorted({*old_uncached, *new_uncached}):
        print(f"not in the local DVC cache (directory output): {path}")
        bad += 1
    for path in sorted(old.keys() | new.keys()):
        if path not in old or path not in new:
            print(f"only in one revision: {path}")
            bad += 1
            continue
        missing = [m for m in (old[path], new[path]) if not _cached(m).exists()]
        if missing:
            print(f"not in the local DVC cache ({missing[0]}): {path}")
            bad += 1
            continue
        a, b = _records(old[path]), _records(new[path])
        same = sum(x == y for x, y in zip(a, b, strict=False))
        ok = same == len(a) == len(b)
        bad += not ok
        print(f"{'same' if ok else 'DIFFERENT'}: {same}/{len(a)} records equal (new has {len(b)}), {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
