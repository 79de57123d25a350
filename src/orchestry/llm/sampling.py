"""One sampled completion per prompt for many prompts, ``batch_size`` prompts per batched ``generate`` call: what
the baselines, ``evaluate`` and the registered model's ``predict`` decode with (:func:`sample_texts`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestry.config import SamplingParams
from orchestry.llm.local import generate


@dataclass
class SampledText:
    """One sampled completion: its text, token counts, its share of the batched call's seconds, and whether it
    reached ``max_completion_length`` (cut)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    truncated: bool = False  # the (last round's) completion reached max_completion_length


def sample_texts(
    model,
    tokenizer,
    prompts: Sequence[str],
    adapters: Sequence[str] | None,
    sampling: SamplingParams,
    seed: int,
    batch_size: int = 32,
    bar=None,
) -> list[SampledText]:
    """Sample one completion per rendered prompt, ``batch_size`` rows per ``generate`` call.

    ``bar``: an optional progress bar (:func:`orchestry.progress.progress_bar`) advanced by one per call, its
    postfix the call's completion tokens per second.
    """
    out: list[SampledText] = []
    for start in range(0, len(prompts), batch_size):
        chunk = list(prompts[start : start + batch_size])
        ad = list(adapters[start : start + batch_size]) if adapters is not None else None
        b = generate(
            model,
            tokenizer,
            chunk,
            ad,
            max_new_tokens=sampling.max_completion_length,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=seed + start,
        )
        per_row = b.seconds / max(1, len(chunk))
        limit = sampling.max_completion_length
        out += [
            SampledText(i.text, i.prompt_tokens, i.completion_tokens, per_row, i.completion_tokens >= limit)
            for i in b.items
        ]
        if bar is not None:
            bar.update(1)
            bar.set_postfix(tok_s=f"{sum(i.completion_tokens for i in b.items) / max(b.seconds, 1e-9):.0f}")
    return out
