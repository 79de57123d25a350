"""``orchestry.runtime.run_stage``: a stage process ends right after ``main`` without losing anything it wrote."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import atexit, os, sys
    from pathlib import Path
    from orchestry.runtime import run_stage

    class Teardown:  # the interpreter's teardown would call this; run_stage skips the teardown
        def __del__(self):
            Path("teardown.txt").write_text("ran")

    KEEP = Teardown()

    def main():
        atexit.register(lambda: Path("atexit.txt").write_text("ran"))
        print("no newline at the end", end="")  # buffered: a pipe, not a terminal
        print("to stderr", end="", file=sys.stderr)
        if os.environ.get("FAIL") == "raise":
            raise RuntimeError("the stage failed")
        if os.environ.get("FAIL") == "params":
            raise SystemExit(2)

    run_stage(main)
    Path("after.txt").write_text("ran")  # never reached
    """
)


def _run(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    (tmp_path / "stage.py").write_text(SCRIPT)
    environ = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    return subprocess.run(
        [sys.executable, "stage.py"], cwd=tmp_path, capture_output=True, text=True, env={**environ, **env}
    )


def test_success_runs_exit_handlers_flushes_and_skips_teardown(tmp_path):
    res = _run(tmp_path)
    assert res.returncode == 0
    assert res.stdout == "no newline at the end"
    assert res.stderr == "to stderr"
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert not (tmp_path / "teardown.txt").exists()  # the interpreter's teardown was skipped
    assert not (tmp_path / "after.txt").exists()


def test_failures_leave_through_the_normal_exit(tmp_path):
    res = _run(tmp_path, FAIL="raise")
    assert res.returncode == 1 and "RuntimeError: the stage failed" in res.stderr
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert (tmp_path / "teardown.txt").read_text() == "ran"
    (tmp_path / "teardown.txt").unlink()
    res = _run(tmp_path, FAIL="params")
    assert res.returncode == 2
    assert (tmp_path / "teardown.txt").read_text() == "ran"


def test_inside_an_accelerate_launch_the_rank_exits_normally(tmp_path):
    res = _run(tmp_path, WORLD_SIZE="2")
    assert res.returncode == 0
    assert res.stdout == "no newline at the end"
    assert (tmp_path / "teardown.txt").read_text() == "ran"


def test_under_a_profiler_the_process_exits_normally_and_the_profile_is_written(tmp_path):
    (tmp_path / "stage.py").write_text(SCRIPT)
    res = subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", "stage.prof", "stage.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "stage.prof").stat().st_size > 0
    assert (tmp_path / "teardown.txt").read_text() == "ran"
