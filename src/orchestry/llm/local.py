"""Batched multi-adapter generation with the local model (:func:`generate`): prompts grouped and prefilled once,
decoded in rounds by :mod:`orchestry.llm.decoding`'s kernels (or ``model.generate``) with per-row LoRA adapters.
Loading the model is :mod:`orchestry.llm.loading`; the training pass's log-probs are :mod:`orchestry.llm.logprobs`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from orchestry.llm import decoding
from orchestry.llm.decoding import LlamaDecoder, StackedLoRA, lora_layer_class
from orchestry.llm.loading import has_adapters

log = logging.getLogger("orchestry.llm")


@dataclass
class Generation:
    """One sampled completion.

    Attributes:
        text: decoded completion (special tokens removed).
        prompt_tokens / completion_tokens: counts (tokens).
        row: index of this row in the padded batch returned by :func:`generate`.
        truncated: the completion reached ``max_new_tokens`` (cut by the token limit, set by :func:`generate`).
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    row: int
    truncated: bool = False


@dataclass
class GenerationBatch:
    """A batched ``generate`` result kept for the policy-gradient pass (no recomputation of prompts).

    Attributes:
        sequences: ``[B, P + T]`` token ids (left-padded prompt of width P, then T completion tokens).
        attention_mask: ``[B, P + T]`` 1 on real prompt tokens and on completion tokens up to and incl. EOS.
        prompt_width: P.
        items: one :class:`Generation` per row.
        seconds: wall time of the call.
    """

    sequences: torch.Tensor
    attention_mask: torch.Tensor
    prompt_width: int
    items: list[Generation]
    seconds: float

    @property
    def completion_mask(self) -> torch.Tensor:
        """``[B, T]`` mask of completion tokens that count (up to and including EOS)."""
        return self.attention_mask[:, self.prompt_width :]


def chat_prompt(tokenizer, user: str, system: str | None = None) -> str:
    """Render one user turn with the model's chat template (generation prompt appended)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}
    ]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return (system + "\n\n" if system else "") + user + "\n"


def prompt_groups(ids: torch.Tensor, mask: torch.Tensor, tags: Sequence | None = None):
    """Rows that share a prompt (and tag, e.g. adapter): ``(first_row_of_group, group_of_row)``; None if all differ.

    The G samples of one agent on one problem share their prompt: its forward pass is then done once.
    """
    seen: dict = {}
    index = []
    for i in range(ids.shape[0]):
        key = (tuple(ids[i][mask[i].bool()].tolist()), tags[i] if tags is not None else None)
        index.append(seen.setdefault(key, len(seen)))
    if len(seen) == len(index):
        return None
    first = [index.index(g) for g in range(len(seen))]
    return torch.tensor(first), torch.tensor(index)


PREFILL_TOKENS = 2048  # padded positions per prefill forward: prompts sorted by length, cut into such buckets


def _prefill_buckets(lengths: Sequence[int], budget: int | None = None) -> list[list[int]]:
    """Indices of ``lengths`` sorted longest first (ties in index order), cut into consecutive buckets of at most
    ``budget`` (default :data:`PREFILL_TOKENS`) padded positions (rows x the bucket's longest; a bucket holds at
    least one row). Left padding to the batch's longest prompt is then paid only within a bucket of similar
    lengths."""
    budget = PREFILL_TOKENS if budget is None else budget
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    buckets: list[list[int]] = []
    for i in order:
        if buckets and (len(buckets[-1]) + 1) * lengths[buckets[-1][0]] <= budget:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets


def _prefill_groups(model, ids: torch.Tensor, mask: torch.Tensor, groups, row_kwargs=None):
    """Keys and values of ``ids[:, :-1]`` (left-padded prompts), computed once per group of rows sharing a prompt.

    The last prompt token is left out so that decoding still has a token to process. The distinct prompts are
    prefilled in buckets of similar length (:func:`_prefill_buckets`), each bucket only as wide as its longest
    prompt, so the left padding of short prompts to the batch's longest is not computed: content positions keep
    their position ids (counted from each prompt's first token) and land at the same positions as in one padded
    forward; padding positions hold zeros, which the attention mask hides.

    Args:
        groups: ``(first_row_of_group [n], group_of_row [B])`` (:func:`prompt_groups`).
        row_kwargs: ``row_kwargs(rows)`` -> extra forward kwargs for the prefill of ``ids[rows]`` (e.g. per-row
            adapters), called before each bucket's forward.

    Returns:
        ``(keys, values)``: one ``[n, H_kv, W - 1, D]`` tensor per layer (``W = ids.shape[1]``; empty lists when
        every prompt is one token long).
    """
    from transformers import DynamicCache

    first, _ = groups
    sub_ids, sub_mask = ids[first, :-1], mask[first, :-1]
    n, W = sub_ids.shape
    lengths = sub_mask.sum(dim=1).tolist()
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    for bucket in _prefill_buckets(lengths):
        w = max(lengths[j] for j in bucket)
        if w == 0:  # one-token prompts: nothing before the token that decoding processes
            continue
        sel = torch.tensor(bucket, device=sub_ids.device)
        b_ids, b_mask = sub_ids[sel, W - w :], sub_mask[sel, W - w :]
        cache = DynamicCache()
        extra = row_kwargs(first[sel]) if row_kwargs is not None else {}
        model(
            input_ids=b_ids,
            attention_mask=b_mask,
            position_ids=(b_mask.cumsum(dim=1) - 1).clamp(min=0),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
            **extra,
        )
        for i, layer in enumerate(cache.layers):
            if len(keys) <= i:
                shape = (n, layer.keys.shape[1], W, layer.keys.shape[3])
                keys.append(layer.keys.new_zeros(shape))
                values.append(layer.values.new_zeros(shape))
            keys[i][sel, :, W - layer.keys.shape[2] :] = layer.keys
            values[i][sel, :, W - layer.values.shape[2] :] = layer.values
    return keys, values


def _prefix_cache(model, ids: torch.Tensor, mask: torch.Tensor, groups, max_len: int, row_kwargs=None):
    """The prompts' keys and values (:func:`_prefill_groups`) spread to every row, in a transformers
    ``StaticCache`` of ``max_len`` positions: ``model.generate`` then writes each new position in place, where the
    default dynamic cache re-allocates and copies the whole cache at every step (its cost is measured in
    benchmarks/README.md, "Decoding details")."""
    from transformers import DynamicCache

    keys, values = _prefill_groups(model, ids, mask, groups, row_kwargs)
    full = DynamicCache()
    for i in range(len(keys)):
        full.update(keys[i], values[i], i)
    return _static_rows(model, full, groups[1], max_len)


def _static_rows(model, cache, rows: torch.Tensor, max_len: int):
    """A new ``StaticCache`` of ``max_len`` positions holding the filled positions of ``cache``'s ``rows``."""
    from transformers import StaticCache

    n = int(cache.get_seq_length())
    static = StaticCache(config=model.config, max_cache_len=max_len)
    for i, layer in enumerate(cache.layers):
        static.update(layer.keys[rows, :, :n], layer.values[rows, :, :n], i)
    return static


class _FenceStop:
    """Per-row stopping: a row is done once its completion closes a ```-fenced code block.

    The embedded model answers with a fenced block followed by prose; everything after the closing fence is
    wasted decoding (gain measured in benchmarks/README.md, levers table). Returns a ``[B]`` bool tensor as
    transformers expects.
    """

    def __init__(self, tokenizer, prompt_width: int):
        self.tok = tokenizer
        self.p = prompt_width
        self._ticks: dict[int, bool] = {}  # token id -> its text holds a backtick (see ticks)

    def ticks(self, tokens: torch.Tensor) -> torch.Tensor:
        """bool ``[B]``: which of ``tokens`` have a backtick in their text (each id decoded once per stopper).

        A completion's count of closed fences can only change when such a token is appended: a backtick is the
        single byte 0x60 in UTF-8 (never inside another character), so other tokens do not touch a run of
        backticks. A row that was not done before and whose new token holds none is not done now."""
        ids = tokens.tolist()
        for i in ids:
            if i not in self._ticks:
                self._ticks[i] = "`" in self.tok.decode([i])
        return torch.tensor([self._ticks[i] for i in ids], dtype=torch.bool)

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        done = []
        for row in input_ids[:, self.p :]:
            text = self.tok.decode(row[-48:], skip_special_tokens=True) if row.numel() else ""
            full = self.tok.decode(row, skip_special_tokens=True) if text.count("```") else ""
            done.append(full.count("```") >= 2)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class NucleusSampler:
    """Temperature + nucleus (top-p) sampling as a transformers logits processor, without sorting the vocabulary.

    Draws the next token from exactly the distribution of transformers' ``TemperatureLogitsWarper`` +
    ``TopPLogitsWarper`` + multinomial sampling (Holtzman et al. 2020, "The Curious Case of Neural Text
    Degeneration", nucleus = the most probable tokens whose exclusive cumulative probability is below ``top_p``),
    and returns scores that are 0 for the drawn token and -inf elsewhere, so that greedy decoding
    (``do_sample=False``) emits it. The nucleus is searched among the ``candidates`` most probable tokens
    (``torch.topk``); a row whose nucleus is larger than that falls back to a full sort. Sorting the 49k-token
    vocabulary and drawing an exponential variate per vocabulary entry took a sixth of each decoding step of the
    embedded model at 16-32 rows (measured with torch.profiler, see benchmarks/README.md); this draws from the
    candidates only.

    The random numbers: by default torch's global generator (``torch.manual_seed`` in :func:`generate`), one
    multinomial draw over the whole batch per step, so a row's tokens depend on which rows share its steps. With
    ``row_seeds`` each row has a stream of its own (a ``torch.Generator`` seeded with its seed, one float64 uniform
    per drawn token) and its token is the inverse CDF of its nucleus at that uniform (the same distribution): a
    row's tokens then depend only on its own logits and seed, not on the batch it is decoded in, the other rows'
    lengths or the call boundaries. Set :attr:`rows` to the batch's row indices (into ``row_seeds``) whenever the
    batch changes.

    Args:
        temperature: > 0. top_p: in (0, 1]; 1 keeps the whole vocabulary. candidates: top-k searched first.
        first: a smaller top-k searched before ``candidates`` (the same draws, less work).
        row_seeds: one seed per row of the call (0 <= seed < 2**63), or None (the global generator).
    """

    def __init__(
        self,
        temperature: float,
        top_p: float,
        candidates: int = 1024,
        first: int = 256,
        row_seeds: Sequence[int] | None = None,
    ):
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.temperature, self.top_p, self.candidates = float(temperature), float(top_p), int(candidates)
        self.first = int(first)
        self.streams = (
            None if row_seeds is None else [torch.Generator().manual_seed(int(s)) for s in row_seeds]
        )
        self.rows: list[int] | None = None  # the current batch's rows (indices into row_seeds); None: 0..B-1

    def probabilities(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(probs [B, K], token ids [B, K])``: each row's nucleus, renormalised, padded with zero probability
        (``K`` = :attr:`candidates`, or wider when a nucleus is; the ids after a row's nucleus are unspecified).

        The nucleus is searched among each row's top :attr:`first` tokens first, and among the top
        :attr:`candidates` only for the rows whose nucleus is still open there (its exclusive cumulative mass at the
        last of them below ``top_p + 1e-4``: the margin covers rounding in the cumulative sum) or holds tied
        logits (``topk`` orders ties differently for another k), then by a full sort for a row whose nucleus is
        wider still. The probabilities and the nucleus ids are those of one search among the top
        :attr:`candidates` of every row (the same draws, the same random numbers taken); a ``topk`` of 256 took
        3.4 ms against 7.7 ms for 1024 on 32 rows of the embedded model's vocabulary (benchmarks/README.md)."""
        logits = scores.float() / self.temperature
        k = min(self.candidates, logits.shape[-1]) if self.top_p < 1 else logits.shape[-1]
        first = min(self.first, k) if self.top_p < 1 else k  # top_p 1: the whole vocabulary anyway
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        top, probs, ids, outside = self._top_mass(logits, lse, first)
        if first < k:
            probs = torch.nn.functional.pad(probs, (0, k - first))
            ids = torch.nn.functional.pad(ids, (0, k - first))
            outside = torch.nn.functional.pad(outside, (0, k - first), value=self.top_p)  # not kept
            # topk orders tied values by its algorithm, which depends on k: a row with a tie among its nucleus
            # (or between its last token and the next) takes the top-k search too, so its ids keep their order
            size = (outside[:, :first] < self.top_p).sum(dim=-1, keepdim=True)  # nucleus size, >= 1
            ties = (top[:, 1:] == top[:, :-1]) & (torch.arange(first - 1, device=logits.device) < size)
            still_open = outside[:, first - 1] < self.top_p + 1e-4
            wide = (still_open | ties.any(dim=-1)).nonzero().squeeze(1)
            if wide.numel():
                _, probs[wide], ids[wide], outside[wide] = self._top_mass(logits[wide], lse[wide], k)
        keep = outside < self.top_p  # the nucleus: exclusive cumulative mass below top_p
        keep[:, 0] = True
        spill = keep[:, -1] & (k < logits.shape[-1])  # the nucleus may extend beyond the candidates
        if bool(spill.any()):
            rows = spill.nonzero().squeeze(1)
            full, full_ids = logits[rows].sort(dim=-1, descending=True)
            fp = torch.softmax(full, dim=-1)
            fkeep = (fp.cumsum(dim=-1) - fp) < self.top_p
            fkeep[:, 0] = True
            width = int(fkeep.sum(dim=-1).max())
            probs = torch.nn.functional.pad(probs, (0, max(0, width - k)))
            ids = torch.nn.functional.pad(ids, (0, max(0, width - k)))
            keep = torch.nn.functional.pad(keep, (0, max(0, width - k)))
            probs[rows], ids[rows], keep[rows] = (
                fp[:, : probs.shape[1]],
                full_ids[:, : ids.shape[1]],
                fkeep[:, : keep.shape[1]],
            )
        probs = probs * keep
        return probs / probs.sum(dim=-1, keepdim=True), ids

    @staticmethod
    def _top_mass(logits: torch.Tensor, lse: torch.Tensor, width: int):
        """Each row's top ``width``: ``(logits, probabilities, ids, exclusive cumulative mass)``, descending."""
        top, ids = logits.topk(width, dim=-1)
        probs = torch.exp(top - lse)
        return top, probs, ids, probs.cumsum(dim=-1) - probs

    def draw(self, scores: torch.Tensor) -> torch.Tensor:
        """``[B]`` token ids drawn from each row's nucleus of ``scores [B, V]``: one multinomial draw per row (or
        one uniform of each row's own stream, see the class doc), the token that ``argmax(self(None, scores))``
        picks, without making the ``[B, V]`` scores."""
        probs, ids = self.probabilities(scores)
        if self.streams is None:
            return ids.gather(-1, torch.multinomial(probs, 1)).squeeze(-1)
        rows = range(probs.shape[0]) if self.rows is None else self.rows
        if len(rows) != probs.shape[0]:
            raise ValueError(f"the sampler's rows name {len(rows)} rows, the scores hold {probs.shape[0]}")
        u = torch.stack([torch.rand((), dtype=torch.float64, generator=self.streams[r]) for r in rows])
        return ids.gather(-1, inverse_cdf(probs, u)[:, None]).squeeze(-1)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        drawn = self.draw(scores)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, drawn[:, None], 0.0)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``[B]`` column of each row of ``probs [B, K]`` (non-negative, a row's positive entries first) whose
    cumulative mass first exceeds ``u [B]`` (in [0, 1)) times the row's total: a draw from the row's
    distribution at the uniform ``u``. Sums in float64; never a zero-probability column."""
    cdf = probs.double().cumsum(dim=-1)
    col = torch.searchsorted(cdf, (u.double() * cdf[:, -1])[:, None], right=True).squeeze(-1)
    # u * total rounding up to the total: the row's last positive entry
    return torch.minimum(col, (probs > 0).sum(dim=-1) - 1)


def row_seeds(prompts: Sequence[str], seed: int) -> list[int]:
    """One random-stream seed per row (:class:`NucleusSampler`'s ``row_seeds``): SHA-256 of ``seed``, the row's
    prompt and how many rows before it repeat that prompt (the k-th sample of a prompt), cut to 63 bits.

    A row's seed names what it is, not where it sits: the same prompt's k-th row gets the same seed in any
    call, batch or order (the first problems of a set are a subset of the whole set's rows), and two agent pairs
    sampled on the same prompts with the same ``seed`` share their random numbers row by row (a paired comparison
    of the pairs sees the adapters' difference, not the draws')."""
    import hashlib

    seen: dict[str, int] = {}
    out = []
    for prompt in prompts:
        k = seen.get(prompt, 0)
        seen[prompt] = k + 1
        digest = hashlib.sha256(f"{int(seed)}\x00{k}\x00{prompt}".encode()).digest()
        out.append(int.from_bytes(digest[:8], "little") >> 1)
    return out


ROUND_TOKENS = 16  # decoding round length: finished rows leave the batch between rounds


def _generate_in_rounds(
    model, enc, kwargs: dict, tokenizer, width: int, fence_stop: bool, stacked=None, sampler=None
) -> torch.Tensor:
    """``model.generate`` in rounds of ``ROUND_TOKENS`` new tokens, continuing each round from the KV cache of
    the previous one with the unfinished rows only. Returns ``[B, width + T]`` ids laid out as one ``generate``
    call returns them (rows that stopped early padded with the pad token). ``stacked``: a
    :class:`orchestry.llm.decoding.StackedLoRA` whose hooks are on, given each round's per-row adapters instead of
    peft's ``adapter_names``. ``sampler``: the :class:`NucleusSampler` among ``kwargs``' logits processors, told
    each round's rows."""
    from transformers import StaticCache

    pad = tokenizer.pad_token_id
    device = getattr(model, "device", torch.device("cpu"))
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    B = ids.shape[0]
    left = int(kwargs.pop("max_new_tokens"))
    adapter_names = kwargs.pop("adapter_names", None)
    cache = kwargs.pop("past_key_values", None)
    stop = _FenceStop(tokenizer, width) if fence_stop else None
    active = torch.arange(B)
    new_tokens: list[list[int]] = [[] for _ in range(B)]
    while left > 0 and active.numel():
        if sampler is not None:
            sampler.rows = active.tolist()
        kw = dict(kwargs, max_new_tokens=min(ROUND_TOKENS, left), return_dict_in_generate=True)
        if cache is not None:
            kw["past_key_values"] = cache
        if adapter_names is not None:
            names = [adapter_names[i] for i in active.tolist()]
            if stacked is not None:
                stacked.set_rows(names)
            else:
                kw["adapter_names"] = names
        res = model.generate(input_ids=ids, attention_mask=mask, **kw)
        new = res.sequences[:, ids.shape[1] :]
        done = ((new == tokenizer.eos_token_id) | (new == pad)).any(dim=1)
        if stop is not None:
            done |= stop(res.sequences, None)
        keep = _end_round(new_tokens, active, new, done)
        left -= new.shape[1]
        if left <= 0 or keep.numel() == 0:
            break
        cache = res.past_key_values
        if isinstance(cache, StaticCache):  # copy the unfinished rows' filled positions into a smaller one
            cache = _static_rows(model, cache, keep, int(cache.get_max_length()))
        else:
            cache.batch_select_indices(keep)
        ids = res.sequences[keep]
        ones = torch.ones(mask.shape[0], new.shape[1], dtype=mask.dtype, device=device)
        mask = torch.cat([mask, ones], dim=1)[keep]
        active = active[keep.cpu()]
    return _laid_out(enc["input_ids"], new_tokens, pad)


def _end_round(new_tokens: list[list[int]], active: torch.Tensor, new: torch.Tensor, done: torch.Tensor):
    """Append each active row's round of ``new`` tokens to ``new_tokens`` (indexed by original row; the ids come
    back to the CPU here); return the indices, within this round's batch, of the rows that go on (``~done``)."""
    for r, i in enumerate(active.tolist()):
        new_tokens[i] += new[r].tolist()
    return (~done).nonzero().squeeze(1)


def _laid_out(prompt_ids: torch.Tensor, new_tokens: list[list[int]], pad: int) -> torch.Tensor:
    """``[B, width + T]``: the prompts, then each row's new tokens, rows that stopped early padded with ``pad``."""
    B, width = prompt_ids.shape
    T = max(len(t) for t in new_tokens)
    out = torch.full((B, width + T), pad, dtype=prompt_ids.dtype)
    out[:, :width] = prompt_ids
    for i, t in enumerate(new_tokens):
        out[i, width : width + len(t)] = torch.tensor(t, dtype=out.dtype)
    return out


@torch.no_grad()
def _decode_in_rounds(
    decoder, prefix, enc, tokenizer, width: int, max_new_tokens: int, sampler, fence_stop: bool, names=None
) -> torch.Tensor:
    """What :func:`_generate_in_rounds` returns, with each step computed by a
    :class:`orchestry.llm.decoding.LlamaDecoder` instead of ``model.generate``.

    The same token choice as transformers' greedy loop over :class:`NucleusSampler`'s scores (``argmax``), the same
    rows carried through a round after they finish (emitting the pad token, and drawing from the random stream as
    ``generate`` does), the same rounds of ``ROUND_TOKENS`` and rows dropped between them, a round ended early once
    every row is done: the same completions (``tests/test_decoding.py``; the attention's sums over the shared
    prompt positions run in another order, so logits agree to rounding).

    Args:
        prefix: the prompts' positions ``< width - 1``, once per distinct prompt
            (:class:`orchestry.llm.decoding.SharedPrefix`); each row's later positions (its last prompt token, then
            its new tokens) go to a per-row cache of ``max_new_tokens`` positions.
        sampler: a :class:`NucleusSampler`, or None for greedy decoding. names: per-row adapters (with the
            decoder's StackedLoRA), or None.
    """
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    seqs, mask = enc["input_ids"], enc["attention_mask"]
    B = seqs.shape[0]
    like = prefix.values[0]
    shape = (B, decoder.kv_heads, int(max_new_tokens), decoder.head_dim)
    keys = [like.new_zeros(shape) for _ in prefix.values]
    values = [like.new_zeros(shape) for _ in prefix.values]
    attend = torch.zeros(B, shape[2], dtype=torch.bool)
    attend[:, 0] = True  # the last prompt token, the first one decoded (rows are left-padded: never padding)
    positions = mask.long().sum(dim=1) - 1  # its position id
    t = 0  # its position in the rows' own cache
    stop = _FenceStop(tokenizer, width) if fence_stop else None
    active = torch.arange(B)
    new_tokens: list[list[int]] = [[] for _ in range(B)]
    left = int(max_new_tokens)
    while left > 0 and active.numel():
        if sampler is not None:
            sampler.rows = active.tolist()
        if names is not None:
            decoder.row_mask = decoder.stacked.row_mask([names[i] for i in active.tolist()])
        start = seqs.shape[1]
        unfinished = torch.ones(seqs.shape[0], dtype=torch.long)
        for _ in range(min(ROUND_TOKENS, left)):
            logits = decoder.step(seqs[:, -1], positions, keys, values, t, attend, prefix)
            # the drawn token: what the greedy argmax over the sampler's 0 / -inf scores picks, without them
            token = sampler.draw(logits) if sampler is not None else torch.argmax(logits, dim=-1)
            token = token * unfinished + pad * (1 - unfinished)
            seqs = torch.cat([seqs, token[:, None]], dim=-1)
            finished = token == eos
            if stop is not None:  # only a row whose new token holds a backtick can have closed its block
                check = (unfinished.bool() & stop.ticks(token)).nonzero().squeeze(1)
                if check.numel():
                    finished[check] |= stop(seqs[check], None)
            unfinished = unfinished & ~finished
            t, positions = t + 1, positions + 1
            if t < attend.shape[1]:
                attend[:, t] = True
            if not bool(unfinished.any()):
                break
        new = seqs[:, start:]
        # what _generate_in_rounds finds at a round's end (an EOS or pad token, or a closed fence): a row that
        # finished has unfinished == 0, and one that did not saw the fence test fail on these very tokens
        done = (unfinished == 0) | (new == pad).any(dim=1)
        keep = _end_round(new_tokens, active, new, done)
        left -= new.shape[1]
        if left <= 0 or keep.numel() == 0:
            break
        if keep.numel() < seqs.shape[0]:  # the unfinished rows only, in smaller tensors
            keys, values = [k[keep] for k in keys], [v[keep] for v in values]
            seqs, attend, positions = seqs[keep], attend[keep], positions[keep]
            prefix.select(keep)
        active = active[keep]
    return _laid_out(enc["input_ids"], new_tokens, pad)


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: Sequence[str],
    adapter_names: Sequence[str] | None = None,
    max_new_tokens: int = 128,
    temperature: float = 0.8,
    top_p: float = 0.95,
    seed: int = 0,
    stop_at_code_end: bool = True,
    stacked_lora: bool = True,
    fast_decoding: bool = True,
    row_seeds: Sequence[int] | None = None,
) -> GenerationBatch:
    """Sample one completion per prompt in ONE batched generation (all rows decoded together).

    Each distinct prompt (with its adapter) is prefilled once and its KV cache shared by the rows that repeat it;
    decoding runs in rounds of ``ROUND_TOKENS`` tokens and drops the rows that have finished (EOS, or a closed
    code block with ``stop_at_code_end``) between rounds, so finished rows stop costing compute.

    Args:
        prompts: fully rendered prompts (see :func:`chat_prompt`), ``B`` of them.
        adapter_names: per-row LoRA adapter (peft mixed-adapter batch), ``None`` for the bare model.
        temperature: 0 means greedy decoding.
        seed: seeds torch's sampler, so the same batch gives the same completions on CPU.
        row_seeds: one random-stream seed per prompt (:func:`row_seeds`): each row samples from its own stream
            (:class:`NucleusSampler`), so its completion does not depend on the other rows of the call or on
            ``seed`` (up to the logits' rounding, which can differ in the last bits with the batch's shape). None:
            torch's global generator, seeded with ``seed``.
        stacked_lora: per-row adapters through :class:`orchestry.llm.decoding.StackedLoRA` (two products per
            LoRA layer); False: through peft's mixed batch (the same completions, slower; kept for comparison).
        fast_decoding: decode with :class:`orchestry.llm.decoding.LlamaDecoder` where it covers the model (fp32
            Llama on the CPU with the decoding kernels; see ``LlamaDecoder.unsupported``), else with
            ``model.generate``: the same completions either way, the first faster (benchmarks/README.md).

    Returns:
        :class:`GenerationBatch` with ``sequences [B, P+T]``.
    """
    from transformers import LogitsProcessorList, StoppingCriteriaList

    t0 = time.time()
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    width = enc["input_ids"].shape[1]
    kwargs = dict(
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    # sampling: NucleusSampler draws the token (same distribution as transformers' temperature + top-p warpers,
    # without sorting the vocabulary) and greedy decoding emits it
    kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    if row_seeds is not None and len(row_seeds) != len(prompts):
        raise ValueError(f"row_seeds holds {len(row_seeds)} seeds for {len(prompts)} prompts")
    sampler = (
        NucleusSampler(temperature, top_p, row_seeds=row_seeds) if temperature and temperature > 0 else None
    )
    if sampler is not None:
        kwargs["logits_processor"] = LogitsProcessorList([sampler])
    if stop_at_code_end:
        kwargs["stopping_criteria"] = StoppingCriteriaList([_FenceStop(tokenizer, width)])
    if adapter_names is not None:
        kwargs["adapter_names"] = list(adapter_names)
    was_training = model.training
    model.eval()  # peft refuses per-row adapters in training mode
    torch.manual_seed(seed)
    stacked = _stacked_lora(model, adapter_names) if stacked_lora else None
    try:
        with stacked.hooks() if stacked is not None else contextlib.nullcontext():
            # rows repeating a prompt (G samples per agent and problem): prefill each distinct prompt once
            decoder = None
            if width > 1:
                rows = torch.arange(len(prompts))
                groups = prompt_groups(enc["input_ids"], enc["attention_mask"], adapter_names) or (
                    rows,
                    rows,
                )
                row_kwargs = None
                if adapter_names is not None:

                    def row_kwargs(sel: torch.Tensor) -> dict:
                        names = [adapter_names[i] for i in sel.tolist()]
                        if stacked is not None:
                            stacked.set_rows(names)
                            return {}
                        return {"adapter_names": names}

                device = getattr(model, "device", torch.device("cpu"))
                ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
                groups = tuple(t.to(device) for t in groups)
                bare = _decoder_bare(model, stacked, adapter_names) if fast_decoding else None
                # LlamaDecoder covers the model: its reordered weights are made after the prefill (memory)
                if bare is not None:
                    # model.decode_dtype bf16: the prompts' forward under bf16 autocast as well (as the update's
                    # forward runs where bf16 is native); its cached keys and values come out fp32 all the same
                    # (tests/test_decoding.py), as the decoding steps need them
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=decoding.DECODE_BF16):
                        keys, values = _prefill_groups(model, ids, mask, groups, row_kwargs)
                    prefix = decoding.SharedPrefix(keys, values, mask[groups[0], :-1], groups[1])
                    decoder = decoding.LlamaDecoder(model, stacked, bare=bare)
                else:
                    kwargs["past_key_values"] = _prefix_cache(
                        model, ids, mask, groups, max_len=width + max_new_tokens, row_kwargs=row_kwargs
                    )
            if decoder is not None:
                out = _decode_in_rounds(
                    decoder,
                    prefix,
                    enc,
                    tokenizer,
                    width,
                    max_new_tokens,
                    sampler,
                    stop_at_code_end,
                    adapter_names if stacked is not None else None,
                )
            else:
                out = _generate_in_rounds(
                    model, enc, kwargs, tokenizer, width, stop_at_code_end, stacked, sampler
                )
    finally:
        model.train(was_training)
    completion = out[:, width:]
    # mask completion tokens after the first EOS (and padding)
    is_eos = completion == tokenizer.eos_token_id
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    comp_mask = (~after_eos).long()
    if tokenizer.pad_token_id != tokenizer.eos_token_id:
        comp_mask = comp_mask * (completion != tokenizer.pad_token_id).long()
    attn = torch.cat([enc["attention_mask"], comp_mask], dim=1)
    items = []
    for i in range(out.shape[0]):
        n = int(comp_mask[i].sum())
        ids = completion[i, :n]
        items.append(
            Generation(
                text=tokenizer.decode(ids, skip_special_tokens=True),
                prompt_tokens=int(enc["attention_mask"][i].sum()),
                completion_tokens=n,
                row=i,
                truncated=n >= max_new_tokens,
            )
        )
    return GenerationBatch(out, attn, width, items, time.time() - t0)


def _decoder_bare(model, stacked, adapter_names: Sequence[str] | None) -> bool | None:
    """Whether a :class:`orchestry.llm.decoding.LlamaDecoder` for this batch runs the bare base model (True), its
    rows' adapters (False), or does not cover the model (None: ``model.generate`` decodes). A batch whose rows all
    name no adapter of the model (peft's ``"__base__"``), or a batch without adapter names inside peft's
    ``disable_adapter()``, runs the bare base model."""
    bare = False
    if stacked is None and has_adapters(model):
        if adapter_names is not None:
            bare = not set(adapter_names) & set(model.peft_config)
        else:
            lora = [m for m in model.modules() if isinstance(m, lora_layer_class())]
            bare = bool(lora) and all(m.disable_adapters for m in lora)
    reason = LlamaDecoder.unsupported(model, stacked, bare)
    if reason:
        log.debug("decoding through model.generate: %s", reason)
        return None
    return bare


def _stacked_lora(model, adapter_names: Sequence[str] | None):
    """A :class:`orchestry.llm.decoding.StackedLoRA` for a batch with per-row adapters, or None: no per-row
    adapters, or LoRA layers it does not cover (then peft's mixed batch runs)."""
    if adapter_names is None or not has_adapters(model):
        return None
    names = sorted(set(adapter_names) & set(model.peft_config))
    if not names:
        return None
    try:
        return StackedLoRA(model, names)
    except ValueError as e:
        log.info("per-row adapters through peft's mixed batch: %s", e)
        return None
