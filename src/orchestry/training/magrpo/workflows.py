"""The writer -> tester -> fixer workflow: three agents in sequence on each problem, the tester's asserts run on
the writer's code in the sandbox and the fixer's final code scored on the problem's hidden asserts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from orchestry.config import SamplingParams
from orchestry.llm.local import GenerationBatch, chat_prompt, generate
from orchestry.problems import Problem
from orchestry.tasks import writer_tester_fixer as wtf
from orchestry.training.magrpo.agent_rewards import agent_rewards
from orchestry.training.magrpo.common import TURN_SEED, WORKFLOW_AGENTS, Rollout, Trainer
from orchestry.training.magrpo.rollouts import step_seed


def workflow_rollout(
    model,
    tokenizer,
    problems: Sequence[Problem],
    G: int,
    sandbox,
    sampling: SamplingParams,
    seed: int,
    adapters: Sequence[str] = WORKFLOW_AGENTS["writer_tester_fixer"],
) -> tuple[dict[str, GenerationBatch], list[dict], list]:
    """G writer -> tester -> fixer episodes per problem: three batched ``generate`` calls and two sandbox batches.

    The writer writes the function; the tester writes asserts, which run on the writer's code in the sandbox
    (:func:`orchestry.tasks.writer_tester_fixer.tester_reports`); the fixer reads the writer's code and that
    report and writes the final function, scored on the problem's hidden asserts
    (:func:`~orchestry.tasks.writer_tester_fixer.workflow_rewards`: the joint reward, 0..2.1).

    Args:
        problems: N problems; G: episodes per problem. seed: the writer's sampling seed (tester, fixer: offsets).
        adapters: the peft adapter of (writer, tester, fixer) rows (``"__base__"``: the bare base model; None: the
            model as it is, e.g. a base model without peft).

    Returns:
        ``({"writer"|"tester"|"fixer": GenerationBatch of N*G rows}, N*G records, N*G tester reports)``; a record
        is the level reward's dict plus task_id, generation, the three texts, ``report``, token counts,
        truncation flags, ``reward_seconds`` (sandbox seconds), and, for the shared record format, ``helper``
        (empty: no aux) and ``main`` (the fixer's final code).
    """
    names = WORKFLOW_AGENTS["writer_tester_fixer"]
    limit = sampling.max_completion_length
    probs = [p for p in problems for _ in range(G)]

    def sample(prompts: list[str], adapter: str | None, offset: int) -> GenerationBatch:
        names = None if adapter is None else [adapter] * len(prompts)
        return generate(model, tokenizer, prompts, names, max_new_tokens=limit,
                        temperature=sampling.temperature, top_p=sampling.top_p, seed=seed + offset)  # fmt: skip

    writer = sample(
        [chat_prompt(tokenizer, wtf.writer_prompt(p), wtf.WRITER_SYSTEM) for p in probs], adapters[0], 0
    )
    w_texts = [i.text for i in writer.items]
    tester = sample([chat_prompt(tokenizer, wtf.tester_prompt(p, w), wtf.TESTER_SYSTEM)
                     for p, w in zip(probs, w_texts, strict=True)], adapters[1], TURN_SEED)  # fmt: skip
    t_texts = [i.text for i in tester.items]
    t0 = time.time()
    reports = wtf.tester_reports(probs, w_texts, t_texts, sandbox)
    seconds = time.time() - t0
    fixer = sample([chat_prompt(tokenizer, wtf.fixer_prompt(p, w, r.text), wtf.FIXER_SYSTEM)
                    for p, w, r in zip(probs, w_texts, reports, strict=True)], adapters[2], 2 * TURN_SEED)  # fmt: skip
    f_texts = [i.text for i in fixer.items]
    batches = dict(zip(names, (writer, tester, fixer), strict=True))
    cut = [[b.items[i].truncated for b in batches.values()] for i in range(len(probs))]
    t0 = time.time()
    results = wtf.workflow_rewards(probs, f_texts, sandbox, truncated=[any(c) for c in cut])
    seconds += time.time() - t0
    details = []
    for i, r in enumerate(results):
        d = r.to_dict()
        d.update(task_id=probs[i].task_id, generation=i % G, writer=w_texts[i], tester=t_texts[i],
                 fixer=f_texts[i], report=reports[i].text, tester_passed=reports[i].passed,
                 tester_total=reports[i].total, helper="", main=f_texts[i], truncated=any(cut[i]), attempt=0,
                 turn=0, reward_seconds=seconds)  # fmt: skip
        for a, b in batches.items():
            d[f"{a}_tokens"] = b.items[i].completion_tokens
            d[f"{a}_truncated"] = b.items[i].truncated
        details.append(d)
    return batches, details, reports


def workflow_episode(tr: Trainer, problems: Sequence[Problem], step: int) -> list[Rollout]:
    """One writer -> tester -> fixer episode per (problem, generation) (:func:`workflow_rollout`), as one
    :class:`Rollout` per agent (phase), all with the episode's joint rewards (the coach's mix per agent when
    enabled); the records (texts, report, tokens) are on the writer's."""
    G, N = tr.cfg.num_generations, len(problems)
    batches, details, reports = workflow_rollout(
        tr.model,
        tr.tokenizer,
        problems,
        G,
        tr.sandbox,
        tr.sampling,
        step_seed(tr, step),
        tr.agents,
    )
    t0 = time.time()
    probs = [p for p in problems for _ in range(G)]
    texts = {a: [d[a] for d in details] for a in tr.agents}
    flat, metrics = agent_rewards(tr, probs, texts, details)
    metrics["tester_pass_rate"] = sum(r.total > 0 and r.passed == r.total for r in reports) / len(reports)
    rewards = torch.tensor([d["total"] for d in details], dtype=torch.float32).view(N, G)
    seconds = details[0].get("reward_seconds", 0.0) + time.time() - t0
    out = []
    for k, a in enumerate(tr.agents):
        ar = {a: flat[a].view(N, G)} if flat is not None else None
        out.append(Rollout(list(problems), batches[a], rewards, details if k == 0 else [], G,
                           seconds if k == 0 else 0.0, agents=(a,), agent_rewards=ar,
                           shared_prompt=k == 0, metrics=metrics if k == 0 else {}))  # fmt: skip
    return out
