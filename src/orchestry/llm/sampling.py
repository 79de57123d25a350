"""One sampled completion per prompt for many prompts, ``batch_size`` prompts per batched ``generate`` call: what
the baselines, ``evaluate`` and the registered model's ``predict`` decode with (:func:`sample_texts`); and the
store of earlier calls' completions that lets a call made twice decode once (:class:`SampleCache`)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestry.config import SamplingParams
from orchestry.llm.local import generate, row_seeds

log = logging.getLogger("orchestry.llm.sampling")


@dataclass
class SampledText:
    """One sampled completion: its text, token counts, its share of the batched call's seconds, and whether it
    reached ``max_completion_length`` (cut)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    truncated: bool = False  # the (last round's) completion reached max_completion_length


class SampleCache:
    """The completions of earlier :func:`sample_texts` calls of a bare model (no adapters), one JSON file per call
    under ``root``: with the baselines' store (``.orchestry/samples/``), discussion's first drafts are
    concat's samples (the same prompts, seed and batches), decoded once per pipeline run.

    A call's key is the SHA-256 of ``identity`` (everything else a sample depends on: the model folder's
    fingerprint and dtype, the decoder's numerics, the machine record, the code's fingerprint) and of the call's
    prompts, sampling parameters, seed and batch size. :meth:`get` returns the stored completions (texts, token
    counts, the seconds measured when they were decoded, truncation) or None; ``hits`` and ``misses`` count
    lookups. Files are written whole (a temporary file renamed into place), so processes sharing the folder never
    read half a file; a file that cannot be read or parsed is a miss, and a failed write is logged and loses
    nothing but the reuse.

    Args:
        root: the folder (created on the first write).
        identity: JSON-serialisable; two stores with different identities never share a call.
    """

    def __init__(self, root: str | Path, identity: dict):
        self.root = Path(root)
        self.identity = json.dumps(identity, sort_keys=True)
        self.hits = self.misses = 0

    def key(self, prompts: Sequence[str], sampling: SamplingParams, seed: int, batch_size: int) -> str:
        """SHA-256 hex of the identity and the call's arguments."""
        call = {
            "prompts": list(prompts),
            "sampling": sampling.model_dump(mode="json"),
            "seed": seed,
            "batch_size": batch_size,
        }
        payload = json.dumps({"identity": self.identity, "call": call}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def get(self, key: str, n: int) -> list[SampledText] | None:
        """The ``n`` completions stored under ``key``, or None (none stored, unreadable, or not ``n`` of them)."""
        try:
            rows = json.loads(self._path(key).read_text())
            texts = [SampledText(**row) for row in rows]
        except (OSError, ValueError, TypeError):
            texts = None
        if texts is None or len(texts) != n:
            self.misses += 1
            return None
        self.hits += 1
        return texts

    def put(self, key: str, texts: Sequence[SampledText]) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w") as fh:
                json.dump([asdict(t) for t in texts], fh)
            os.replace(tmp, self._path(key))
        except OSError as e:
            log.error("could not store samples under %s: %s", self.root, e)


def sample_texts(
    model,
    tokenizer,
    prompts: Sequence[str],
    adapters: Sequence[str] | None,
    sampling: SamplingParams,
    seed: int,
    batch_size: int = 32,
    bar=None,
    cache: SampleCache | None = None,
) -> list[SampledText]:
    """Sample one completion per rendered prompt, ``batch_size`` rows per ``generate`` call.

    Each row samples from a random stream of its own, seeded from ``seed``, its prompt and how many rows before
    it repeat that prompt (:func:`orchestry.llm.local.row_seeds`): a row's completion is the same whatever the
    batch size, the order of the prompts or the other prompts of the call (up to the logits' last bits, which can
    change with the batch's shape: a different token then needs a near-tie in the nucleus; measured on an Intel
    Xeon with AMX, 79 of 80 evaluation samples equal at 64 and 256 rows per call, docs/reproducibility.md), and rows
    of two agent pairs on the same prompts share their random numbers.

    ``bar``: an optional progress bar (:func:`orchestry.progress.progress_bar`) advanced by one per call, its
    postfix the call's completion tokens per second. ``cache``: a :class:`SampleCache` of the bare model; the
    completions of a call already in it are returned without decoding (the bar jumps over its calls), the others
    are stored in it.

    Raises:
        ValueError: ``cache`` with ``adapters`` (the store's identity names no adapter weights).
    """
    if cache is not None:
        if adapters is not None:
            raise ValueError("a SampleCache holds the bare model's samples: it cannot be used with adapters")
        key = cache.key(prompts, sampling, seed, batch_size)
        stored = cache.get(key, len(prompts))
        if stored is not None:
            if bar is not None:
                bar.update(-(-len(prompts) // max(1, batch_size)))
            return stored
        out = sample_texts(model, tokenizer, prompts, None, sampling, seed, batch_size, bar)
        cache.put(key, out)
        return out
    out: list[SampledText] = []
    seeds = row_seeds(prompts, seed)
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
            row_seeds=seeds[start : start + batch_size],
        )
        per_row = b.seconds / max(1, len(chunk))
        out += [
            SampledText(i.text, i.prompt_tokens, i.completion_tokens, per_row, i.truncated) for i in b.items
        ]
        if bar is not None:
            bar.update(1)
            bar.set_postfix(tok_s=f"{sum(i.completion_tokens for i in b.items) / max(b.seconds, 1e-9):.0f}")
    return out
