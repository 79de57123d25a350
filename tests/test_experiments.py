"""Seeds aggregated from real DVC experiments (a temporary repository with a one-line stage)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from orchestry.cli import app
from orchestry.reporting.experiments import collect, parse_exp_show, seed_table

DVC = shutil.which("dvc") or str(Path(sys.executable).with_name("dvc"))

STAGE = (
    "import yaml, json; s = yaml.safe_load(open('params.yaml'))['train_magrpo']['seed']; "
    "json.dump({'methods': {'magrpo': {'reward': 1 + s / 10}, 'base': {'reward': 0.5}}}, open('m.json', 'w')); "
    "json.dump({'diff': s / 100, 'text': 'no metric'}, open('o.json', 'w'))"
)  # o.json: a summary that is a plain output (like reports/metrics.json), not a DVC metric


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    d = tmp_path_factory.mktemp("exps")

    def run(*cmd):
        subprocess.run(cmd, cwd=d, check=True, capture_output=True, text=True)

    run("git", "init", "-q")
    run("git", "config", "user.email", "t@example.com")
    run("git", "config", "user.name", "t")
    run(DVC, "init", "-q")
    (d / "params.yaml").write_text("train_magrpo:\n  seed: 0\n")
    (d / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: " + json.dumps(f'{sys.executable} -c "{STAGE}"') + "\n"
        "    params: [train_magrpo.seed]\n    metrics: [m.json: {cache: false}]\n    outs: [o.json: {cache: false}]\n"
    )
    run("git", "add", "-A")
    run("git", "commit", "-qm", "init")
    for s in (1, 2, 3):
        run(DVC, "exp", "run", "-q", "-S", f"train_magrpo.seed={s}")
    return d


def test_seed_table_from_real_experiments(repo):
    df = collect(repo, DVC)
    key = "metric:m.json:methods.magrpo.reward - metric:m.json:methods.base.reward"
    per_seed, summary = seed_table(df, "param:params.yaml:train_magrpo.seed", [key], resamples=2000)
    assert list(per_seed.index) == [1, 2, 3]
    assert per_seed[key].round(6).tolist() == [0.6, 0.7, 0.8]
    row = summary.loc[key]
    assert row["n_seeds"] == 3 and row["mean"] == pytest.approx(0.7)
    assert 0.6 - 1e-9 <= row["ci_low"] < 0.7 < row["ci_high"] <= 0.8 + 1e-9
    assert bool(row["excludes_zero"])
    with pytest.raises(KeyError, match="no metric column"):
        seed_table(df, "param:params.yaml:train_magrpo.seed", ["metric:m.json:nope"])


def test_summaries_that_are_plain_outputs_are_read_from_each_experiments_commit(repo):
    """Only reports/key_metrics.json is a DVC metric (dvc exp show stays readable): `orchestry seeds` reads the
    other summaries (reports/metrics.json, ...) from each experiment's commit."""
    df = collect(repo, DVC, outputs=["o.json"])
    assert "metric:o.json:diff" not in parse_exp_show(json.loads(_exp_show_json(repo)))  # not a DVC metric
    per_seed, _ = seed_table(df, "param:params.yaml:train_magrpo.seed", ["metric:o.json:diff"], resamples=100)
    assert per_seed["metric:o.json:diff"].round(6).tolist() == [0.01, 0.02, 0.03]
    assert set(df["metric:o.json:text"].dropna()) == {"no metric"}


def _exp_show_json(repo) -> str:
    return subprocess.run([DVC, "exp", "show", "--json", "--all-commits"], cwd=repo, check=True,
                          capture_output=True, text=True).stdout  # fmt: skip


def test_cli_seeds_prints_the_table_and_fails_in_one_line(repo):
    r = CliRunner().invoke(
        app,
        [
            "seeds",
            "--repo",
            str(repo),
            "--metric",
            "m.json:methods.magrpo.reward - m.json:methods.base.reward",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "0.700" in r.output and "yes" in r.output
    bad = CliRunner().invoke(app, ["seeds", "--repo", str(repo), "--metric", "m.json:missing"])
    assert bad.exit_code == 2 and "no metric column" in bad.output


def test_committed_presets_apply_cleanly_to_params():
    """Every committed preset names real keys with valid values (else `dvc exp run -S` would fail late)."""
    from orchestry.reporting.experiments import preset_overrides

    presets = sorted(Path("configs/experiments").glob("*.yaml"))
    assert presets, "no experiment presets committed"
    for p in presets:
        overrides = preset_overrides(p)
        assert overrides and all("=" in o for o in overrides)
    assert "sampling.max_completion_length=192" in preset_overrides("configs/experiments/long.yaml")


def test_preset_with_a_misspelt_key_or_bad_value_fails_before_queueing(tmp_path):
    from orchestry.params_file import ParamsError
    from orchestry.reporting.experiments import preset_overrides

    bad_key = tmp_path / "k.yaml"
    bad_key.write_text("train_magrpo.num_stepz: 3\n")
    with pytest.raises(ParamsError, match="num_stepz"):
        preset_overrides(bad_key)
    bad_value = tmp_path / "v.yaml"
    bad_value.write_text("train_magrpo.num_steps: -3\n")
    with pytest.raises(ParamsError, match="num_steps"):
        preset_overrides(bad_value)
    lists = tmp_path / "l.yaml"
    lists.write_text("baselines.methods: [single, concat]\n")
    assert preset_overrides(lists) == ["baselines.methods=[single, concat]"]


def test_seed_table_ignores_old_commits_without_the_metrics():
    """An old commit with the same seed but no metrics must not hide the workspace's values for that seed."""
    seed, m = "param:params.yaml:train_magrpo.seed", "metric:m.json:r"
    df = pd.DataFrame(
        [
            {"name": "workspace", seed: 0, m: 0.5},
            {"name": "HEAD", seed: 0, m: 0.5},
            {"name": "seed1", seed: 1, m: 0.7},
            {"name": "old", seed: 0, m: None},
            {"name": "older", seed: 2},
        ]
    )
    per_seed, summary = seed_table(df, seed, [m], resamples=200)
    assert per_seed[m].to_dict() == {0: 0.5, 1: 0.7}
    assert summary.loc[m, "n_seeds"] == 2


def test_seed_table_keeps_swept_variants_out_of_the_defaults_seeds():
    seed, ev, turns, weights = (
        f"param:params.yaml:{k}"
        for k in ("train_magrpo.seed", "evaluate.seed", "train_magrpo.turns", "train_magrpo.turn_weights")
    )
    m = "metric:m.json:r"
    df = pd.DataFrame(
        [
            {"name": "workspace", seed: 0, ev: 1, turns: 1, weights: [1.0, 0.5], m: 0.5},
            {"name": "turns2", seed: 0, ev: 1, turns: 2, weights: [1.0, 0.5], m: 0.9},
            {"name": "turns2_s1", seed: 1, ev: 2, turns: 2, weights: [1.0, 0.5], m: 0.9},
            {"name": "default_s1", seed: 1, ev: 2, turns: 1, weights: [1.0, 0.5], m: 0.6},
            {"name": "default_s2", seed: 2, ev: 3, turns: 1, weights: [1.0, 0.5], m: 0.7},
            {"name": "other_w", seed: 3, ev: 4, turns: 1, weights: [1.0, 1.0], m: 0.1},
        ]
    )
    per_seed, summary = seed_table(df, seed, [m], resamples=200)
    assert per_seed[m].to_dict() == {0: 0.5, 1: 0.6, 2: 0.7}
    assert per_seed.attrs["left_out"] == ["turns2", "turns2_s1", "other_w"]
    # like=: the seeds of a variant
    variant, _ = seed_table(df, seed, [m], resamples=200, like="turns2")
    assert variant[m].to_dict() == {0: 0.9, 1: 0.9}
    assert "workspace" in variant.attrs["left_out"] and "default_s2" in variant.attrs["left_out"]
    with pytest.raises(KeyError, match="no experiment named 'nope'"):
        seed_table(df, seed, [m], like="nope")
    # the evaluation seed is not allowed to differ when vary is empty: only seed 0 is left
    assert seed_table(df, seed, [m], resamples=200, vary=())[0][m].to_dict() == {0: 0.5}
    # vary=None: no check, the first row per seed wins (turns2_s1 hides default_s1)
    assert seed_table(df, seed, [m], resamples=200, vary=None)[0][m].to_dict() == {
        0: 0.5,
        1: 0.9,
        2: 0.7,
        3: 0.1,
    }


def test_running_and_failed_experiments_do_not_count():
    """While an experiment runs, `dvc exp show` lists it with its baseline's (stale) metrics: skip it."""
    from orchestry.reporting.experiments import parse_exp_show

    def rev(name, seed, r):
        return {"rev": name, "name": name, "data": {
            "params": {"params.yaml": {"data": {"train_magrpo": {"seed": seed}}}},
            "metrics": {"m.json": {"data": {"r": r}}}}}  # fmt: skip

    payload = [
        rev("workspace", 0, 0.5),
        {**rev("main", 0, 0.5), "experiments": [
            {"executor": {"state": "running"}, "name": "s1", "revs": [rev("s1", 1, 0.5)]},
            {"executor": {"state": "failed"}, "name": "s2", "revs": [rev("s2", 2, 0.1)]},
            {"executor": {"state": "success"}, "name": "s3", "revs": [rev("s3", 3, 0.8)]},
            {"executor": None, "name": "s4", "revs": [rev("s4", 4, 0.9)]},
        ]},
    ]  # fmt: skip
    df = parse_exp_show(payload)
    assert df["name"].tolist() == ["workspace", "main", "s3", "s4"]
    per_seed, _ = seed_table(df, "param:params.yaml:train_magrpo.seed", ["metric:m.json:r"], resamples=100)
    assert per_seed["metric:m.json:r"].to_dict() == {0: 0.5, 3: 0.8, 4: 0.9}
