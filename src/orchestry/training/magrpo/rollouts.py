"""Rollouts of the helper/main pair: each agent's G completions of every problem of a step in one batched
``generate`` call (per-row LoRA adapters), and the scoring of the (helper, main) pairs with the level reward.

The sampling seed of step s is ``seed * 1_000_003 + s + 7919 * rank`` (plus an offset for resamples, later turns
and the curriculum's base rollout), so a resumed run samples what an uninterrupted one does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from orchestry.llm.local import Generation, GenerationBatch, chat_prompt, generate
from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, Problem
from orchestry.rewards.code import level_rewards
from orchestry.training.magrpo.agent_rewards import agent_rewards
from orchestry.training.magrpo.common import AGENTS, BASE, CURRICULUM_SEED, RESAMPLE_SEED, Rollout, Trainer


def generate_rows(tr: Trainer, prompts: list[str], adapters: list[str], seed: int) -> GenerationBatch:
    """Sample ``prompts`` (row i with the adapter ``adapters[i]``) under the run's sampling params."""
    return generate(
        tr.model,
        tr.tokenizer,
        prompts,
        adapters,
        max_new_tokens=tr.sampling.max_completion_length,
        temperature=tr.sampling.temperature,
        top_p=tr.sampling.top_p,
        seed=seed,
    )


def step_seed(tr: Trainer, step: int, offset: int = 0) -> int:
    """Sampling seed of ``step`` on this process (``offset``: a resample's, a turn's)."""
    return tr.cfg.seed * 1_000_003 + step + 7919 * tr.rank + offset


def rollout(
    tr: Trainer, problems: Sequence[Problem], step: int, attempt: int = 0, base: bool = False
) -> Rollout:
    """Sample G completions per agent for each problem (one batched ``generate``) and score the pairs.

    ``attempt`` > 0: a resample of ``step`` (dynamic sampling), with its own seed. ``base``: the bare base
    model writes both agents' completions (the curriculum's rollout), seeded alike on every process.
    Each sample's record holds its completion token counts and whether each hit ``max_completion_length``;
    with ``credit: counterfactual`` or the coach, also each agent's reward
    (:func:`orchestry.training.magrpo.agent_rewards.agent_rewards`).
    """
    G = tr.cfg.num_generations
    prompts, adapters = [], []
    for p in problems:
        hp = chat_prompt(tr.tokenizer, p.helper_prompt(), HELPER_SYSTEM)
        mp = chat_prompt(tr.tokenizer, p.main_prompt(), MAIN_SYSTEM)
        for agent, prompt in zip(AGENTS, (hp, mp), strict=True):
            prompts += [prompt] * G
            adapters += [BASE if base else agent] * G
    if base:
        seed = tr.cfg.seed * 1_000_003 + step + CURRICULUM_SEED
    else:
        seed = step_seed(tr, step, RESAMPLE_SEED * attempt)
    batch = generate_rows(tr, prompts, adapters, seed)
    t0 = time.time()
    k = len(AGENTS)
    samples = [
        (p, batch.items[Rollout.row_of(n, 0, g, k, G)], batch.items[Rollout.row_of(n, 1, g, k, G)])
        for n, p in enumerate(problems)
        for g in range(G)
    ]
    details, flat, metrics = score_pairs(tr, samples, [g for _ in problems for g in range(G)], attempt,
                                         coach=not base)  # fmt: skip
    N = len(problems)
    rewards = torch.tensor([d["total"] for d in details], dtype=torch.float32).view(N, G)
    agent_rewards = {a: r.view(N, G) for a, r in flat.items()} if flat else None
    return Rollout(list(problems), batch, rewards, details, G, time.time() - t0,
                   agent_rewards=agent_rewards, metrics=metrics)  # fmt: skip


def score_pairs(
    tr: Trainer,
    samples: list[tuple[Problem, Generation, Generation]],
    generations: list[int],
    attempt: int = 0,
    turn: int = 0,
    coach: bool = True,
    previous: list[dict] | None = None,
) -> tuple[list[dict], dict[str, torch.Tensor] | None, dict]:
    """Score B (problem, helper, main) samples: their records (level reward, texts, token counts,
    truncation), the per-agent rewards ``{agent: [B]}`` (None: shared) and the metrics of
    :func:`orchestry.training.magrpo.agent_rewards.agent_rewards`. ``previous``: the samples' records of the turn before
    (the coach's earlier feedback)."""
    probs = [s[0] for s in samples]
    helpers, mains = [s[1].text for s in samples], [s[2].text for s in samples]
    if tr.reward_fn is not None:
        results = tr.reward_fn(probs, helpers, mains)
    else:
        truncated = [h.truncated or m.truncated for _, h, m in samples]
        results = level_rewards(probs, helpers, mains, tr.sandbox, truncated=truncated)
    details = []
    for i, r in enumerate(results):
        _, h, m = samples[i]
        d = r.to_dict()
        d.update(task_id=probs[i].task_id, generation=generations[i], helper=helpers[i], main=mains[i])
        d.update(
            helper_tokens=h.completion_tokens,
            main_tokens=m.completion_tokens,
            helper_truncated=h.truncated,
            main_truncated=m.truncated,
            truncated=h.truncated or m.truncated,
            attempt=attempt,
            turn=turn,
        )
        details.append(d)
    flat, metrics = agent_rewards(tr, probs, {"helper": helpers, "main": mains}, details, coach, previous)
    return details, flat, metrics
