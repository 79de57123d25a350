#!/usr/bin/env python3
"""Build ``mbpp_easy.jsonl``: easy MBPP test-split problems in HumanEval format.

Source: ``mbpp/mbpp.jsonl`` of github.com/google-research/google-research (MBPP, CC BY 4.0), copied
line for line into ``mbpp_raw.jsonl`` beside this script (records task_id 1..112, the prefix of the
source file that was read); the script works offline from that copy.

Selection rule (deterministic, no hand-picking), over records in task_id order:

1. MBPP test split: 11 <= task_id <= 510;
2. ``test_setup_code`` is empty;
3. the reference ``code`` parses and its module body is exactly one ``def`` (no other top-level
   statement, no nested ``def``/``class``);
4. the code contains no ``import``/``from ... import`` anywhere;
5. the function body (the lines after the ``def`` header) has at most 4 non-empty lines (comment lines
   count);
6. the record passes the conversion check below.

The first ``N_SELECT`` (40) records that meet 1-6 are written.

Conversion (HumanEval format, one JSON object per line):

* ``task_id`` ``"MBPP/<id>"``, ``entry_point`` the function name;
* ``prompt`` = the ``def`` header copied from the reference (``\\r`` removed, trailing blanks stripped),
  then a docstring: the MBPP ``text``, then ``>>> <call expression of the first assert>`` and
  ``<its expected value>`` (source text of the two sides of ``==``), all indented by 4 spaces;
* ``canonical_solution`` = the reference body re-indented to 4 spaces per block level (tabs expanded,
  continuation lines shifted with their statement, comment lines at the level of the next statement);
* ``test`` = ``def check(candidate):`` followed by each ``test_list`` assert, with the function name
  replaced by ``candidate`` at call sites only (token-level: a NAME token equal to the entry point that
  is followed by ``(``), and nothing else.

Conversion check (a record failing any part is dropped, with the reason printed):

* the first assert has the form ``<entry_point>(...) == <expected>``; no ``\"\"\"`` in the MBPP text;
* every assert is one ``assert`` statement; after the replacement no other reference to the entry
  point's name is left; the test module parses;
* ``header + canonical_solution`` parses to the same AST as the reference code (re-indentation
  changed nothing) and ``prompt + canonical_solution`` parses;
* executing ``prompt + canonical_solution + test + check(<entry_point>)`` in a fresh
  ``python -I`` subprocess (10 s timeout) exits 0;
* if the ``orchestry`` package is importable (the project's venv): ``orchestry.problems.make_problem``
  accepts the record, and its canonical solution passes every assert unit in
  ``orchestry.sandbox.Sandbox`` (as ``check_canonical_solutions`` does in the ``prepare`` stage).

Usage (from any directory)::

    source .venv/bin/activate; export OMP_NUM_THREADS=1
    python reports/experiments/learnable_default_v3/external/make_mbpp_easy.py            # writes mbpp_easy.jsonl beside this script
    python reports/experiments/learnable_default_v3/external/make_mbpp_easy.py --no-sandbox   # subprocess check only
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import subprocess
import sys
import tokenize
from pathlib import Path

HERE = Path(__file__).resolve().parent
N_SELECT = 40
MAX_BODY_LINES = 4
TEST_SPLIT = (11, 510)
EXEC_TIMEOUT_S = 10.0


class Reject(Exception):
    """The record fails the selection rule or the conversion check; the message says why."""


# ----------------------------------------------------------------------------- selection rule
def _expand_leading_tabs(line: str) -> str:
    stripped = line.lstrip(" \t")
    lead = line[: len(line) - len(stripped)]
    return lead.expandtabs(8) + stripped


def _header_end_row(code: str, fn: ast.FunctionDef) -> int:
    """1-based row of the ``:`` that ends the ``def`` header (the header may span rows)."""
    depth = 0
    started = False
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.start[0] < fn.lineno:
            continue
        if tok.type == tokenize.NAME and tok.string == "def":
            started = True
        if not started or tok.type != tokenize.OP:
            continue
        if tok.string in "([{":
            depth += 1
        elif tok.string in ")]}":
            depth -= 1
        elif tok.string == ":" and depth == 0:
            return tok.start[0]
    raise Reject("no ':' ending the def header")


def rule(rec: dict) -> tuple[str, ast.FunctionDef, int]:
    """Apply rules 2-5; returns ``(code without \\r, function node, header end row)``."""
    if (rec.get("test_setup_code") or "").strip():
        raise Reject("test_setup_code not empty")
    code = rec["code"].replace("\r", "")
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise Reject(f"reference code does not parse: {e.msg}") from e
    if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(tree)):
        raise Reject("has an import")
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        kinds = [type(n).__name__ for n in tree.body]
        raise Reject(f"module body is not exactly one def: {kinds}")
    fn = tree.body[0]
    nested = [
        n
        for n in ast.walk(fn)
        if n is not fn and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    if nested:
        raise Reject("nested def/class")
    hdr = _header_end_row(code, fn)
    lines = code.split("\n")
    body_lines = [ln for ln in lines[hdr:] if ln.strip()]
    if len(body_lines) > MAX_BODY_LINES:
        raise Reject(f"body has {len(body_lines)} non-empty lines")
    if fn.body[0].lineno == hdr:
        raise Reject("body on the def line")
    return code, fn, hdr


# ----------------------------------------------------------------------------- conversion
def reindent_body(code: str, hdr: int) -> str:
    """The function body (rows after ``hdr``) re-indented to 4 spaces per block level."""
    lines = [_expand_leading_tabs(ln) for ln in code.split("\n")]
    src = "\n".join(lines) + "\n"
    depth = 0
    starts: dict[int, int] = {}  # row -> block depth, for rows that start a logical line
    comment_rows: set[int] = set()
    string_interior: set[int] = set()  # rows inside a multi-line string (left untouched)
    owner: dict[int, int] = {}  # continuation row -> row of its logical line start
    at_line_start = True
    cur_start = 0
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.INDENT:
            depth += 1
            continue
        if tok.type == tokenize.DEDENT:
            depth -= 1
            continue
        if tok.type in (tokenize.NEWLINE, tokenize.NL):
            at_line_start = tok.type == tokenize.NEWLINE or at_line_start
            continue
        if tok.type == tokenize.ENDMARKER:
            break
        if tok.type == tokenize.COMMENT and at_line_start:
            comment_rows.add(tok.start[0])
            continue
        if at_line_start:
            starts[tok.start[0]] = depth
            cur_start = tok.start[0]
            at_line_start = False
        for r in range(tok.start[0] + 1, tok.end[0] + 1):
            if tok.type == tokenize.STRING or (
                hasattr(tokenize, "FSTRING_MIDDLE") and tok.type == tokenize.FSTRING_MIDDLE
            ):
                string_interior.add(r)
        for r in range(tok.start[0], tok.end[0] + 1):
            if r != cur_start:
                owner.setdefault(r, cur_start)
    out: list[str] = []
    n = len(lines)
    for row in range(hdr + 1, n + 1):
        line = lines[row - 1]
        text = line.strip()
        if not text:
            out.append("")
            continue
        old = len(line) - len(line.lstrip(" "))
        if row in string_interior:
            out.append(line.rstrip())
        elif row in starts:
            out.append(" " * (4 * starts[row]) + text)
        elif row in comment_rows:
            nxt = min((r for r in starts if r > row), default=None)
            lvl = starts[nxt] if nxt is not None else 1
            out.append(" " * (4 * max(lvl, 1)) + text)
        elif row in owner:
            s = owner[row]
            s_old = len(lines[s - 1]) - len(lines[s - 1].lstrip(" "))
            shift = 4 * starts[s] - s_old
            out.append(" " * max(old + shift, 1) + text)
        else:
            raise Reject(f"cannot place row {row} when re-indenting")
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"


def _docstring_escape(s: str) -> str:
    if '"""' in s:
        raise Reject('text contains """')
    return s.replace("\\", "\\\\")


def _replace_call_sites(src: str, name: str) -> str:
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    sig = [
        t
        for t in toks
        if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)
    ]
    spans = []
    for i, t in enumerate(sig[:-1]):
        if t.type == tokenize.NAME and t.string == name and sig[i + 1].string == "(":
            if i > 0 and sig[i - 1].string == ".":
                continue  # attribute access obj.name(...) is not the function
            spans.append((t.start[1], t.end[1]))
    out = src
    for a, b in reversed(spans):  # single-line source: columns are offsets
        out = out[:a] + "candidate" + out[b:]
    return out


def convert(rec: dict, code: str, fn: ast.FunctionDef, hdr: int) -> dict:
    name = fn.name
    lines = code.split("\n")
    header = "\n".join(ln.rstrip() for ln in lines[fn.lineno - 1 : hdr])
    body = reindent_body(code, hdr)
    try:
        same = ast.dump(ast.parse(header + "\n" + body)) == ast.dump(ast.parse(code))
    except SyntaxError as e:
        raise Reject(f"re-indented body does not parse: {e.msg}") from e
    if not same:
        raise Reject("re-indented body changes the AST")

    asserts = [a.replace("\r", "").strip() for a in rec["test_list"]]
    if not asserts:
        raise Reject("empty test_list")
    first = asserts[0]
    try:
        node = ast.parse(first).body
    except SyntaxError as e:
        raise Reject(f"first assert does not parse: {e.msg}") from e
    ok = (
        len(node) == 1
        and isinstance(node[0], ast.Assert)
        and isinstance(node[0].test, ast.Compare)
        and len(node[0].test.ops) == 1
        and isinstance(node[0].test.ops[0], ast.Eq)
        and isinstance(node[0].test.left, ast.Call)
        and isinstance(node[0].test.left.func, ast.Name)
        and node[0].test.left.func.id == name
    )
    if not ok:
        raise Reject(f"first assert is not `{name}(...) == expected`")
    call = ast.get_source_segment(first, node[0].test.left)
    expected = ast.get_source_segment(first, node[0].test.comparators[0])
    if "\n" in call or "\n" in expected:
        raise Reject("first assert spans several lines")
    text = " ".join(rec["text"].replace("\r", "").split())
    prompt = (
        f"{header}\n"
        f'    """{_docstring_escape(text)}\n'
        f"    >>> {_docstring_escape(call)}\n"
        f"    {_docstring_escape(expected)}\n"
        f'    """\n'
    )
    try:
        ast.parse(prompt + body)
    except SyntaxError as e:
        raise Reject(f"prompt + canonical_solution does not parse: {e.msg}") from e

    test_lines = []
    for a in asserts:
        try:
            stmts = ast.parse(a).body
        except SyntaxError as e:
            raise Reject(f"assert does not parse: {e.msg}") from e
        if len(stmts) != 1 or not isinstance(stmts[0], ast.Assert) or "\n" in a:
            raise Reject(f"not a single one-line assert: {a[:60]!r}")
        new = _replace_call_sites(a, name)
        left = [n for n in ast.walk(ast.parse(new)) if isinstance(n, ast.Name) and n.id == name]
        if left:
            raise Reject(f"assert refers to `{name}` other than by a call: {a[:60]!r}")
        test_lines.append("    " + new + "\n")
    test = "def check(candidate):\n" + "".join(test_lines)
    ast.parse(test)
    return {
        "task_id": f"MBPP/{rec['task_id']}",
        "prompt": prompt,
        "entry_point": name,
        "canonical_solution": body,
        "test": test,
    }


# ----------------------------------------------------------------------------- checks
def exec_check(p: dict) -> None:
    src = p["prompt"] + p["canonical_solution"] + "\n\n" + p["test"] + f"\n\ncheck({p['entry_point']})\n"
    try:
        r = subprocess.run(
            [sys.executable, "-I", "-c", src], capture_output=True, text=True, timeout=EXEC_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as e:
        raise Reject(f"canonical timed out ({EXEC_TIMEOUT_S:.0f} s)") from e
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise Reject(f"canonical fails its asserts: {last[:120]}")


def sandbox_failures(records: list[dict]) -> dict[str, str]:
    """task_id -> reason, for records the project's reader rejects or whose canonical fails in its Sandbox."""
    from orchestry.problems import ProblemFormatError, check_canonical_solutions, make_problem
    from orchestry.sandbox import Sandbox

    bad: dict[str, str] = {}
    problems = []
    for r in records:
        try:
            problems.append(make_problem(r, r["task_id"]))
        except ProblemFormatError as e:
            bad[r["task_id"]] = f"orchestry make_problem rejects it: {e}"
    with Sandbox(max_workers=1) as sb:
        _, failed = check_canonical_solutions(problems, sb, progress=False)
    for tid in failed:
        bad[tid] = "canonical fails an assert unit in orchestry.sandbox.Sandbox"
    return bad


# ----------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--raw", type=Path, default=HERE / "mbpp_raw.jsonl")
    ap.add_argument("--out", type=Path, default=HERE / "mbpp_easy.jsonl")
    ap.add_argument("--n", type=int, default=N_SELECT)
    ap.add_argument("--no-sandbox", action="store_true", help="skip the orchestry reader + Sandbox check")
    args = ap.parse_args()

    recs = [json.loads(ln) for ln in args.raw.read_text(encoding="utf-8").splitlines() if ln.strip()]
    recs.sort(key=lambda r: r["task_id"])
    lo, hi = TEST_SPLIT
    test_split = [r for r in recs if lo <= r["task_id"] <= hi]

    use_sandbox = not args.no_sandbox
    if use_sandbox:
        try:
            import orchestry  # noqa: F401
        except ImportError:
            print("orchestry not importable: run in .venv, or pass --no-sandbox", file=sys.stderr)
            return 2

    excluded: dict[str, int] = {}
    converted: list[dict] = []
    dropped: list[tuple[str, str]] = []
    # Convert + subprocess-check candidates in task_id order; the sandbox check runs on each batch of
    # survivors so that a sandbox failure pulls in the next candidate.
    i = 0
    selected: list[dict] = []
    while len(selected) < args.n and i < len(test_split):
        batch: list[dict] = []
        while len(selected) + len(batch) < args.n and i < len(test_split):
            rec = test_split[i]
            i += 1
            try:
                code, fn, hdr = rule(rec)
            except Reject as e:
                key = str(e).split(":")[0]
                key = "body has > 4 non-empty lines" if key.startswith("body has") else key
                excluded[key] = excluded.get(key, 0) + 1
                continue
            try:
                p = convert(rec, code, fn, hdr)
                exec_check(p)
            except Reject as e:
                dropped.append((f"MBPP/{rec['task_id']}", str(e)))
                continue
            batch.append(p)
            converted.append(p)
        bad = sandbox_failures(batch) if (use_sandbox and batch) else {}
        for p in batch:
            if p["task_id"] in bad:
                dropped.append((p["task_id"], bad[p["task_id"]]))
            else:
                selected.append(p)

    scanned = i
    last_id = test_split[scanned - 1]["task_id"] if scanned else None
    print(f"raw records: {len(recs)} (test split: {len(test_split)}); scanned task_id {lo}..{last_id}")
    print("excluded by the selection rule:", json.dumps(dict(sorted(excluded.items()))))
    print(
        f"candidates meeting rules 1-5: {len(selected) + len(dropped)}; dropped by the conversion check: {len(dropped)}"
    )
    for tid, why in dropped:
        print(f"  dropped {tid}: {why}")
    if len(selected) < args.n:
        print(
            f"only {len(selected)} problems (< {args.n}): extend {args.raw.name} with more source lines",
            file=sys.stderr,
        )
        return 1
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for p in selected:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    print(f"wrote {len(selected)} problems to {args.out}")
    print("task_ids:", " ".join(p["task_id"].split("/")[1] for p in selected))
    return 0


if __name__ == "__main__":
    sys.exit(main())
