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
from orchestry.llm.sampling import SampleCache, SampledText, sample_texts
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


def _generate_calls(method: str, n: int, b: int) -> int:
    """``generate`` calls of ``method`` for ``n`` prompts per agent at batch size ``b`` (the progress bar's length)."""
    if b <= 0:
        return 0
    one, two = -(-n // b), -(-2 * n // b)  # calls for n prompts, and for the 2n prompts of helper + main
    return {"single": one, "concat": two, "magrpo": two, "sequential": 2 * one, "discussion": 2 * two}[method]


class _Sampler:
    """:func:`sample_texts` with a run's fixed arguments: ``sample(prompts, agents, offset)`` decodes the rendered
    ``prompts`` (one adapter name per row, or None for the bare model) at seed ``seed + offset``."""

    def __init__(self, model, tokenizer, sampling, seed, batch_size, adapters, bar, cache=None):
        self.model, self.tokenizer, self.sampling, self.seed = model, tokenizer, sampling, seed
        self.batch_size, self.adapters, self.bar, self.cache = batch_size, adapters, bar, cache

    def render(self, system: str, user: str) -> str:
        return chat_prompt(self.tokenizer, user, system)

    def __call__(self, prompts: list[str], agents: list[str], offset: int = 0) -> list[SampledText]:
        rows = agents if self.adapters else None
        return sample_texts(
            self.model,
            self.tokenizer,
            prompts,
            rows,
            self.sampling,
            self.seed + offset,
            self.batch_size,
            self.bar,
            None if self.adapters else self.cache,
        )


Pair = tuple[
    list[SampledText], list[SampledText]
]  # (helper completions, main completions); helpers [] if none


def _single(ps: list[Problem], sample: _Sampler) -> Pair:
    """One agent writes the entry point alone."""
    return [], sample([sample.render(SINGLE_SYSTEM, p.single_prompt()) for p in ps], ["main"] * len(ps))


def _concat(ps: list[Problem], sample: _Sampler) -> Pair:
    """Helper and main write independently, in one batch (also how the MAGRPO-trained pair is evaluated)."""
    n = len(ps)
    prompts = [sample.render(HELPER_SYSTEM, p.helper_prompt()) for p in ps]
    prompts += [sample.render(MAIN_SYSTEM, p.main_prompt()) for p in ps]
    gens = sample(prompts, ["helper"] * n + ["main"] * n)
    return gens[:n], gens[n:]


def _sequential(ps: list[Problem], sample: _Sampler) -> Pair:
    """The helper writes ``aux`` first; main sees the helper's code."""
    n = len(ps)
    helpers = sample([sample.render(HELPER_SYSTEM, p.helper_prompt()) for p in ps], ["helper"] * n)
    code = [extract_code(h.text)[0] for h in helpers]
    prompts = [
        sample.render(MAIN_SYSTEM, p.main_prompt(helper_code=c or None))
        for p, c in zip(ps, code, strict=True)
    ]
    return helpers, sample(prompts, ["main"] * n, 100_000)


def _discussion(ps: list[Problem], sample: _Sampler) -> Pair:
    """One round: both drafts in one batch, then both revisions (each seeing the other's draft) in one batch. The
    drafts are ``concat``'s call (same prompts, seed and batches): with a sample store they are read, not decoded."""
    n = len(ps)
    h1, m1 = _concat(ps, sample)
    hc = [extract_code(g.text)[0] for g in h1]
    mc = [extract_code(g.text)[0] for g in m1]
    prompts = [sample.render(HELPER_SYSTEM, _revise_helper_prompt(p, hc[i], mc[i])) for i, p in enumerate(ps)]
    prompts += [sample.render(MAIN_SYSTEM, _revise_main_prompt(p, mc[i], hc[i])) for i, p in enumerate(ps)]
    revisions = sample(prompts, ["helper"] * n + ["main"] * n, 200_000)
    h2, m2 = revisions[:n], revisions[n:]
    return [_revised(a, b) for a, b in zip(h1, h2, strict=True)], [
        _revised(a, b) for a, b in zip(m1, m2, strict=True)
    ]


_GENERATE = {"single": _single, "concat": _concat, "magrpo": _concat, "sequential": _sequential,
             "discussion": _discussion}  # fmt: skip


def _score(method: str, ps: list[Problem], helpers, mains, sandbox, chunk: int, progress: bool) -> list:
    """Each sample's reward levels, ``chunk`` samples per sandbox batch (a reward does not depend on its batch)."""
    rewards: list = []
    with progress_bar(len(ps), f"{method}: score", "sample", enable=progress) as bar:
        for a in range(0, len(ps), chunk):
            b = min(len(ps), a + chunk)
            if method == "single":
                truncated = [m.truncated for m in mains[a:b]]
                part = single_rewards(ps[a:b], [m.text for m in mains[a:b]], sandbox, truncated=truncated)
            else:
                truncated = [
                    h.truncated or m.truncated for h, m in zip(helpers[a:b], mains[a:b], strict=True)
                ]
                helper_texts, main_texts = [h.text for h in helpers[a:b]], [m.text for m in mains[a:b]]
                part = level_rewards(ps[a:b], helper_texts, main_texts, sandbox, truncated=truncated)
            rewards += part
            bar.update(len(part))
            bar.set_postfix(reward=f"{sum(r.total for r in rewards) / len(rewards):.3f}")
    return rewards


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
    cache: SampleCache | None = None,
) -> list[dict]:
    """Generate and score ``num_samples`` samples per problem with ``method``.

    Args:
        adapters: use the peft adapters named ``helper`` and ``main`` (per-row) instead of the bare model.
        progress: allow the progress bars (module docstring); ``False`` never draws them.
        cache: the bare model's store of earlier calls (:class:`orchestry.llm.sampling.SampleCache`): a call made
            before (``discussion``'s drafts are ``concat``'s call) is read, not decoded again; unused with adapters.

    Returns:
        one record per (problem, sample), ordered by problem then sample.

    Raises:
        ValueError: unknown method.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r} (allowed: {', '.join(METHODS)})")
    t0 = time.time()
    jobs = [(p, s) for p in problems for s in range(num_samples)]
    ps = [p for p, _ in jobs]
    calls = _generate_calls(method, len(jobs), batch_size)
    with progress_bar(calls, f"{method}: generate", "batch", enable=progress) as gen_bar:
        sample = _Sampler(model, tokenizer, sampling, seed, batch_size, adapters, gen_bar, cache)
        helpers, mains = _GENERATE[method](ps, sample)
    rewards = _score(method, ps, helpers, mains, sandbox, max(1, batch_size), progress)
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
