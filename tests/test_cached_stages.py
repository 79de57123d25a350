"""A pipeline execution whose stages DVC did not run still lands complete in MLflow and ``orchestry compare``.

A temporary git + DVC repository with a toy pipeline: a matrix stage ``train`` (``train@a``, ``train@b``: stage
names with ``@``, as ``baselines@<method>``) whose runs log a metric and write an uncached metrics file, and
``plot``, which depends on both. Real DVC (``dvc repro``, ``dvc exp run`` in the workspace, DVC's run cache) and a
real sqlite MLflow store at the repository root; each stage is a python script using
:func:`orchestry.tracking.runs.stage_run`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import mlflow
import pytest

from orchestry.reporting.compare import executions, load_runs
from orchestry.smoke import clean_env
from orchestry.tracking.stage_cache import OUTPUTS_TAG, cached_run_tag, outputs_digest

TRAIN = """
import json, pathlib, sys, yaml
import mlflow
from orchestry.tracking.runs import stage_run
from orchestry.paths import repo_root

m = sys.argv[1]
params = yaml.safe_load(open("params.yaml"))
with open(repo_root() / "train_executions.log", "a") as f:  # proves the script ran
    f.write(m + "\\n")
with stage_run(f"train@{m}", params["train"], "cached"):
    score = params["train"]["x"] / 10 + (m == "b")
    pathlib.Path(f"score_{m}.json").write_text(json.dumps({"score": score}))
    mlflow.log_metric("score", score)
"""

PLOT = """
import pathlib, yaml
from orchestry.tracking.runs import stage_run

params = yaml.safe_load(open("params.yaml"))
with stage_run("plot", params["plot"], "cached"):
    text = pathlib.Path("score_a.json").read_text() + pathlib.Path("score_b.json").read_text()
    pathlib.Path("plot.txt").write_text(f"{text} at dpi {params['plot']['dpi']}")
"""

DVC_YAML = """
stages:
  train:
    matrix:
      m: [a, b]
    cmd: python train.py ${item.m}
    deps: [train.py]
    params: [train]
    metrics:
      - score_${item.m}.json:
          cache: false
  plot:
    cmd: python plot.py
    deps: [plot.py, score_a.json, score_b.json]
    params: [plot]
    outs:
      - plot.txt:
          cache: false
"""


def sh(cmd: list[str], cwd: Path, env: dict) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{' '.join(cmd)}: {res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """The toy repository, its baseline reproduced (a plain ``dvc repro``) and committed."""
    root = tmp_path_factory.mktemp("cached") / "repo"
    env = clean_env()
    env.update(MLFLOW_ENABLE_ASYNC_LOGGING="false", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t", DVC_NO_ANALYTICS="1")  # fmt: skip
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    (root / "plot.py").write_text(PLOT)
    (root / "dvc.yaml").write_text(DVC_YAML)
    (root / "params.yaml").write_text("train:\n  x: 0\nplot:\n  dpi: 50\n")
    (root / ".gitignore").write_text("/mlflow.db\n/mlartifacts/\n/.orchestry/\n/train_executions.log\n")
    sh(["git", "init", "-q", "-b", "main"], root, env)
    sh(["dvc", "init", "-q"], root, env)
    sh(["dvc", "repro", "-q"], root, env)
    sh(["git", "add", "-A"], root, env)
    sh(["git", "commit", "-qm", "baseline"], root, env)
    return root, env


def _store(root: Path) -> str:
    return f"sqlite:///{root / 'mlflow.db'}"


def _runs(root: Path):
    client = mlflow.MlflowClient(_store(root))
    exp = client.get_experiment_by_name("cached")
    return client.search_runs([exp.experiment_id], max_results=1000)


def _table(root: Path):
    metrics = ["train@a:score", "train@b:score", "score"]
    return executions(load_runs("cached", _store(root)), metrics).set_index("execution")


def _baseline_train_runs(root: Path) -> dict[str, str]:
    return {
        r.data.tags["stage"]: r.info.run_id
        for r in _runs(root)
        if r.data.tags.get("stage", "").startswith("train@") and "dvc_experiment" not in r.data.tags
    }


def test_the_baseline_runs_every_stage_and_tags_its_outputs(repo):
    root, _ = repo
    runs = [r for r in _runs(root) if "dvc_experiment" not in r.data.tags]
    stages = {r.data.tags.get("stage", "<parent>"): r for r in runs}
    assert sorted(stages) == ["<parent>", "plot", "train@a", "train@b"]
    assert stages["train@a"].data.tags[OUTPUTS_TAG] == outputs_digest(["score_a.json"], root)
    assert stages["plot"].data.tags[OUTPUTS_TAG] == outputs_digest(["plot.txt"], root)
    assert not any(k.startswith("cached_run.") for k in stages["<parent>"].data.tags)  # every stage ran
    ws = _table(root).loc["workspace"]
    assert (ws["stages"], ws["cached"]) == (3, 0)
    assert (ws["train@a:score"], ws["train@b:score"]) == (0.0, 1.0)


def test_a_plot_only_experiment_links_the_cached_stages_and_compare_shows_their_metrics(repo):
    root, env = repo
    before = (root / "train_executions.log").read_text()
    sh(["dvc", "exp", "run", "-q", "-n", "dpi60", "-S", "plot.dpi=60"], root, env)
    assert (root / "train_executions.log").read_text() == before, "train ran for a plot-only change"
    mine = [r for r in _runs(root) if r.data.tags.get("dvc_experiment") == "dpi60"]
    assert sorted(r.data.tags.get("stage", "<parent>") for r in mine) == ["<parent>", "plot"]
    parent = next(r for r in mine if "stage" not in r.data.tags)
    baseline = _baseline_train_runs(root)
    for stage in ("train@a", "train@b"):
        assert parent.data.tags[cached_run_tag(stage)] == baseline[stage]
    assert cached_run_tag("train@a") == "cached_run.train_at_a"
    row = _table(root).loc["dpi60"]
    assert (row["stages"], row["cached"], row["status"]) == (1, 2, "FINISHED")
    assert (row["train@a:score"], row["train@b:score"], row["score"]) == (0.0, 1.0, 1.0)


def test_a_stage_restored_from_the_run_cache_links_the_run_that_made_its_outputs(repo):
    root, env = repo
    sh(["dvc", "exp", "run", "-q", "-n", "x2", "-S", "train.x=2"], root, env)  # train runs: new outputs
    row = _table(root).loc["x2"]
    assert (row["stages"], row["cached"]) == (3, 0)
    assert (row["train@a:score"], row["train@b:score"]) == (0.2, 1.2)
    ran = (root / "train_executions.log").read_text()
    # back to x=0 (the workspace holds x=2's outputs): DVC restores train's outputs from its run cache
    sh(["dvc", "exp", "run", "-q", "-n", "back", "-S", "train.x=0", "-S", "plot.dpi=70"], root, env)
    assert (root / "train_executions.log").read_text() == ran, "train ran although its run cache had x=0"
    parent = next(
        r for r in _runs(root) if r.data.tags.get("dvc_experiment") == "back" and "stage" not in r.data.tags
    )
    baseline = _baseline_train_runs(root)
    assert {s: parent.data.tags.get(cached_run_tag(s)) for s in baseline} == baseline
    row = _table(root).loc["back"]
    assert (row["stages"], row["cached"]) == (1, 2)
    assert (row["train@a:score"], row["train@b:score"]) == (0.0, 1.0)


GRAPH_YAML = """
stages:
  train:
    matrix:
      m: ${methods}
    cmd: python train.py ${item.m}
    outs:
      - score_${item.m}.json:
          cache: false
  plot:
    cmd: python plot.py
    deps: [score_a.json]
    outs: [plot.txt]
"""


FOREACH_YAML = """
stages:
  train:
    foreach: [a, b]
    do:
      vars:
        - params.yaml
      cmd: python train.py ${item}
      outs:
        - score_${item}.json:
            cache: false
"""


def test_the_stage_graph_is_kept_under_the_bytes_of_dvc_yaml_and_params(tmp_path, monkeypatch):
    """dvc_stages answers from .orchestry/dvc_stages.json while dvc.yaml and params.yaml are unchanged (the file is
    what it returns: edited by hand, the edit comes back) and asks DVC again when either changes, when the file is
    unreadable or asked from another directory, and never keeps one when dvc.yaml names vars (files the key does
    not cover)."""
    from orchestry.tracking.stage_cache import _read_dvc_stages, dvc_stages

    subprocess.run(["dvc", "init", "-q", "--no-scm"], cwd=tmp_path, check=True, env=clean_env())
    monkeypatch.chdir(tmp_path)  # as in a stage: DVC names stages relative to the working directory
    (tmp_path / "dvc.yaml").write_text(GRAPH_YAML)
    (tmp_path / "params.yaml").write_text("methods: [a, b]\n")
    cache = tmp_path / ".orchestry" / "dvc_stages.json"
    expected = {
        "train@a": (["score_a.json"], set()),
        "train@b": (["score_b.json"], set()),
        "plot": ([], {"train@a"}),
    }
    assert dvc_stages(tmp_path) == expected
    assert cache.is_file()
    (tmp_path / "sub").mkdir()
    # asked from elsewhere: DVC's names then carry the path, and so does the key
    monkeypatch.chdir(tmp_path / "sub")
    assert dvc_stages(tmp_path) == _read_dvc_stages(tmp_path) != expected
    monkeypatch.chdir(tmp_path)
    assert dvc_stages(tmp_path) == expected
    saved = cache.read_text()
    cache.write_text(saved.replace('"score_b.json"', '"edited.json"'))
    assert dvc_stages(tmp_path)["train@b"] == (["edited.json"], set())  # read from the file
    (tmp_path / "params.yaml").write_text("methods: [a, b, c]\n")  # the matrix grows
    assert dvc_stages(tmp_path) == {**expected, "train@c": (["score_c.json"], set())}
    (tmp_path / "dvc.yaml").write_text(GRAPH_YAML.replace("deps: [score_a.json]", "deps: [score_c.json]"))
    assert dvc_stages(tmp_path)["plot"] == ([], {"train@c"})
    cache.write_text("{not json")
    assert dvc_stages(tmp_path)["plot"] == ([], {"train@c"})
    cache.unlink()
    (tmp_path / "dvc.yaml").write_text("vars:\n  - params.yaml\n" + GRAPH_YAML)
    assert dvc_stages(tmp_path)["train@c"] == (["score_c.json"], set())
    assert not cache.exists()
    (tmp_path / "dvc.yaml").write_text(FOREACH_YAML)  # vars inside a foreach's do
    assert dvc_stages(tmp_path) == {
        "train@a": (["score_a.json"], set()),
        "train@b": (["score_b.json"], set()),
    }
    assert not cache.exists()
