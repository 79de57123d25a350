"""The whole pipeline with micro params in a temporary copy of the project (``orchestry smoke``, and
``tests/test_pipeline.py``).

:func:`make_micro_repo` copies what ``dvc repro`` needs (:data:`COPY`: ``dvc.yaml``, ``params.yaml``, the stage
scripts, the package source, the human overrides and task data under ``data/``; the working tree as it is, without
``__pycache__``), overrides ``params.yaml`` with
:data:`MICRO` (2 problems, 2 MAGRPO updates, 24-token completions, ...), then makes the copy its own git and DVC
repository with one commit. :func:`run_repro` runs ``dvc repro`` there; the copy's MLflow store is its own
``mlflow.db`` (``DVC_ROOT`` and ``DVC_EXP_NAME`` are removed from the environment), read back by
:func:`stage_seconds`. On the 2-core machine a micro run takes a few minutes (``prepare`` checks HumanEval's 164
canonical solutions and converts the embedded model).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from orchestry.params_file import read_params_mapping

#: Files and folders of the project that ``dvc repro`` needs, relative to its root.
COPY = (
    "dvc.yaml",
    "params.yaml",
    "stages",
    "src",
    "pyproject.toml",
    "data/overrides.jsonl",
    "data/tasks",
    "data/behaviors",
    "data/external",  # prepare.transfer's problem sets written outside the generator
)

#: Micro overrides of ``params.yaml``: every stage runs, on 1-2 problems with short completions.
MICRO: dict[str, dict[str, Any]] = {
    "sampling": {"max_completion_length": 24},
    "baselines": {"max_problems": 2, "num_samples": 1},
    "train_magrpo": {"num_steps": 2, "problems_per_step": 1, "num_generations": 2, "max_problems": 2,
                     "checkpoint_every": 1, "warm_start_epochs": 1},
    "evaluate": {"max_problems": 2, "num_samples": 2, "max_problems_transfer": 1},
    "train_orchestrator": {"num_episodes": 2, "episodes_per_update": 2, "max_problems": 1, "max_problems_eval": 1,
                           "max_tokens": 24, "min_steps": 1, "max_steps": 2},
    "api_grpo": {"num_episodes": 1, "max_problems_eval": 1},
}  # fmt: skip


class SmokeError(RuntimeError):
    """A command in the temporary copy failed: the message is one line (command and exit code), ``output`` holds
    the tail of what it printed (empty when its output went to the terminal)."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


def merge(base: Mapping, over: Mapping) -> dict:
    """``base`` with ``over`` applied recursively (nested mappings are merged, other values replaced)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(base.get(k) or {}, v) if isinstance(v, Mapping) else v
    return out


def micro_params(params: Mapping) -> dict:
    """``params`` (a parsed ``params.yaml``) with :data:`MICRO` applied."""
    return merge(params, MICRO)


def clean_env() -> dict[str, str]:
    """The environment for commands in the copy: no ``DVC_ROOT``/``DVC_EXP_NAME``/``MLFLOW_TRACKING_URI`` (MLflow
    logs to the copy's own store, even where the caller's process set a store, as ``mlflow.set_tracking_uri``
    does through that variable), no model-hub access, and this interpreter's ``bin`` first on ``PATH`` (for
    ``python``)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("DVC_ROOT", "DVC_EXP_NAME", "MLFLOW_TRACKING_URI")
    }
    env.update(HF_HUB_OFFLINE="1", PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    return env


def run(
    cmd: list[str],
    cwd: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 3600,
    capture: bool = True,
) -> str:
    """Run ``cmd`` in ``cwd``; return its stdout (``""`` with ``capture=False``: the output goes to the terminal).

    Raises:
        SmokeError: a non-zero exit (``output``: the last 4,000 characters of stdout and stderr).
    """
    res = subprocess.run(cmd, cwd=cwd, env=dict(env or clean_env()), capture_output=capture, text=True,
                         timeout=timeout)  # fmt: skip
    if res.returncode != 0:
        tail = f"{(res.stdout or '')[-4000:]}\n{(res.stderr or '')[-4000:]}" if capture else ""
        shown = " ".join("python" if c == sys.executable else c for c in cmd)
        raise SmokeError(f"`{shown}` in {cwd} exited with code {res.returncode}", tail)
    return res.stdout or ""


def make_micro_repo(root: str | Path, dest: str | Path, env: Mapping[str, str] | None = None) -> Path:
    """Copy :data:`COPY` from the project at ``root`` into the new folder ``dest``, write micro params, and make
    ``dest`` a git + DVC repository with everything committed. Returns ``dest``.

    Raises:
        FileNotFoundError: ``root`` lacks one of :data:`COPY` (not the project's root).
        FileExistsError: ``dest`` exists and is not empty.
        SmokeError: ``git`` or ``dvc init`` failed.
    """
    root, dest = Path(root), Path(dest)
    missing = [name for name in COPY if not (root / name).exists()]
    if missing:
        raise FileNotFoundError(f"{root} is not the project's root: no {', '.join(missing)}")
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPY:
        src = root / name
        if src.is_dir():
            shutil.copytree(
                src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
            )
        else:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    params = read_params_mapping(dest / "params.yaml")
    (dest / "params.yaml").write_text(yaml.safe_dump(micro_params(params), sort_keys=False))
    env = env or clean_env()
    git = ["git", "-c", "user.name=orchestry-smoke", "-c", "user.email=smoke@localhost"]
    run(["git", "init", "-q"], dest, env)
    run([sys.executable, "-m", "dvc", "init", "-q"], dest, env)
    run([*git, "add", "-A"], dest, env)
    run([*git, "commit", "-qm", "micro params"], dest, env)
    return dest


def run_repro(
    repo: str | Path, env: Mapping[str, str] | None = None, timeout: float = 3600, capture: bool = True
) -> str:
    """``dvc repro`` in ``repo``; returns its stdout (``""`` with ``capture=False``: it goes to the terminal).

    Raises:
        SmokeError: DVC exited non-zero.
    """
    return run([sys.executable, "-m", "dvc", "repro"], Path(repo), env, timeout, capture)


def stage_seconds(repo: str | Path, experiment: str = "orchestry"):
    """Wall seconds of each stage run in ``repo``'s own MLflow store (``repo/mlflow.db``), in run order.

    Returns:
        a pandas DataFrame with columns ``stage``, ``status``, ``seconds`` (MLflow's ``cost/wall_seconds``).
    """
    from orchestry.reporting.compare import load_runs

    runs = load_runs(experiment, f"sqlite:///{Path(repo).resolve() / 'mlflow.db'}")
    runs = runs[runs.get("tags.stage").notna()].sort_values("start_time")
    out = runs[["tags.stage", "status", "metrics.cost/wall_seconds"]]
    return out.set_axis(["stage", "status", "seconds"], axis=1).reset_index(drop=True)


def key_metrics(repo: str | Path) -> dict[str, float]:
    """Key results of a run in ``repo``: each method's mean reward (``reports/metrics.json``) and MAGRPO's
    training reward gain (``reports/train/magrpo.json``: last minus first quarter); files that are missing are
    left out."""
    repo = Path(repo)
    out: dict[str, float] = {}
    metrics = repo / "reports" / "metrics.json"
    if metrics.exists():
        for name, m in json.loads(metrics.read_text()).get("methods", {}).items():
            if "reward" in m:
                out[f"{name} reward"] = m["reward"]
    train = repo / "reports" / "train" / "magrpo.json"
    if train.exists():
        diff = json.loads(train.read_text()).get("difference")
        if diff is not None:
            out["train_magrpo reward gain (last - first quarter)"] = diff
    return out
