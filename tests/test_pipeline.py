"""`dvc repro` of the real pipeline in a temporary copy with micro params: every stage's outputs and MLflow runs.

Uses the real embedded model, the real sandbox, real DVC and a real sqlite MLflow store (a few minutes).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COPY = ["dvc.yaml", "params.yaml", "stages", "src", "pyproject.toml"]

MICRO = {
    "sampling": {"max_completion_length": 24},
    "baselines": {"max_problems": 2, "num_samples": 1},
    "train_magrpo": {"num_steps": 2, "problems_per_step": 1, "num_generations": 2, "max_problems": 2,
                     "checkpoint_every": 1},
    "evaluate": {"max_problems": 2, "num_samples": 2},
    "train_orchestrator": {"num_episodes": 2, "episodes_per_update": 2, "max_problems": 1, "max_problems_eval": 1,
                           "max_tokens": 24, "min_steps": 1, "max_steps": 2},
}  # fmt: skip


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base.get(k, {}), v) if isinstance(v, dict) else v
    return out


def _run(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res


@pytest.mark.slow
def test_dvc_repro_micro_pipeline(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, repo / name)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    micro = _merge(params, MICRO)
    if "api_grpo" in params:
        micro["api_grpo"] = _merge(params["api_grpo"], {"num_episodes": 1, "max_problems_eval": 1})
    (repo / "params.yaml").write_text(yaml.safe_dump(micro, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k not in ("DVC_ROOT", "DVC_EXP_NAME")}
    env.update(HF_HUB_OFFLINE="1", PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    _run(["git", "init", "-q"], repo, env)
    _run([sys.executable, "-m", "dvc", "init", "-q"], repo, env)
    _run([*git, "add", "-A"], repo, env)
    _run([*git, "commit", "-qm", "micro"], repo, env)

    _run([sys.executable, "-m", "dvc", "repro"], repo, env)

    for out in [
        "data/problems/train.jsonl",
        "data/problems/test.jsonl",
        "models/base/model.safetensors",
        "reports/prepare.json",
        "reports/baselines/single.jsonl",
        "reports/baselines/discussion.json",
        "models/adapters/magrpo/helper/adapter_config.json",
        "models/adapters/magrpo/main/adapter_model.safetensors",
        "checkpoints/magrpo/trainer.json",
        "reports/train/magrpo_steps.csv",
        "reports/eval/magrpo.jsonl",
        "reports/metrics.json",
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
    assert prep["canonical_passed"] == prep["canonical_checked"] == 164
    metrics = json.loads((repo / "reports/metrics.json").read_text())
    assert {"base", "magrpo", "baseline_single", "baseline_concat"} <= set(metrics["methods"])
    assert metrics["methods"]["magrpo"]["n_samples"] == 4  # 2 problems x 2 samples
    assert 0.0 <= metrics["methods"]["magrpo"]["reward"] <= 4.0
    assert {"with", "without"} <= set(metrics["api_grpo"]["eval"])
    schemes = json.loads((repo / "reports/schemes.json").read_text())
    assert abs(sum(schemes["distribution"]["magrpo"].values()) - 1.0) < 1e-6

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("orchestry")
    runs = client.search_runs([exp.experiment_id])
    stages = {r.data.tags.get("stage"): r for r in runs}
    expected = {"prepare", "baselines@single", "baselines@concat", "baselines@sequential", "baselines@discussion",
                "train_magrpo", "train_api_grpo", "evaluate", "detect_schemes", "plot"}  # fmt: skip
    assert expected <= set(stages), f"MLflow runs: {sorted(stages)}"
    for r in stages.values():
        assert r.info.status == "FINISHED"
        assert "cost/wall_seconds" in r.data.metrics
        assert r.data.tags.get("git_revision") not in (None, "unknown")
    train = stages["train_magrpo"]
    history = client.get_metric_history(train.info.run_id, "reward")
    assert sorted(m.step for m in history) == [0, 1]
    assert "magrpo/pass_at_2" in stages["evaluate"].data.metrics
    artifacts = {a.path for a in client.list_artifacts(train.info.run_id, "adapters")}
    assert artifacts == {"adapters/helper", "adapters/main"}

    # nothing changed: every stage is skipped
    res = _run([sys.executable, "-m", "dvc", "repro"], repo, env)
    assert "Running stage" not in res.stdout, res.stdout
    status = _run([sys.executable, "-m", "dvc", "status"], repo, env)
    assert "up to date" in status.stdout.lower(), status.stdout
