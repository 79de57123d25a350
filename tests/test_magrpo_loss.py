"""The loss the trainer optimises is the one stated in ``orchestry.algorithms.magrpo``.

``micro_batch_loss`` is one micro-batch's share of ``policy_loss``; the trainer's fast path (rows with a zero
advantage skipped, the rest in micro-batches within a token budget, one backward each) must give the gradient of
``policy_loss`` on the whole ``[N, G]`` batch computed in one go.
"""

from __future__ import annotations

import pytest
import torch

from orchestry.algorithms.magrpo import group_advantages, k3_kl, micro_batch_loss, policy_loss
from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.loading import adapter_parameters, attach_adapters
from orchestry.llm.local import Generation, GenerationBatch
from orchestry.llm.logprobs import completion_logprobs
from orchestry.problems import load_problems
from orchestry.rewards.code import LevelReward
from orchestry.training.magrpo import AGENTS, Rollout
from orchestry.training.magrpo.trainer import MAGRPOTrainer


@pytest.mark.parametrize("beta", [0.0, 0.3])
@pytest.mark.parametrize("with_groups", [False, True])
def test_micro_batch_shares_sum_to_policy_loss(beta, with_groups):
    g = torch.Generator().manual_seed(0)
    N, G = 3, 4
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 2.0], [0.5, 0.5, 0.5, 0.5], [3.0, 1.0, 2.0, 0.0]]))
    logp = (-torch.rand(N * G, generator=g) * 5).requires_grad_()
    kl = torch.rand(N * G, generator=g) if beta else None
    groups = torch.tensor([0, 2]) if with_groups else None
    # what the trainer keeps: rows with a non-zero advantage (all rows with a KL term), in groups of the loss
    keep = [j for j in range(N * G) if (beta > 0 or float(adv.flatten()[j]) != 0.0)]
    if groups is not None:
        keep = [j for j in keep if j // G in groups.tolist()]
    chunks = [keep[:3], keep[3:4], keep[4:]]
    total = sum(
        micro_batch_loss(logp[c], torch.tensor(c), adv, kl[c] if kl is not None else None, beta, groups)
        for c in chunks
    )
    full_lp, full_adv = logp.view(N, G), adv
    full_kl = kl.view(N, G) if kl is not None else None
    if groups is not None:
        full_lp, full_adv = full_lp[groups], full_adv[groups]
        full_kl = full_kl[groups] if full_kl is not None else None
    want = policy_loss(full_lp, full_adv, full_kl, beta)
    assert float(total) == pytest.approx(float(want), abs=1e-6)
    (grad_total,) = torch.autograd.grad(total, logp)
    (grad_want,) = torch.autograd.grad(want, logp)
    assert torch.allclose(grad_total, grad_want, atol=1e-7)


def _rollout(problems, G, rewards, vocab):
    g = torch.Generator().manual_seed(1)
    B = len(problems) * 2 * G
    seqs = torch.randint(3, vocab, (B, 12), generator=g)
    mask = torch.ones(B, 12, dtype=torch.long)
    mask[1, -3:] = 0  # completions that ended early
    mask[6, -1:] = 0
    batch = GenerationBatch(seqs, mask, 6, [Generation("", 6, 6, i) for i in range(B)], 0.0)
    details = [LevelReward().to_dict() for _ in range(len(problems) * G)]
    return Rollout(list(problems), batch, rewards, details, G)


@pytest.mark.parametrize("beta", [0.0, 0.2])
def test_the_trainers_fast_path_is_the_gradient_of_policy_loss(tiny_llama, beta):
    """One update with tiny micro-batches (and zero-advantage rows skipped) moves each adapter by exactly
    -grad policy_loss(whole batch) (SGD, lr 1, no clipping)."""
    problems = load_problems()[:2]
    G, vocab = 3, 64
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.5, 2.0, 3.5]])  # problem 0 has a zero-advantage row
    ro = _rollout(problems, G, rewards, vocab)
    model = attach_adapters(tiny_llama(vocab, seed=3), AGENTS, r=4, alpha=8, seed=1)
    torch.manual_seed(5)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.3)
    cfg = TrainMagrpoParams(num_generations=G, problems_per_step=2, bf16_update=False, max_grad_norm=1e9,
                            weight_decay=0.0, beta=beta)  # fmt: skip
    trainer = MAGRPOTrainer(model, None, problems, None, cfg, SamplingParams(), checkpoint_dir="/nonexistent",
                            micro_batch_tokens_limit=14)  # fmt: skip
    for agent in AGENTS:  # several micro-batches per agent
        rows = ro.rows(agent)
        assert len(trainer._micro_batches(ro, rows, list(range(len(rows))))) > 2
    # the reference: policy_loss on the whole batch in one go, before the update
    want = {}
    for agent in AGENTS:
        model.set_adapter(agent)
        sel = torch.tensor(ro.rows(agent))
        seqs, mask = ro.batch.sequences[sel], ro.batch.attention_mask[sel]
        seq_lp, tok_lp, tmask = completion_logprobs(model, seqs, mask, ro.batch.prompt_width)
        kl = None
        if beta:
            with torch.no_grad(), model.disable_adapter():
                _, ref_lp, _ = completion_logprobs(model, seqs, mask, ro.batch.prompt_width)
            kl = k3_kl(tok_lp, ref_lp, tmask).view(2, G)
        loss = policy_loss(seq_lp.view(2, G), group_advantages(rewards), kl, beta)
        params = adapter_parameters(model, agent)
        grads = torch.autograd.grad(loss, params)
        want.update({id(p): -g for p, g in zip(params, grads, strict=True)})
    trainer.optimizers = {a: torch.optim.SGD(adapter_parameters(model, a), lr=1.0) for a in AGENTS}
    before = {id(p): p.detach().clone() for a in AGENTS for p in adapter_parameters(model, a)}
    out = trainer.update(ro)
    if not beta:
        assert out["rows_updated/helper"] == 5  # the zero-advantage row is skipped
    for a in AGENTS:
        for p in adapter_parameters(model, a):
            assert torch.allclose(p.detach() - before[id(p)], want[id(p)], atol=1e-6)
