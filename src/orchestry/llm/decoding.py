"""Decoding kernels for small models on CPU: single-query attention, skinny linear layers, mixed-adapter LoRA.

Each computes what transformers + peft compute, in fewer and larger operations (floating-point sums in another
order, so logits agree to ~1e-6, not bit for bit). Measured on the embedded 135M model (figures and commands in
benchmarks/README.md, "Decoding kernels"):

* :func:`decode_attention`, registered as the attention implementation ``"orchestry_sdpa"``: a decoding step
  (one query per row) is two batched matrix products over the grouped query heads and the cache positions that
  any row can see. torch's SDPA kernel for CPU took 30 % of a 64-row step (torch.profiler), reading the whole
  preallocated static cache (unfilled positions included). Every other call (prefill, training, masks that are
  not boolean) goes to transformers' SDPA unchanged.
* :class:`DecodeLinear`: a linear layer applied to a few rows (a decoding step: one token per row) without
  autograd computes ``(W x^T)^T`` instead of ``x W^T``: the same products, which MKL's fp32 GEMM ran about 1.5x
  faster at 16 rows and 1.0-1.3x at 64 rows (by layer shape; 1.0x for the 576 -> 1536 MLP projection) on the
  development CPU (benchmarks/README.md, "Decoding kernels"). Larger inputs take ``F.linear`` as before;
  under autograd, :func:`orchestry.llm.frozen.frozen_linear` (``F.linear``'s values and gradients, without keeping
  a frozen weight's autocast copy for the backward).
* :class:`StackedLoRA`: rows of one batch that use different LoRA adapters (peft's ``adapter_names``). peft
  computes each adapter on its rows with indexing, two products and a scatter per adapter and layer; here every
  row goes through all adapters' concatenated ``A`` (``[in, n·r]``), a per-row 0/1 mask keeps its own adapter's
  ``r`` columns, and the concatenated, scaled ``B`` (``[n·r, out]``) sums them back: two products per layer. The
  LoRA update is Hu et al. 2021, "LoRA", eq. 3: ``h = W0 x + (alpha / r) B A x``.
* :class:`LlamaDecoder`: a whole decoding step of a Llama-architecture model (one new token per row) written out
  over the model's own weights, with the three pieces above, in place of a ``model.generate`` step. It makes
  the operations transformers makes in that step, in the same order and on the same layouts, and leaves out the
  framework around them (mask construction, cache objects, module calls and hooks, generate's per-step
  bookkeeping); its projections run through oneDNN's inner product on weights reordered once per call (or,
  with ``products="mkl"``, exactly as above: then a step over a per-row cache gives transformers' bits).
* :class:`SharedPrefix`: the prompt positions of a decoding batch held once per distinct prompt; the rows that
  share a prompt (a MAGRPO group's G samples) read its keys and values once per step instead of G times.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Sequence

import torch

from orchestry.llm.frozen import frozen_linear, use_lean_mlp
from orchestry.numerics import resolve_decode_bf16

ATTENTION = "orchestry_sdpa"  # attention implementation name registered with transformers


def decode_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw
):
    """Attention of a decoding step; any other call goes to transformers' SDPA attention.

    Args:
        query: ``[B, H, 1, D]``; key, value: ``[B, H_kv, L, D]`` (grouped-query heads, ``H`` a multiple of
            ``H_kv``); attention_mask: bool ``[B, 1, 1, L]``, True where a row may attend.
        scaling: the softmax scale (``1/sqrt(D)`` for this model).

    Returns:
        ``([B, 1, H, D], None)`` as transformers' attention functions return.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = (
        query.shape[2] == 1
        and not dropout
        and attention_mask is not None
        and attention_mask.dtype == torch.bool
        and attention_mask.dim() == 4
        and attention_mask.shape[2] == 1
        and kw.get("softcap") is None
        and kw.get("position_bias") is None
        and query.shape[1] % key.shape[1] == 0
    )
    if not plain:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kw,
        )
    B, H, _, D = query.shape
    Hkv = key.shape[1]
    seen = attention_mask.any(dim=0).reshape(-1)
    n = int(seen.nonzero().max()) + 1 if bool(seen.any()) else key.shape[2]  # positions past it hold no token
    k, v, mask = key[:, :, :n], value[:, :, :n], attention_mask[..., :n]
    q = query.reshape(B, Hkv, H // Hkv, D)
    scale = scaling if scaling is not None else D**-0.5
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [B, H_kv, groups, n]
    scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, H_kv, groups, D]
    return out.reshape(B, H, 1, D).transpose(1, 2).contiguous(), None


SKINNY_ROWS = 64  # DecodeLinear's transposed product up to this many rows (a decoding step of 64 rows)


class DecodeLinear(torch.nn.Linear):
    """``nn.Linear`` whose no-grad forward on at most ``SKINNY_ROWS`` rows is ``(W x^T)^T`` (see the module doc).

    Made by :func:`use_decode_kernels` by changing the class of a model's existing ``nn.Linear`` layers, so
    their parameters (and weight tying) are untouched. Shapes: ``x [..., in]`` -> ``[..., out]``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # training: a frozen weight's autocast copy is not kept for the backward (orchestry.llm.frozen)
        if torch.is_grad_enabled():
            return frozen_linear(x, self.weight, self.bias)
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows > SKINNY_ROWS or rows == 0 or x.device.type != "cpu":
            return torch.nn.functional.linear(x, self.weight, self.bias)
        out = torch.mm(self.weight, x.reshape(rows, -1).t()).t()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


_registered = False


def use_decode_kernels(model) -> None:
    """Switch ``model`` (a transformers model, or a peft model around one) to the kernels of this module.

    Its SDPA attention becomes :func:`decode_attention` (``"orchestry_sdpa"`` is registered with transformers'
    attention and mask interfaces once per process; the masks are SDPA's); attention that is not SDPA (eager,
    flash, flex) is left as it is. Its plain ``nn.Linear`` layers become :class:`DecodeLinear`, its Llama-style SiLU
    MLPs :func:`orchestry.llm.frozen.lean_mlp_class` (their training forward keeps less for the backward).
    """
    global _registered
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if not _registered:
        AttentionInterface.register(ATTENTION, decode_attention)
        AttentionMaskInterface.register(ATTENTION, sdpa_mask)
        _registered = True
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "_attn_implementation", None) == "sdpa":
        base.set_attn_implementation(ATTENTION)
    for module in base.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = DecodeLinear
    use_lean_mlp(base)


def lora_layer_class() -> type | None:
    """peft's ``LoraLayer`` class, or None while peft is not imported: then no module of any model is a LoRA layer
    (peft makes them), and a stage whose model has no adapters never pays peft's import (1-2.5 s of start-up)."""
    module = sys.modules.get("peft.tuners.lora")
    return getattr(module, "LoraLayer", None)


class StackedLoRA:
    """Per-row LoRA adapters in one batch, as forward hooks on peft's LoRA linear layers (see the module doc).

    Make the model calls inside :meth:`hooks`, after :meth:`set_rows`: peft's own adapters are switched off there
    (``disable_adapter``) and each LoRA layer's hook adds ``((x A_cat) * row_mask) B_cat`` to the base output.
    The concatenated weights are read when the object is made: make a new one after an optimizer step.

    Args:
        model: a peft model whose LoRA layers all hold ``adapters`` (plain LoRA: no DoRA or other variant).
        adapters: the adapter names rows may use; any other name (peft's ``"__base__"``) is the bare model.

    Raises:
        ValueError: a LoRA layer lacks one of ``adapters`` or uses a LoRA variant (use peft's mixed batch).
    """

    def __init__(self, model, adapters: Sequence[str]):
        from peft.tuners.lora import LoraLayer

        self.model, self.adapters = model, list(adapters)
        self.layers: list[tuple[torch.nn.Module, torch.Tensor, torch.Tensor]] = []
        self.width = 0
        for module in model.modules():
            if not isinstance(module, LoraLayer):
                continue
            missing = [a for a in self.adapters if a not in module.lora_A]
            if missing or any(a in getattr(module, "lora_variant", {}) for a in self.adapters):
                raise ValueError(f"LoRA layer without plain adapters {missing or self.adapters}: {module}")
            with torch.no_grad():
                a_cat = torch.cat([module.lora_A[a].weight.t() for a in self.adapters], dim=1)  # [in, n*r]
                b_cat = torch.cat([module.lora_B[a].weight.t() * module.scaling[a] for a in self.adapters])
            self.layers.append((module, a_cat.contiguous(), b_cat.contiguous()))
            self.width = a_cat.shape[1]
        self.ranks = (
            [self.layers[0][0].lora_A[a].weight.shape[0] for a in self.adapters] if self.layers else []
        )
        self._mask: torch.Tensor | None = None

    def row_mask(self, names: Sequence[str]) -> torch.Tensor:
        """``[B, n·r]`` 0/1 mask: row b keeps the columns of its adapter ``names[b]`` (none for the base)."""
        mask = torch.zeros(len(names), self.width)
        starts = [sum(self.ranks[:i]) for i in range(len(self.ranks))]
        for b, name in enumerate(names):
            if name in self.adapters:
                i = self.adapters.index(name)
                mask[b, starts[i] : starts[i] + self.ranks[i]] = 1.0
        return mask

    def _hook(self, a_cat: torch.Tensor, b_cat: torch.Tensor):
        def add_lora(module, inputs, output):
            x = inputs[0]
            mask = self._mask.to(x.device, x.dtype)
            flat = x.reshape(-1, x.shape[-1])
            if flat.shape[0] != mask.shape[0]:  # [B, T, in]: every position of row b takes row b's mask
                mask = mask[:, None].expand(x.shape[0], x.shape[1], -1).reshape(flat.shape[0], -1)
            delta = torch.addmm(
                output.reshape(-1, output.shape[-1]),
                torch.mm(flat, a_cat.to(x.dtype)) * mask,
                b_cat.to(x.dtype),
            )
            return delta.view(output.shape)

        return add_lora

    @contextlib.contextmanager
    def hooks(self):
        """Inside: peft's adapters are off and every LoRA layer adds the rows' adapters set by :meth:`set_rows`."""
        handles = [m.register_forward_hook(self._hook(a, b)) for m, a, b in self.layers]
        try:
            with self.model.disable_adapter():
                yield self
        finally:
            for h in handles:
                h.remove()
            self._mask = None

    def set_rows(self, names: Sequence[str]) -> None:
        """The next model calls run row b with adapter ``names[b]`` (their batch has ``len(names)`` rows)."""
        self._mask = self.row_mask(names)


class SharedPrefix:
    """The prompts' keys and values, stored once per distinct prompt, for the rows of a decoding batch that share them.

    The G rows that sample one agent's prompt on one problem see the same prompt positions; a per-row cache holds
    (and each decoding step reads) G copies of them. Here each distinct prompt's positions are kept once, and a
    step's attention over them is one product per prompt with the query vectors of all its rows stacked: the
    G-fold read of the prompt's keys and values becomes one (the idea of Hydragen, Juravsky et al. 2024, and of
    cascade attention). The rows' own new positions stay in a per-row cache (:meth:`LlamaDecoder.step`).

    Args:
        keys, values: one ``[n, H_kv, W, D]`` tensor per layer: the ``n`` distinct prompts' positions, left-padded
            to the same ``W``. visible: bool ``[n, W]``, True at a prompt's content positions.
        group: ``[B]`` long, the prompt of each row (``0 <= group < n``).

    Raises:
        ValueError: shapes disagree, or a row names no prompt.
    """

    def __init__(self, keys, values, visible: torch.Tensor, group: torch.Tensor):
        n, W = visible.shape
        if len(keys) != len(values) or any(k.shape[0] != n or k.shape[2] != W for k in (*keys, *values)):
            raise ValueError(
                f"prefix keys/values must be [{n}, H_kv, {W}, D] per layer, as visible [{n}, {W}]"
            )
        group = group.long()
        if group.numel() and (int(group.min()) < 0 or int(group.max()) >= n):
            raise ValueError(f"row groups must lie in [0, {n}), got {group.tolist()}")
        self.keys_t = [k.transpose(-1, -2).contiguous() for k in keys]  # [n, H_kv, D, W]: read as one product
        self.values = list(values)
        self.visible = visible.bool()
        self._place(group)

    def _place(self, group: torch.Tensor) -> None:
        """Rows' slots within their prompt: row b is query ``slot[b]`` of prompt ``group[b]``."""
        counts: dict[int, int] = {}
        slot = []
        for g in group.tolist():
            slot.append(counts.get(g, 0))
            counts[g] = slot[-1] + 1
        self.group, self.slot = group, torch.tensor(slot, dtype=torch.long)
        self.slots = max(counts.values(), default=1)
        n = self.visible.shape[0]
        # every prompt's rows side by side in the batch, as many per prompt (a MAGRPO rollout's G samples before
        # any row stops): stacking is a reshape, not a scatter into zeros and a gather back
        self.dense = group.numel() == n * self.slots and torch.equal(
            group, torch.arange(group.numel()) // self.slots
        )

    @property
    def identity(self) -> bool:
        """Every prompt has exactly one row, in prompt order: the products need no stacking at all."""
        return self.dense and self.slots == 1

    @property
    def width(self) -> int:
        return self.visible.shape[1]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the current batch), in that order; prompts no row uses are dropped."""
        group = self.group[rows]
        live, group = torch.unique(group, return_inverse=True)
        if live.numel() < self.visible.shape[0]:
            self.keys_t = [k[live] for k in self.keys_t]
            self.values = [v[live] for v in self.values]
            self.visible = self.visible[live]
        self._place(group.reshape(-1))

    def row_visible(self) -> torch.Tensor:
        """bool ``[B, W]``: the prompt positions each row attends to."""
        return self.visible[self.group]

    def _stacked(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, H_kv, g, F]`` -> ``[n, H_kv, slots * g, F]``: each prompt's rows side by side (empty slots 0)."""
        B, Hkv, g, F = x.shape
        if self.dense:  # the same values in the same layout as the scatter below
            n = self.visible.shape[0]
            return x.reshape(n, self.slots, Hkv, g, F).transpose(1, 2).reshape(n, Hkv, self.slots * g, F)
        out = x.new_zeros(self.visible.shape[0], Hkv, self.slots, g, F)
        out[self.group, :, self.slot] = x
        return out.view(out.shape[0], Hkv, self.slots * g, F)

    def _rows(self, y: torch.Tensor, g: int) -> torch.Tensor:
        """Inverse of :meth:`_stacked` for a product's result ``[n, H_kv, slots * g, F]`` -> ``[B, H_kv, g, F]``."""
        n, Hkv, _, F = y.shape
        if self.dense:
            return y.view(n, Hkv, self.slots, g, F).transpose(1, 2).reshape(n * self.slots, Hkv, g, F)
        return y.view(n, Hkv, self.slots, g, F)[self.group, :, self.slot]

    def scores(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """``q [B, H_kv, g, D]`` (grouped query heads) -> ``q · k`` over the prompt positions, ``[B, H_kv, g, W]``."""
        if self.identity:
            return torch.matmul(q, self.keys_t[layer])
        return self._rows(torch.matmul(self._stacked(q), self.keys_t[layer]), q.shape[2])

    def mix(self, layer: int, probs: torch.Tensor) -> torch.Tensor:
        """``probs [B, H_kv, g, W]`` (attention weights on the prompt positions) -> ``probs · v``, ``[B, H_kv, g, D]``."""
        if self.identity:
            return torch.matmul(probs, self.values[layer])
        return self._rows(torch.matmul(self._stacked(probs), self.values[layer]), probs.shape[2])


#: How :class:`LlamaDecoder` computes its projections: ``"onednn"`` (oneDNN's fp32 inner product on weights
#: reordered once per decoder: 1.5-1.75x faster than MKL's GEMM for the embedded model's layers at 16-64 rows on
#: an AVX-512 CPU, benchmarks/README.md) or ``"mkl"`` (what transformers computes under DecodeLinear, bit for bit).
PRODUCTS = "onednn"
#: Whether :class:`LlamaDecoder` runs the projections that read one input as one stacked product (its ``stack``;
#: the same bits either way; False only to measure the difference: benchmarks/rollout_breakdown.py --stack 0).
STACK = True
#: Whether :class:`LlamaDecoder`'s projections take bf16 operands (``model.decode_dtype``, resolved by
#: :func:`orchestry.numerics.resolve_decode_bf16`): oneDNN's bf16 inner product (fp32 sums, each result rounded
#: to bf16); the LM head stays fp32.
DECODE_BF16 = False


#: The decoder's numerics unless configured otherwise (``model.decode_products``, ``model.decode_dtype`` defaults).
DEFAULT_NUMERICS = ("onednn", "float32")


def decode_numerics() -> tuple[str, str]:
    """``(products, operand dtype)`` of this process's decoder as resolved by :func:`use_products`, e.g.
    ``("onednn", "float32")`` or ``("onednn", "bfloat16")``: what the machine record and response caches name."""
    return PRODUCTS, "bfloat16" if DECODE_BF16 else "float32"


def use_products(name: str, dtype: str = "float32") -> bool:
    """Set :data:`PRODUCTS` and :data:`DECODE_BF16` for this process (``model.decode_products``,
    ``model.decode_dtype``: ``float32``, ``bfloat16`` or ``auto``). Returns the resolved :data:`DECODE_BF16`.

    Raises:
        ValueError: another name or dtype, or ``bfloat16`` with ``mkl`` products or on a CPU without native bf16.
    """
    global PRODUCTS, DECODE_BF16

    if name not in ("onednn", "mkl"):
        raise ValueError(f"decode products must be 'onednn' or 'mkl', got {name!r}")
    bf16 = resolve_decode_bf16(dtype, name)
    PRODUCTS, DECODE_BF16 = name, bf16
    return bf16


def _onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class LlamaDecoder:
    """One decoding step of a Llama-architecture causal LM over its own weights: ``logits = step(...)``.

    The step is the one transformers' ``LlamaForCausalLM`` computes for one new token per row with a static KV
    cache under :func:`use_decode_kernels` (RMSNorm, rotary embeddings, grouped-query :func:`decode_attention`,
    SiLU MLP, tied LM head; Touvron et al. 2023, "LLaMA"), plus the rows' LoRA adapters as :class:`StackedLoRA`
    adds them (Hu et al. 2021, eq. 3). With ``products="mkl"`` these are the same operations on the same
    layouts, so the logits equal transformers' bit for bit; with ``"onednn"`` (the default, :data:`PRODUCTS`) the
    frozen base weights are reordered once for oneDNN's inner product, whose sums run in another order (logits
    within ~1e-6 relative; a row's result does not depend on the batch's other rows or on the thread count), and
    the projections that read the same input share one product (``stack``).
    Use :meth:`unsupported` first: other architectures, biases, quantised or non-fp32 weights, other attention
    implementations and active peft adapters are left to transformers. The reordered weights are a copy (the
    size of the base model) that lives as long as the decoder: make one per ``generate`` call.

    Args:
        model: the (peft-wrapped) model. stacked: the batch's :class:`StackedLoRA`, or None (bare model).
        products: ``"onednn"`` or ``"mkl"``; None: :data:`PRODUCTS` (``"mkl"`` where torch has no oneDNN).
        bare: every row runs the base model (peft's ``"__base__"`` rows): LoRA layers are skipped.
        bf16: the projections (not the LM head) take bf16 weights and inputs (oneDNN; sums in fp32, each result
            rounded to bf16; the rows' LoRA stays fp32); None: :data:`DECODE_BF16` (``model.decode_dtype``).
        stack: with oneDNN products, the projections that read the same input run as one product each: q, k and
            v over their stacked weights, gate and up over theirs (the same logits, bit for bit, in fewer and
            larger calls: a step at 16 / 256 rows 83 / 447 ms against 97 / 510 ms on an Intel Xeon with AMX,
            benchmarks/README.md); False: one
            product per projection (kept for comparison); None: :data:`STACK`.

    Raises:
        ValueError: ``unsupported(model, stacked)`` gives a reason, ``products`` is unknown, or ``bf16`` without
            oneDNN products.
    """

    def __init__(
        self,
        model,
        stacked: StackedLoRA | None = None,
        products: str | None = None,
        bare: bool = False,
        bf16: bool | None = None,
        stack: bool | None = None,
    ):
        reason = self.unsupported(model, stacked, bare)
        if reason:
            raise ValueError(f"LlamaDecoder cannot run this model: {reason}")
        products = PRODUCTS if products is None else products
        if products not in ("onednn", "mkl"):
            raise ValueError(f"products must be 'onednn' or 'mkl', got {products!r}")
        if products == "onednn" and not _onednn_available():
            products = "mkl"
        bf16 = DECODE_BF16 if bf16 is None else bf16
        if bf16 and products != "onednn":
            raise ValueError("bf16 decoding needs oneDNN products (model.decode_products: onednn)")
        self.bf16 = bool(bf16)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        inner, cfg = base.model, base.config
        lora = {id(m): (a, b) for m, a, b in stacked.layers} if stacked is not None else {}
        self.stacked, self.products = stacked, products

        # oneDNN products: the projections that read the same input (q, k, v; gate, up) run as one product over
        # their weights stacked along the outputs (fewer, larger calls; each output is the same sum, bit for bit:
        # tests/test_decoding.py); their entries in self.layers then keep only the LoRA (weight None)
        self.fused = products == "onednn" and (STACK if stack is None else stack)

        def reordered(weight, bf16=self.bf16):
            if products == "onednn":
                if bf16:
                    weight = weight.to(torch.bfloat16)
                weight = torch.ops.mkldnn._reorder_linear_weight(weight, SKINNY_ROWS)
            return weight

        def linear(module, bf16=self.bf16, product=True):
            plain = getattr(module, "base_layer", module)
            weight = reordered(plain.weight.detach(), bf16) if product else None
            return weight, type(plain) is DecodeLinear, lora.get(id(module))

        def stacked_weight(modules):
            return reordered(torch.cat([getattr(m, "base_layer", m).weight.detach() for m in modules]))

        def norm(module):
            return module.weight, module.variance_epsilon

        own = not self.fused
        self.layers = [
            (
                norm(layer.input_layernorm),
                [linear(getattr(layer.self_attn, n), product=own) for n in ("q_proj", "k_proj", "v_proj")]
                + [linear(layer.self_attn.o_proj)],
                norm(layer.post_attention_layernorm),
                [linear(getattr(layer.mlp, n), product=own) for n in ("gate_proj", "up_proj")]
                + [linear(layer.mlp.down_proj)],
            )
            for layer in inner.layers[: cfg.num_hidden_layers]
        ]
        #: per layer, the stacked ``(q|k|v, gate|up)`` weights (oneDNN products), else None
        self.stacked_products = (
            [
                (
                    stacked_weight([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                    stacked_weight([layer.mlp.gate_proj, layer.mlp.up_proj]),
                )
                for layer in inner.layers[: cfg.num_hidden_layers]
            ]
            if self.fused
            else None
        )
        self.final_norm = norm(inner.norm)
        self.embed = inner.embed_tokens.weight
        # the LM head stays fp32: oneDNN's bf16 product rounds its result to bf16, and logits rounded to 8
        # significant bits (steps of 1/16 at a logit of 10) would move the sampling probabilities by percents
        self.head = linear(base.lm_head, bf16=False)
        self.inv_freq = inner.rotary_emb.inv_freq.float()
        self.rope_scale = inner.rotary_emb.attention_scaling
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scale = self.head_dim**-0.5
        # a power-of-two scale commutes with rounding: scaling the queries' rotary factors gives bit for bit the
        # scaled scores (q·k * scale) without a pass over the scores (outside the subnormal range, |q_d k_d| <
        # 2^-123, which no model's attention reaches); any other scale is applied to the scores
        self.scale_in_rotary = math.frexp(self.scale)[0] == 0.5
        self.row_mask: torch.Tensor | None = None  # [B, n*r] of stacked.row_mask(names), set per batch

    @staticmethod
    def unsupported(model, stacked: StackedLoRA | None = None, bare: bool = False) -> str | None:
        """Why this model's decoding step is not the one :class:`LlamaDecoder` computes (None: it is).
        ``bare``: the rows use no adapter, so LoRA layers are not in the step."""
        LoraLayer = lora_layer_class()
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = getattr(base, "config", None)
        if type(base).__name__ != "LlamaForCausalLM" or cfg is None:
            return f"not a LlamaForCausalLM ({type(base).__name__})"
        if getattr(cfg, "_attn_implementation", None) != ATTENTION:
            return f"attention is {getattr(cfg, '_attn_implementation', None)!r}, not {ATTENTION!r}"
        if (
            cfg.hidden_act != "silu"
            or getattr(cfg, "attention_bias", False)
            or getattr(cfg, "mlp_bias", False)
        ):
            return "activation or biases differ from Llama's"
        if base.lm_head.weight.device.type != "cpu":
            return "not on the CPU"
        covered = {id(m) for m, _, _ in stacked.layers} if stacked is not None else set()
        for module in base.modules():
            if LoraLayer and isinstance(module, LoraLayer) and id(module) not in covered and not bare:
                return "a LoRA layer outside the batch's StackedLoRA (peft's active adapters)"
            if isinstance(module, torch.nn.Linear) and type(module) not in (torch.nn.Linear, DecodeLinear):
                return f"linear layer of type {type(module).__name__}"
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor) and weight.dtype != torch.float32:
                return f"{weight.dtype} weights"
        return None

    def _product(self, x: torch.Tensor, weight: torch.Tensor, skinny: bool) -> torch.Tensor:
        """``x [B, in]`` times a base weight (oneDNN, or as DecodeLinear / F.linear do it), without LoRA."""
        if weight.dtype == torch.bfloat16:  # bf16 operands, fp32 sums, the result rounded to bf16
            return torch.ops.mkldnn._linear_pointwise(
                x.to(torch.bfloat16), weight, None, "none", [], ""
            ).float()
        if self.products == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
        if skinny and x.shape[0] <= SKINNY_ROWS and x.shape[0]:
            return torch.mm(weight, x.t()).t()
        return torch.nn.functional.linear(x, weight)

    def _add_lora(self, out: torch.Tensor, x: torch.Tensor, lora, into: bool = False) -> torch.Tensor:
        """``out`` plus the rows' LoRA of one projection (``lora``: its ``(A_cat, B_cat)``, or None: ``out``).
        ``into``: ``out`` is a column slice of a stacked product, and the sum is written into it."""
        if lora is None:
            return out
        a_cat, b_cat = lora
        low = torch.mm(x, a_cat) * self.row_mask
        # in place on a fresh row-major result: the same product (beta = 1 on the same C) without addmm's copy; a
        # slice of a stacked product likewise (the same bits as on its own product: tests/test_decoding.py)
        return out.addmm_(low, b_cat) if into or out.is_contiguous() else torch.addmm(out, low, b_cat)

    def _linear(self, x: torch.Tensor, layer) -> torch.Tensor:
        """``x [B, in]`` through one projection (:meth:`_product`) and its LoRA."""
        weight, skinny, lora = layer
        return self._add_lora(self._product(x, weight, skinny), x, lora)

    def _attention_inputs(self, x: torch.Tensor, i: int, layer) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q|k [B, H + H_kv, D], v [B, H_kv, D])`` of layer ``i`` for the normed ``x [B, hidden]``, each with
        its LoRA: one stacked product (oneDNN) or three."""
        B, H, Hkv, D = x.shape[0], self.heads, self.kv_heads, self.head_dim
        q_p, k_p, v_p = layer[:3]
        if self.stacked_products is None:
            qk = torch.cat([self._linear(x, q_p), self._linear(x, k_p)], dim=1).view(B, H + Hkv, D)
            return qk, self._linear(x, v_p).view(B, Hkv, D)
        out = self._product(x, self.stacked_products[i][0], False)
        for (_, _, lora), lo, hi in zip(
            (q_p, k_p, v_p), (0, H * D, (H + Hkv) * D), (H * D, (H + Hkv) * D, (H + 2 * Hkv) * D), strict=True
        ):
            self._add_lora(out[:, lo:hi], x, lora, into=True)
        return out[:, : (H + Hkv) * D].view(B, H + Hkv, D), out[:, (H + Hkv) * D :].view(B, Hkv, D)

    def _gate_up(self, x: torch.Tensor, i: int, layer) -> torch.Tensor:
        """``silu(gate(x)) * up(x)`` of layer ``i`` (each with its LoRA): one stacked product (oneDNN) or two."""
        g_p, u_p = layer[:2]
        if self.stacked_products is None:
            return torch.nn.functional.silu(self._linear(x, g_p)) * self._linear(x, u_p)
        out = self._product(x, self.stacked_products[i][1], False)
        n = out.shape[1] // 2
        gate, up = self._add_lora(out[:, :n], x, g_p[2], True), self._add_lora(out[:, n:], x, u_p[2], True)
        return torch.nn.functional.silu(gate) * up

    def projections(self, x: torch.Tensor, inner: torch.Tensor) -> None:
        """Every product of a step (each layer's projections with their LoRA, the LM head) on ``x [B, hidden]``
        and ``inner [B, intermediate]``, results discarded: what benchmarks time against the whole step."""
        for i, (_, attn, _, mlp) in enumerate(self.layers):
            self._attention_inputs(x, i, attn)
            self._linear(x, attn[3])
            self._gate_up(x, i, mlp)
            self._linear(inner, mlp[2])
        self._linear(x, self.head)

    @staticmethod
    def _rms(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
        weight, eps = norm
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    @staticmethod
    def _rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        """transformers' ``x * cos + rotate_half(x) * sin`` as ``x * cos + roll(x, D/2) * sin_signed``, where
        ``sin_signed`` is ``sin`` with its first half negated: ``rotate_half(x) = cat(-x2, x1)`` and
        ``(-a) * s = a * (-s)`` exactly, so the same bits in fewer operations."""
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed

    def step(self, tokens, positions, keys, values, t: int, attend, prefix: SharedPrefix | None = None):
        """Logits of the next token of every row; writes the rows' key and value at cache position ``t``.

        Args:
            tokens: ``[B]`` ids of each row's latest token; positions: ``[B]`` its position id (rows are
                left-padded, so a row's position is its count of attended tokens minus one).
            keys, values: one ``[B, H_kv, L, D]`` cache per layer, positions ``< t`` filled.
            attend: bool ``[B, L]``, True where a row may attend (``attend[:, t]`` included).
            prefix: the rows' prompt positions held once per distinct prompt (:class:`SharedPrefix`); then
                ``keys``, ``values``, ``attend`` and ``t`` cover only the positions after them (each row's own), and
                a row attends to its prompt's visible positions followed by its own. Its attention then sums over
                the two parts separately (logits within rounding of the one-cache step, not its bits).

        Returns:
            ``[B, vocab]`` fp32 logits.
        """
        B = tokens.shape[0]
        H, Hkv, D = self.heads, self.kv_heads, self.head_dim
        g = H // Hkv
        h = self.embed[tokens]
        freqs = positions[:, None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scale)[:, None, :]
        sin = (emb.sin() * self.rope_scale)[:, None, :]
        sin = torch.cat((-sin[..., : D // 2], sin[..., D // 2 :]), dim=-1)  # for _rotary
        n = t + 1
        seen = attend[:, :n] if prefix is None else torch.cat([prefix.row_visible(), attend[:, :n]], dim=1)
        # the attention mask as an addend (0 where a row attends, -inf elsewhere): x + 0 = x and x + -inf = -inf,
        # so the same scores as masked_fill, in one cheaper in-place pass
        mask = torch.zeros(seen.shape).masked_fill_(~seen, float("-inf"))[:, None, None, :]
        folded = self.scale_in_rotary
        cos_q, sin_q = (cos * self.scale, sin * self.scale) if folded else (cos, sin)
        # the queries' and keys' rotary factors side by side: one rotation of q|k (element-wise: the same bits)
        cos_qk = torch.cat([cos_q.expand(B, H, D), cos.expand(B, Hkv, D)], dim=1)
        sin_qk = torch.cat([sin_q.expand(B, H, D), sin.expand(B, Hkv, D)], dim=1)
        for i, (norm1, attn, norm2, mlp) in enumerate(self.layers):
            x = self._rms(h, norm1)
            qk, v = self._attention_inputs(x, i, attn)
            qk = self._rotary(qk, cos_qk, sin_qk)
            q, k = qk[:, :H], qk[:, H:]
            keys[i][:, :, t] = k
            values[i][:, :, t] = v
            q = q.reshape(B, Hkv, g, D)
            scores = torch.matmul(q, keys[i][:, :, :n].transpose(-1, -2))
            if prefix is not None:
                scores = torch.cat([prefix.scores(i, q), scores], dim=-1)
            if not folded:
                scores = scores * self.scale
            scores = scores.add_(mask)  # a fresh tensor: the product's or the cat's
            probs = torch.softmax(scores, dim=-1)
            if prefix is None:
                att = torch.matmul(probs, values[i][:, :, :n])
            else:
                W = prefix.width
                att = prefix.mix(i, probs[..., :W]) + torch.matmul(probs[..., W:], values[i][:, :, :n])
            h = h + self._linear(att.reshape(B, H * D), attn[3])
            x = self._rms(h, norm2)
            h = h + self._linear(self._gate_up(x, i, mlp), mlp[2])
        return self._linear(self._rms(h, self.final_norm), self.head).float()
