"""Multi-turn helper/main episodes: turn t >= 1 continues each sample that did not pass every assert with a new
(helper, main) pair whose prompts carry the sandbox's feedback (:mod:`orchestry.tasks.multi_turn`).
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from orchestry.llm.local import Generation, GenerationBatch, chat_prompt
from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM
from orchestry.tasks.multi_turn import feedback_text, next_turn_prompts
from orchestry.training.magrpo.common import AGENTS, TURN_SEED, Rollout, Trainer
from orchestry.training.magrpo.rollouts import generate_rows, score_pairs, step_seed


def next_turn(tr: Trainer, prev: Rollout, step: int, turn: int) -> Rollout | None:
    """Turn ``turn`` (>= 1) of the helper/main episode whose last turn is ``prev``.

    Each sample that did not pass every assert is continued by one new (helper, main) pair whose prompts
    carry the sandbox's feedback on its previous pair, main seeing the helper's previous ``aux``
    (:func:`orchestry.tasks.multi_turn.next_turn_prompts`; plus the coach's comments with
    ``coach.show_feedback``). All continued samples are sampled in one batched ``generate``. A sample that
    passed stops early: its reward is carried over, its rows are empty placeholders that are never trained
    (``active`` False). Returns None when every sample has stopped.
    """
    G, N = prev.G, len(prev.problems)
    todo = [
        (n, g)
        for n in range(N)
        for g in range(G)
        if not (prev.details[n * G + g]["total_asserts"] > 0
                and prev.details[n * G + g]["passed"] == prev.details[n * G + g]["total_asserts"])
    ]  # fmt: skip
    if not todo:
        return None
    prompts, adapters = [], []
    for n, g in todo:
        d, p = prev.details[n * G + g], prev.problems[n]
        notes = None
        if tr.cfg.coach.show_feedback:
            notes = {a: d.get(f"coach_{a}_feedback", "") for a in AGENTS}
        hp, mp = next_turn_prompts(p, d["helper"], d["main"], feedback_text(p, d), notes)
        prompts += [
            chat_prompt(tr.tokenizer, hp, HELPER_SYSTEM),
            chat_prompt(tr.tokenizer, mp, MAIN_SYSTEM),
        ]
        adapters += list(AGENTS)
    sub = generate_rows(tr, prompts, adapters, step_seed(tr, step, TURN_SEED * turn))
    # the full [n][agent][g] layout; rows of stopped samples stay empty (mask 0) and are never trained
    B, k = N * len(AGENTS) * G, len(AGENTS)
    seqs = torch.zeros(B, sub.sequences.shape[1], dtype=sub.sequences.dtype)
    mask = torch.zeros(B, sub.sequences.shape[1], dtype=sub.attention_mask.dtype)
    items = [Generation("", 0, 0, i) for i in range(B)]
    for j, (n, g) in enumerate(todo):
        for a in range(k):
            src, dst = j * k + a, Rollout.row_of(n, a, g, k, G)
            seqs[dst], mask[dst] = sub.sequences[src], sub.attention_mask[src]
            items[dst] = replace(sub.items[src], row=dst)
    batch = GenerationBatch(seqs, mask, sub.prompt_width, items, sub.seconds)
    t0 = time.time()
    samples = [
        (prev.problems[n], items[Rollout.row_of(n, 0, g, k, G)], items[Rollout.row_of(n, 1, g, k, G)])
        for n, g in todo
    ]
    previous = [prev.details[n * G + g] for n, g in todo]
    details_new, flat, metrics = score_pairs(tr, samples, [g for _, g in todo], turn=turn, previous=previous)
    rewards = prev.rewards.clone()
    details = [dict(d, turn=turn, carried=True) for d in prev.details]
    active = torch.zeros(N, G, dtype=torch.bool)
    agent_rewards = None
    if flat is not None or prev.agent_rewards is not None:
        agent_rewards = {a: prev.reward_of(a).clone() for a in AGENTS}
    for j, (n, g) in enumerate(todo):
        rewards[n, g] = details_new[j]["total"]
        details[n * G + g] = details_new[j]
        active[n, g] = True
        if agent_rewards is not None:
            for a in AGENTS:
                agent_rewards[a][n, g] = flat[a][j] if flat is not None else details_new[j]["total"]
    return Rollout(list(prev.problems), batch, rewards, details, G, time.time() - t0,
                   agent_rewards=agent_rewards, active=active, turn=turn, shared_prompt=False,
                   metrics=metrics)  # fmt: skip
