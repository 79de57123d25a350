"""Validate HumanEval-style JSONL exercise files.

Usage: python3 check.py FILE [FILE ...]
If both others_a.jsonl and others_val.jsonl are given (or present next to
this script), also checks that no problem is shared between them.
"""

import ast
import json
import os
import re
import subprocess
import sys

KEYS = {"task_id", "prompt", "entry_point", "canonical_solution", "test"}
PREFIX = {"others_a.jsonl": "OthersA", "others_val.jsonl": "OthersVal"}
ASSERT_RE = re.compile(r"^    assert candidate\(.*\) == .+$")


def run_py(src):
    try:
        r = subprocess.run([sys.executable, "-I", "-c", src], capture_output=True, text=True, timeout=10)
        return r.returncode == 0, r.stderr.strip().splitlines()[-1:] if r.stderr else []
    except subprocess.TimeoutExpired:
        return False, ["timeout"]


def check_file(path):
    errors = []
    n_asserts = 0
    n_multi_arg = 0
    recs = []
    prefix = PREFIX.get(os.path.basename(path))
    with open(path) as f:
        lines = [x for x in f.read().split("\n") if x.strip()]
    for ln, line in enumerate(lines):

        def err(msg, ln=ln):
            errors.append(f"{path}:{ln + 1}: {msg}")

        try:
            rec = json.loads(line)
        except Exception as e:
            err(f"bad json: {e}")
            continue
        recs.append(rec)
        if set(rec) != KEYS:
            err(f"keys {sorted(rec)} != {sorted(KEYS)}")
            continue
        if not all(isinstance(rec[k], str) for k in KEYS):
            err("non-string field")
            continue
        tid, prompt, name = rec["task_id"], rec["prompt"], rec["entry_point"]
        sol, test = rec["canonical_solution"], rec["test"]
        want_tid = f"{prefix}/{ln}" if prefix else None
        if want_tid and tid != want_tid:
            err(f"task_id {tid!r}, expected {want_tid!r}")
        elif not re.fullmatch(r"\w+/" + str(ln), tid):
            err(f"task_id {tid!r} not sequential")

        # --- prompt format ---
        m = re.match(r"def (\w+)\((.*)\):\n", prompt)
        if not m:
            err("prompt must start with 'def NAME(ARGS):\\n'")
            continue
        if m.group(1) != name:
            err(f"entry_point {name!r} != def name {m.group(1)!r}")
        if not prompt.endswith("\n"):
            err("prompt must end with newline")
        rest = prompt[m.end() :]
        if not (
            rest.startswith('    """')
            and rest.rstrip("\n").endswith('"""')
            and rest.endswith('    """\n')
            and rest.count('"""') == 2
        ):
            err("prompt body must be a single indented triple-double-quoted docstring")
        plines = rest.split("\n")
        ex_idx = [i for i, x in enumerate(plines) if x.strip().startswith(">>> ")]
        if len(ex_idx) != 1:
            err(f"expected exactly one '>>> ' line, found {len(ex_idx)}")
            continue
        ex_call = plines[ex_idx[0]].strip()[4:]
        ex_out = plines[ex_idx[0] + 1].strip() if ex_idx[0] + 1 < len(plines) else ""
        if not ex_out or ex_out.startswith('"""'):
            err("missing expected-output line after >>> example")
        desc = rest.split(">>>")[0].replace('"""', "").strip()
        if len(desc.split()) < 4:
            err("description too short")
        try:
            sig = ast.parse(prompt + "    pass\n").body[0]
            if len(sig.args.args) >= 2:
                n_multi_arg += 1
        except SyntaxError as e:
            err(f"prompt does not parse: {e}")
            continue

        # --- canonical solution format ---
        body_lines = sol.rstrip("\n").split("\n")
        if not sol.endswith("\n") or not 1 <= len(body_lines) <= 4:
            err(f"canonical_solution must be 1-4 lines ending in newline, got {len(body_lines)}")
        for bl in body_lines:
            if not bl.startswith("    ") or not bl.strip():
                err(f"solution line not indented 4 spaces: {bl!r}")
        if re.search(r"^\s*(import|from)\s", sol, re.M) or "__import__" in sol:
            err("solution uses an import")

        # --- test format ---
        tlines = test.rstrip("\n").split("\n")
        if tlines[0] != "def check(candidate):":
            err("test must start with 'def check(candidate):'")
        asserts = tlines[1:]
        if not 3 <= len(asserts) <= 5:
            err(f"test must have 3-5 assert lines, has {len(asserts)}")
        for a in asserts:
            if not ASSERT_RE.match(a):
                err(f"bad assert line: {a!r}")
        n_asserts += len(asserts)

        # --- execution checks in fresh subprocess ---
        prog = prompt + sol + "\n" + test + f"\ncheck({name})\n"
        ok, tail = run_py(prog)
        if not ok:
            err(f"canonical solution fails its tests: {tail}")
        ok_none, _ = run_py(prompt + "    return None\n" + "\n" + test + f"\ncheck({name})\n")
        if ok_none:
            err("tests pass with 'return None' body")

        # --- in-process value checks: doctest example and each assert ---
        ns = {}
        try:
            exec(prompt + sol, ns)
            fn = ns[name]
        except Exception as e:
            err(f"cannot define function: {e!r}")
            continue
        try:
            got = eval(ex_call, {name: fn})
            try:
                match = repr(got) == ex_out or got == eval(ex_out)
            except Exception:
                match = False
            if not match:
                err(f"docstring example {ex_call} gives {got!r}, shown {ex_out}")
        except Exception as e:
            err(f"docstring example raises {e!r}")
        try:
            tree = ast.parse(test)
            for node in tree.body[0].body:
                if not (
                    isinstance(node, ast.Assert)
                    and isinstance(node.test, ast.Compare)
                    and len(node.test.ops) == 1
                    and isinstance(node.test.ops[0], ast.Eq)
                ):
                    err(f"non 'assert X == Y' statement: {ast.unparse(node)}")
                    continue
                call = ast.unparse(node.test.left)
                exp_src = ast.unparse(node.test.comparators[0])
                got = eval(call, {"candidate": fn})
                exp = eval(exp_src, {})
                if got != exp or type(got) is not type(exp):
                    err(f"assert {call} == {exp_src}: solution returns {got!r}")
        except Exception as e:
            err(f"assert evaluation error: {e!r}")

    names = [r.get("entry_point") for r in recs]
    dups = {n for n in names if names.count(n) > 1}
    if dups:
        errors.append(f"{path}: duplicate entry points {sorted(dups)}")
    return errors, recs, n_asserts, n_multi_arg


def main(paths):
    here = os.path.dirname(os.path.abspath(__file__))
    total_errors = []
    loaded = {}
    for p in paths:
        errs, recs, na, nm = check_file(p)
        loaded[os.path.basename(p)] = recs
        total_errors += errs
        print(f"{p}: {len(recs)} problems, {na} asserts, {nm} with 2+ args, {len(errs)} errors")
        for e in errs:
            print("  ERROR", e)
    # cross-file overlap check
    a = loaded.get("others_a.jsonl")
    v = loaded.get("others_val.jsonl")
    if a is None and v is not None and os.path.exists(os.path.join(here, "others_a.jsonl")):
        a = check_file(os.path.join(here, "others_a.jsonl"))[1]
    if v is None and a is not None and os.path.exists(os.path.join(here, "others_val.jsonl")):
        v = check_file(os.path.join(here, "others_val.jsonl"))[1]
    if a is not None and v is not None:

        def norm(s):
            return re.sub(r"\s+", " ", s).strip()

        a_names = {r["entry_point"] for r in a}
        a_sols = {norm(r["canonical_solution"]) for r in a}
        cross = []
        for r in v:
            if r["entry_point"] in a_names:
                cross.append(f"cross-file: entry point {r['entry_point']!r} in both files")
            if norm(r["canonical_solution"]) in a_sols:
                cross.append(f"cross-file: {r['task_id']} has same canonical_solution as an OthersA problem")
        print(f"cross-file overlap check: {len(cross)} errors")
        for e in cross:
            print("  ERROR", e)
        total_errors += cross
    print(f"TOTAL ERRORS: {len(total_errors)}")
    return 1 if total_errors else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
