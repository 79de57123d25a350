"""The descriptions of MLflow runs (``mlflow.note.content``, the "Description" box above a run's page): what a
stage did and its headline figures (:func:`describe_stage_run`), and the params an execution changed against the
commit (:func:`describe_parent_run`). :func:`orchestry.tracking.runs.stage_run` writes both when a stage run ends
FINISHED.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestry.paths import repo_root
from orchestry.tracking.execution import _flatten

#: What each ``dvc.yaml`` stage does and the metrics its MLflow run's description leads with (``mlflow.note.content``,
#: shown above the run's page in the MLflow UI; :func:`describe_stage_run`).
STAGE_SUMMARY: dict[str, tuple[str, tuple[str, ...]]] = {
    "prepare": ("writes the train/test/val problems and the transfer sets, checks every canonical solution in the "
                "sandbox, converts the embedded model", ("prepare/problems", "prepare/canonical_passed")),
    "baselines": ("the four untrained methods (single, concat, sequential, discussion) on the test split",
                  ("test/baseline_single/pass_at_1", "test/baseline_concat/pass_at_1")),
    "train_magrpo": ("the warm start, then MAGRPO's updates of the helper and main LoRA adapters",
                     ("train/summary/first_quarter_reward", "train/summary/last_quarter_reward")),
    "evaluate_base": ("the untrained pair on the test split and the transfer sets",
                      ("test/base/pass_at_1", "transfer/easy40/base/pass_at_1")),
    "evaluate": ("the trained pair on the test split and the transfer sets, paired with the base pair",
                 ("test/magrpo/pass_at_1", "test/base/pass_at_1", "transfer/easy40/magrpo/pass_at_1",
                  "transfer/others_a/magrpo/pass_at_1")),
    "train_api_grpo": ("API-GRPO's beam search and behavior library", ("test/api_grpo/with_minus_without/reward",)),
    "train_orchestrator": ("the learned orchestrator (REINFORCE with a cost penalty) against fixed orders",
                           ("test/orchestrator/learned/reward",)),
    "detect_schemes": ("the cooperation schemes of the trained pair's samples", ()),
    "plot": ("the figures and reports/index.html", ()),
}  # fmt: skip

#: MLflow's tag for a run's description (the "Description" box of the run page).
NOTE_TAG = "mlflow.note.content"


def describe_stage_run(client, run_id: str, stage: str) -> str:
    """Set and return the stage run's description: what the stage did, its headline figures (the metrics of
    :data:`STAGE_SUMMARY` that the run logged, 3 decimals) and where the report is."""
    what, keys = STAGE_SUMMARY.get(stage.split("@")[0], ("", ()))
    metrics = client.get_run(run_id).data.metrics
    figures = ", ".join(f"`{k}` {metrics[k]:.3f}" for k in keys if k in metrics)
    report = repo_root() / "reports" / "index.html"
    lines = [f"**{stage}**" + (f": {what}." if what else ".")]
    if figures:
        lines.append(f"Headline: {figures}.")
    lines.append(
        f"Report: `{report}` (`orchestry report` rebuilds it; `dvc repro` writes it in the plot stage)."
    )
    text = "\n\n".join(lines)
    client.set_tag(run_id, NOTE_TAG, text)
    return text


def params_diff(root: Path | None = None, ref: str = "HEAD") -> dict[str, tuple[Any, Any]]:
    """``{key: (committed, now)}`` for every flattened key of ``params.yaml`` whose value differs from git
    ``ref``'s (what ``dvc exp run -S`` changed); ``{}`` when nothing differs or either side cannot be read."""
    import yaml

    root = root or repo_root()
    try:
        now = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8")) or {}
        committed = subprocess.run(["git", "show", f"{ref}:params.yaml"], cwd=root, capture_output=True, text=True,
                                   timeout=20, check=True).stdout  # fmt: skip
        before = yaml.safe_load(committed) or {}
    except (OSError, subprocess.SubprocessError, yaml.YAMLError):
        return {}
    a, b = _flatten(before), _flatten(now)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def describe_parent_run(client, parent_id: str, execution: Mapping[str, Any]) -> str:
    """Set and return the parent run's description: the execution (DVC experiment or plain ``dvc repro``) and the
    params it changed against the commit (:func:`params_diff`)."""
    name = execution.get("dvc_experiment") or "dvc repro"
    rev = str(execution.get("git_revision") or "HEAD")
    diff = params_diff(ref=rev if rev != "unknown" else "HEAD")  # against the experiment's baseline commit
    lines = [f"**{name}** at `{str(execution.get('git_revision', '?'))[:8]}`."]
    if diff:
        lines.append(
            "Params changed from the commit: "
            + ", ".join(f"`{k}` {a!r} → {b!r}" for k, (a, b) in diff.items())
        )
    else:
        lines.append("Params: the committed params.yaml.")
    text = "\n\n".join(lines)
    client.set_tag(parent_id, NOTE_TAG, text)
    return text
