"""Validate easy40.jsonl: canonical passes, `return None` fails, example agrees, keys/ids unique."""

import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "easy40.jsonl")
KEYS = {"task_id", "prompt", "entry_point", "canonical_solution", "test"}


def run(code):
    try:
        r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=10)
        return r.returncode, r.stderr.strip().splitlines()[-1:]
    except subprocess.TimeoutExpired:
        return -1, ["timeout"]


with open(PATH) as fh:
    recs = [json.loads(ln) for ln in fh if ln.strip()]
errors, n_asserts, neg_fail = [], 0, 0
for i, r in enumerate(recs):
    tid = r.get("task_id")
    if set(r) != KEYS:
        errors.append(f"{tid}: keys {sorted(r)}")
        continue
    if tid != f"Easy/{i}":
        errors.append(f"{tid}: expected task_id Easy/{i}")
    ep, prompt, body, test = r["entry_point"], r["prompt"], r["canonical_solution"], r["test"]
    if not prompt.startswith(f"def {ep}(") or not prompt.endswith("\n"):
        errors.append(f"{tid}: prompt header/newline")
    if prompt.count(">>>") != 1:
        errors.append(f"{tid}: need exactly one >>> example")
    lines = [ln for ln in test.splitlines()[1:] if ln.strip()]
    if (
        not test.startswith("def check(candidate):\n")
        or not 3 <= len(lines) <= 5
        or not all(ln.startswith("    assert candidate(") and " == " in ln for ln in lines)
    ):
        errors.append(f"{tid}: test format")
    n_asserts += len(lines)
    blines = [ln for ln in body.splitlines() if ln.strip()]
    if not 1 <= len(blines) <= 4 or not all(ln.startswith("    ") for ln in blines) or "import" in body:
        errors.append(f"{tid}: body must be 1-4 indented lines, no imports")
    # canonical solution passes
    rc, err = run(prompt + body + "\n" + test + f"\ncheck({ep})\n")
    if rc != 0:
        errors.append(f"{tid}: canonical fails {err}")
    # negative control
    rc, _ = run(prompt + "    return None\n\n" + test + f"\ncheck({ep})\n")
    if rc != 0:
        neg_fail += 1
    else:
        errors.append(f"{tid}: `return None` passes the tests")
    # docstring example agrees with canonical solution
    m = re.search(r"^\s*>>> (.+)\n\s*(.+)\n", prompt, re.M)
    if not m:
        errors.append(f"{tid}: no example found")
    else:
        call, want = m.group(1), m.group(2)
        rc, err = run(prompt + body + f"\nassert ({call}) == ({want}), repr({call})\n")
        if rc != 0:
            errors.append(f"{tid}: example disagrees {err}")

for k in ("task_id", "entry_point"):
    vals = [r.get(k) for r in recs]
    if len(set(vals)) != len(vals):
        errors.append(f"duplicate {k}")

for e in errors:
    print("ERROR", e)
status = "all pass" if not errors else f"{len(errors)} errors"
print(f"{len(recs)} problems, {n_asserts} asserts, {status}; negative control fails {neg_fail}/{len(recs)}")
sys.exit(1 if errors else 0)
