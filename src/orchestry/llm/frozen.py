"""Training passes through a frozen base model that keep less for the backward (LoRA: only the adapters train).

Under autocast, ``F.linear(x, W)`` casts the fp32 weight ``W`` to bf16 at every call, and autograd keeps that copy
until the backward, which needs it for the input's gradient (``grad_x = grad_y W``). A LoRA training forward so
keeps a bf16 copy of every base weight it used: 255 MiB per micro-batch for the embedded 135M model (a quarter of
what its forward keeps), ~3 GB for a 1.5B model by arithmetic (parameters x 2 bytes), while the fp32 weights stay resident anyway.

* :func:`frozen_linear`: the same product; the backward casts the fp32 weight again instead of keeping the copy.
* :func:`silu_mul`: a SwiGLU MLP's ``silu(gate) * up`` (Shazeer 2020, "GLU Variants Improve Transformer"; Llama's
  MLP) keeping ``gate`` and ``up``; autograd also keeps ``silu(gate)``, which the backward recomputes here.

Both give autograd's values and gradients bit for bit: the same casts, products and kernels, in the same order
(``tests/test_frozen.py``); they cost one more cast of each weight, resp. one SiLU, per backward. The model's
linear layers use :func:`frozen_linear` through :class:`orchestry.llm.decoding.DecodeLinear`, its Llama MLPs
:func:`silu_mul` through :class:`LeanLlamaMLP` (both installed by :func:`orchestry.llm.decoding.use_decode_kernels`).
Inside :func:`kept_casts` autograd's own path runs (for comparisons).
"""

from __future__ import annotations

import contextlib

import torch

_enabled = True


@contextlib.contextmanager
def kept_casts():
    """Inside: :func:`frozen_linear` and :func:`silu_mul` run autograd's own path (what they replace)."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


class _FrozenLinear(torch.autograd.Function):
    """``F.linear(x, W.to(dtype), bias)`` keeping a reference to the fp32 ``W`` for the backward, not the cast."""

    @staticmethod
    def forward(ctx, x, weight, bias, dtype):
        ctx.save_for_backward(weight)
        ctx.dtype = dtype
        return torch.nn.functional.linear(x, weight.to(dtype), bias)

    @staticmethod
    def backward(ctx, grad):
        (weight,) = ctx.saved_tensors
        w = weight.to(ctx.dtype)  # the forward's cast again (what autograd would have kept)
        g = grad.reshape(-1, grad.shape[-1]).mm(w)  # linear's input gradient: grad_y W, as matmul's backward
        return g.view(*grad.shape[:-1], w.shape[1]), None, None, None


def frozen_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a frozen ``weight``; under autocast without keeping the weight's cast.

    Args:
        x: ``[..., in]``; weight: ``[out, in]`` (``requires_grad`` False); bias: ``[out]`` or None.

    Returns:
        ``[..., out]``: autograd's values, and the same gradient w.r.t. ``x``. A weight or bias that trains, no
        autocast, no gradient to compute or a weight already in the autocast dtype: ``F.linear`` itself.
    """
    kind = x.device.type
    if (
        not _enabled
        or weight.requires_grad
        or (bias is not None and bias.requires_grad)
        or not torch.is_grad_enabled()
        or not x.requires_grad
        or not torch.is_autocast_enabled(kind)
    ):
        return torch.nn.functional.linear(x, weight, bias)
    dtype = torch.get_autocast_dtype(kind)
    if weight.dtype == dtype:
        return torch.nn.functional.linear(x, weight, bias)
    x = x.to(dtype)  # autocast's cast of the input: its gradient flows back through it as autocast's would
    with torch.autocast(kind, enabled=False):
        return _FrozenLinear.apply(x, weight, None if bias is None else bias.to(dtype), dtype)


class _SiluMul(torch.autograd.Function):
    """``silu(gate) * up``, keeping ``gate`` and ``up`` for the backward (not ``silu(gate)``)."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return torch.nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        # autograd's MulBackward0 (grad * other, grad * self) and SiluBackward0 (aten.silu_backward)
        grad_up = grad * torch.nn.functional.silu(gate)
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return grad_gate, grad_up


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (same shapes), keeping two of autograd's three tensors for the backward.

    Without a gradient to compute, or inside :func:`kept_casts`: the plain expression."""
    if not _enabled or not torch.is_grad_enabled() or not (gate.requires_grad or up.requires_grad):
        return torch.nn.functional.silu(gate) * up
    return _SiluMul.apply(gate, up)


_LEAN: dict[type, type] = {}  # MLP class -> its lean subclass


def lean_mlp_class(cls: type) -> type:
    """A subclass of a Llama-style MLP class (``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with SiLU) whose
    training forward goes through :func:`silu_mul`; made once per class."""
    lean = _LEAN.get(cls)
    if lean is None:

        def forward(self, x):
            # inference, or kept_casts: the module's own forward, its operations in its order (gate, silu, up:
            # the backward's order of gradient sums follows it, so silu_mul's plain branch would not give its bits)
            if not _enabled or not torch.is_grad_enabled():
                return cls.forward(self, x)
            gate = self.gate_proj(x)
            return self.down_proj(silu_mul(gate, self.up_proj(x)))

        lean = _LEAN[cls] = type(f"Lean{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})
    return lean


def use_lean_mlp(model) -> int:
    """Switch the model's Llama-style SiLU MLPs (modules with ``gate_proj``, ``up_proj``, ``down_proj`` and an
    ``act_fn`` that is SiLU) to :func:`lean_mlp_class`; returns how many. Other MLPs are left as they are."""
    n = 0
    for module in model.modules():
        if (
            all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn"))
            and type(module.act_fn).__name__ in ("SiLU", "SiLUActivation")  # torch's, transformers' (F.silu)
            and type(module).__name__.endswith("MLP")
            and type(module) not in _LEAN.values()
        ):
            module.__class__ = lean_mlp_class(type(module))
            n += 1
    return n
