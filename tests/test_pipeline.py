"""`dvc repro` of the real pipeline in a temporary copy with micro params: every stage's outputs and MLflow runs.

Uses the real embedded model, the real sandbox, real DVC and a real sqlite MLflow store (a few minutes).
"""

import json
import sys
from pathlib import Path

import pytest

from orchestry.smoke import SmokeError, clean_env, make_micro_repo, run, run_repro

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_dvc_repro_micro_pipeline(tmp_path):
    env = clean_env()
    repo = make_micro_repo(
        ROOT, tmp_path / "repo", env
    )  # what `orchestry smoke` runs: micro params, own git + DVC

    run_repro(repo, env)

    for out in [
        "data/problems/train.jsonl",
        "data/problems/test.jsonl",
        "models/base/model.safetensors",
        "reports/prepare.json",
        "reports/baselines/single.jsonl",
        "reports/baselines/discussion.json",
        "reports/baselines.json",
        "models/adapters/magrpo/helper/adapter_config.json",
        "models/adapters/magrpo/main/adapter_model.safetensors",
        "reports/index.html",
        "reports/train/magrpo_steps.csv",
        "reports/eval/magrpo.jsonl",
        "reports/metrics.json",
        "reports/key_metrics.json",
        "reports/schemes.json",
        "reports/figures/learning_curves.png",
        "reports/figures/methods.png",
        "reports/figures/schemes.png",
        "reports/figures/api_grpo.png",
        "reports/api_grpo/episodes.jsonl",
        "reports/api_grpo/learned_behaviors.json",
        "reports/orchestrator/summary.json",
        "models/orchestrator/policy.pt",
        "reports/figures/orchestrator_pareto.png",
    ]:
        assert (repo / out).exists(), f"missing output {out}"
    prep = json.loads((repo / "reports/prepare.json").read_text())
    # generated problems (48 train, 8 val, 32 test) + HumanEval's test split (31) as the transfer set
    # train: 48 compositional + 48 beginner; transfer: HumanEval's 31 test problems + three external sets of 40
    assert prep["canonical_passed"] == prep["canonical_checked"] == 96 + 8 + 32 + 31 + 3 * 40
    assert prep["transfer_sizes"] == {"humaneval": 31, "easy40": 40, "mbpp_easy": 40, "others_a": 40}
    metrics = json.loads((repo / "reports/metrics.json").read_text())
    assert {"base", "magrpo", "baseline_single", "baseline_concat"} <= set(metrics["methods"])
    assert metrics["methods"]["magrpo"]["n_samples"] == 4  # 2 problems x 2 samples
    assert 0.0 <= metrics["methods"]["magrpo"]["reward"] <= 4.0
    transfer = metrics["transfer"]["humaneval"]
    assert (
        transfer["problems"] == 1 and transfer["methods"]["magrpo"]["n_samples"] == 2
    )  # 1 problem x 2 samples
    assert (repo / "reports/eval/transfer/humaneval_base.jsonl").exists()
    # evaluate_base's samples of the base pair, copied by evaluate
    copies = {"test": "base", "transfer/humaneval": "transfer/humaneval_base"}
    for name, copy in copies.items():
        base = (repo / "reports/eval_base" / f"{name}.jsonl").read_bytes()
        assert base == (repo / "reports/eval" / f"{copy}.jsonl").read_bytes(), name
    assert {"with", "without"} <= set(metrics["api_grpo"]["eval"])
    schemes = json.loads((repo / "reports/schemes.json").read_text())
    assert abs(sum(schemes["distribution"]["magrpo"].values()) - 1.0) < 1e-6

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("orchestry")
    runs = client.search_runs([exp.experiment_id])
    stages = {r.data.tags["stage"]: r for r in runs if r.data.tags.get("stage")}
    parents = [r for r in runs if not r.data.tags.get("stage")]  # one parent run for this one `dvc repro`
    assert len(parents) == 1, [r.info.run_name for r in parents]
    assert {r.data.tags.get("mlflow.parentRunId") for r in stages.values()} == {parents[0].info.run_id}
    expected = {"prepare", "baselines", "train_magrpo", "train_api_grpo", "evaluate_base", "evaluate",
                "detect_schemes", "plot"}  # fmt: skip
    assert expected <= set(stages), f"MLflow runs: {sorted(stages)}"
    for r in stages.values():
        assert r.info.status == "FINISHED"
        assert "cost/wall_seconds" in r.data.metrics
        assert r.data.tags.get("git_revision") not in (None, "unknown")
    train = stages["train_magrpo"]
    history = client.get_metric_history(train.info.run_id, "train/reward")
    assert sorted(m.step for m in history) == [0, 1]
    assert "test/magrpo/pass_at_2" in stages["evaluate"].data.metrics
    artifacts = {a.path for a in client.list_artifacts(train.info.run_id, "adapters")}
    assert artifacts == {"adapters/helper", "adapters/main"}

    # nothing changed: every stage is skipped
    rerun = run_repro(repo, env)
    assert "Running stage" not in rerun, rerun
    status = run([sys.executable, "-m", "dvc", "status"], repo, env)
    assert "up to date" in status.lower(), status

    # a plot-only DVC experiment runs plot alone; its parent run links the runs that made every other stage's
    # outputs (tags cached_run.<stage>), so `orchestry compare` shows the whole execution (issue 26)
    from orchestry.reporting.compare import DEFAULT_METRICS, executions, load_runs
    from orchestry.tracking.stage_cache import OUTPUTS_TAG, cached_run_tag

    assert all(OUTPUTS_TAG in r.data.tags for r in stages.values())
    run([sys.executable, "-m", "dvc", "exp", "run", "-n", "dpi61", "-S", "plot.dpi=61"], repo, env)
    runs = client.search_runs([exp.experiment_id], filter_string="tags.dvc_experiment = 'dpi61'")
    assert sorted(r.data.tags.get("stage", "<parent>") for r in runs) == ["<parent>", "plot"]
    parent = next(r for r in runs if "stage" not in r.data.tags)
    linked = {s: parent.data.tags.get(cached_run_tag(s)) for s in stages if s != "plot"}
    assert linked == {s: r.info.run_id for s, r in stages.items() if s != "plot"}
    table = executions(load_runs("orchestry", f"sqlite:///{repo / 'mlflow.db'}")).set_index("execution")
    first, dpi = table.loc["workspace"], table.loc["dpi61"]
    assert (dpi["stages"], dpi["cached"]) == (1, len(stages) - 1)
    assert dpi["evaluate:test/magrpo/reward"] == stages["evaluate"].data.metrics["test/magrpo/reward"]
    for m in DEFAULT_METRICS:  # the same figures as the execution that ran every stage
        assert dpi[m] == first[m] or (dpi[m] != dpi[m] and first[m] != first[m]), m

    # a training-only DVC experiment (another training seed: other adapters) samples the trained pair again, not
    # the base pair: evaluate_base's outputs come from the cache
    run([sys.executable, "-m", "dvc", "exp", "run", "-n", "seed1", "-S", "train_magrpo.seed=1"], repo, env)
    runs = client.search_runs([exp.experiment_id], filter_string="tags.dvc_experiment = 'seed1'")
    ran = sorted(r.data.tags.get("stage", "<parent>") for r in runs)
    assert ran == ["<parent>", "detect_schemes", "evaluate", "plot", "train_magrpo"], ran

    # the peers' estimators are DVC experiments of the training stage: each runs with its value (the train_magrpo run
    # of the experiment logs it and finishes), ReMax's greedy rollouts are counted, the critics log their value fit
    # (a misspelt estimator: the end of this test)
    estimators = [("rloo", {}, None), ("reinforce", {}, None), ("agent_turn", {}, None),
                  ("remax", {}, "remax/greedy_reward"), ("critic", {}, "critic/value_loss_after"),
                  ("critic", {"critic": "per_agent"}, "critic/value_loss_after")]  # fmt: skip
    for i, (advantage, more, column) in enumerate(estimators):
        sets = {"advantage": advantage, **more}
        cmd = [sys.executable, "-m", "dvc", "exp", "run", "train_magrpo", "-n", f"est{i}"]
        run(cmd + [arg for k, v in sets.items() for arg in ("-S", f"train_magrpo.{k}={v}")], repo, env)
        (trained,) = client.search_runs([exp.experiment_id], filter_string=f"tags.dvc_experiment = 'est{i}'"
                                        " and tags.stage = 'train_magrpo'")  # fmt: skip
        assert trained.info.status == "FINISHED"
        assert {k: trained.data.params[k] for k in sets} == sets, trained.data.params
        steps = (repo / "reports/train/magrpo_steps.csv").read_text().splitlines()  # the experiment's outputs
        assert column is None or column in steps[0].split(","), steps[0]
        summary = json.loads((repo / "reports/train/magrpo.json").read_text())
        assert (summary.get("greedy_prompt_tokens", 0) > 0) == (advantage == "remax"), summary
    # evaluate run by hand after a change to what evaluate_base reads (its code): refused, before any model loads
    script = repo / "stages/evaluate_base.py"
    script.write_text(script.read_text() + "# changed\n")
    with pytest.raises(SmokeError) as stale:
        run([sys.executable, "stages/evaluate.py"], repo, env)
    assert "samples made from other code, data or base model" in stale.value.output

    # a misspelt estimator: the training stage fails naming the key (last: it leaves the value in params.yaml)
    with pytest.raises(SmokeError) as misspelt:
        run(
            [sys.executable, "-m", "dvc", "exp", "run", "train_magrpo", "-S", "train_magrpo.advantage=remx"],
            repo,
            env,
        )
    assert "advantage" in misspelt.value.output and "'remax'" in misspelt.value.output, misspelt.value.output
