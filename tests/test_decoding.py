"""The decoding kernels (orchestry.llm.decoding) compute what transformers and peft compute."""

import os
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_llama

from orchestry.llm import decoding
from orchestry.llm.loading import attach_adapters
from orchestry.llm.local import generate


def _kv(B=3, H=4, Hkv=2, L=12, D=8, filled=9, pad=(0, 2, 5)):
    """A decoding step's query and a static cache: rows left-padded by ``pad``, positions from ``filled`` empty."""
    torch.manual_seed(0)
    q = torch.randn(B, H, 1, D)
    k, v = torch.randn(B, Hkv, L, D), torch.randn(B, Hkv, L, D)
    mask = torch.zeros(B, 1, 1, L, dtype=torch.bool)
    for b, p in enumerate(pad):
        mask[b, 0, 0, p:filled] = True
    return q, k, v, mask


class _Attn(torch.nn.Module):
    num_key_value_groups = 2
    is_causal = True
    training = False


def test_decode_attention_matches_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v, mask = _kv()
    ours, _ = decoding.decode_attention(_Attn(), q, k, v, mask, scaling=0.3)
    ref, _ = sdpa_attention_forward(_Attn(), q, k, v, mask, scaling=0.3)
    assert ours.shape == ref.shape == (3, 1, 4, 8)
    assert torch.allclose(ours, ref, atol=1e-6)
    # the empty tail is not read: garbage there changes nothing
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 9:], v2[:, :, 9:] = 1e9, float("nan")
    again, _ = decoding.decode_attention(_Attn(), q, k2, v2, mask, scaling=0.3)
    assert torch.equal(again, ours)
    # a row that sees a position changes the output there
    mask[0, 0, 0, 10] = True
    moved, _ = decoding.decode_attention(_Attn(), q, k, v, mask, scaling=0.3)
    assert not torch.allclose(moved[0], ours[0])


def test_decode_attention_passes_prefill_to_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None].expand(2, 1, 5, 5)
    ours, _ = decoding.decode_attention(_Attn(), q, k, v, mask, scaling=0.3)
    ref, _ = sdpa_attention_forward(_Attn(), q, k, v, mask, scaling=0.3)
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("rows", [1, 7, decoding.SKINNY_ROWS, decoding.SKINNY_ROWS + 1])
def test_decode_linear_matches_linear(rows):
    torch.manual_seed(2)
    lin = torch.nn.Linear(24, 40)
    x = torch.randn(rows, 1, 24)
    ref = lin(x)
    lin.__class__ = decoding.DecodeLinear
    with torch.no_grad():
        out = lin(x)
    assert out.shape == ref.shape and torch.allclose(out, ref, atol=1e-5)
    y = lin(x)  # under autograd: F.linear, gradients as before
    y.sum().backward()
    assert torch.equal(y, ref) and lin.weight.grad is not None


def _pair(seed=0, vocab_size=64, b_seed=None):
    """A tiny Llama with adapters ``helper`` and ``main`` whose LoRA B are random (seed ``b_seed``, default
    ``seed + 10``), so the two agents differ from each other and from the base."""
    model = make_tiny_llama(vocab_size=vocab_size, seed=seed)
    pm = attach_adapters(model, ["helper", "main"], r=4, alpha=8)
    torch.manual_seed(seed + 10 if b_seed is None else b_seed)
    for n, p in pm.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)
    return pm.eval()


def test_stacked_lora_matches_peft_mixed_batch():
    pm = _pair()
    names = ["helper", "main", "__base__", "main"]
    ids = torch.randint(0, 64, (4, 6))
    with torch.no_grad():
        ref = pm(input_ids=ids, adapter_names=names).logits
        stacked = decoding.StackedLoRA(pm, ["helper", "main"])
        with stacked.hooks():
            stacked.set_rows(names)
            ours = pm(input_ids=ids).logits
        plain = pm(input_ids=ids, adapter_names=["__base__"] * 4).logits
        after = pm(input_ids=ids, adapter_names=names).logits  # hooks removed, peft's adapters back on
    assert torch.allclose(ours, ref, atol=1e-5)
    assert torch.allclose(ours[2], plain[2], atol=1e-5)  # the base row has no adapter
    assert not torch.allclose(ours[0], ours[1], atol=1e-3)  # the adapters differ
    assert torch.equal(after, ref)


def test_stacked_lora_refuses_a_missing_adapter():
    pm = _pair()
    with pytest.raises(ValueError, match="reviewer"):
        decoding.StackedLoRA(pm, ["helper", "reviewer"])


def test_generate_same_tokens_with_and_without_the_kernels(embedded_tokenizer, one_thread):
    """Greedy and seeded sampling give the same completions through peft's mixed batch and SDPA as through the
    stacked LoRA, the decoding attention and DecodeLinear (tiny model: its logits differ by ~1e-6)."""
    tok = embedded_tokenizer
    pm = _pair(seed=3, vocab_size=len(tok), b_seed=4)
    prompts = ["def f(x):", "def f(x):", "return the sum", "count vowels in s"]
    names = ["helper", "helper", "main", "__base__"]
    runs = {}
    for kernels in (False, True):
        if kernels:
            decoding.use_decode_kernels(pm)
            assert pm.get_base_model().config._attn_implementation == decoding.ATTENTION
            assert isinstance(pm.get_base_model().lm_head, decoding.DecodeLinear)
        for temperature in (0.0, 0.8):
            out = generate(pm, tok, prompts, names, max_new_tokens=20, temperature=temperature, seed=5,
                           stop_at_code_end=False, stacked_lora=kernels)  # fmt: skip
            runs[kernels, temperature] = [g.text for g in out.items]
    assert runs[True, 0.0] == runs[False, 0.0]
    assert runs[True, 0.8] == runs[False, 0.8]
    assert runs[True, 0.8][0] != runs[True, 0.8][1]  # sampled rows of one prompt differ: sampling happened


def _kernels_pair(tok, seed=3):
    """:func:`_pair` over the tokenizer's vocabulary with the decoding kernels on (as load_model sets them)."""
    pm = _pair(seed=seed, vocab_size=len(tok), b_seed=seed + 1)
    pm.get_base_model().generation_config.pad_token_id = tok.pad_token_id
    decoding.use_decode_kernels(pm)
    return pm


@pytest.mark.parametrize("products", ["mkl", "onednn"])
def test_llama_decoder_step_matches_transformers(embedded_tokenizer, one_thread, products):
    """One decoding step over a prefilled static cache: LlamaDecoder's logits and written keys/values against
    transformers + peft under the same kernels; "mkl" bit for bit, "onednn" to rounding."""
    from transformers import StaticCache

    pm = _kernels_pair(embedded_tokenizer)
    base = pm.get_base_model()
    names = ["helper", "main", "__base__"]
    torch.manual_seed(7)
    ids = torch.randint(0, len(embedded_tokenizer), (3, 9))
    stacked = decoding.StackedLoRA(pm, ["helper", "main"])
    with torch.no_grad(), stacked.hooks():
        stacked.set_rows(names)
        cache = StaticCache(config=base.config, max_cache_len=12)
        pm(input_ids=ids[:, :8], past_key_values=cache, use_cache=True)
        keys = [layer.keys.clone() for layer in cache.layers]
        values = [layer.values.clone() for layer in cache.layers]
        ref = pm(input_ids=ids[:, 8:], past_key_values=cache, use_cache=True).logits[:, -1]
    decoder = decoding.LlamaDecoder(pm, stacked, products=products)
    decoder.row_mask = stacked.row_mask(names)
    attend = torch.zeros(3, 12, dtype=torch.bool)
    attend[:, :9] = True
    with torch.no_grad():
        ours = decoder.step(ids[:, 8], torch.full((3,), 8), keys, values, 8, attend)
    assert ours.shape == ref.shape == (3, len(embedded_tokenizer))
    if products == "mkl":
        assert torch.equal(ours, ref)
        assert all(torch.equal(k, layer.keys) for k, layer in zip(keys, cache.layers, strict=True))
    else:
        assert torch.allclose(ours, ref, atol=1e-5, rtol=1e-5)
        assert all(
            torch.allclose(k, layer.keys, atol=1e-5) for k, layer in zip(keys, cache.layers, strict=True)
        )
    assert not torch.allclose(ours[0], ours[1], atol=1e-3)  # the rows' adapters differ


@pytest.mark.parametrize("isa", [None, "AVX2"])
def test_stacked_products_give_the_per_projection_bits(embedded_tokenizer, one_thread, isa):
    """oneDNN products over stacked weights (q|k|v, gate|up; ``stack=True``, the default) against one product per
    projection: the same logits and written keys/values, bit for bit, at 1, 3 and 70 rows (70: above SKINNY_ROWS),
    with the rows' LoRA (two adapters and the bare model) and a shared prompt prefix; under the kernels capped at
    AVX2 too (what ``model.numerics: portable`` pins), in a fresh process (oneDNN reads the cap once)."""
    import subprocess
    import sys

    if isa is not None:
        env = dict(os.environ, ONEDNN_MAX_CPU_ISA=isa)
        test = f"{__file__}::test_stacked_products_give_the_per_projection_bits[None]"
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                              env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
        return
    # LoRA on every projection (the default targets are attention's only): the MLP's stacked product too
    model = make_tiny_llama(vocab_size=len(embedded_tokenizer), seed=3)
    every = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    pm = attach_adapters(model, ["helper", "main"], r=4, alpha=8, target_modules=every)
    torch.manual_seed(4)
    for n, p in pm.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)
    pm.eval()
    decoding.use_decode_kernels(pm)
    cfg = pm.get_base_model().config
    stacked = decoding.StackedLoRA(pm, ["helper", "main"])
    decoders = {
        stack: decoding.LlamaDecoder(pm, stacked, products="onednn", stack=stack) for stack in (True, False)
    }
    assert decoders[True].stacked_products is not None and decoders[False].stacked_products is None
    Hkv, D = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    torch.manual_seed(3)
    for rows in (1, 3, 70):
        names = (["helper", "main", "__base__"] * rows)[:rows]
        prefix_k = [torch.randn(2, Hkv, 6, D) for _ in range(cfg.num_hidden_layers)]
        prefix_v = [torch.randn(2, Hkv, 6, D) for _ in range(cfg.num_hidden_layers)]
        keys = [torch.randn(rows, Hkv, 5, D) for _ in range(cfg.num_hidden_layers)]
        values = [torch.randn(rows, Hkv, 5, D) for _ in range(cfg.num_hidden_layers)]
        attend = torch.zeros(rows, 5, dtype=torch.bool)
        attend[:, :3] = True
        tokens = torch.randint(0, len(embedded_tokenizer), (rows,))
        out = {}
        for stack, dec in decoders.items():
            dec.row_mask = stacked.row_mask(names)
            visible = torch.ones(2, 6, dtype=torch.bool)
            prefix = decoding.SharedPrefix(prefix_k, prefix_v, visible, torch.arange(rows) % 2)
            ks, vs = [k.clone() for k in keys], [v.clone() for v in values]
            with torch.no_grad():
                out[stack] = (dec.step(tokens, torch.full((rows,), 8), ks, vs, 2, attend, prefix), ks, vs)
        assert torch.equal(out[True][0], out[False][0]), rows
        assert all(torch.equal(a, b) for a, b in zip(out[True][1], out[False][1], strict=True))
        assert all(torch.equal(a, b) for a, b in zip(out[True][2], out[False][2], strict=True))
        assert rows == 1 or not torch.equal(out[True][0][0], out[True][0][-1])


def test_llama_decoder_refuses_what_it_does_not_compute(embedded_tokenizer):
    pm = _kernels_pair(embedded_tokenizer)
    unsupported = decoding.LlamaDecoder.unsupported
    # peft's active adapter would apply: not covered without StackedLoRA
    assert "StackedLoRA" in unsupported(pm)
    assert unsupported(pm, decoding.StackedLoRA(pm, ["helper", "main"])) is None
    # every row on the base model: the LoRA layers are not in the step
    assert unsupported(pm, bare=True) is None
    plain = make_tiny_llama(vocab_size=len(embedded_tokenizer), seed=1)
    assert "attention" in unsupported(plain)  # transformers' own SDPA: not the kernels' attention
    decoding.use_decode_kernels(plain)
    assert unsupported(plain) is None
    assert "bfloat16" in unsupported(plain.to(torch.bfloat16))
    with pytest.raises(ValueError, match="cannot run"):
        decoding.LlamaDecoder(plain)
    with pytest.raises(ValueError, match="products"):
        decoding.LlamaDecoder(plain.float(), products="blas")


@pytest.mark.parametrize("products", ["mkl", "onednn"])
def test_fast_decoding_gives_generates_completions(embedded_tokenizer, one_thread, monkeypatch, products):
    """generate() with LlamaDecoder and with model.generate: the same greedy sequences over left-padded prompts,
    per-row adapters, rows sharing a prompt and rows that finish (EOS) in different rounds. (The decoder's
    attention sums over the shared prompt positions apart from the rows' own, so its logits differ from
    transformers' by ~1e-7 with either products; sampling at T = 1 over this random model's flat 49k-token
    distribution can then draw another token. Sampling on the embedded model: benchmarks/README.md.)"""
    from orchestry.llm import local

    monkeypatch.setattr(decoding, "PRODUCTS", products)
    tok = embedded_tokenizer
    pm = _kernels_pair(tok)
    prompts = ["def f(x):", "def f(x):", "return the sum of a list", "count vowels in s", "x", "def f(x):"]
    names = ["helper", "helper", "main", "main", "__base__", "helper"]
    bare = ["__base__"] * len(prompts)  # no row on an adapter: the bare base model (peft's mixed batch there)
    seqs = {fast: generate(pm, tok, prompts, bare, max_new_tokens=20, temperature=0.0, seed=5, fast_decoding=fast)
            for fast in (False, True)}  # fmt: skip
    assert torch.equal(seqs[True].sequences, seqs[False].sequences)
    assert local._decoder_bare(pm, None, bare) is True  # the fast path ran, on the bare model
    assert local._decoder_bare(pm, None, None) is None  # peft's active adapter: model.generate
    with pm.disable_adapter():  # evaluate's base pair: no adapter names, peft's adapters switched off
        assert local._decoder_bare(pm, None, None) is True
        plain = {fast: generate(pm, tok, prompts, None, max_new_tokens=20, temperature=0.0, seed=5,
                                fast_decoding=fast) for fast in (False, True)}  # fmt: skip
    assert torch.equal(seqs[True].sequences, plain[False].sequences)
    assert torch.equal(plain[True].sequences, plain[False].sequences)
    first = generate(
        pm, tok, prompts, names, max_new_tokens=40, temperature=0.0, seed=5, stop_at_code_end=False
    )
    # make EOS the greedy choice where the first run chose a token that one row first emits after the first
    # round: that row then stops there (the LM head is tied to the embeddings), the others go on
    late = [
        t for r in first.sequences[:, first.prompt_width :].tolist() for t in set(r[local.ROUND_TOKENS :]) - set(r[: local.ROUND_TOKENS])
    ]  # fmt: skip
    token = max(set(late), key=lambda t: (-late.count(t), t))
    with torch.no_grad():
        weight = pm.get_base_model().model.embed_tokens.weight
        weight[tok.eos_token_id] = 1.5 * weight[token]
    runs = {
        fast: generate(pm, tok, prompts, names, max_new_tokens=40, temperature=0.0, seed=5, stop_at_code_end=True,
                       fast_decoding=fast)
        for fast in (False, True)
    }  # fmt: skip
    assert torch.equal(runs[True].sequences, runs[False].sequences)
    assert [g.text for g in runs[True].items] == [g.text for g in runs[False].items]
    lengths = [g.completion_tokens for g in runs[True].items]  # rows stopped in a later round, others went on
    assert any(local.ROUND_TOKENS < n < 40 for n in lengths) and 40 in lengths, lengths


def test_use_products_sets_the_decoders_products(embedded_tokenizer, monkeypatch):
    monkeypatch.setattr(decoding, "PRODUCTS", "onednn")
    decoding.use_products("mkl")
    plain = make_tiny_llama(vocab_size=len(embedded_tokenizer), seed=1)
    decoding.use_decode_kernels(plain)
    assert decoding.LlamaDecoder(plain).products == "mkl"
    with pytest.raises(ValueError, match="decode products"):
        decoding.use_products("blas")
    assert decoding.PRODUCTS == "mkl"


def _step_inputs(cfg, prompt_lens, group, new=3, seed=0):
    """Random prompt keys/values for ``len(prompt_lens)`` distinct prompts (left-padded to the longest), the rows'
    ``group``, ``new`` positions of each row's own already filled: the one-cache layout and the shared layout."""
    torch.manual_seed(seed)
    n, W, B = len(prompt_lens), max(prompt_lens), len(group)
    Hkv, D, layers = (
        cfg.num_key_value_heads,
        cfg.hidden_size // cfg.num_attention_heads,
        cfg.num_hidden_layers,
    )
    visible = torch.zeros(n, W, dtype=torch.bool)
    for j, L in enumerate(prompt_lens):
        visible[j, W - L :] = True
    pk = [torch.randn(n, Hkv, W, D) * visible[:, None, :, None] for _ in range(layers)]
    pv = [torch.randn(n, Hkv, W, D) * visible[:, None, :, None] for _ in range(layers)]
    S = new + 4
    own_k = [torch.randn(B, Hkv, S, D) for _ in range(layers)]
    own_v = [torch.randn(B, Hkv, S, D) for _ in range(layers)]
    one_k = [torch.cat([k[group], o], dim=2) for k, o in zip(pk, own_k, strict=True)]
    one_v = [torch.cat([v[group], o], dim=2) for v, o in zip(pv, own_v, strict=True)]
    attend_own = torch.zeros(B, S, dtype=torch.bool)
    attend_own[:, : new + 1] = True
    attend_one = torch.cat([visible[group], attend_own], dim=1)
    positions = visible[group].sum(dim=1) + new
    return (pk, pv, visible), (own_k, own_v, attend_own), (one_k, one_v, attend_one), positions


@pytest.mark.parametrize("products", ["mkl", "onednn"])
def test_shared_prefix_step_matches_the_one_cache_step(embedded_tokenizer, one_thread, products):
    """Rows sharing a prompt (ragged groups, rows out of order, a prompt no row uses after select): the step over
    the shared prompt positions gives the one-cache step's logits and writes the same keys and values."""
    pm = _kernels_pair(embedded_tokenizer)
    cfg = pm.get_base_model().config
    stacked = decoding.StackedLoRA(pm, ["helper", "main"])
    decoder = decoding.LlamaDecoder(pm, stacked, products=products)
    group = torch.tensor([1, 0, 1, 2, 1, 0])
    names = ["main", "helper", "main", "helper", "main", "helper"]
    (pk, pv, visible), (own_k, own_v, attend_own), (one_k, one_v, attend_one), positions = _step_inputs(
        cfg, [5, 9, 2], group
    )
    decoder.row_mask = stacked.row_mask(names)
    tokens = torch.randint(0, len(embedded_tokenizer), (len(group),))
    W, t = visible.shape[1], 3
    with torch.no_grad():
        ref = decoder.step(tokens, positions, one_k, one_v, W + t, attend_one)
        prefix = decoding.SharedPrefix(pk, pv, visible, group)
        assert prefix.slots == 3 and not prefix.identity
        ours = decoder.step(tokens, positions, own_k, own_v, t, attend_own, prefix)
    assert torch.allclose(ours, ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ours[0], ours[2], atol=1e-3)  # rows of one prompt differ by their own positions
    assert torch.equal(own_k[0][:, :, t], one_k[0][:, :, W + t])  # the first layer's: before any attention
    for a, b in zip(own_k, one_k, strict=True):
        assert torch.allclose(a[:, :, t], b[:, :, W + t], atol=1e-5)
    # rows 3 (the only row of prompt 2) and 1 leave: prompt 2 is dropped, the others keep their rows
    keep = torch.tensor([0, 2, 4, 5])
    prefix.select(keep)
    assert prefix.visible.shape[0] == 2 and prefix.group.tolist() == [1, 1, 1, 0]
    decoder.row_mask = stacked.row_mask([names[i] for i in keep.tolist()])
    with torch.no_grad():
        again = decoder.step(
            tokens[keep], positions[keep], [k[keep] for k in own_k], [v[keep] for v in own_v], t,
            attend_own[keep], prefix,
        )  # fmt: skip
    assert torch.allclose(again, ours[keep], atol=1e-5, rtol=1e-5)


def test_shared_prefix_dense_rows_stack_by_reshape_with_the_same_bits(embedded_tokenizer, one_thread):
    """G rows per prompt side by side (a rollout before any row stops): the prefix stacks them by a reshape, and
    the step's logits and written keys are the bits of the scatter/gather path, within rounding of one cache."""
    pm = _kernels_pair(embedded_tokenizer)
    stacked = decoding.StackedLoRA(pm, ["helper", "main"])
    decoder = decoding.LlamaDecoder(pm, stacked)
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    decoder.row_mask = stacked.row_mask(["helper"] * 3 + ["main"] * 3)
    (pk, pv, visible), (own_k, own_v, attend_own), (one_k, one_v, attend_one), positions = _step_inputs(
        pm.get_base_model().config, [6, 3], group, seed=2
    )
    tokens = torch.tensor([5, 6, 7, 8, 9, 10])
    W, t = visible.shape[1], 3
    steps = []
    with torch.no_grad():
        for dense in (True, False):
            prefix = decoding.SharedPrefix(pk, pv, visible, group)
            assert prefix.dense and prefix.slots == 3
            prefix.dense = dense  # False: the general scatter/gather path, for comparison
            keys, values = [k.clone() for k in own_k], [v.clone() for v in own_v]
            steps.append((decoder.step(tokens, positions, keys, values, t, attend_own, prefix), keys))
        ref = decoder.step(tokens, positions, one_k, one_v, W + t, attend_one)
    (fast, fast_keys), (slow, slow_keys) = steps
    assert torch.equal(fast, slow)
    assert all(torch.equal(a, b) for a, b in zip(fast_keys, slow_keys, strict=True))
    assert torch.allclose(fast, ref, atol=1e-5, rtol=1e-5)
    assert not decoding.SharedPrefix(pk, pv, visible, torch.tensor([0, 1, 0, 1, 0, 1])).dense


def test_shared_prefix_without_repeats_is_per_row(embedded_tokenizer, one_thread):
    """Every row on its own prompt: the prefix is the rows' own (no stacking), the same logits as one cache."""
    pm = _kernels_pair(embedded_tokenizer)
    decoder = decoding.LlamaDecoder(pm, bare=True)  # the base model alone
    group = torch.arange(3)
    (pk, pv, visible), (own_k, own_v, attend_own), (one_k, one_v, attend_one), positions = _step_inputs(
        pm.get_base_model().config, [4, 7, 1], group, seed=1
    )
    tokens = torch.tensor([5, 6, 7])
    with torch.no_grad():
        ref = decoder.step(tokens, positions, one_k, one_v, visible.shape[1] + 3, attend_one)
        prefix = decoding.SharedPrefix(pk, pv, visible, group)
        assert prefix.identity
        ours = decoder.step(tokens, positions, own_k, own_v, 3, attend_own, prefix)
    assert torch.allclose(ours, ref, atol=1e-5, rtol=1e-5)


def test_shared_prefix_refuses_bad_shapes():
    k = [torch.zeros(2, 1, 4, 8)]
    visible = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="per layer"):
        decoding.SharedPrefix(k, [torch.zeros(2, 1, 5, 8)], visible, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="row groups"):
        decoding.SharedPrefix(k, k, visible, torch.tensor([0, 2]))


def test_fence_stop_needs_checking_only_after_a_backtick_token(embedded_tokenizer):
    """The fast loop re-tests a row's fences only when its new token holds a backtick: on completions built token
    by token (fences split over tokens, a fence after 60 tokens of prose, special tokens between backticks), the
    first step at which that rule finds the row done is the first step at which testing every step does."""
    from orchestry.llm.local import _FenceStop

    tok = embedded_tokenizer
    texts = [
        "Sure:\n```python\ndef f(x):\n    return x + 1\n```\nThat adds one.",
        "``" + "`py\nprint(1)\n`" + "``",
        "word " * 60 + "```\nx = 1\n```",
        "no fence here, only `inline` code",
    ]
    stop = _FenceStop(tok, 2)
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if "``" + "`py" in text:  # a special token between two backticks of the closing fence
            ids = ids[:-1] + [tok.eos_token_id] + ids[-1:]
        every, rule, done = None, None, False
        for n in range(1, len(ids) + 1):
            row = torch.tensor([[7, 7, *ids[:n]]])
            now = bool(stop(row, None)[0])
            if now and every is None:
                every = n
            if not done and bool(stop.ticks(row[:, -1])[0]):
                done = bool(stop(row, None)[0])
                if done:
                    rule = n
        assert rule == every, (text, rule, every)
        assert (every is not None) == (text.count("```") >= 2 or "``" + "`py" in text)


@pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="oneDNN's bf16 inner product needs native bf16"
)
def test_bf16_decoder_step_rounds_the_operands_only(embedded_tokenizer, one_thread):
    """LlamaDecoder(bf16=True): its projections take bf16 weights and inputs and sum in fp32, so its logits are
    those of the fp32 step with every projection's operands rounded to bf16 (up to the sums' order), and differ
    from the fp32 step's by that rounding."""
    pm = _kernels_pair(embedded_tokenizer)
    names = ["helper", "main", "__base__"]
    stacked = decoding.StackedLoRA(pm, ["helper", "main"])
    cfg = pm.get_base_model().config
    torch.manual_seed(5)
    L, Hkv, D = 12, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    keys = [torch.randn(3, Hkv, L, D) for _ in range(cfg.num_hidden_layers)]
    values = [torch.randn(3, Hkv, L, D) for _ in range(cfg.num_hidden_layers)]
    attend = torch.zeros(3, L, dtype=torch.bool)
    attend[:, :9] = True
    tokens = torch.randint(0, len(embedded_tokenizer), (3,))

    def step(**kw):
        dec = decoding.LlamaDecoder(pm, stacked, products="onednn", **kw)
        dec.row_mask = stacked.row_mask(names)
        ks, vs = [k.clone() for k in keys], [v.clone() for v in values]
        with torch.no_grad():
            return dec.step(tokens, torch.full((3,), 8), ks, vs, 8, attend), dec

    fp32, _ = step(bf16=False)
    bf16, dec = step(bf16=True)
    assert dec.bf16 and bf16.dtype == torch.float32
    # the reference: the fp32 step with each base projection's weights, inputs and result rounded to bf16 (the LM
    # head excepted: it stays fp32), the rows' LoRA in fp32
    rounded = decoding.LlamaDecoder(pm, stacked, products="mkl")
    rounded.layers = [
        (n1, [(w.to(torch.bfloat16).float(), True, lo) for w, _, lo in attn], n2,
         [(w.to(torch.bfloat16).float(), True, lo) for w, _, lo in mlp])
        for n1, attn, n2, mlp in rounded.layers
    ]  # fmt: skip
    rounded.head = (rounded.head[0], False, None)

    def linear(x, layer):
        w, bf16, lora = layer
        if not bf16:
            return torch.nn.functional.linear(x, w)
        out = torch.nn.functional.linear(x.to(torch.bfloat16).float(), w).to(torch.bfloat16).float()
        if lora is not None:
            out = out + torch.mm(torch.mm(x, lora[0]) * rounded.row_mask, lora[1])
        return out

    rounded._linear = linear
    rounded.row_mask = stacked.row_mask(names)
    ks, vs = [k.clone() for k in keys], [v.clone() for v in values]
    with torch.no_grad():
        ref = rounded.step(tokens, torch.full((3,), 8), ks, vs, 8, attend)
    scale = fp32.abs().max()
    assert (bf16 - ref).abs().max() < 1e-4 * scale  # the same rounded operands, sums in another order
    assert (bf16 - fp32).abs().max() > 10 * (bf16 - ref).abs().max()  # and not the fp32 step
    with pytest.raises(ValueError, match="onednn"):
        decoding.LlamaDecoder(pm, stacked, products="mkl", bf16=True)


@pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="oneDNN's bf16 inner product needs native bf16"
)
def test_generate_under_decode_bf16_prefills_in_bf16_and_decodes_in_fp32_caches(
    embedded_tokenizer, one_thread, monkeypatch
):
    """model.decode_dtype resolved to bf16: generate() prefills the prompts under bf16 autocast and hands the
    decoding steps fp32 keys and values; the decoder's projections are bf16, its LM head fp32. With fp32 (the
    default) neither autocast nor a bf16 weight is involved."""
    from orchestry.llm import local

    tok = embedded_tokenizer
    pm = _kernels_pair(tok)
    prompts = ["def f(x):", "def f(x):", "return the sum of a list", "count vowels in s"]
    names = ["helper", "helper", "main", "main"]
    seen = []
    prefill, init = local._prefill_groups, decoding.LlamaDecoder.__init__

    def spy_prefill(*a, **kw):
        keys, values = prefill(*a, **kw)
        seen.append(("prefill", torch.is_autocast_enabled("cpu")))
        return keys, values

    shared = decoding.SharedPrefix.__init__

    def spy_shared(self, keys, values, *a, **kw):
        seen.append(("prefix", {k.dtype for k in (*keys, *values)}))
        shared(self, keys, values, *a, **kw)

    def spy_init(self, *a, **kw):
        init(self, *a, **kw)
        seen.append(("decoder", self.stacked_products[0][0].dtype, self.head[0].dtype))

    monkeypatch.setattr(local, "_prefill_groups", spy_prefill)
    monkeypatch.setattr(decoding.LlamaDecoder, "__init__", spy_init)
    monkeypatch.setattr(decoding.SharedPrefix, "__init__", spy_shared)
    monkeypatch.setattr(decoding, "PRODUCTS", "onednn")
    out = {}
    for bf16 in (False, True):
        monkeypatch.setattr(decoding, "DECODE_BF16", bf16)
        out[bf16] = generate(pm, tok, prompts, names, max_new_tokens=12, temperature=0.0, seed=5)
    assert seen == [
        ("prefill", False),
        ("prefix", {torch.float32}),
        ("decoder", torch.float32, torch.float32),
        ("prefill", True),
        ("prefix", {torch.float32}),
        ("decoder", torch.bfloat16, torch.float32),
    ]
    assert all(g.completion_tokens > 0 for g in out[True].items)


def test_bare_model_decoder_checks_do_not_import_peft():
    """A stage without adapters (baselines, evaluate_base) passes the decoder's checks for a bare model
    (``_decoder_bare``, ``LlamaDecoder.unsupported``) without importing peft (1-2.5 s of start-up): no peft module,
    so no LoRA layer can exist. A fresh process, because this test session has imported peft already. (The whole
    path, ``stages/baselines.py``'s generation on the embedded model, was checked by hand the same way.)"""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from conftest import make_tiny_llama\n"
        "from orchestry.llm.decoding import lora_layer_class, use_decode_kernels\n"
        "from orchestry.llm.local import _decoder_bare\n"
        "model = make_tiny_llama(64)\n"
        "use_decode_kernels(model)\n"
        "assert lora_layer_class() is None\n"
        "bare = _decoder_bare(model, None, None)\n"
        "print(bare, 'peft' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # the LlamaDecoder covers it (not bare: no adapters), and peft was not imported
    assert out.stdout.split()[-2:] == ["False", "False"]


def test_lora_layer_class_is_peft_s_once_imported():
    from peft.tuners.lora import LoraLayer

    from orchestry.llm.decoding import lora_layer_class

    assert lora_layer_class() is LoraLayer
