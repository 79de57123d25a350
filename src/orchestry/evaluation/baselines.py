"""Ways of producing (helper, main) code for a problem with a local model, and their per-sample records.

Methods (MAGRPO paper's baselines, plus the trained agents):

- ``single``: one agent writes the entry point alone (no helper).
- ``concat``: naive concatenation -- helper and main write independently, no communication. With LoRA
  adapters per agent this is also how MAGRPO-trained agents are evaluated (``method="magrpo"``).
- ``sequential``: the helper writes ``aux`` first; main sees the helper's code.
- ``discussion``: one round -- both write drafts independently, then each revises after seeing the other's.

Every sample becomes a record: method, task_id, sample index, texts, each reward level (flat, see
``LevelReward.to_dict``), prompt/completion tokens and seconds (its share of the batched generate calls).

Progress (:mod:`orchestry.progress`, stderr, only on a terminal unless ``ORCHESTRY_PROGRESS`` says otherwise):
one bar over the ``generate`` calls (live completion tokens per second), then one over the scored samples
(live mean reward so far). Scoring runs ``batch_size`` samples per sandbox batch; each sample's reward does
not depend on the batch it is scored in.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from orchestry.config import SamplingParams
from orchestry.llm.local import chat_prompt
from orchestry.llm.sampling import SampledText, sample_texts
from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, SINGLE_SYSTEM, Problem
from orchestry.progress import progress_bar
from orchestry.rewards.code import extract_code, level_rewards, single_rewards

METHODS = ("single", "concat", "sequential", "discussion", "magrpo")


def _revised(draft: SampledText, revision: SampledText) -> SampledText:
    """The revision's text, with the tokens and seconds of the draft and the revision together."""
    return SampledText(
        revision.text,
        draft.prompt_tokens + revision.prompt_tokens,
        draft.completion_tokens + revision.completion_tokens,
        draft.seconds + revision.seconds,
        revision.truncated,
    )


def _revise_helper_prompt(p: Problem, own: str, other: str) -> str:
    return (
        p.helper_prompt()
        + f"\n\nYour first draft:\n```python\n{own}\n```\n"
        + f"Your teammate's draft of `{p.entry_point}`, which will call `aux`:\n```python\n{other}\n```\n"
        + "Write your improved `aux` only."
    )


def _revise_main_prompt(p: Problem, own: str, other: str) -> str:
    return (
        p.main_prompt(helper_code=other)
        + f"\n\nYour first draft:\n```python\n{own}\n```\nWrite your improved `{p.entry_point}` only."
    )


def run_method(
    method: str,
    problems: Sequence[Problem],
    model,
    tokenizer,
    sandbox,
    sampling: SamplingParams,
    num_samples: int = 1,
    seed: int = 0,
    batch_size: int = 32,
    adapters: bool = False,
    progress: bool = True,
) -> list[dict]:
    """Generate and score ``num_samples`` samples per problem with ``method``.

    Args:
        adapters: use the peft adapters named ``helper`` and ``main`` (per-row) instead of the bare model.
        progress: allow the progress bars (module docstring); ``False`` never draws them.

    Returns:
        one record per (problem, sample), ordered by problem then sample.

    Raises:
        ValueError: unknown method.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r} (allowed: {', '.join(METHODS)})")
    t0 = time.time()
    jobs = [(p, s) for p in problems for s in range(num_samples)]

    def render(system, user):
        return chat_prompt(tokenizer, user, system)

    def ad(agent, n):
        return [agent] * n if adapters else None

    n = len(jobs)
    calls = -(-n // batch_size) if batch_size > 0 else 0  # generate calls for n prompts
    two = -(-2 * n // batch_size) if batch_size > 0 else 0  # ... for the 2n prompts of helper + main
    total_calls = {
        "single": calls,
        "concat": two,
        "magrpo": two,
        "sequential": 2 * calls,
        "discussion": 2 * two,
    }
    gen_bar = progress_bar(total_calls[method], f"{method}: generate", "batch", enable=progress)

    def sample(prompts, agent, offset):
        return sample_texts(
            model, tokenizer, prompts, ad(agent, len(prompts)), sampling, seed + offset, batch_size, gen_bar
        )

    helpers: list[SampledText] = []
    mains: list[SampledText]
    if method == "single":
        mains = sample([render(SINGLE_SYSTEM, p.single_prompt()) for p, _ in jobs], "main", 0)
    elif method in ("concat", "magrpo"):
        prompts = [render(HELPER_SYSTEM, p.helper_prompt()) for p, _ in jobs]
        prompts += [render(MAIN_SYSTEM, p.main_prompt()) for p, _ in jobs]
        agents = ["helper"] * n + ["main"] * n
        gens = sample_texts(
            model,
            tokenizer,
            prompts,
            agents if adapters else None,
            sampling,
            seed,
            batch_size,
            gen_bar,
        )
        helpers, mains = gens[:n], gens[n:]
    elif method == "sequential":
        helpers = sample([render(HELPER_SYSTEM, p.helper_prompt()) for p, _ in jobs], "helper", 0)
        hcode = [extract_code(h.text)[0] for h in helpers]
        mains = sample(
            [
                render(MAIN_SYSTEM, p.main_prompt(helper_code=c or None))
                for (p, _), c in zip(jobs, hcode, strict=True)
            ],
            "main",
            100_000,
        )
    else:  # discussion: both drafts in one batch, then both revisions in one batch
        both = ["helper"] * n + ["main"] * n if adapters else None
        drafts = sample_texts(
            model,
            tokenizer,
            [render(HELPER_SYSTEM, p.helper_prompt()) for p, _ in jobs]
            + [render(MAIN_SYSTEM, p.main_prompt()) for p, _ in jobs],
            both,
            sampling,
            seed,
            batch_size,
            gen_bar,
        )
        h1, m1 = drafts[:n], drafts[n:]
        hc = [extract_code(g.text)[0] for g in h1]
        mc = [extract_code(g.text)[0] for g in m1]
        revisions = sample_texts(
            model,
            tokenizer,
            [render(HELPER_SYSTEM, _revise_helper_prompt(p, hc[i], mc[i])) for i, (p, _) in enumerate(jobs)]
            + [render(MAIN_SYSTEM, _revise_main_prompt(p, mc[i], hc[i])) for i, (p, _) in enumerate(jobs)],
            both,
            sampling,
            seed + 200_000,
            batch_size,
            gen_bar,
        )
        h2, m2 = revisions[:n], revisions[n:]
        helpers = [_revised(a, b) for a, b in zip(h1, h2, strict=True)]
        mains = [_revised(a, b) for a, b in zip(m1, m2, strict=True)]
    gen_bar.close()
    probs = [p for p, _ in jobs]
    rewards = []
    chunk = max(1, batch_size)
    with progress_bar(n, f"{method}: score", "sample", enable=progress) as score_bar:
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            if method == "single":
                part = single_rewards(
                    probs[a:b],
                    [m.text for m in mains[a:b]],
                    sandbox,
                    truncated=[m.truncated for m in mains[a:b]],
                )
            else:
                trunc = [h.truncated or m.truncated for h, m in zip(helpers[a:b], mains[a:b], strict=True)]
                part = level_rewards(
                    probs[a:b],
                    [h.text for h in helpers[a:b]],
                    [m.text for m in mains[a:b]],
                    sandbox,
                    truncated=trunc,
                )
            rewards += part
            score_bar.update(len(part))
            score_bar.set_postfix(reward=f"{sum(r.total for r in rewards) / len(rewards):.3f}")
    records = []
    for i, ((p, s), r) in enumerate(zip(jobs, rewards, strict=True)):
        h = helpers[i] if helpers else SampledText("", 0, 0, 0.0)
        m = mains[i]
        rec = {
            "method": method,
            "task_id": p.task_id,
            "sample": s,
            "helper": h.text,
            "main": m.text,
            **r.to_dict(),
            "pass": r.total_asserts > 0 and r.passed == r.total_asserts,
            "helper_truncated": h.truncated,
            "main_truncated": m.truncated,
            "prompt_tokens": h.prompt_tokens + m.prompt_tokens,
            "completion_tokens": h.completion_tokens + m.completion_tokens,
            "seconds": h.seconds + m.seconds,
        }
        records.append(rec)
    if records:
        records[0]["method_wall_seconds"] = time.time() - t0
    return records
