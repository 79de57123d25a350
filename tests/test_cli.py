"""``orchestry`` command line from a careless user's side: every bad value is one line on stderr, exit code 2."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestry.cli import app

PROBLEM = {
    "task_id": "Tiny/0",
    "prompt": "def one() -> int:\n",
    "entry_point": "one",
    "test": "def check(candidate):\n    assert candidate() == 1\n",
}
runner = CliRunner()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps(PROBLEM) + "\n")
    completions = tmp_path / "c.jsonl"
    completions.write_text(
        json.dumps({"task_id": "Tiny/0", "helper": "", "main": "def one():\n  return 1\n"})
    )
    return {"problems": problems, "completions": completions, "out": tmp_path / "out.jsonl"}


def score(files: dict[str, Path], *extra: str, **override: str | Path):
    args = {**files, **override}
    argv = ["score", *(x for k, v in args.items() for x in (f"--{k}", str(v))), *extra]
    return runner.invoke(app, argv)


def assert_one_line_error(result, option: str, code: int = 2) -> None:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert option in lines[0] and "Traceback" not in result.output
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--timeout-s", "0"),
        ("--timeout-s", "-1"),
        ("--timeout-s", "inf"),
        ("--timeout-s", "nan"),
        ("--timeout-s", "1e400"),
        ("--timeout-s", "soon"),
        ("--isolation", "bogus"),
        ("--workers", "0"),
        ("--workers", "-3"),
        ("--memory-mb", "-1"),
        ("--memory-mb", "0"),
        ("--memory-mb", "99999999999999999"),
        ("--chunk-size", "0"),
        ("--chunk-size", "-5"),
    ],
)
def test_bad_option_value_is_one_line_naming_the_option(
    files: dict[str, Path], option: str, value: str
) -> None:
    result = score(files, option, value)
    assert_one_line_error(result, option)
    assert not files["out"].exists()


def test_quiet_never_hides_errors(files: dict[str, Path], tmp_path: Path) -> None:
    result = score(files, "-q", completions=tmp_path / "missing.jsonl")
    assert_one_line_error(result, "--completions")
    assert_one_line_error(score(files, "-q", "--timeout-s", "0"), "--timeout-s")


def _corrupt_gz(path: Path) -> Path:
    path.write_bytes(b"\x1f\x8b\x08\x00 this is not deflate data at all")
    return path


def _truncated_gz(path: Path) -> Path:
    data = gzip.compress((json.dumps(PROBLEM) + "\n").encode() * 20)
    path.write_bytes(data[: len(data) // 2])
    return path


def _not_gz(path: Path) -> Path:
    path.write_text(json.dumps(PROBLEM) + "\n")  # plain text under a .gz name
    return path


def _undecodable(path: Path) -> Path:
    path.write_bytes(b'{"task_id": "\xff\xfe"}\n')
    return path


@pytest.mark.parametrize("make", [_corrupt_gz, _truncated_gz, _not_gz, _undecodable])
def test_unreadable_problems_file_is_one_line(files: dict[str, Path], tmp_path: Path, make) -> None:
    bad = make(tmp_path / ("p.jsonl.gz" if make is not _undecodable else "p.jsonl"))
    assert_one_line_error(score(files, problems=bad), "--problems")
    assert not files["out"].exists()


@pytest.mark.parametrize(
    "content", [b"", b"\n  \n\t\n", b"[]", b"[\n]\n"], ids=["empty", "blank", "list", "list2"]
)
def test_a_problems_file_without_problems_is_one_line(
    files: dict[str, Path], tmp_path: Path, content
) -> None:
    empty = tmp_path / "none.jsonl"
    empty.write_bytes(content)
    assert_one_line_error(
        score(files, problems=empty), "holds no problems"
    )  # was: exit 0, every line unknown
    assert not files["out"].exists()


@pytest.mark.parametrize("option", ["problems", "completions", "out"])
def test_directory_instead_of_a_file_is_one_line(files: dict[str, Path], tmp_path: Path, option: str) -> None:
    folder = tmp_path / "a_folder"
    folder.mkdir()
    assert_one_line_error(score(files, **{option: folder}), f"--{option}")
    assert list(folder.iterdir()) == []


def test_out_under_a_file_is_one_line(files: dict[str, Path]) -> None:
    assert_one_line_error(score(files, out=files["completions"] / "o.jsonl"), "--out")


def test_debug_shows_the_traceback(files: dict[str, Path], tmp_path: Path) -> None:
    bad = _corrupt_gz(tmp_path / "p.jsonl.gz")
    result = score(files, "--debug", problems=bad)
    assert result.exit_code == 2
    assert "Traceback" in result.stderr and "--problems" in result.stderr.strip().splitlines()[-1]


def test_missing_and_unknown_options_are_one_line(files: dict[str, Path]) -> None:
    result = runner.invoke(app, ["score", "--completions", str(files["completions"]), "--out", "o.jsonl"])
    assert_one_line_error(result, "--problems")
    assert_one_line_error(score(files, "--timeout", "3"), "--timeout")


def test_help_still_works() -> None:
    result = runner.invoke(app, ["score", "--help"])
    assert result.exit_code == 0 and "--timeout-s" in result.stdout and "--debug" in result.stdout
    result = runner.invoke(app, [])
    assert "score" in result.output


def test_out_that_is_not_a_regular_file_is_never_replaced(files: dict[str, Path], tmp_path: Path) -> None:
    import os
    import stat

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert_one_line_error(score(files, out=fifo), "--out")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert {p.name for p in tmp_path.iterdir()} == {"problems.jsonl", "c.jsonl", "pipe"}
