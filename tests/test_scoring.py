"""``orchestry score`` end to end through the typer app (real sandbox, temp files, bad lines)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestry.cli import app

PROBLEMS = [
    {
        "task_id": "Tiny/0",
        "prompt": 'def double_all(xs: list) -> list:\n    """Double every element of xs."""\n',
        "entry_point": "double_all",
        "test": (
            "def check(candidate):\n"
            "    assert candidate([]) == []\n"
            "    assert candidate([1]) == [2]\n"
            "    assert candidate([1, 2, 3]) == [2, 4, 6]\n"
        ),
        "canonical_solution": "    return [2 * x for x in xs]\n",
    },
    {
        "task_id": "Tiny/1",
        "prompt": "import math\n\ndef hypot2(a: float, b: float) -> float:\n",
        "entry_point": "hypot2",
        "test": "def check(candidate):\n    assert candidate(3, 4) == 5.0\n    assert candidate(0, 0) == 0\n",
    },
]
AUX = "```python\ndef aux(x):\n    return 2 * x\n```\nDoubles x."
GOOD = "```python\ndef double_all(xs):\n    return [aux(x) for x in xs]\n```"
HYPOT_AUX = "def aux(a, b):\n    return a * a + b * b\n"
HYPOT_MAIN = "def hypot2(a, b):\n    return math.sqrt(aux(a, b))\n"

runner = CliRunner()


def write_jsonl(path: Path, lines: list) -> Path:
    path.write_text(
        "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8"
    )
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def problems_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "problems.jsonl", PROBLEMS)


def run(*args: str):
    return runner.invoke(app, ["score", *map(str, args)])


COMPLETIONS = [
    {"task_id": "Tiny/0", "helper": AUX, "main": GOOD, "sample": 0, "meta": {"seed": 1, "tags": ["a"]}},
    "{this is not json",
    "",  # blank lines are skipped
    {"task_id": "Nope/9", "helper": AUX, "main": GOOD, "sample": 2},
    {"task_id": "Tiny/0", "main": GOOD, "sample": 3},
    {"task_id": "Tiny/0", "helper": AUX, "main": ["not", "a", "string"], "sample": 4},
    [1, 2, 3],
    {"task_id": "Tiny/1", "helper": HYPOT_AUX, "main": HYPOT_MAIN, "sample": 6},
    {"task_id": "Tiny/0", "helper": "I can't do that.", "main": "Neither can I.", "sample": 7},
    {"helper": AUX, "main": GOOD, "sample": 8},
    {"task_id": "Tiny/0", "helper": AUX, "main": "def double_all(xs):\n    return aux(xs)\n", "sample": 9},
]


def test_score_cli_keeps_order_keys_and_reasons(tmp_path: Path, problems_file: Path) -> None:
    completions = write_jsonl(tmp_path / "completions.jsonl", COMPLETIONS)
    out = tmp_path / "out" / "scores.jsonl"
    result = run("--problems", problems_file, "--completions", completions, "--out", out, "--chunk-size", 3)
    assert result.exit_code == 0, result.output
    rows = read_jsonl(out)
    assert len(rows) == 10  # one per non-blank line
    assert not (tmp_path / "out" / "scores.jsonl.tmp").exists()
    fields = {
        "structure",
        "syntax",
        "tests",
        "cooperation",
        "total",
        "passed",
        "total_asserts",
        "scheme",
        "reasons",
        "aux_defined",
        "aux_called",
        "aux_used",
        "truncated",
        "format_paid",
    }
    for row in rows:
        assert fields <= set(row)
        assert "helper" not in row and "main" not in row

    good, bad_json, unknown, no_helper, bad_main, not_obj, hypot, prose, no_id, wrapper = rows
    assert good["sample"] == 0 and good["meta"] == {"seed": 1, "tags": ["a"]} and good["task_id"] == "Tiny/0"
    assert good["total"] == 4.0 and good["passed"] == good["total_asserts"] == 3 and good["reasons"] == []
    assert good["scheme"] == "coordinator"

    assert bad_json == {**bad_json, "line": 2, "total": 0.0}
    assert "not valid JSON" in bad_json["reasons"][0] and set(bad_json) == fields | {"line"}
    assert unknown["sample"] == 2 and unknown["reasons"] == ["input: unknown task_id 'Nope/9'"]
    assert no_helper["reasons"] == ["input: missing field 'helper'"] and no_helper["total_asserts"] == 3
    assert bad_main["reasons"] == ["input: field 'main' must be a string, got list"]
    assert not_obj["line"] == 7 and "not a JSON object" in not_obj["reasons"][0]
    assert hypot["sample"] == 6 and hypot["total"] == 4.0 and hypot["scheme"] == "decorator"
    assert prose["total"] == 0.0
    assert (
        "helper: no code block found" in prose["reasons"] and "main: no code block found" in prose["reasons"]
    )
    assert no_id["reasons"] == ["input: missing field 'task_id'"]
    assert wrapper["sample"] == 9 and wrapper["scheme"] == "wrapper" and wrapper["cooperation"] == 0.5
    for row in (bad_json, unknown, no_helper, bad_main, not_obj, no_id):
        assert row["total"] == 0.0 and row["passed"] == 0

    assert wrapper["passed"] == 1  # aux(xs) doubles the list itself: only `[]` passes
    # 2 of 10 lines pass every assert; 6 are invalid
    assert re.search(r"pass@1\W+0\.200\b", result.stdout), result.stdout
    assert re.search(r"invalid lines\W+6\b", result.stdout), result.stdout


def test_chunking_does_not_change_results(tmp_path: Path, problems_file: Path) -> None:
    completions = write_jsonl(tmp_path / "c.jsonl", COMPLETIONS)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert run("--problems", problems_file, "--completions", completions, "--out", a, "-q").exit_code == 0
    assert (
        run(
            "--problems", problems_file, "--completions", completions, "--out", b, "--chunk-size", 1, "-q"
        ).exit_code
        == 0
    )
    assert read_jsonl(a) == read_jsonl(b)


def test_keep_code_and_single_mode(tmp_path: Path, problems_file: Path) -> None:
    completions = write_jsonl(
        tmp_path / "single.jsonl",
        [
            {"task_id": "Tiny/0", "main": "def double_all(xs):\n    return [x * 2 for x in xs]\n"},
            {"task_id": "Tiny/0", "helper": "ignored", "main": GOOD},
        ],
    )
    out = tmp_path / "single_out.jsonl"
    result = run(
        "--problems", problems_file, "--completions", completions, "--out", out, "--single", "--keep-code"
    )
    assert result.exit_code == 0, result.output
    solo, calls_aux = read_jsonl(out)
    assert solo["total"] == pytest.approx(2.1) and solo["main"].startswith("def double_all")
    assert calls_aux["helper"] == "ignored" and calls_aux["cooperation"] == 0.0 and calls_aux["passed"] == 1


def test_humaneval_source(tmp_path: Path) -> None:
    completions = write_jsonl(
        tmp_path / "he.jsonl",
        [
            {
                "task_id": "HumanEval/2",
                "helper": "def aux(x):\n    return int(x)\n",
                "main": "def truncate_number(number: float) -> float:\n    return number - aux(number)\n",
            }
        ],
    )
    out = tmp_path / "he_out.jsonl"
    result = run("--problems", "humaneval", "--completions", completions, "--out", out, "--workers", 1)
    assert result.exit_code == 0, result.output
    (row,) = read_jsonl(out)
    assert row["total"] == 4.0 and row["total_asserts"] == 3


def test_bad_problems_file_exits_2(tmp_path: Path) -> None:
    completions = write_jsonl(tmp_path / "c.jsonl", [{"task_id": "x", "helper": "", "main": ""}])
    bad = tmp_path / "problems.jsonl"
    bad.write_text('{"task_id": "T/0", "prompt": "def f():\\n"}\n', encoding="utf-8")
    for problems in (tmp_path / "missing.jsonl", bad):
        result = run("--problems", problems, "--completions", completions, "--out", tmp_path / "o.jsonl")
        assert result.exit_code == 2
        assert "error" in result.output
    assert not (tmp_path / "o.jsonl").exists()


def test_missing_completions_file_exits_2(tmp_path: Path, problems_file: Path) -> None:
    result = run(
        "--problems", problems_file, "--completions", tmp_path / "none.jsonl", "--out", tmp_path / "o.jsonl"
    )
    assert result.exit_code == 2 and "not found" in result.output


def test_app_is_multi_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "score" in result.output


# --- a careless user's --out, and hostile lines: the input is never touched, the run never stops on a line ---


def _names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


@pytest.mark.parametrize("spelling", ["same", "dotdot", "relative", "symlink", "hardlink", "problems"])
def test_out_resolving_to_an_input_is_refused_before_any_work(
    tmp_path: Path, problems_file: Path, spelling: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    completions = write_jsonl(tmp_path / "c.jsonl", COMPLETIONS[:1])
    before, problems_before = completions.read_bytes(), problems_file.read_bytes()
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    if spelling == "symlink":
        (tmp_path / "link.jsonl").symlink_to(completions)
    if spelling == "hardlink":
        (tmp_path / "hard.jsonl").hardlink_to(completions)
    out = {
        "same": completions,
        "dotdot": tmp_path / "sub" / ".." / "c.jsonl",
        "relative": Path("../c.jsonl"),
        "symlink": tmp_path / "link.jsonl",
        "hardlink": tmp_path / "hard.jsonl",
        "problems": problems_file,
    }[spelling]
    files = _names(tmp_path)
    result = run("--problems", problems_file, "--completions", completions, "--out", out)
    assert result.exit_code == 2, result.output
    assert "--out" in result.output and "Traceback" not in result.output
    assert completions.read_bytes() == before and problems_file.read_bytes() == problems_before
    assert _names(tmp_path) == files  # no temporary file left behind


def test_input_named_like_the_outputs_old_temp_file_is_read_not_truncated(
    tmp_path: Path, problems_file: Path
) -> None:
    out = tmp_path / "scores.jsonl"
    completions = write_jsonl(tmp_path / "scores.jsonl.tmp", COMPLETIONS[:2])
    before = completions.read_bytes()
    result = run("--problems", problems_file, "--completions", completions, "--out", out, "-q")
    assert result.exit_code == 0, result.output
    assert completions.read_bytes() == before
    assert [r.get("sample") for r in read_jsonl(out)] == [0, None]
    assert _names(tmp_path) == {"problems.jsonl", "scores.jsonl", "scores.jsonl.tmp"}


def test_lone_surrogates_and_huge_numbers_score_their_line(tmp_path: Path, problems_file: Path) -> None:
    lines = [
        '{"task_id": "Tiny/0", "helper": "x", "main": "y", "note": "\\ud800"}',
        '{"task_id": "Tiny/\\udfff", "helper": "x", "main": "y"}',
        '{"task_id": "Tiny/0", "helper": "x", "main": "y", "\\ud800key": 1}',
        '{"task_id": "Tiny/0", "helper": "def aux(x):\\n    return \'\\ud800\'\\n", "main": "# \\udc80"}',
        '{"task_id": "Tiny/0", "helper": "x", "main": "y", "n": 1' + "0" * 5000 + "}",
        json.dumps({"task_id": "Tiny/0", "helper": AUX, "main": GOOD, "note": "é ✓"}, ensure_ascii=False),
    ]
    completions = tmp_path / "c.jsonl"
    completions.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "o.jsonl"
    result = run("--problems", problems_file, "--completions", completions, "--out", out, "-q")
    assert result.exit_code == 0, result.output
    rows = read_jsonl(out)
    assert len(rows) == len(lines)
    assert rows[0]["note"] == "\ud800" and rows[0]["reasons"]
    assert rows[1]["task_id"] == "Tiny/\udfff" and "unknown task_id" in rows[1]["reasons"][0]
    assert rows[2]["\ud800key"] == 1
    assert rows[3]["total_asserts"] == 3
    assert rows[4]["line"] == 5 and "not valid JSON" in rows[4]["reasons"][0]
    assert rows[5]["total"] == 4.0 and rows[5]["note"] == "é ✓"
    assert "é ✓" in out.read_text(encoding="utf-8")  # readable text stays readable
    assert _names(tmp_path) == {"problems.jsonl", "c.jsonl", "o.jsonl"}


def test_corrupt_gzip_completions_leave_no_output_and_no_temp_file(
    tmp_path: Path, problems_file: Path
) -> None:
    import gzip

    good = gzip.compress(b"".join(json.dumps(c).encode() + b"\n" for c in COMPLETIONS[:1] * 50))
    completions = tmp_path / "c.jsonl.gz"
    completions.write_bytes(good[: len(good) // 2])  # truncated stream
    out = tmp_path / "o.jsonl"
    result = run("--problems", problems_file, "--completions", completions, "--out", out, "--chunk-size", 1)
    assert result.exit_code == 2, result.output
    assert "--completions" in result.stderr and "Traceback" not in result.output
    assert _names(tmp_path) == {"problems.jsonl", "c.jsonl.gz"}
