"""orchestry.llm.frozen: autograd's values and gradients bit for bit, with fewer tensors kept for the backward."""

from __future__ import annotations

import pytest
import torch

from orchestry.llm import frozen


def _saved(fn):
    """``(result, [saved tensors])`` of ``fn()``: what autograd keeps for the backward."""
    kept = []

    def pack(t):
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, kept


@pytest.mark.parametrize("shape", [(7, 12), (2, 5, 12)])
def test_frozen_linear_matches_autocast_linear_without_keeping_the_cast(shape):
    torch.manual_seed(0)
    weight = torch.randn(9, 12)  # frozen: requires_grad False
    x0 = torch.randn(*shape)
    results = []
    for fn in (torch.nn.functional.linear, frozen.frozen_linear):
        x = x0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, kept = _saved(lambda fn=fn, x=x: fn(x, weight))
        (y.float() * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
        results.append((y.detach(), x.grad, kept))
    (y_a, g_a, kept_a), (y_b, g_b, kept_b) = results
    assert y_b.dtype == torch.bfloat16 and torch.equal(y_a, y_b)
    assert torch.equal(g_a, g_b)
    casts = [t for t in kept_a if t.dtype == torch.bfloat16 and t.numel() == weight.numel()]  # W^T, a view
    assert casts, "autocast's linear keeps the weight's bf16 copy"
    assert not [t for t in kept_b if t.dtype == torch.bfloat16 and t.numel() == weight.numel()]
    assert any(t is weight for t in kept_b)  # the fp32 weight itself: no copy


def test_frozen_linear_leaves_trainable_weights_and_fp32_to_autograd():
    torch.manual_seed(0)
    weight = torch.randn(4, 6, requires_grad=True)
    x = torch.randn(3, 6, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        frozen.frozen_linear(x, weight).float().sum().backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0
    y = frozen.frozen_linear(x, weight.detach())  # no autocast: F.linear in fp32
    assert y.dtype == torch.float32 and torch.equal(y, torch.nn.functional.linear(x, weight.detach()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_autograd_and_keeps_two_tensors(dtype):
    torch.manual_seed(1)
    g0, u0 = torch.randn(3, 8, 16).to(dtype), torch.randn(3, 8, 16).to(dtype)
    w = torch.randn(16).to(dtype)
    results = []
    for fn in (lambda g, u: torch.nn.functional.silu(g) * u, frozen.silu_mul):
        g, u = g0.clone().requires_grad_(True), u0.clone().requires_grad_(True)
        y, kept = _saved(lambda fn=fn, g=g, u=u: fn(g, u))
        (y * w).sum().backward()
        results.append((y.detach(), g.grad, u.grad, len({t.data_ptr() for t in kept})))
    a, b = results
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    assert (a[3], b[3]) == (3, 2)


def _lora_model(tiny_llama, seed: int):
    """A tiny random Llama (vocabulary 64) under the decoding kernels (DecodeLinear, the lean MLP) with one LoRA
    adapter, ``helper``, whose B matrices are random (so the adapter changes the outputs), in training mode."""
    from orchestry.llm.decoding import use_decode_kernels
    from orchestry.llm.loading import attach_adapters

    model = tiny_llama(64, seed=seed)
    use_decode_kernels(model)
    peft_model = attach_adapters(model, ["helper"], r=4, alpha=8, seed=0)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.3)
    return peft_model.train()


@pytest.mark.parametrize("bf16", [True, False])
def test_lora_training_pass_gradients_are_autograds_bit_for_bit(tiny_llama, bf16):
    """A LoRA model under the decoding kernels (DecodeLinear, the lean MLP): the same log-probs and adapter
    gradients with and without orchestry.llm.frozen, and fewer bytes kept for the backward with it."""
    peft_model = _lora_model(tiny_llama, seed=2)
    assert type(peft_model.get_base_model().model.layers[0].mlp).__name__ == "LeanLlamaMLP"
    ids = torch.randint(0, 64, (3, 11), generator=torch.Generator().manual_seed(5))
    params = {p.untyped_storage().data_ptr() for p in peft_model.parameters()}

    def run():
        peft_model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits, kept = _saved(lambda: peft_model(input_ids=ids).logits)
            loss = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).mean()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in peft_model.named_parameters() if p.grad is not None}
        kept_bytes = sum(
            {
                t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in kept
                if t.untyped_storage().data_ptr() not in params
            }.values()
        )
        return logits.detach(), grads, kept_bytes

    with frozen.kept_casts():
        ref = run()
    lean = run()
    assert torch.equal(ref[0], lean[0])
    assert ref[1] and ref[1].keys() == lean[1].keys()
    assert all(torch.equal(ref[1][n], lean[1][n]) for n in ref[1])
    assert lean[2] < ref[2]


def test_cast_once_gives_the_same_bits_and_drops_its_copies(tiny_llama):
    """A warm-start pass (completion_logprobs: the packed path, the chunked LM head) under bf16 autocast gives the
    same log-probs and adapter gradients with one cast per weight for the block as with casts at every call."""
    from orchestry.llm.logprobs import completion_logprobs

    peft_model = _lora_model(tiny_llama, seed=3)
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 64, (3, 14), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a left-padded prompt
    mask[1, 12:] = 0  # a shorter completion

    def run():
        peft_model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, tok_lp, tmask = completion_logprobs(peft_model, ids, mask, 8)
        (-tok_lp.sum() / tmask.sum()).backward()
        grads = {n: p.grad.clone() for n, p in peft_model.named_parameters() if p.grad is not None}
        return tok_lp.detach(), grads

    ref = run()
    with frozen.cast_once(peft_model, torch.bfloat16) as made:
        frozen_2d = [p for p in peft_model.parameters() if not p.requires_grad and p.dim() == 2]
        assert made == len(frozen_2d) > 0 and len(frozen._CASTS) == made
        once = run()
    assert not frozen._CASTS
    assert torch.equal(ref[0], once[0])
    assert ref[1] and ref[1].keys() == once[1].keys()
    assert all(torch.equal(ref[1][n], once[1][n]) for n in ref[1])


def test_weight_cast_outside_or_after_an_in_place_change_casts_afresh():
    weight = torch.randn(5, 4)
    assert torch.equal(frozen.weight_cast(weight, torch.bfloat16), weight.to(torch.bfloat16))
    module = torch.nn.Linear(4, 5, bias=False).requires_grad_(False)
    with frozen.cast_once(module, torch.bfloat16):
        first = frozen.weight_cast(module.weight, torch.bfloat16)
        assert frozen.weight_cast(module.weight, torch.bfloat16) is first  # the copy made on entry
        with torch.no_grad():
            module.weight.mul_(2.0)  # changed in place: the copy is stale
        fresh = frozen.weight_cast(module.weight, torch.bfloat16)
        assert fresh is not first and torch.equal(fresh, module.weight.to(torch.bfloat16))
        assert frozen.weight_cast(module.weight, torch.float16).dtype == torch.float16
