"""The MAGRPO speed levers change the speed, not the numbers: packed log-probs, shared prompt prefill in
``generate``, micro-batched updates and the bf16 gate, each against the plain computation on a tiny random Llama."""

import pytest
import torch

import orchestry.llm.local as L
import orchestry.llm.logprobs as LP
import orchestry.numerics as N
from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.loading import attach_adapters
from orchestry.llm.local import Generation, GenerationBatch, generate
from orchestry.llm.logprobs import completion_logprobs
from orchestry.problems import load_problems
from orchestry.rewards.code import LevelReward
from orchestry.training.magrpo import AGENTS, Rollout
from orchestry.training.magrpo.trainer import MAGRPOTrainer

VOCAB, EOS = 64, 0


pytestmark = pytest.mark.usefixtures("one_thread")


def _model(tiny_llama, vocab=VOCAB, seed=3):
    model = attach_adapters(tiny_llama(vocab, seed=seed), AGENTS, r=4, alpha=8, seed=1)
    with torch.no_grad():  # non-zero lora_B so that the adapters matter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.linspace(-0.2, 0.2, p.numel()).view_as(p))
    return model


def _plain(model, sequences, attention_mask, P):
    """Reference: one left-padded row per sequence, logits at every position."""
    pos = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    logits = model(input_ids=sequences, attention_mask=attention_mask, position_ids=pos).logits[:, P - 1 : -1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, sequences[:, P:, None]).squeeze(-1)
    return (logp * attention_mask[:, P:]).sum(1)


def _rollout_batch(G=3, n_prompts=3, P=7, T=6, seed=0):
    """Rows [prompt k][g]: shared left-padded prompts of different lengths, completions ending early with EOS."""
    g = torch.Generator().manual_seed(seed)
    rows, masks = [], []
    for k in range(n_prompts):
        plen = P - k
        prompt = torch.randint(3, VOCAB, (plen,), generator=g)
        for i in range(G):
            comp = torch.randint(3, VOCAB, (T,), generator=g)
            cmask = torch.ones(T, dtype=torch.long)
            n = T - (i + k) % 3  # lengths T, T-1, T-2
            if n < T:
                comp[n - 1] = EOS
                comp[n:] = EOS  # padding after EOS (pad = EOS)
                cmask[n:] = 0
            rows.append(torch.cat([torch.zeros(P - plen, dtype=torch.long), prompt, comp]))
            masks.append(
                torch.cat(
                    [torch.zeros(P - plen, dtype=torch.long), torch.ones(plen, dtype=torch.long), cmask]
                )
            )
    return torch.stack(rows), torch.stack(masks), P


def test_packed_logprobs_and_gradients_equal_plain(tiny_llama):
    model = _model(tiny_llama)
    model.set_adapter("main")
    model.train()
    seqs, mask, P = _rollout_batch()
    packed, tok_lp, cmask = completion_logprobs(model, seqs, mask, P)
    packed.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    plain = _plain(model, seqs, mask, P)
    plain.sum().backward()
    assert torch.allclose(packed, plain, atol=1e-4)
    assert torch.allclose(tok_lp.sum(1), packed) and torch.equal(cmask, mask[:, P:].float())
    assert grads
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(grads[n], p.grad, atol=1e-5), n


def test_packing_splits_long_groups_without_changing_results(tiny_llama):
    model = _model(tiny_llama)
    seqs, mask, P = _rollout_batch(G=4)
    ref = _plain(model, seqs, mask, P)
    for max_pack in (1, 12, 1024):  # 1: every completion in its own row with its prompt
        got, _, _ = LP._packed_logprobs(model, seqs, mask, P, max_pack=max_pack)
        assert torch.allclose(got, ref, atol=1e-4), max_pack


def test_shared_prompt_prefill_gives_the_same_samples(tiny_llama, embedded_tokenizer, monkeypatch):
    tok = embedded_tokenizer
    model = _model(tiny_llama, vocab=len(tok), seed=5)
    prompts = ["def f(x):", "def f(x):", "hello there my friend", "hello there my friend", "def f(x):"]
    adapters = ["helper", "helper", "main", "main", "main"]
    for temperature in (0.0, 1.0):
        shared = generate(model, tok, prompts, adapters, max_new_tokens=6, temperature=temperature, seed=3)
        with monkeypatch.context() as m:
            m.setattr(L, "prompt_groups", lambda *a, **k: None)
            alone = generate(model, tok, prompts, adapters, max_new_tokens=6, temperature=temperature, seed=3)
        assert torch.equal(shared.sequences, alone.sequences)
        assert torch.equal(shared.attention_mask, alone.attention_mask)


def test_prefill_buckets_cover_every_prompt_within_the_budget():
    lengths = [5, 40, 3, 40, 12, 0, 7]
    buckets = L._prefill_buckets(lengths, budget=60)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    flat = [i for b in buckets for i in b]
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)  # longest first
    assert flat[:2] == [1, 3]  # ties keep their order
    for b in buckets:  # rows x longest within the budget, unless a prompt alone exceeds it
        assert len(b) * max(lengths[i] for i in b) <= 60 or len(b) == 1
    assert buckets[0] == [1]  # 2 x 40 > 60
    assert L._prefill_buckets(lengths, budget=10**6) == [flat]
    assert L._prefill_buckets(lengths, budget=1) == [[i] for i in flat]


def test_bucketed_prefill_gives_the_same_cache_and_samples(tiny_llama, embedded_tokenizer, monkeypatch):
    """Prompts of very different lengths prefilled in length buckets (each only as wide as its longest prompt)
    give the cache of one left-padded forward at every content position, and the same samples."""
    tok = embedded_tokenizer
    model = _model(tiny_llama, vocab=len(tok), seed=11)
    prompts = [
        "def f(x):",
        "hello there my friend, how are you doing on this fine and sunny day in the middle of the week?",
        "def f(x):",
        "def g(y):\n    return y + 1\n\n\ndef h(z):",
        "a",
    ]
    adapters = ["helper", "main", "helper", "main", "helper"]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    groups = L.prompt_groups(ids, mask, adapters)
    model.eval()
    caches = []
    for budget in (10**6, 1):  # one padded forward; every prompt alone at its own width
        monkeypatch.setattr(L, "PREFILL_TOKENS", budget)
        with torch.no_grad():
            caches.append(
                L._prefix_cache(model, ids, mask, groups, ids.shape[1] + 4,
                                row_kwargs=lambda sel: {"adapter_names": [adapters[i] for i in sel.tolist()]})
            )  # fmt: skip
    seen = mask[:, :-1].bool()  # content positions of the prefilled part
    for one, alone in zip(caches[0].layers, caches[1].layers, strict=True):
        W = seen.shape[1]
        for a, b in ((one.keys, alone.keys), (one.values, alone.values)):
            a, b = a[:, :, :W].transpose(1, 2)[seen], b[:, :, :W].transpose(1, 2)[seen]
            assert a.abs().sum() > 0 and torch.allclose(a, b, atol=1e-5)
    assert len(groups[0]) == 4  # rows 0 and 2 share their prompt and adapter
    for temperature, stacked in ((0.0, True), (1.0, True), (1.0, False)):  # False: peft's mixed batch
        outs = []
        for budget in (10**6, 1):
            monkeypatch.setattr(L, "PREFILL_TOKENS", budget)
            outs.append(generate(model, tok, prompts, adapters, max_new_tokens=6, temperature=temperature, seed=4,
                                 stacked_lora=stacked))  # fmt: skip
        assert torch.equal(outs[0].sequences, outs[1].sequences)
        assert torch.equal(outs[0].attention_mask, outs[1].attention_mask)


def test_micro_batched_update_equals_one_batch(tiny_llama):
    G, problems = 3, load_problems()[:3]
    seqs, mask, P = _rollout_batch(G=G, n_prompts=6)  # 3 problems x 2 agents
    batch = GenerationBatch(seqs, mask, P, [Generation("", 0, 0, i) for i in range(len(seqs))], 0.0)
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.5, 0.5, 3.0], [1.0, 1.0, 1.0]])
    ro = Rollout(problems, batch, rewards, [LevelReward().to_dict()] * 9, G)
    cfg = TrainMagrpoParams(num_generations=G, problems_per_step=3, bf16_update=False, learning_rate=1e-2)
    params = []
    for limit in (10**6, 1):  # one micro-batch; one row per micro-batch (prompt recomputed each time)
        model = _model(tiny_llama)
        trainer = MAGRPOTrainer(
            model, None, problems, None, cfg, SamplingParams(), "/x", micro_batch_tokens_limit=limit
        )
        chunks = trainer._micro_batches(ro, ro.rows(0), [j for j in range(9) if j // G != 2])
        assert len(chunks) == (1 if limit > 1 else 6)
        out = trainer.update(ro)
        params.append({n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n})
        assert out["rows_updated/helper"] == 5  # problem 2: all advantages zero; problem 0: one row
    for n in params[0]:
        assert torch.allclose(params[0][n], params[1][n], atol=1e-6), n


def test_bf16_autocast_only_where_the_cpu_runs_bf16(tiny_llama, monkeypatch):
    """bf16_update: auto (the default) turns bf16 autocast on only on a CPU that runs bf16 natively."""
    model = tiny_llama(VOCAB)
    monkeypatch.setattr(N, "cpu_bf16_supported", lambda: False)
    with N.bf16_autocast(model, N.resolve_bf16("auto", "cpu")):
        assert not torch.is_autocast_enabled("cpu")
    monkeypatch.setattr(N, "cpu_bf16_supported", lambda: True)
    with N.bf16_autocast(model, N.resolve_bf16("auto", "cpu")):
        assert torch.is_autocast_enabled("cpu")
    with N.bf16_autocast(model, N.resolve_bf16(False, "cpu")):
        assert not torch.is_autocast_enabled("cpu")


def test_decoding_in_rounds_gives_the_same_greedy_samples(tiny_llama, embedded_tokenizer, monkeypatch):
    """Finished rows leave the batch between rounds; the rows that go on decode exactly as in one call."""
    import copy

    tok = copy.deepcopy(embedded_tokenizer)
    model = _model(tiny_llama, vocab=len(tok), seed=7)
    prompts = ["def f(x):", "hello there my friend", "def g(y):\n    return", "hello there my friend"]
    adapters = ["helper", "main", "main", "helper"]
    monkeypatch.setattr(L, "ROUND_TOKENS", 10**6)
    first = generate(model, tok, prompts, adapters, max_new_tokens=9, temperature=0.0)
    # make a token that row 0 emits at its third step the end-of-sequence token, so that rows end early
    tok.eos_token = tok.convert_ids_to_tokens(int(first.sequences[0, first.prompt_width + 2]))
    one = generate(model, tok, prompts, adapters, max_new_tokens=9, temperature=0.0)
    monkeypatch.setattr(L, "ROUND_TOKENS", 2)
    rounds = generate(model, tok, prompts, adapters, max_new_tokens=9, temperature=0.0)
    assert min(i.completion_tokens for i in one.items) <= 3  # some rows did finish early
    assert torch.equal(one.sequences, rounds.sequences)
    assert torch.equal(one.attention_mask, rounds.attention_mask)
    assert [i.text for i in one.items] == [i.text for i in rounds.items]


@pytest.mark.parametrize("candidates", [1024, 4])  # 4: most rows' nucleus spills over, the full-sort path
@pytest.mark.parametrize("top_p", [0.95, 0.5, 1.0])
def test_nucleus_sampler_draws_from_transformers_top_p_distribution(candidates, top_p):
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 300, generator=g) * torch.tensor([0.1, 1.0, 3.0, 8.0, 0.5, 2.0])[:, None]
    scores[4] = torch.linspace(0.0, 0.01, 300)  # nearly flat: the nucleus is most of the vocabulary (no ties)
    ref = TopPLogitsWarper(top_p)(None, TemperatureLogitsWarper(0.7)(None, scores.clone()))
    ref = torch.softmax(ref, dim=-1)
    sampler = L.NucleusSampler(0.7, top_p, candidates=candidates)
    probs, ids = sampler.probabilities(scores)
    ours = torch.zeros_like(ref).scatter_add_(-1, ids, probs)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)
    # the processor's output makes greedy decoding emit one token from the nucleus
    torch.manual_seed(1)
    out = sampler(None, scores)
    drawn = out.argmax(dim=-1)
    assert torch.isinf(out).sum(dim=-1).tolist() == [299] * 6
    assert bool((ref.gather(-1, drawn[:, None]) > 0).all())


def test_nucleus_search_in_stages_gives_the_one_stage_tensor_and_draws():
    """Searching each row's top ``first`` tokens before the top ``candidates`` (and a full sort) gives the very
    probabilities tensor of one search among the top ``candidates``, so the same draws and random numbers taken:
    rows whose nucleus closes within ``first``, between ``first`` and ``candidates``, and beyond ``candidates``."""
    gen = torch.Generator().manual_seed(0)
    paths = set()
    # peaked ... flat: nuclei of a few, dozens, thousands of tokens
    for spread in (40.0, 12.0, 6.0, 4.0, 3.0, 0.5):
        scores = torch.randn(6, 3000, generator=gen) * spread
        scores[0] = torch.randn(3000, generator=gen) * 40.0  # one peaked row in every batch
        one_stage = L.NucleusSampler(0.8, 0.95, candidates=64, first=64)
        staged = L.NucleusSampler(0.8, 0.95, candidates=64, first=16)
        p_ref, ids_ref = one_stage.probabilities(scores)
        p_new, ids_new = staged.probabilities(scores)
        assert p_new.shape == p_ref.shape and torch.equal(p_new, p_ref)
        widest = int((p_ref > 0).sum(-1).max())
        paths.add("first" if widest <= 16 else "candidates" if widest <= 64 else "full sort")
        assert torch.equal(ids_new[p_new > 0], ids_ref[p_ref > 0])
        torch.manual_seed(3)
        drawn_ref, after_ref = one_stage(None, scores).argmax(-1), torch.rand(4)
        torch.manual_seed(3)
        drawn_new, after_new = staged.draw(scores), torch.rand(4)
        assert torch.equal(drawn_new, drawn_ref) and torch.equal(after_new, after_ref)
    assert paths == {"first", "candidates", "full sort"}  # batches whose widest nucleus needs each stage


def test_nucleus_search_in_stages_keeps_the_order_of_tied_tokens():
    """topk orders tied values by an algorithm that depends on k: a row whose nucleus holds ties (exact ties in
    fp32, or the many ties of logits rounded through bf16) must keep the one-stage search's ids, or the same draw
    index would name another token."""
    gen = torch.Generator().manual_seed(1)
    scores = torch.randn(8, 49152, generator=gen)
    tied = torch.tensor([7, 4242, 9000, 31337, 40000])
    scores[0, tied] = 12.0  # five tied tokens make row 0's nucleus
    scores[1:] = (torch.randn(7, 49152, generator=gen) * 5.0).bfloat16().float()  # ties everywhere
    one_stage = L.NucleusSampler(1.0, 0.9, first=1024)
    staged = L.NucleusSampler(1.0, 0.9)
    p_ref, ids_ref = one_stage.probabilities(scores)
    p_new, ids_new = staged.probabilities(scores)
    assert torch.equal(p_new, p_ref) and torch.equal(ids_new[p_new > 0], ids_ref[p_ref > 0])
    # row 0's nucleus is the five tied tokens; the bf16 rows' nuclei close within the first stage's 256
    assert int((p_ref[0] > 0).sum()) == 5 and int((p_ref[1:] > 0).sum(-1).max()) <= 256
    for seed in range(10):
        torch.manual_seed(seed)
        drawn_ref = one_stage.draw(scores)
        torch.manual_seed(seed)
        assert torch.equal(staged.draw(scores), drawn_ref)


def test_nucleus_sampler_frequencies_match_the_distribution():
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    sampler = L.NucleusSampler(1.0, 0.9)  # nucleus {0, 1, 2}: probabilities 0.5/0.95, 0.3/0.95, 0.15/0.95
    torch.manual_seed(0)
    counts = torch.bincount(torch.cat([sampler(None, scores).argmax(-1) for _ in range(4000)]), minlength=4)
    assert counts[3] == 0
    torch.testing.assert_close(counts[:3] / 4000.0, torch.tensor([0.5, 0.3, 0.15]) / 0.95, atol=0.03, rtol=0)
    with pytest.raises(ValueError, match="top_p"):
        L.NucleusSampler(1.0, 0.0)


@pytest.mark.parametrize("autocast", [False, True])
def test_token_logprobs_match_autograds_head(autocast):
    """The chunked LM head gives the log-probs and the gradient w.r.t. the hidden states of the plain
    ``log_softmax(linear(h, W).float()).gather`` (chunks of 5 over 13 positions: a short last chunk)."""
    from orchestry.llm.logprobs import token_logprobs

    torch.manual_seed(0)
    W = torch.randn(50, 8)
    h0 = torch.randn(13, 8)
    targets = torch.randint(0, 50, (13,))
    upstream = torch.randn(13)
    results = []
    for chunked in (False, True):
        h = h0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if chunked:
                lp = token_logprobs(h, W, targets, chunk=5)
            else:
                lp = torch.log_softmax(torch.nn.functional.linear(h, W).float(), -1).gather(
                    -1, targets[:, None]
                )
                lp = lp.squeeze(-1)
        (lp * upstream).sum().backward()
        results.append((lp.detach(), h.grad))
    (lp_ref, g_ref), (lp_ours, g_ours) = results
    assert lp_ours.dtype == torch.float32 and lp_ours.shape == (13,)
    tol = 1e-2 if autocast else 1e-6
    assert torch.allclose(lp_ours, lp_ref, atol=tol) and torch.allclose(g_ours, g_ref, atol=tol)
    assert g_ref.abs().sum() > 0
