"""``orchestry.runtime.run_stage``: a stage process ends right after ``main`` without losing anything it wrote."""

import os
import signal
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
        if os.environ.get("FAIL") == "sigint":
            import signal, time
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of the work
            time.sleep(30)

    run_stage(main)
    Path("after.txt").write_text("ran")  # never reached
    """
)


def _run(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    (tmp_path / "stage.py").write_text(SCRIPT)
    environ = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    return subprocess.run(
        [sys.executable, "stage.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**environ, **env},
        preexec_fn=default_sigint,
    )


def default_sigint() -> None:
    """The child takes Ctrl-C as a terminal's foreground process does: a test suite started as a background job of a
    non-interactive shell has SIGINT ignored, which its children inherit (then Python installs no handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    """SIGINT used to print the whole traceback and exit 1 (under dvc repro too); now one line and 128 + 2."""
    done = _run(tmp_path, FAIL="sigint")
    assert done.returncode == 130, done.stderr
    lines = done.stderr.strip().splitlines()  # the script's own "to stderr" has no newline
    assert "Traceback" not in done.stderr and len(lines) == 1 and "error: interrupted (SIGINT)" in lines[0]
    assert not (tmp_path / "after.txt").exists()
    debug = _run(tmp_path, FAIL="sigint", ORCHESTRY_DEBUG="1")
    assert "Traceback" in debug.stderr and "KeyboardInterrupt" in debug.stderr
