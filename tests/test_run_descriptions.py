"""Each stage run's MLflow description (``mlflow.note.content``): what the stage did and its headline figures; the
parent run's: the params the execution changed against its commit (a real git repository and sqlite store)."""

from __future__ import annotations

import subprocess

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from orchestry.tracking.descriptions import NOTE_TAG, params_diff
from orchestry.tracking.runs import stage_run


def _git(root, *args) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository whose committed params.yaml has seed 0; the workspace's says seed 3 (as `dvc exp run -S`)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    for env in ("DVC_EXP_NAME", "DVC_EXP_BASELINE_REV", "ORCHESTRY_TUNE_STUDY", "ORCHESTRY_TUNE_TRIAL",
                "MLFLOW_TRACKING_URI"):  # fmt: skip
        monkeypatch.delenv(env, raising=False)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@t")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "params.yaml").write_text("train_magrpo:\n  seed: 0\n  learning_rate: 0.0001\n")
    _git(tmp_path, "add", "params.yaml")
    _git(tmp_path, "commit", "-qm", "params")
    (tmp_path / "params.yaml").write_text("train_magrpo:\n  seed: 3\n  learning_rate: 0.0001\n")
    yield tmp_path
    mlflow.set_tracking_uri(None)


def test_params_diff_names_what_changed(repo) -> None:
    assert params_diff(repo) == {"train_magrpo.seed": (0, 3)}
    (repo / "params.yaml").write_text("train_magrpo:\n  seed: 0\n  learning_rate: 0.0001\n")
    assert params_diff(repo) == {}
    assert params_diff(repo, ref="no-such-ref") == {}


def test_stage_and_parent_runs_get_descriptions(repo) -> None:
    with stage_run("evaluate", {"evaluate": {"seed": 1}}) as run:
        mlflow.log_metric("test/magrpo/pass_at_1", 0.4375)
        mlflow.log_metric("test/base/pass_at_1", 0.109375)
        run_id = run.info.run_id
    client = MlflowClient()
    r = client.get_run(run_id)
    note = r.data.tags[NOTE_TAG]
    assert note.startswith("**evaluate**: the trained pair")
    assert "`test/magrpo/pass_at_1` 0.438, `test/base/pass_at_1` 0.109" in note
    assert str(repo / "reports" / "index.html") in note
    parent = client.get_run(r.data.tags["mlflow.parentRunId"]).data.tags[NOTE_TAG]
    assert parent.startswith("**dvc repro**") and "`train_magrpo.seed` 0 → 3" in parent


def test_a_failed_stage_gets_no_description(repo) -> None:
    with pytest.raises(RuntimeError), stage_run("plot", {}) as run:
        run_id = run.info.run_id
        raise RuntimeError("boom")
    assert NOTE_TAG not in MlflowClient().get_run(run_id).data.tags
