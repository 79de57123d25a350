"""Which samples and problems a step trains on: dynamic sampling (DAPO, arXiv 2503.14476) rolls out again the
groups whose G joint rewards are all equal (:func:`orchestry.training.magrpo.common.flat_groups`), and the curriculum
orders the training problems by the base policy's mean group reward, easiest first.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import torch

from orchestry.llm.local import GenerationBatch
from orchestry.training.magrpo.common import Rollout, Trainer, flat_groups

log = logging.getLogger("orchestry.magrpo")


def _padded(batch: GenerationBatch, P: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch``'s sequences and attention mask laid out as ``[B, P + T]``: prompts left-padded to width ``P``,
    completions right-padded to ``T`` (padding: id 0 under mask 0, as :func:`generate`'s own padding)."""
    B, width = batch.sequences.shape[0], batch.prompt_width
    t = batch.sequences.shape[1] - width
    seqs = torch.zeros(B, P + T, dtype=batch.sequences.dtype)
    mask = torch.zeros(B, P + T, dtype=batch.attention_mask.dtype)
    seqs[:, P - width : P + t] = batch.sequences
    mask[:, P - width : P + t] = batch.attention_mask
    return seqs, mask


def replace_groups(ro: Rollout, new: Rollout, pairs: list[tuple[int, int]]) -> Rollout:
    """``ro`` with its group ``n`` replaced by group ``j`` of ``new`` for each ``(n, j)`` of ``pairs`` (same G,
    same problem): rows, rewards and records; the two batches are re-padded to one layout."""
    G, n_agents = ro.G, len(ro.agents)
    P = max(ro.batch.prompt_width, new.batch.prompt_width)
    T = max(
        ro.batch.sequences.shape[1] - ro.batch.prompt_width,
        new.batch.sequences.shape[1] - new.batch.prompt_width,
    )
    seqs_a, mask_a = _padded(ro.batch, P, T)
    seqs_b, mask_b = _padded(new.batch, P, T)
    offset = seqs_a.shape[0]
    source = list(range(offset))  # row of the merged batch -> row of cat(ro, new)
    rewards = ro.rewards.clone()
    agent_rewards = {a: r.clone() for a, r in ro.agent_rewards.items()} if ro.agent_rewards else None
    details = list(ro.details)
    for n, j in pairs:
        if new.problems[j].task_id != ro.problems[n].task_id:
            raise ValueError(f"group {n} ({ro.problems[n].task_id}) replaced by another problem")
        for a in range(n_agents):
            for g in range(G):
                source[Rollout.row_of(n, a, g, n_agents, G)] = offset + Rollout.row_of(j, a, g, n_agents, G)
        rewards[n] = new.rewards[j]
        if agent_rewards is not None:
            for a in agent_rewards:
                agent_rewards[a][n] = new.agent_rewards[a][j]
        details[n * G : (n + 1) * G] = new.details[j * G : (j + 1) * G]
    index = torch.tensor(source)
    seqs, mask = torch.cat([seqs_a, seqs_b])[index], torch.cat([mask_a, mask_b])[index]
    all_items = [*ro.batch.items, *new.batch.items]
    items = [replace(all_items[src], row=i) for i, src in enumerate(source)]
    batch = GenerationBatch(seqs, mask, P, items, ro.batch.seconds)
    return Rollout(list(ro.problems), batch, rewards, details, G, ro.reward_seconds, agents=ro.agents,
                   agent_rewards=agent_rewards, metrics=dict(ro.metrics))  # fmt: skip


def resample(tr: Trainer, ro: Rollout, step: int) -> Rollout:
    """Dynamic sampling (DAPO): roll the flat groups of ``ro`` out again, at most ``max_resample`` times.

    Each extra rollout takes the problems whose group is still flat (one batched ``generate``); a group
    that comes back with unequal rewards replaces the flat one. Groups still flat after the last attempt
    stay (and the update leaves them out of the loss). Time and tokens of every rollout are counted.
    """
    G, N = ro.G, len(ro.problems)
    ro.zero_variance_groups = float(flat_groups(ro.rewards).float().mean())
    tokens = [
        sum(i.prompt_tokens for i in ro.batch.items),
        sum(i.completion_tokens for i in ro.batch.items),
    ]
    todo = [n for n, f in enumerate(flat_groups(ro.rewards).tolist()) if f]
    attempt = 0
    while todo and attempt < tr.cfg.max_resample:
        attempt += 1
        new = tr.rollout([ro.problems[n] for n in todo], step, attempt=attempt)
        tokens[0] += sum(i.prompt_tokens for i in new.batch.items)
        tokens[1] += sum(i.completion_tokens for i in new.batch.items)
        still = flat_groups(new.rewards).tolist()
        fixed = [(n, j) for j, n in enumerate(todo) if not still[j]]
        merged = replace_groups(ro, new, fixed) if fixed else ro
        merged.reward_seconds = ro.reward_seconds + new.reward_seconds
        merged.batch.seconds = ro.batch.seconds + new.batch.seconds
        merged.zero_variance_groups = ro.zero_variance_groups
        merged.resample_rollouts = ro.resample_rollouts + 1
        merged.resampled_groups = ro.resampled_groups + len(fixed)
        ro = merged
        todo = [n for j, n in enumerate(todo) if still[j]]
        log.debug("step %d resample %d: %d of %d groups still flat", step, attempt, len(todo), N)
    ro.tokens = (tokens[0], tokens[1])
    assert ro.rewards.shape == (N, G)
    return ro


def build_curriculum(tr: Trainer) -> dict:
    """Order the training problems by the base policy's mean group reward, easiest first (ties keep the
    seeded order), from one rollout of the bare base model (``problems_per_step`` problems per batch).

    Every process computes the same order (seeds without the rank; the main process's order is broadcast
    when several train together). Sets ``tr.order`` and ``tr.curriculum`` and returns the latter.
    """
    t0 = time.time()
    P = tr.cfg.problems_per_step
    means: list[float] = []
    tokens = [0, 0]
    for k, start in enumerate(range(0, len(tr.problems), P)):
        ro = tr.rollout(tr.problems[start : start + P], k, base=True)
        means += ro.rewards.mean(dim=1).tolist()
        tokens[0] += sum(i.prompt_tokens for i in ro.batch.items)
        tokens[1] += sum(i.completion_tokens for i in ro.batch.items)
    order = sorted(tr.order, key=lambda i: -means[i])  # stable: ties keep the seeded shuffle's order
    if tr.world_size > 1:
        from accelerate.utils import broadcast_object_list

        order = broadcast_object_list([order], from_process=0)[0]
    tr.order = order
    tr.curriculum = {
        "order": [tr.problems[i].task_id for i in order],
        "base_reward": {tr.problems[i].task_id: means[i] for i in order},
        "seconds": time.time() - t0,
        "tokens/prompt": tokens[0],
        "tokens/completion": tokens[1],
    }
    log.info(
        "curriculum (base policy's mean group reward, easiest first): %s",
        ", ".join(f"{t} {r:.3f}" for t, r in tr.curriculum["base_reward"].items()),
    )
    return tr.curriculum


def curriculum_order(problems, curriculum: dict | None) -> list[int] | None:
    """A checkpoint's curriculum as an order of ``problems`` (None: no curriculum); raises if it does not
    name each of this run's problems exactly once."""
    if not curriculum:
        return None
    index = {p.task_id: i for i, p in enumerate(problems)}
    order = [index[t] for t in curriculum["order"]]
    if sorted(order) != list(range(len(problems))):
        raise ValueError("the checkpoint's curriculum does not list this run's problems")
    return order
