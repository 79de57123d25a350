"""Stage `train_magrpo`: MAGRPO with one LoRA adapter per agent on a shared frozen base; resumable.

With ``train_magrpo.num_processes`` > 1 the script relaunches itself under ``accelerate launch`` (data parallel;
docs/scaling.md) and exits with the launcher's code, so ``dvc repro`` stays the one command. Inside the launch
every process loads the same params, problems and model and trains; the main process (rank 0) alone opens the
MLflow run, logs, and writes the adapters, reports, the step CSV and the checkpoints (the trainer gathers every
process's step record and samples, so they are the whole run's).
"""

import csv
import hashlib
import json
import logging
import os
import shutil
from contextlib import nullcontext
from pathlib import Path

import mlflow

from orchestry.analysis.metrics import quarter_comparison
from orchestry.analysis.schemes import SCHEMES
from orchestry.paths import repo_root
from orchestry.problems import read_problems
from orchestry.rewards.coach import open_coach
from orchestry.runtime import (
    build_policy,
    machine_info,
    open_sandbox,
    relaunch_under_accelerate,
    run_stage,
    stage_inputs_key,
    start_stage,
    write_json,
    write_jsonl,
)
from orchestry.tracking.metric_names import magrpo_step_metrics, magrpo_summary_metrics
from orchestry.tracking.models import register_adapters
from orchestry.tracking.runs import log_metrics, stage_run
from orchestry.training.magrpo import agent_names
from orchestry.training.magrpo.batching import process_group
from orchestry.training.magrpo.trainer import MAGRPOTrainer

log = logging.getLogger("train_magrpo")

# Checkpoints live outside DVC (like the API response caches), in the real repository (DVC_ROOT in `dvc exp run`),
# one directory per run inputs: a queued experiment's workspace never lacks an out (so DVC does not re-run this
# stage for a plot-only change), and experiments never resume each other's checkpoints.
CKPT_ROOT = Path(".orchestry/checkpoints/magrpo")
ADAPTERS = Path("models/adapters/magrpo")
STEPS_CSV = Path("reports/train/magrpo_steps.csv")
CSV_FIELDS = [
    "step", "reward", "structure", "syntax", "tests", "cooperation", "cooperation_rate", "pass_rate",
    "tokens/prompt", "tokens/completion", "seconds/generate", "seconds/reward", "seconds/update", "seconds",
    # ungated collaboration evidence, truncation, main's scheme shares, learning signal (dynamic sampling)
    "aux_defined_rate", "aux_called_rate", "aux_used_rate",
    "truncation_rate", "truncation_rate/helper", "truncation_rate/main",
    *(f"scheme/{s}" for s in SCHEMES),
    "zero_variance_groups", "skipped_groups", "resample_rollouts", "resampled_groups",
]  # fmt: skip
# columns the options add when on (turns, per-agent rewards from credit or the coach, the workflow's tester, the
# remax estimator's greedy rollout and the critic estimator's value fit)
OPTION_PREFIXES = ("turns_run", "reward/", "credit/", "coach/", "advantage_abs/", "tester_pass_rate", "remax/",
                   "tokens/prompt/greedy", "tokens/completion/greedy", "seconds/greedy", "critic/")  # fmt: skip


def main() -> None:
    params = start_stage("train_magrpo")
    cfg = params.train_magrpo
    if cfg.num_processes > 1 and "WORLD_SIZE" not in os.environ:  # not inside a launch yet
        raise SystemExit(relaunch_under_accelerate(cfg.num_processes, __file__))
    rank, world_size = process_group()  # (0, 1) in a lone process
    if world_size != cfg.num_processes:  # e.g. `accelerate launch` by hand: the params do not say how it ran
        log.warning("train_magrpo.num_processes is %d but %d processes run", cfg.num_processes, world_size)
    problems = read_problems("data/problems/train.jsonl")[: cfg.max_problems]
    logged = {**cfg.model_dump(), **params.sampling.model_dump(), **params.model.model_dump()}
    # the trainer compares its own params (train_magrpo) itself; the intervals only shape the summary,
    # recomputed from the checkpoint's samples
    resume_key = stage_inputs_key("train_magrpo", params, exclude=["train_magrpo", "intervals"])
    run_key = json.dumps([resume_key, cfg.model_dump(mode="json")], sort_keys=True).encode()
    ckpt = repo_root() / CKPT_ROOT / hashlib.sha256(run_key).hexdigest()[:16]
    agents = agent_names(cfg)
    main_process = rank == 0
    run = stage_run("train_magrpo", logged, params.mlflow.experiment, params.mlflow.tracking_uri)
    with run if main_process else nullcontext():
        # the coach first: a misconfigured backend fails before the policy is loaded
        coach = open_coach(cfg.coach, params.model.path, params.model.dtype) if cfg.coach.enabled else None
        model, tok = build_policy(params, agents)

        def on_step(rec: dict) -> None:
            log_metrics(magrpo_step_metrics(rec), step=rec["step"])

        with open_sandbox(params) as sb:
            trainer = MAGRPOTrainer(
                model,
                tok,
                problems,
                sb,
                cfg,
                params.sampling,
                ckpt,
                on_step=on_step,
                resume_key=resume_key,
                coach=coach,
            )
            if main_process:  # auto resolved: True = bf16; how (and the measurement it read, if any)
                mlflow.log_param("train_magrpo.bf16_update_resolved", trainer.bf16)
                mlflow.log_params(
                    {f"train_magrpo.update_dtype.{k}": v for k, v in trainer.update_decision.items()}
                )
            history = trainer.train()
        if not main_process:  # trained: the adapters are the main process's, and so are the outputs
            return
        shutil.rmtree(ADAPTERS, ignore_errors=True)
        trainer.save_adapters(ADAPTERS)
        if trainer.warm_start:  # the pair after the warm start alone, for `orchestry evaluate --adapters`
            shutil.copytree(trainer.warm_start_dir, ADAPTERS / "warm_start")
        STEPS_CSV.parent.mkdir(parents=True, exist_ok=True)
        with open(STEPS_CSV, "w", newline="") as f:
            options = sorted({k for rec in history for k in rec if k.startswith(OPTION_PREFIXES)})
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS + options, extrasaction="ignore")
            w.writeheader()
            for rec in history:
                w.writerow(rec)
        write_jsonl("reports/train/magrpo_samples.jsonl", trainer.samples)
        # the first turn's rewards (turn 0): comparable whatever `turns` is
        per_step = [
            [s["total"] for s in trainer.samples if s["step"] == rec["step"] and s.get("turn", 0) == 0]
            for rec in history
        ]
        summary = quarter_comparison(per_step, params.intervals.confidence, params.intervals.resamples)
        summary.update(
            steps=len(history),
            seconds_per_step=sum(r["seconds"] for r in history) / max(1, len(history)),
            completion_tokens=sum(r["tokens/completion"] for r in history),
            prompt_tokens=sum(r["tokens/prompt"] for r in history),
            update_dtype="bf16" if trainer.bf16 else "fp32",  # train_magrpo.bf16_update as resolved here
            update_dtype_decision={k: v for k, v in trainer.update_decision.items() if k != "reason"},
            machine=machine_info(),
        )
        if cfg.advantage == "remax":  # the greedy rollouts' share of the totals above (they are included)
            summary["greedy_prompt_tokens"] = sum(r.get("tokens/prompt/greedy", 0) for r in history)
            summary["greedy_completion_tokens"] = sum(r.get("tokens/completion/greedy", 0) for r in history)
        if trainer.warm_start:
            summary.update({f"warm_start_{k.replace('/', '_')}": v for k, v in trainer.warm_start.items()})
        if trainer.curriculum:  # curriculum=base_reward: the order (logged) and the base rollout's cost
            mlflow.log_dict(trainer.curriculum, "train/magrpo_curriculum.json")
            summary["prompt_tokens"] += trainer.curriculum["tokens/prompt"]
            summary["completion_tokens"] += trainer.curriculum["tokens/completion"]
        if coach is not None:  # the coach's calls, parse failures and spend (cache hits are free)
            summary.update({f"coach_{k}": v for k, v in coach.counters().items()})
            summary["coach_usd"] = coach.client.tracker.spent_usd
        write_json("reports/train/magrpo.json", summary)
        # at the last step, so the logged model (log_model links the metrics of its step) carries the final
        # values of the curves and these totals
        final_step = history[-1]["step"] if history else 0
        log_metrics(magrpo_summary_metrics(summary), step=final_step)
        for agent in agents:
            mlflow.log_artifacts(str(ADAPTERS / agent), f"adapters/{agent}")
        mlflow.log_artifact(str(STEPS_CSV), "train")
        # the helper/main adapters as a pyfunc model in the Model Registry (loads back offline; tracking/models.py)
        if cfg.workflow == "helper_main":
            register_adapters(ADAPTERS, base_path=params.model.path, dtype=params.model.dtype,
                              load_in_4bit=params.model.load_in_4bit,
                              max_new_tokens=params.sampling.max_completion_length, step=final_step)  # fmt: skip
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()}))
    # done: the adapters are DVC outs now; the checkpoint (adapters + AdamW states) and the warm-started pair
    # (copied into the adapters above) only served a resume
    for folder in (ckpt, *(ckpt.with_name(ckpt.name + s) for s in (".new", ".old", ".warm_start"))):
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    run_stage(main)
