"""Sweeps through DVC's experiment queue, tracked in MLflow as one parent run per pipeline execution.

A temporary git + DVC repository with a toy two-stage pipeline (``train`` -> ``plot``) whose stages are small
python scripts using :func:`orchestry.tracking.runs.stage_run`; ``train`` keeps resumable state outside DVC the way
``stages/train_magrpo.py`` does (``<repo_root()>/.orchestry/checkpoints/<key>``, deleted on success). Real DVC
(``dvc exp run --queue`` / ``--run-all`` starts a celery worker) and a real sqlite MLflow store at the repo root.
"""

import json
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from orchestry.smoke import clean_env

TRAIN = """
import hashlib, json, os, pathlib, shutil, yaml
from orchestry.tracking.runs import stage_run
from orchestry.paths import repo_root

params = yaml.safe_load(open("params.yaml"))
with open(repo_root() / "train_executions.log", "a") as f:  # the real repository: proves the script ran
    f.write(os.environ.get("DVC_EXP_NAME", "workspace") + "\\n")
key = hashlib.sha256(json.dumps(params["train"], sort_keys=True).encode()).hexdigest()[:16]
ckpt = repo_root() / ".orchestry" / "checkpoints" / key
STATE_OUT
with stage_run("train", params["train"], "sweep"):
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "state.json").write_text(json.dumps({"step": 1}))
    pathlib.Path("model.txt").write_text(str(params["train"]["x"] * 10))
    score = params["train"]["x"] / 10
    json.dump({"score": score}, open("metrics.json", "w"))
    import mlflow
    mlflow.log_metric("score", score)
shutil.rmtree(ckpt)
"""

PLOT = """
import pathlib, yaml
from orchestry.tracking.runs import stage_run

params = yaml.safe_load(open("params.yaml"))
with stage_run("plot", params["plot"], "sweep"):
    model = pathlib.Path("model.txt").read_text()
    pathlib.Path("plot.txt").write_text(f"model {model} at dpi {params['plot']['dpi']}")
"""

DVC_YAML = """
stages:
  train:
    cmd: python train.py
    deps: [train.py]
    params: [train]
    outs:
      - model.txt
STATE_YAML
    metrics:
      - metrics.json:
          cache: false
  plot:
    cmd: python plot.py
    deps: [plot.py, model.txt]
    params: [plot]
    outs:
      - plot.txt:
          cache: false
"""

# what train_magrpo had before: a resumable state dir as an uncached persistent out, absent from a queued workspace
LEGACY_STATE_YAML = """      - state:
          persist: true
          cache: false"""
LEGACY_STATE_OUT = 'pathlib.Path("state").mkdir(exist_ok=True); pathlib.Path("state/s.txt").write_text("1")'


def sh(cmd: list[str], cwd: Path, env: dict) -> str:
    # output to files, not pipes: `dvc exp run --run-all` leaves its queue worker running for a while, and the
    # worker inherits the command's stdout/stderr, so reading pipes to EOF would wait for the worker to exit
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        res = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True, timeout=300)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert res.returncode == 0, f"{' '.join(cmd)}: {stdout[-3000:]}\n{stderr[-3000:]}"
    return stdout


def make_repo(root: Path, legacy: bool = False) -> tuple[Path, dict]:
    """The toy repository, its baseline reproduced and committed; returns it and the environment to run in."""
    env = clean_env()
    env.update(MLFLOW_ENABLE_ASYNC_LOGGING="false", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t", DVC_NO_ANALYTICS="1")  # fmt: skip
    root.mkdir()
    (root / "train.py").write_text(TRAIN.replace("STATE_OUT", LEGACY_STATE_OUT if legacy else ""))
    (root / "plot.py").write_text(PLOT)
    (root / "dvc.yaml").write_text(
        DVC_YAML.replace("STATE_YAML\n", LEGACY_STATE_YAML + "\n" if legacy else "")
    )
    (root / "params.yaml").write_text("train:\n  x: 0\nplot:\n  dpi: 50\n")
    ignored = "/mlflow.db\n/mlartifacts/\n/.orchestry/\n/train_executions.log\n"
    (root / ".gitignore").write_text(ignored + ("/state/\n" if legacy else ""))  # as /checkpoints/ was
    sh(["git", "init", "-q", "-b", "main"], root, env)
    sh(["dvc", "init", "-q"], root, env)
    sh(["dvc", "repro", "-q"], root, env)
    sh(["git", "add", "-A"], root, env)
    sh(["git", "commit", "-qm", "baseline"], root, env)
    return root, env


def train_executions(repo: Path) -> list[str]:
    return (repo / "train_executions.log").read_text().split()


def runs(repo: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweep")
    return client.search_runs([exp.experiment_id], max_results=1000)


def queue_and_run(repo: Path, env: dict, *sets: list[str]) -> None:
    for s in sets:
        sh(["dvc", "exp", "run", "--queue", *s], repo, env)
    sh(["dvc", "exp", "run", "--run-all", "-j", "2"], repo, env)
    sh(["dvc", "queue", "stop"], repo, env)  # the run is over: no queue worker outlives the test (one did)


def exp_show(repo: Path, env: dict) -> dict[str, dict]:
    """``dvc exp show --json``: experiment name -> its ``data`` (params, metrics)."""
    out = json.loads(sh(["dvc", "exp", "show", "--json"], repo, env))
    exps = {}
    for baseline in out:
        for exp in baseline.get("experiments") or []:
            for rev in exp["revs"]:
                exps[rev["name"]] = rev["data"]
    return exps


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("sweep") / "repo")


def test_a_queued_sweep_lands_as_comparable_experiments_in_dvc_and_mlflow(repo):
    root, env = repo
    queue_and_run(root, env, ["-S", "train.x=1"], ["-S", "train.x=2"])
    shown = exp_show(root, env)
    by_x = {d["params"]["params.yaml"]["data"]["train"]["x"]: (name, d) for name, d in shown.items()}
    assert set(by_x) == {1, 2}, shown
    for x, (_, data) in by_x.items():
        assert data["metrics"]["metrics.json"]["data"]["score"] == x / 10
    all_runs = runs(root)
    parents = {r.info.run_id: r for r in all_runs if "mlflow.parentRunId" not in r.data.tags}
    children = [r for r in all_runs if "mlflow.parentRunId" in r.data.tags]
    assert all(c.data.tags["mlflow.parentRunId"] in parents for c in children)
    for x, (name, _) in by_x.items():
        mine = [p for p in parents.values() if p.data.tags.get("dvc_experiment") == name]
        assert len(mine) == 1, f"{name}: {len(mine)} parent runs"
        parent = mine[0]
        tags = parent.data.tags
        assert len(tags["git_revision"]) == 40 and len(tags["params_hash"]) == 64
        assert parent.data.params["train.x"] == str(x) and parent.data.params["plot.dpi"] == "50"
        assert parent.info.status == "FINISHED"
        stages = {
            c.data.tags["stage"]: c
            for c in children
            if c.data.tags["mlflow.parentRunId"] == parent.info.run_id
        }
        assert set(stages) == {"train", "plot"}
        assert stages["train"].data.metrics["score"] == x / 10
        for child in stages.values():
            assert child.info.status == "FINISHED"
            assert {k: child.data.tags[k] for k in ("dvc_experiment", "git_revision", "params_hash")} == {
                k: tags[k] for k in ("dvc_experiment", "git_revision", "params_hash")
            }
    hashes = {p.data.tags["params_hash"] for p in parents.values() if p.data.tags.get("dvc_experiment")}
    assert len(hashes) == 2
    assert not list((root / ".orchestry" / "checkpoints").iterdir())  # deleted after each successful run


def test_a_queued_plot_only_change_runs_only_plot(repo):
    root, env = repo
    before = train_executions(root)
    queue_and_run(root, env, ["-S", "plot.dpi=60"])
    assert train_executions(root) == before, "the train stage ran for a plot-only change"
    name = next(
        n for n, d in exp_show(root, env).items() if d["params"]["params.yaml"]["data"]["plot"]["dpi"] == 60
    )
    mine = [r for r in runs(root) if r.data.tags.get("dvc_experiment") == name]
    assert sorted(r.data.tags.get("stage", "<parent>") for r in mine) == ["<parent>", "plot"]


def test_an_uncached_persistent_out_made_a_plot_only_change_retrain(tmp_path):
    """The check above is sensitive: with train's state as a ``persist: true, cache: false`` out (train_magrpo's
    ``checkpoints/magrpo`` before), the queued workspace lacks it and DVC re-runs ``train``."""
    root, env = make_repo(tmp_path / "legacy", legacy=True)
    before = train_executions(root)
    queue_and_run(root, env, ["-S", "plot.dpi=60"])
    assert len(train_executions(root)) == len(before) + 1


def test_two_stage_runs_of_one_pipeline_execution_share_one_parent(tmp_path, monkeypatch):
    import mlflow

    from orchestry.tracking.runs import stage_run

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.setenv("DVC_EXP_NAME", "exp-one")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.5")  # the stage default is 10 s
    (tmp_path / "params.yaml").write_text("a:\n  b: 1\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ids = []
    for stage in ("first", "second"):
        with stage_run(stage, {"b": 1}, "t", uri=uri) as run:
            ids.append(run.info.run_id)
            time.sleep(1.5 if stage == "first" else 0)
    (tmp_path / "params.yaml").write_text("a:\n  b: 2\n")  # another params hash: another execution
    with stage_run("first", {"b": 2}, "t", uri=uri) as run:
        ids.append(run.info.run_id)
    client = mlflow.MlflowClient(uri)
    first, second, other = (client.get_run(i).data.tags["mlflow.parentRunId"] for i in ids)
    assert first == second != other
    parent = client.get_run(first)
    assert parent.data.tags["dvc_experiment"] == "exp-one" and parent.data.params == {"a.b": "1"}
    assert parent.info.status == "FINISHED" and client.get_run(other).data.params == {"a.b": "2"}
    assert client.get_run(ids[0]).data.tags["stage"] == "first"
    assert any(k.startswith("system/cpu") for k in client.get_run(ids[0]).data.metrics)  # system metrics on
