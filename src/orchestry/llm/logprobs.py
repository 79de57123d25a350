"""Log-probabilities of completions under the local model, for the policy-gradient pass: rows packed by prompt
(:func:`completion_logprobs`) and the LM head's log-softmax in chunks with its own backward (:func:`token_logprobs`).
"""

from __future__ import annotations

import torch

from orchestry.llm.frozen import weight_cast
from orchestry.llm.local import prompt_groups


def completion_logprobs(model, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int):
    """Sum of log π(y_t | x, y_<t) over each row's completion tokens.

    Rows are packed by prompt (:func:`_packed_logprobs`): each distinct prompt goes through the model once,
    followed by the completions that share it, each only as long as it really is; only completion positions go
    through the LM head, so prompt tokens' log-probs are never computed. Rows whose completion mask is not a
    prefix (not made by :func:`generate`) take the plain path: one padded row per sequence, ``logits_to_keep``.

    Args:
        sequences: ``[B, P+T]`` ids from :func:`generate`; attention_mask: ``[B, P+T]``.

    Returns:
        ``(seq_logprob [B], token_logprob [B, T], completion_mask [B, T])``.
    """
    T = sequences.shape[1] - prompt_width
    comp = attention_mask[:, prompt_width:]
    if T > 0 and prompt_width > 0 and bool((comp.cumprod(dim=1) == comp).all()):
        return _packed_logprobs(model, sequences, attention_mask, prompt_width)
    device = getattr(model, "device", sequences.device)
    sequences, attention_mask = sequences.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    out = model(
        input_ids=sequences,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=T + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :].float()  # predictions for positions P .. P+T-1
    targets = sequences[:, prompt_width:]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    mask = attention_mask[:, prompt_width:].to(logp.dtype)
    token_logp = logp * mask
    return token_logp.sum(dim=1), token_logp, mask


HEAD_CHUNK = 256  # positions per LM-head product in token_logprobs


class _TokenLogprobs(torch.autograd.Function):
    """Forward and backward of ``log_softmax(h W^T)[target]`` chunk by chunk (:func:`token_logprobs`)."""

    @staticmethod
    def forward(ctx, h, weight, targets, chunk, dtype):
        w = weight_cast(
            weight, dtype
        )  # autocast's cast of the frozen head, made again in the backward (not kept)
        logits = [torch.nn.functional.linear(h[i : i + chunk], w) for i in range(0, h.shape[0], chunk)]
        out = [
            torch.log_softmax(x.float(), dim=-1)
            .gather(-1, targets[i * chunk : (i + 1) * chunk, None])
            .squeeze(-1)
            for i, x in enumerate(logits)
        ]
        ctx.save_for_backward(weight, targets, *logits)
        ctx.chunk, ctx.dtype = chunk, dtype
        return torch.cat(out) if out else h.new_zeros(0, dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad):
        weight, targets, *logits = ctx.saved_tensors
        weight = weight_cast(weight, ctx.dtype)
        parts = []
        for i, x in enumerate(logits):
            rows = slice(i * ctx.chunk, (i + 1) * ctx.chunk)
            logp = torch.log_softmax(x.float(), dim=-1)  # what autograd would have kept, one chunk at a time
            g = logp.new_zeros(logp.shape).scatter_add_(-1, targets[rows, None], grad[rows, None])
            g = torch._log_softmax_backward_data(g, logp, -1, torch.float32).to(x.dtype)
            parts.append(torch.mm(g, weight))
        return (torch.cat(parts) if parts else grad.new_zeros(0, weight.shape[1])), None, None, None, None


def token_logprobs(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = HEAD_CHUNK):
    """``log softmax(h W^T)[target]`` of each position: the LM head and the log-probs of the sampled tokens.

    The same values and gradient (w.r.t. ``h``) as ``log_softmax(linear(h, W).float()).gather(...)`` under the
    same autocast, computed ``chunk`` positions at a time: autograd would keep the fp32 log-probs of the whole
    vocabulary for every position (``N x V x 4`` bytes, 135 MiB at 720 positions of a 49k vocabulary) and make
    the fp32 copy and the log-softmax of all positions at once; here only the logits in the product's dtype (bf16
    under autocast: half of that) are kept, the rest is recomputed per chunk in the backward. The head weight is
    taken as frozen (LoRA leaves it alone): its autocast copy is made again in the backward, not kept (54 MiB for
    the embedded model; :mod:`orchestry.llm.frozen`); a trainable one goes through autograd as before.

    Args:
        h: ``[N, d]`` hidden states; weight: ``[V, d]``; targets: ``[N]`` token ids.

    Returns:
        ``[N]`` fp32 log-probs.
    """
    if weight.requires_grad:
        logits = torch.nn.functional.linear(h, weight).float()
        return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    dtype = weight.dtype
    if torch.is_autocast_enabled(h.device.type):  # autocast's casts, made here: the Function runs without it
        dtype = torch.get_autocast_dtype(h.device.type)
        h = h.to(dtype)
    with torch.autocast(h.device.type, enabled=False):
        return _TokenLogprobs.apply(h, weight, targets, chunk, dtype)


PACK_TOKENS = 1024  # longest packed row; a prompt's completions beyond it go to another row (prompt repeated)


def _packed_logprobs(
    model, sequences: torch.Tensor, attention_mask: torch.Tensor, P: int, max_pack: int = PACK_TOKENS
):
    """:func:`completion_logprobs` with rows packed by prompt: ``[prompt, c_1, ..., c_m]`` per packed row.

    Each completion attends to its prompt and causally to itself only (a block attention mask), its positions
    continue the prompt's, and its first token is predicted from the prompt's last position: the same
    log-probs as one left-padded row per sequence, without computing the prompt G times or any padding. The
    gradients of the rows that share a prompt add up in its single forward pass.
    """
    B, T = sequences.shape[0], sequences.shape[1] - P
    lengths = attention_mask[:, P:].sum(dim=1).tolist()
    groups = prompt_groups(sequences[:, :P], attention_mask[:, :P])
    group_of = groups[1].tolist() if groups is not None else list(range(B))
    packs: list[list] = []  # [prompt row, member rows, packed length]
    open_pack: dict[int, int] = {}
    for i in range(B):
        if not lengths[i]:
            continue
        k = open_pack.get(group_of[i])
        if k is None or packs[k][2] + lengths[i] > max_pack:
            packs.append([i, [], int(attention_mask[i, :P].sum())])
            k = open_pack[group_of[i]] = len(packs) - 1
        packs[k][1].append(i)
        packs[k][2] += lengths[i]
    token_logp = torch.zeros(B, T)
    if packs:
        S = max(p[2] for p in packs)
        ids = torch.zeros(len(packs), S, dtype=sequences.dtype)
        pos = torch.zeros(len(packs), S, dtype=torch.long)
        seg = torch.full((len(packs), S), -1, dtype=torch.long)
        src_pack, src_pos, dst_row, dst_col, targets = [], [], [], [], []
        for k, (r0, members, _) in enumerate(packs):
            prompt = sequences[r0, :P][attention_mask[r0, :P].bool()]
            Lp = prompt.numel()
            ids[k, :Lp], pos[k, :Lp], seg[k, :Lp] = prompt, torch.arange(Lp), 0
            off = Lp
            for j, i in enumerate(members, start=1):
                L = lengths[i]
                ids[k, off : off + L] = sequences[i, P : P + L]
                pos[k, off : off + L] = torch.arange(Lp, Lp + L)
                seg[k, off : off + L] = j
                src_pack += [k] * L
                src_pos += [Lp - 1, *range(off, off + L - 1)]
                dst_row += [i] * L
                dst_col += range(L)
                targets += sequences[i, P : P + L].tolist()
                off += L
        device = getattr(model, "device", torch.device("cpu"))
        ids, pos, seg = ids.to(device), pos.to(device), seg.to(device)
        q = torch.arange(S, device=device)
        seg_q, seg_k = seg[:, :, None], seg[:, None, :]
        allowed = (q[:, None] >= q[None, :]) & (seg_k >= 0) & ((seg_k == 0) | (seg_k == seg_q))
        allowed = (allowed | torch.eye(S, dtype=torch.bool, device=device))[
            :, None
        ]  # padding queries see themselves
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if (
            getattr(base.config, "_attn_implementation", "sdpa") == "eager"
        ):  # eager adds the mask to the scores
            allowed = torch.zeros(allowed.shape, device=device).masked_fill(
                ~allowed, torch.finfo(torch.float32).min
            )
        hidden = base.get_decoder()(
            input_ids=ids, attention_mask=allowed, position_ids=pos, use_cache=False
        ).last_hidden_state
        at = {"device": device}
        h = hidden[torch.tensor(src_pack, **at), torch.tensor(src_pos, **at)]
        logp = token_logprobs(h, base.get_output_embeddings().weight, torch.tensor(targets, **at))
        token_logp = token_logp.to(device).index_put(
            (torch.tensor(dst_row, **at), torch.tensor(dst_col, **at)), logp
        )
    mask = attention_mask[:, P:].to(token_logp.device, token_logp.dtype)
    return token_logp.sum(dim=1), token_logp, mask
