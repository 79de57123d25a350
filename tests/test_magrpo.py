"""MAGRPO math against hand-computed values, and real updates on a tiny random Llama with two LoRA adapters."""

import json

import pytest
import torch

from orchestry.algorithms.magrpo import group_advantages, policy_loss
from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.local import Generation, GenerationBatch, adapter_parameters, attach_adapters
from orchestry.problems import load_problems
from orchestry.rewards.code import LevelReward
from orchestry.training.magrpo import AGENTS, MAGRPOTrainer, Rollout


def test_group_advantages_hand_computed():
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0], [0.5, 0.5, 0.5, 0.5]])
    # group means 3.0 and 0.5
    assert torch.allclose(
        group_advantages(r, "mean"), torch.tensor([[-2.0, -1.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    )
    # rloo: R_g - mean of the other three: 1 - 11/3, 2 - 10/3, 3 - 3, 6 - 2
    expected = torch.tensor([[1 - 11 / 3, 2 - 10 / 3, 0.0, 4.0], [0.0] * 4])
    assert torch.allclose(group_advantages(r, "rloo"), expected, atol=1e-6)
    assert torch.allclose(group_advantages(r, "max")[0], torch.tensor([-5.0, -4.0, -3.0, 0.0]))
    std = torch.tensor([1.0, 2.0, 3.0, 6.0]).std(unbiased=False)
    assert torch.allclose(
        group_advantages(r, "mean_std")[0], torch.tensor([-2.0, -1.0, 0.0, 3.0]) / (std + 1e-6)
    )
    with pytest.raises(ValueError, match="allowed"):
        group_advantages(r, "bogus")
    with pytest.raises(ValueError, match="G >= 2"):
        group_advantages(torch.ones(3, 1))


def test_policy_loss_hand_computed():
    logp = torch.tensor([[-10.0, -20.0, -30.0, -40.0], [-1.0, -2.0, -3.0, -4.0]], requires_grad=True)
    adv = torch.tensor([[-2.0, -1.0, 0.0, 3.0], [1.0, -1.0, 0.0, 0.0]])
    loss = policy_loss(logp, adv)
    # problem 1: -(1/4)(20 + 20 + 0 - 120) = 20 ; problem 2: -(1/4)(-1 + 2) = -0.25 ; mean = 9.875
    assert loss.item() == pytest.approx(9.875)
    loss.backward()
    # d loss / d logp = -A / (G * N)
    assert torch.allclose(logp.grad, -adv / 8)


def _crafted_rollout(vocab: int, problems, G: int, rewards: torch.Tensor) -> Rollout:
    """A rollout with fixed token ids: 2 problems x 2 agents x G rows, prompt width 6, 5 completion tokens."""
    g = torch.Generator().manual_seed(0)
    B = len(problems) * len(AGENTS) * G
    seqs = torch.randint(3, vocab, (B, 11), generator=g)
    mask = torch.ones(B, 11, dtype=torch.long)
    mask[0, :2] = 0  # some left padding
    mask[1, -2:] = 0  # a completion that ended early
    items = [Generation("", 6, 5, i) for i in range(B)]
    batch = GenerationBatch(seqs, mask, 6, items, 0.0)
    details = [LevelReward().to_dict() for _ in range(len(problems) * G)]
    return Rollout(list(problems), batch, rewards, details, G)


def test_one_update_changes_each_adapter_and_not_the_base(tiny_llama, only_adapters_changed):
    problems = load_problems()[:2]
    model = attach_adapters(tiny_llama(64), AGENTS, r=4, alpha=8)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    lora_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    cfg = TrainMagrpoParams(num_generations=2, problems_per_step=2, learning_rate=1e-2, bf16_update=False)
    trainer = MAGRPOTrainer(model, None, problems, None, cfg, SamplingParams(), checkpoint_dir="/nonexistent")
    ro = _crafted_rollout(64, problems, 2, torch.tensor([[1.0, 0.0], [0.5, 2.0]]))
    out = trainer.update(ro)
    assert out["loss/helper"] != 0.0 and out["loss/main"] != 0.0
    only_adapters_changed(model, base_before, lora_before, AGENTS)


def test_zero_advantage_groups_leave_adapters_unchanged(tiny_llama):
    problems = load_problems()[:2]
    model = attach_adapters(tiny_llama(64), AGENTS, r=4, alpha=8)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    cfg = TrainMagrpoParams(num_generations=2, problems_per_step=2, bf16_update=False)
    trainer = MAGRPOTrainer(model, None, problems, None, cfg, SamplingParams(), checkpoint_dir="/nonexistent")
    trainer.update(_crafted_rollout(64, problems, 2, torch.tensor([[1.0, 1.0], [3.0, 3.0]])))
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if "lora_" in n)


def test_update_gradient_matches_manual_loss(tiny_llama):
    """The trainer's update equals one AdamW step on the hand-written MAGRPO loss for each agent."""
    problems = load_problems()[:2]
    rewards = torch.tensor([[1.0, 0.0], [0.5, 2.0]])
    G = 2
    model_a = attach_adapters(tiny_llama(64, seed=3), AGENTS, r=4, alpha=8, seed=1)
    model_b = attach_adapters(tiny_llama(64, seed=3), AGENTS, r=4, alpha=8, seed=1)
    model_b.load_state_dict(model_a.state_dict())
    cfg = TrainMagrpoParams(
        num_generations=G, problems_per_step=2, learning_rate=1e-2, bf16_update=False, max_grad_norm=1e6
    )
    ro = _crafted_rollout(64, problems, G, rewards)
    MAGRPOTrainer(model_a, None, problems, None, cfg, SamplingParams(), checkpoint_dir="/x").update(ro)
    # manual: per agent, sum of completion-token log-probs, loss = -mean_N (1/G) sum_g A_g logp_g
    adv = rewards - rewards.mean(dim=1, keepdim=True)
    model_b.train()
    for a_idx, agent in enumerate(AGENTS):
        model_b.set_adapter(agent)
        opt = torch.optim.AdamW(adapter_parameters(model_b, agent), lr=1e-2, weight_decay=0.0)
        rows = ro.rows(a_idx)
        seqs, mask = ro.batch.sequences[rows], ro.batch.attention_mask[rows]
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        logits = model_b(input_ids=seqs, attention_mask=mask, position_ids=pos).logits[:, 5:-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, seqs[:, 6:].unsqueeze(-1)).squeeze(-1)
        seq_lp = (lp * mask[:, 6:]).sum(1).view(2, G)
        loss = -(adv * seq_lp).mean(1).mean()
        loss.backward()
        opt.step()
    pa, pb = dict(model_a.named_parameters()), dict(model_b.named_parameters())
    for n in pa:
        if "lora_" in n:
            assert torch.allclose(pa[n], pb[n], atol=1e-5), n


class _LengthReward:
    """A real (if simple) reward: longer helper and main completions score higher; used to force learning."""

    def __call__(self, problems, helpers, mains):
        return [
            LevelReward(structure=min(1.0, (len(h) + len(m)) / 200.0))
            for h, m in zip(helpers, mains, strict=True)
        ]


def test_checkpoint_resume_reproduces_uninterrupted_run(tmp_path, embedded_tokenizer, tiny_llama):
    tok = embedded_tokenizer
    problems = load_problems()[:3]
    sampling = SamplingParams(max_completion_length=6, temperature=1.0, top_p=1.0)
    cfg = TrainMagrpoParams(num_steps=3, problems_per_step=1, num_generations=2, learning_rate=5e-2,
                            checkpoint_every=1, bf16_update=False)  # fmt: skip

    def make(ckpt):
        model = attach_adapters(tiny_llama(len(tok), seed=5), AGENTS, r=4, alpha=8, seed=2)
        return MAGRPOTrainer(model, tok, problems, None, cfg, sampling, ckpt, reward_fn=_LengthReward())

    full = make(tmp_path / "full")
    hist_full = full.train(progress=False)
    assert len(hist_full) == 3

    part = make(tmp_path / "part")
    part.cfg = cfg.model_copy(update={"num_steps": 2})
    part.train(progress=False)
    resumed = make(tmp_path / "part")  # fresh process-equivalent: new model, resumes from step 2
    hist = resumed.train(progress=False)
    assert [h["step"] for h in hist] == [0, 1, 2]
    assert json.loads((tmp_path / "part" / "trainer.json").read_text())["next_step"] == 3
    pf, pr = dict(full.model.named_parameters()), dict(resumed.model.named_parameters())
    assert any(not torch.equal(pf[n], p0) for n, p0 in dict(make(tmp_path / "fresh").model.named_parameters()).items()
               if "lora_B" in n)  # fmt: skip
    for n in pf:
        if "lora_" in n:
            assert torch.allclose(pf[n], pr[n], atol=1e-6), n
    # a run with other inputs (code, data, params outside cfg: another resume key) starts afresh
    other = make(tmp_path / "part")
    other.resume_key = "other inputs"
    assert other.load_checkpoint() == 0 and other.history == []
    assert make(tmp_path / "part").load_checkpoint() == 3


def test_stage_inputs_key_follows_deps_and_params_of_the_stage(tmp_path, monkeypatch):
    from orchestry.config import Params
    from orchestry.runtime import stage_inputs_key

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text("1\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: python code.py\n    deps: [code.py, data]\n    params: [sandbox, sampling.top_p]\n"
    )
    p = Params()
    key = stage_inputs_key("s", p)
    assert stage_inputs_key("s", p) == key
    unrelated = p.model_copy(update={"train_magrpo": p.train_magrpo.model_copy(update={"num_steps": 99})})
    assert stage_inputs_key("s", unrelated) == key
    other_sandbox = p.model_copy(update={"sandbox": p.sandbox.model_copy(update={"max_timeouts": None})})
    assert stage_inputs_key("s", other_sandbox) != key
    other_top_p = p.model_copy(update={"sampling": p.sampling.model_copy(update={"top_p": 0.5})})
    assert stage_inputs_key("s", other_top_p) != key
    other_temp = p.model_copy(update={"sampling": p.sampling.model_copy(update={"temperature": 0.1})})
    assert stage_inputs_key("s", other_temp) == key  # not a param of the stage
    (tmp_path / "data" / "a.jsonl").write_text("2\n")
    assert stage_inputs_key("s", p) != key
    assert stage_inputs_key("s", other_sandbox, exclude=["sandbox"]) == stage_inputs_key(
        "s", p, exclude=["sandbox"]
    )
    with pytest.raises(KeyError):
        stage_inputs_key("missing", p)
