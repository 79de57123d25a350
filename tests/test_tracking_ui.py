"""What a user sees in MLflow: the tags of every run, the parent run's key metrics, and the runs table that
``orchestry ui`` prints, opened in headless Chromium.

Real parts only: real sqlite MLflow stores in temporary directories, the real ``orchestry ui`` (a real
``mlflow server`` subprocess) and Debian's ``chromium`` (the browser test skips without it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import pytest

from orchestry.tracking.execution import execution_key, pipeline_execution
from orchestry.tracking.runs import log_metrics, stage_run, tracking_uri
from orchestry.tracking.ui import (
    VIEW_METRICS,
    VIEW_TAG,
    VIEW_TAGS,
    execution_metrics,
    log_execution_metrics,
    runs_table_url,
)

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh store ``sqlite:///<tmp>/mlflow.db`` (cwd = tmp, no DVC experiment) with ``params.yaml``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    monkeypatch.delenv("DVC_EXP_BASELINE_REV", raising=False)
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "1")
    (tmp_path / "params.yaml").write_text("evaluate:\n  seed: 1\n")
    yield f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(None)


def _one_execution(store: str) -> tuple[str, str]:
    """An ``evaluate`` stage run with one metric; returns (experiment id, stage run id)."""
    with stage_run("evaluate", {"seed": 1}, "orchestry", uri=store) as run:
        log_metrics({"magrpo/reward": 0.5})
    return run.info.experiment_id, run.info.run_id


def test_every_run_carries_the_columns_a_user_filters_by(store, monkeypatch):
    monkeypatch.setenv("DVC_EXP_NAME", "exp-a")
    exp_id, run_id = _one_execution(store)
    client = mlflow.MlflowClient(store)
    run = client.get_run(run_id)
    parent = client.get_run(run.data.tags["mlflow.parentRunId"])
    key = execution_key(pipeline_execution())
    for r in (run, parent):
        assert r.data.tags["pipeline_execution"] == key
        assert r.data.tags["dvc_experiment"] == "exp-a"
        assert r.data.tags["git_revision"] and len(r.data.tags["params_hash"]) == 64
    assert run.data.tags["stage"] == "evaluate" and "stage" not in parent.data.tags
    assert parent.info.run_name == "exp-a"
    # the next stage of the execution finds the same parent (not the first stage run, which has the key too)
    with stage_run("plot", {}, "orchestry", uri=store) as plot:
        pass
    assert client.get_run(plot.info.run_id).data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert "mlflow.parentRunId" not in parent.data.tags
    # the runs table's view: those tags, then the key metrics, newest first
    view = json.loads(client.get_experiment(exp_id).tags[VIEW_TAG])
    assert view["selectedColumns"][: len(VIEW_TAGS)] == [f"tags.`{t}`" for t in VIEW_TAGS]
    assert view["selectedColumns"][len(VIEW_TAGS) :] == [f"metrics.`{m}`" for m in VIEW_METRICS]
    assert (view["orderByKey"], view["orderByAsc"]) == ("attributes.start_time", False)


def test_the_store_is_the_params_uri_then_mlflow_tracking_uri_then_the_repo_sqlite(
    store, tmp_path, monkeypatch
):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri() == store
    shared = f"sqlite:///{tmp_path / 'team' / 'shared.db'}"  # a team's store, named by the environment
    (tmp_path / "team").mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", shared)
    assert tracking_uri() == shared and tracking_uri("sqlite:///x.db") == "sqlite:///x.db"
    assert tracking_uri("http://mlflow.team:5000") == "http://mlflow.team:5000"
    with stage_run("evaluate", {"seed": 1}, "orchestry") as run:  # the stage's params give no uri
        log_metrics({"magrpo/reward": 0.25})
    assert mlflow.MlflowClient(shared).get_run(run.info.run_id).data.metrics["magrpo/reward"] == 0.25
    assert not (tmp_path / "mlflow.db").exists()  # nothing written to the repository's own store


def test_a_workspace_execution_is_named_workspace(store):
    _, run_id = _one_execution(store)
    client = mlflow.MlflowClient(store)
    parent = client.get_run(client.get_run(run_id).data.tags["mlflow.parentRunId"])
    assert parent.info.run_name.startswith("workspace ") and "dvc_experiment" not in parent.data.tags


def test_the_parent_run_gets_the_execution_key_metrics(store, tmp_path):
    reports = tmp_path / "reports"
    shutil.copytree(
        ROOT / "reports", reports, ignore=shutil.ignore_patterns("*.png", "*.html", "screenshots")
    )
    metrics = json.loads((reports / "metrics.json").read_text())
    orch = json.loads((reports / "orchestrator" / "summary.json").read_text())
    with stage_run("plot", {}, "orchestry", uri=store) as run:
        logged = log_execution_metrics(reports)
    client = mlflow.MlflowClient(store)
    plot = client.get_run(run.info.run_id)
    parent = client.get_run(plot.data.tags["mlflow.parentRunId"])
    for method, m in metrics["methods"].items():
        assert parent.data.metrics[f"test/{method}/pass_at_1"] == pytest.approx(m["pass@1"])
        assert parent.data.metrics[f"test/{method}/reward"] == pytest.approx(m["reward"])
        assert parent.data.metrics[f"test/{method}/cooperation_rate"] == pytest.approx(m["cooperation_rate"])
        tokens = m["prompt_tokens"] + m["completion_tokens"]
        assert parent.data.metrics[f"cost/{method}/tokens_per_sample"] == pytest.approx(tokens)
    learned = orch["eval"]["methods"]["learned"]
    assert parent.data.metrics["test/orchestrator/learned/objective"] == pytest.approx(
        learned["objective"]["mean"]
    )
    assert parent.data.metrics["test/api_grpo/with_behaviors/reward"] == pytest.approx(
        metrics["api_grpo"]["eval"]["with"]["mean"]
    )
    assert set(logged) == set(parent.data.metrics) and set(VIEW_METRICS) <= set(logged)
    assert not any(k.startswith("test/") for k in plot.data.metrics)  # the stage run keeps its own metrics


def test_execution_metrics_skip_missing_and_bad_reports(tmp_path):
    assert execution_metrics(tmp_path / "nowhere") == {}
    (tmp_path / "metrics.json").write_text(
        json.dumps({"methods": {"base": {"pass@1": 0.5, "reward": float("nan"), "cooperation_rate": True}}})
    )
    (tmp_path / "api_grpo").mkdir()
    (tmp_path / "api_grpo" / "summary.json").write_text("{not json")
    assert execution_metrics(tmp_path) == {"test/base/pass_at_1": 0.5}
    with pytest.raises(RuntimeError, match="needs run_id or an active stage run"):
        log_execution_metrics(tmp_path)


# ---------------------------------------------------------------- orchestry ui, in a browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian package `chromium`)")
def test_the_url_orchestry_ui_prints_shows_the_runs_table_with_the_stage_column(store, tmp_path, monkeypatch):
    """``orchestry ui`` prints the runs table's address; Chromium renders it with the stage, DVC experiment, git
    revision and pipeline execution columns, a key metric's column with the parent's value, and the run of the
    store (MLflow 3 opens an experiment on GenAI traces otherwise)."""
    monkeypatch.setenv("DVC_EXP_NAME", "exp-in-the-ui")  # MLflow shows a tag column only when a run has it
    exp_id, run_id = _one_execution(store)
    client = mlflow.MlflowClient(store)  # the execution's key metric, as the plot stage logs it on the parent
    parent_id = client.get_run(run_id).data.tags["mlflow.parentRunId"]
    client.log_metric(parent_id, "test/magrpo/pass_at_1", 0.625)
    port = _free_port()
    env = {**os.environ, "MLFLOW_ENABLE_ASYNC_LOGGING": "false"}
    for var in ("DVC_ROOT", "DISPLAY", "WAYLAND_DISPLAY", "BROWSER"):
        env.pop(var, None)
    out_path, log_path = tmp_path / "ui.out", tmp_path / "ui.log"
    with open(out_path, "wb") as out, open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestry.cli", "ui", "--no-browser", "--port", str(port),
             "--tracking-uri", store],
            cwd=tmp_path, env=env, stdout=out, stderr=log, start_new_session=True,
        )  # fmt: skip
    try:
        deadline, health = time.time() + 180, None
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    health = r.read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert health == "OK", log_path.read_text()[-3000:]
        while time.time() < deadline and "ready" not in out_path.read_text():  # it polls /health too
            time.sleep(0.2)
        url = out_path.read_text().splitlines()[0]
        assert url == runs_table_url(exp_id, f"http://127.0.0.1:{port}")
        run = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1600,1000",
             "--virtual-time-budget=30000", "--dump-dom", url],
            capture_output=True, text=True, timeout=150, check=False,
        )  # fmt: skip
        dom = run.stdout
        columns = set(re.findall(r'role="columnheader"[^>]*col-id="([^"]*)"', dom))
        want = {"tags.`stage`", "tags.`dvc_experiment`", "tags.`git_revision`", "tags.`pipeline_execution`",
                "metrics.`test/magrpo/pass_at_1`"}  # fmt: skip
        assert want <= columns, (sorted(columns), run.stderr[-1000:])
        assert ">0.625<" in dom  # the parent's key metric in its row
        assert ">exp-in-the-ui<" in dom  # the parent run's row (the stage run is nested under it)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # orchestry ui stops its server's process group
        proc.wait(timeout=60)
    assert proc.returncode == 0, log_path.read_text()[-3000:]
