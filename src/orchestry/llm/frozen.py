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

* :func:`cast_once`: for a stretch of training passes with no decoding in between (the supervised warm start), one
  cast of each frozen weight made on entry and used by every forward and backward inside (:func:`weight_cast`),
  instead of two casts per weight per pass (44 ms each for the embedded model's 211 projections), at the cost of
  holding the copies (255 MiB for the embedded model) until the block ends. The same bits: a cast is exact and
  deterministic, so the copy is what each call would have made.
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


_CASTS: dict[
    int, tuple[torch.Tensor, int, torch.Tensor]
] = {}  # id(weight) -> (weight, its version, its cast)


@contextlib.contextmanager
def cast_once(model: torch.nn.Module, dtype: torch.dtype):
    """Inside: :func:`weight_cast` of each frozen (``requires_grad`` False) floating-point matrix of ``model`` to
    ``dtype`` returns one cast made on entry (module docstring); the copies are dropped on exit. A weight changed
    in place inside the block (its version moved on) is cast afresh at each call, as outside it.

    Args:
        model: any module; its parameters of two dimensions that do not train and are not already ``dtype``.
        dtype: the autocast dtype of the passes inside (``torch.bfloat16``).
    """
    made = []
    for p in model.parameters():
        if (
            p.requires_grad
            or p.dim() != 2
            or not p.is_floating_point()
            or p.dtype == dtype
            or id(p) in _CASTS
        ):
            continue
        _CASTS[id(p)] = (p, p._version, p.detach().to(dtype))
        made.append(id(p))
    try:
        yield len(made)
    finally:
        for key in made:
            _CASTS.pop(key, None)


def weight_cast(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``weight.to(dtype)``, or inside :func:`cast_once` the copy made on entry (the same values)."""
    hit = _CASTS.get(id(weight))
    if hit is not None and hit[0] is weight and hit[1] == weight._version and hit[2].dtype == dtype:
        return hit[2]
    return weight.to(dtype)


class _FrozenLinear(torch.autograd.Function):
    """``F.linear(x, W.to(dtype), bias)`` keeping a reference to the fp32 ``W`` for the backward, not the cast."""

    @staticmethod
    def forward(ctx, x, weight, bias, dtype):
        ctx.save_for_backward(weight)
        ctx.dtype = dtype
        return torch.nn.functional.linear(x, weight_cast(weight, dtype), bias)

    @staticmethod
    def backward(ctx, grad):
        (weight,) = ctx.saved_tensors
        w = weight_cast(weight, ctx.dtype)  # the forward's cast again (what autograd would have kept)
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
