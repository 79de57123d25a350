"""The step log: one record of metrics per MAGRPO step (rewards and levels, collaboration and truncation rates,
schemes, zero-variance groups, tokens, seconds, the update's losses), and the step's samples as an MLflow table.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestry.analysis.metrics import chain_form_rate, distinct_solutions
from orchestry.analysis.schemes import scheme_distribution
from orchestry.config import TrainMagrpoParams
from orchestry.training.magrpo.common import Rollout, flat_groups


def log_samples_table(samples: list[dict], step: int) -> None:
    """Step ``step``'s samples (as in ``reports/train/magrpo_samples.jsonl``, with a ``step`` column) as the
    MLflow table ``samples/train_step_<NNNN>.json`` of the active run; nothing without an active run."""
    from orchestry.tracking.models import log_samples_table as log_table

    log_table([s for s in samples if s["step"] == step], f"samples/train_step_{step:04d}.json")


def step_record(
    cfg: TrainMagrpoParams,
    step,
    episode: Rollout | Sequence[Rollout],
    upd: dict,
    gen_s: float,
    upd_s: float,
    total_s: float,
) -> dict:
    """The step's metrics. Rewards, levels and rates are those of the first turn (comparable whatever
    ``turns`` is; the workflow's first phase holds the episode's records); ``reward/turn_<t>`` is each turn's
    mean reward (samples that stopped early count with their carried reward) and ``reward/<agent>`` each
    agent's own reward when credit or the coach make them differ; tokens and seconds are the whole step's.
    The collapse metrics (docs/metrics.md): ``chain_form_rate``, the share of the step's main answers in the
    generator's chain form, and ``distinct_solutions``, the mean over the step's groups (a problem's G samples)
    of distinct normalised joint programs / G."""
    rollouts = [episode] if isinstance(episode, Rollout) else list(episode)
    ro = rollouts[0]
    det = ro.details
    n = len(det)
    prompt_tokens = completion_tokens = 0
    for r in rollouts:
        p_tok, c_tok = r.tokens or (
            sum(i.prompt_tokens for i in r.batch.items),
            sum(i.completion_tokens for i in r.batch.items),
        )
        prompt_tokens, completion_tokens = prompt_tokens + p_tok, completion_tokens + c_tok
    flat = float(flat_groups(ro.rewards).float().mean())
    # details are ordered [problem n][generation g]: a group is a problem's G samples
    if len(det) == len(ro.problems) * ro.G:
        groups = [det[i : i + ro.G] for i in range(0, n, ro.G)]
    else:
        by_task: dict[str, list[dict]] = {}
        for d in det:
            by_task.setdefault(d.get("task_id"), []).append(d)
        groups = list(by_task.values())
    entries = {p.task_id: p.entry_point for p in ro.problems}
    rec = {
        "step": step,
        "reward": float(ro.rewards.mean()),
        "structure": sum(d["structure"] for d in det) / n,
        "syntax": sum(d["syntax"] for d in det) / n,
        "tests": sum(d["tests"] for d in det) / n,
        "cooperation": sum(d["cooperation"] for d in det) / n,
        "cooperation_rate": sum(d["cooperation"] > 0 for d in det) / n,
        "pass_rate": sum(d["total_asserts"] > 0 and d["passed"] == d["total_asserts"] for d in det) / n,
        "reward_std_in_group": float(ro.rewards.std(dim=1, unbiased=False).mean()),
        # ungated collaboration evidence (move before any assert passes) and truncation
        "aux_defined_rate": sum(bool(d.get("aux_defined")) for d in det) / n,
        "aux_called_rate": sum(bool(d.get("aux_called")) for d in det) / n,
        "aux_used_rate": sum(bool(d.get("aux_used")) for d in det) / n,
        "truncation_rate": sum(bool(d.get("truncated")) for d in det) / n,
        "truncation_rate/helper": sum(bool(d.get("helper_truncated")) for d in det) / n,
        "truncation_rate/main": sum(bool(d.get("main_truncated")) for d in det) / n,
        **{f"scheme/{k}": v for k, v in scheme_distribution(d.get("scheme", "none") for d in det).items()},
        # collapse: one template (the generator's chain form) written on every task
        "chain_form_rate": chain_form_rate(det, entries),
        "distinct_solutions": distinct_solutions(groups),
        # signal: groups whose G rewards are all equal give no gradient (as first sampled, before resampling)
        "zero_variance_groups": flat if ro.zero_variance_groups is None else ro.zero_variance_groups,
        "resample_rollouts": ro.resample_rollouts,
        "resampled_groups": ro.resampled_groups,
        "tokens/prompt": prompt_tokens,
        "tokens/completion": completion_tokens,
        "seconds/generate": gen_s,
        "seconds/reward": sum(r.reward_seconds for r in rollouts),
        "seconds/update": upd_s,
        "seconds": total_s,
        "problems": [p.task_id for p in ro.problems],
    }
    if cfg.turns > 1:
        for t in range(cfg.turns):  # a turn not reached (everything passed before) keeps the last one's
            r = rollouts[min(t, len(rollouts) - 1)]
            rec[f"reward/turn_{t + 1}"] = float(r.rewards.mean())
        rec["turns_run"] = len(rollouts)
    for r in rollouts:
        for a in r.agents:
            if r.agent_rewards is not None and a in r.agent_rewards and r.turn == 0:
                rec[f"reward/{a}"] = float(r.agent_rewards[a].mean())
        for k, v in r.metrics.items():
            key = k if r.turn == 0 else f"{k}/turn_{r.turn + 1}"
            rec[key] = v
    rec.update(upd)
    return rec
