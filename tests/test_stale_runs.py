"""A stage killed with SIGKILL cannot end its MLflow run: the next stage that starts (of the same execution or of
another) ends it KILLED, with an end time and the tag ``orchestry.stale`` saying why. A run whose process is alive,
or that another host holds, is left RUNNING.

Real parts only: a real sqlite MLflow store in a temporary directory and real stage processes
(:func:`orchestry.tracking.runs.stage_run` in a child Python), killed with a real SIGKILL.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import psutil
import pytest
from mlflow.tracking import MlflowClient

from orchestry.tracking.runs import stage_run

EXPERIMENT = "t"
#: The tags a user reads in MLflow: why a run was ended KILLED, and the process that holds a run.
STALE_TAG = "orchestry.stale"
PID_TAG, HOST_TAG, START_TAG = (f"orchestry.process.{k}" for k in ("pid", "host", "start_time"))

#: A stage that opens its run, says its run and parent ids, then works until it is killed.
VICTIM = """
import sys, time
from orchestry.tracking.runs import stage_run
with stage_run("victim", {"a": 1}, experiment=sys.argv[2], uri=sys.argv[1]) as run:
    print(run.info.run_id, run.data.tags["mlflow.parentRunId"], flush=True)
    time.sleep(300)
"""


@pytest.fixture
def store(tmp_path, monkeypatch):
    """``sqlite:///<tmp>/mlflow.db``, cwd and DVC_ROOT = tmp (no git, no DVC experiment), with ``params.yaml``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    for env in ("DVC_EXP_NAME", "DVC_EXP_BASELINE_REV", "ORCHESTRY_TUNE_STUDY", "ORCHESTRY_TUNE_TRIAL"):
        monkeypatch.delenv(env, raising=False)
    (tmp_path / "params.yaml").write_text("evaluate:\n  seed: 1\n")
    yield f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(None)


def _victim(tmp_path: Path, store: str) -> tuple[subprocess.Popen, str, str]:
    """A stage process with its run open: (process, stage run id, parent run id)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", VICTIM, store, EXPERIMENT],
        cwd=tmp_path,
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline().split()
    if len(line) != 2:
        proc.kill()
        pytest.fail(f"the victim stage did not start: {proc.communicate(timeout=60)[1][-2000:]}")
    return proc, line[0], line[1]


def _sigkill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.close()
    proc.stderr.close()


def _run(store: str, run_id: str):
    return MlflowClient(tracking_uri=store).get_run(run_id)


def test_a_sigkilled_stage_run_is_marked_killed_when_the_next_stage_starts(store, tmp_path):
    proc, victim_id, parent_id = _victim(tmp_path, store)
    _sigkill(proc)
    assert _run(store, victim_id).info.status == "RUNNING"  # what main left for ever
    before = int(time.time() * 1000)
    with stage_run("next", {}, EXPERIMENT, uri=store) as run:
        assert run.data.tags["mlflow.parentRunId"] == parent_id  # the same execution: the same parent
        victim = _run(store, victim_id)
        assert victim.info.status == "KILLED"
        assert victim.info.end_time is not None and victim.info.end_time >= before
        why = victim.data.tags[STALE_TAG]
        host = socket.gethostname()
        assert f"process {proc.pid} no longer alive on {host}" in why, why
        assert why.startswith(f"marked KILLED by next (pid {os.getpid()} on {host})"), why
        parent = _run(store, parent_id)
        assert parent.info.status == "RUNNING" and STALE_TAG not in parent.data.tags  # this stage runs in it
        assert parent.data.tags[PID_TAG] == str(os.getpid())
    assert _run(store, run.info.run_id).info.status == "FINISHED"
    assert _run(store, parent_id).info.status == "FINISHED"
    assert _run(store, victim_id).info.status == "KILLED"


def test_a_live_run_is_left_running_and_marked_once_its_process_is_killed(store, tmp_path):
    proc, victim_id, old_parent = _victim(tmp_path, store)
    try:
        (tmp_path / "params.yaml").write_text("evaluate:\n  seed: 2\n")  # the next execution
        with stage_run("other", {}, EXPERIMENT, uri=store) as run:
            assert run.data.tags["mlflow.parentRunId"] != old_parent
        for run_id in (victim_id, old_parent):  # its process works on: not stale
            r = _run(store, run_id)
            assert r.info.status == "RUNNING" and STALE_TAG not in r.data.tags
    finally:
        _sigkill(proc)
    with stage_run("other", {}, EXPERIMENT, uri=store):
        pass
    for run_id in (victim_id, old_parent):  # the stage, then its execution's parent (no RUNNING child left)
        r = _run(store, run_id)
        assert r.info.status == "KILLED" and r.info.end_time is not None
        assert f"process {proc.pid} no longer alive" in r.data.tags[STALE_TAG]
    # the killed execution resumes: its parent runs again, without the stale tag, and ends with its stage
    (tmp_path / "params.yaml").write_text("evaluate:\n  seed: 1\n")
    with stage_run("victim", {"a": 1}, EXPERIMENT, uri=store) as run:
        assert run.data.tags["mlflow.parentRunId"] == old_parent
        parent = _run(store, old_parent)
        assert parent.info.status == "RUNNING" and STALE_TAG not in parent.data.tags
    assert _run(store, old_parent).info.status == "FINISHED"
    assert _run(store, victim_id).info.status == "KILLED"


def test_only_runs_of_this_host_whose_process_is_gone_are_marked(store, tmp_path):
    """A reused pid (alive, started at another time) is gone; another host's run, a live process's run and a run
    without the process tags are left RUNNING."""
    mlflow.set_tracking_uri(store)
    client = MlflowClient(tracking_uri=store)
    exp = client.create_experiment(EXPERIMENT)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    me = {
        PID_TAG: str(os.getpid()),
        HOST_TAG: socket.gethostname(),
        START_TAG: repr(psutil.Process().create_time()),
    }
    runs = {
        "reused pid": {**me, START_TAG: "1.0"},
        "other host": {**me, PID_TAG: str(dead.pid), HOST_TAG: "another-host.example"},
        "alive": me,
        "no tags": {},
    }
    ids = {name: client.create_run(exp, run_name=name, tags=tags).info.run_id for name, tags in runs.items()}
    with stage_run("next", {}, EXPERIMENT, uri=store):
        pass
    reused = _run(store, ids["reused pid"])
    assert reused.info.status == "KILLED"
    assert "the pid now belongs to a process started at" in reused.data.tags[STALE_TAG]
    for name in ("other host", "alive", "no tags"):
        r = _run(store, ids[name])
        assert r.info.status == "RUNNING" and STALE_TAG not in r.data.tags, name
