"""MAGRPO math against hand-computed values, and real updates on a tiny random Llama with two LoRA adapters."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from orchestry.algorithms.magrpo import group_advantages, policy_loss
from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.loading import adapter_parameters, attach_adapters
from orchestry.llm.local import Generation, GenerationBatch
from orchestry.problems import load_problems
from orchestry.rewards.code import LevelReward
from orchestry.training.magrpo import AGENTS, Rollout
from orchestry.training.magrpo.trainer import MAGRPOTrainer

ROOT = Path(__file__).resolve().parents[1]


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


# ---------------------------------------------------------------------------------------------------------
# dynamic sampling (DAPO): flat groups skipped or resampled; per-step collaboration metrics; curriculum
# ---------------------------------------------------------------------------------------------------------
def _sub_rollout(ro: Rollout, n: int) -> Rollout:
    """Group ``n`` of ``ro`` alone (same token rows)."""
    G, A = ro.G, len(AGENTS)
    rows = list(range(n * A * G, (n + 1) * A * G))
    b = ro.batch
    items = [
        Generation("", b.items[r].prompt_tokens, b.items[r].completion_tokens, i) for i, r in enumerate(rows)
    ]
    batch = GenerationBatch(b.sequences[rows], b.attention_mask[rows], b.prompt_width, items, 0.0)
    return Rollout([ro.problems[n]], batch, ro.rewards[n : n + 1].clone(), ro.details[n * G : (n + 1) * G], G)


def _seq_logprobs(model, ro: Rollout, agent_index: int) -> torch.Tensor:
    """Sum of completion-token log-probs of one agent's rows, computed by hand ([N, G], as in the test above)."""
    model.set_adapter(AGENTS[agent_index])
    rows = ro.rows(agent_index)
    seqs, mask = ro.batch.sequences[rows], ro.batch.attention_mask[rows]
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=seqs, attention_mask=mask, position_ids=pos).logits[:, 5:-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, seqs[:, 6:].unsqueeze(-1)).squeeze(-1)
    return (lp * mask[:, 6:]).sum(1).view(len(ro.problems), ro.G)


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_skip_leaves_flat_groups_out_of_the_loss(tiny_llama, beta):
    """Group 2 has equal rewards: with skip it adds nothing, and the update is the one of group 1 alone."""
    problems = load_problems()[:2]
    rewards = torch.tensor([[1.0, 0.0], [3.0, 3.0]])
    G = 2
    models = [attach_adapters(tiny_llama(64, seed=3), AGENTS, r=4, alpha=8, seed=1) for _ in range(3)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    common = dict(num_generations=G, problems_per_step=2, learning_rate=1e-2, bf16_update=False, max_grad_norm=1e6,
                  beta=beta)  # fmt: skip
    skip_cfg = TrainMagrpoParams(dynamic_sampling="skip", **common)
    none_cfg = TrainMagrpoParams(**common)
    ro = _crafted_rollout(64, problems, G, rewards)
    # hand-computed loss of group 1 (A = R - mean R = [0.5, -0.5]) before any update; KL is 0 at LoRA B = 0
    models[0].train()
    lp = _seq_logprobs(models[0], ro, 1)
    expected = -(torch.tensor([0.5, -0.5]) * lp[0]).mean()

    def trainer(model, cfg):
        return MAGRPOTrainer(model, None, problems, None, cfg, SamplingParams(), checkpoint_dir="/x")

    out_skip = trainer(models[0], skip_cfg).update(ro)
    out_alone = trainer(models[1], none_cfg).update(_sub_rollout(ro, 0))
    out_none = trainer(models[2], none_cfg).update(ro)
    assert out_skip["skipped_groups"] == 0.5 and out_none["skipped_groups"] == 0.0
    assert out_skip["loss/main"] == pytest.approx(float(expected), rel=1e-5)
    assert out_skip["loss/main"] == pytest.approx(out_alone["loss/main"], rel=1e-6)
    if beta == 0.0:  # the paper's loss averages over both groups: the flat one halves the loss
        assert out_none["loss/main"] == pytest.approx(out_skip["loss/main"] / 2, rel=1e-5)
    assert out_skip["rows_updated/main"] == out_alone["rows_updated/main"] == G
    pa, pb = dict(models[0].named_parameters()), dict(models[1].named_parameters())
    for n in pa:
        if "lora_" in n:
            assert torch.equal(pa[n], pb[n]), n


def test_skip_with_only_flat_groups_changes_nothing(tiny_llama):
    problems = load_problems()[:2]
    model = attach_adapters(tiny_llama(64), AGENTS, r=4, alpha=8)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    cfg = TrainMagrpoParams(num_generations=2, problems_per_step=2, bf16_update=False, beta=0.1,
                            dynamic_sampling="skip")  # fmt: skip
    trainer = MAGRPOTrainer(model, None, problems, None, cfg, SamplingParams(), checkpoint_dir="/nonexistent")
    out = trainer.update(_crafted_rollout(64, problems, 2, torch.tensor([[1.0, 1.0], [3.0, 3.0]])))
    assert out["skipped_groups"] == 1.0 and out["loss/helper"] == out["loss/main"] == 0.0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if "lora_" in n)


class _ScriptedReward:
    """Rewards by call: call k gives ``script[k][task_id]`` (a list of G totals, repeated as needed), so a group
    can be flat at first and not when sampled again; calls are recorded."""

    def __init__(self, script):
        self.script, self.calls = script, []

    def __call__(self, problems, helpers, mains):
        k = len(self.calls)
        self.calls.append([p.task_id for p in problems])
        step = self.script[min(k, len(self.script) - 1)]
        seen: dict[str, int] = {}
        out = []
        for p in problems:
            i = seen[p.task_id] = seen.get(p.task_id, -1) + 1
            totals = step[p.task_id]
            out.append(LevelReward(structure=totals[i % len(totals)], aux_called=i == 0, scheme="decorator"))
        return out


def test_resample_rolls_out_the_flat_problem_again(embedded_tokenizer, tiny_llama, tmp_path, one_thread):
    tok = embedded_tokenizer
    problems = load_problems()[:2]
    a, b = problems[0].task_id, problems[1].task_id
    # first rollout: a varies, b flat; the resample of b (alone) varies
    reward = _ScriptedReward([{a: [1.0, 0.0], b: [0.5]}, {b: [0.0, 0.75]}])
    sampling = SamplingParams(max_completion_length=5, temperature=1.0, top_p=1.0)
    cfg = TrainMagrpoParams(num_steps=1, problems_per_step=2, num_generations=2, bf16_update=False,
                            dynamic_sampling="resample", max_resample=3)  # fmt: skip
    model = attach_adapters(tiny_llama(len(tok), seed=5), AGENTS, r=4, alpha=8, seed=2)
    trainer = MAGRPOTrainer(model, tok, problems, None, cfg, sampling, tmp_path / "ck", reward_fn=reward)
    calls = []
    rollout = trainer.rollout

    def spy(probs, step, attempt=0, base=False):
        calls.append(([p.task_id for p in probs], step, attempt))
        return rollout(probs, step, attempt=attempt, base=base)

    trainer.rollout = spy
    first = rollout(trainer.problems_for_step(0), 0)
    order = [p.task_id for p in first.problems]
    reward.calls.clear()
    (rec,) = trainer.train(progress=False)
    assert calls == [(order, 0, 0), ([b], 0, 1)]  # rollout again for the flat problem only, once
    assert (
        rec["zero_variance_groups"] == 0.5 and rec["resample_rollouts"] == 1 and rec["resampled_groups"] == 1
    )
    assert rec["skipped_groups"] == 0.0 and rec["rows_updated/main"] == 4  # both groups now train
    # tokens of both rollouts count (the first one is the same as `first`: same seed, same adapters)
    assert rec["tokens/prompt"] > sum(i.prompt_tokens for i in first.batch.items)
    assert rec["tokens/completion"] >= sum(i.completion_tokens for i in first.batch.items)
    by_task = {}
    for s in trainer.samples:
        by_task.setdefault(s["task_id"], []).append((s["attempt"], s["total"]))
    assert by_task[b] == [(1, 0.0), (1, 0.75)] and by_task[a] == [(0, 1.0), (0, 0.0)]
    assert rec["aux_called_rate"] == 0.5 and rec["scheme/decorator"] == 1.0 and rec["scheme/none"] == 0.0


def test_resample_gives_up_after_max_resample(embedded_tokenizer, tiny_llama, tmp_path, one_thread):
    tok = embedded_tokenizer
    problems = load_problems()[:1]
    reward = _ScriptedReward([{problems[0].task_id: [2.0]}])  # always flat
    sampling = SamplingParams(max_completion_length=4, temperature=1.0, top_p=1.0)
    cfg = TrainMagrpoParams(num_steps=1, num_generations=2, bf16_update=False, dynamic_sampling="resample",
                            max_resample=2)  # fmt: skip
    model = attach_adapters(tiny_llama(len(tok), seed=5), AGENTS, r=4, alpha=8, seed=2)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    trainer = MAGRPOTrainer(model, tok, problems, None, cfg, sampling, tmp_path / "ck", reward_fn=reward)
    (rec,) = trainer.train(progress=False)
    assert len(reward.calls) == 3 and rec["resample_rollouts"] == 2 and rec["resampled_groups"] == 0
    assert rec["zero_variance_groups"] == 1.0 and rec["skipped_groups"] == 1.0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if "lora_" in n)


def test_replaced_groups_keep_their_tokens_and_logprobs(embedded_tokenizer, tiny_llama, one_thread):
    """Merging a resample (other prompt/completion widths) re-pads rows without changing their log-probs."""
    from orchestry.llm.logprobs import completion_logprobs
    from orchestry.training.magrpo.sampling import replace_groups as _replace_groups

    tok = embedded_tokenizer
    problems = load_problems()[:3]
    sampling = SamplingParams(max_completion_length=6, temperature=1.0, top_p=1.0)
    cfg = TrainMagrpoParams(num_generations=2, problems_per_step=3, bf16_update=False)
    model = attach_adapters(tiny_llama(len(tok), seed=5), AGENTS, r=4, alpha=8, seed=2)
    reward = _ScriptedReward([{p.task_id: [1.0, 0.0] for p in problems}])
    trainer = MAGRPOTrainer(model, tok, problems, None, cfg, sampling, "/x", reward_fn=reward)
    ro = trainer.rollout(problems, 0)
    new = trainer.rollout([problems[2]], 0, attempt=1)  # a shorter prompt batch than ro's
    merged = _replace_groups(ro, new, [(2, 0)])
    assert merged.batch.sequences.shape[0] == ro.batch.sequences.shape[0]
    for row in range(merged.batch.sequences.shape[0]):
        src, r = (new, row - 8) if row >= 8 else (ro, row)
        m_seq, m_mask = merged.batch.sequences[row], merged.batch.attention_mask[row]
        s_seq, s_mask = src.batch.sequences[r], src.batch.attention_mask[r]
        assert torch.equal(m_seq[m_mask.bool()], s_seq[s_mask.bool()]), row
        assert merged.batch.items[row].text == src.batch.items[r].text and merged.batch.items[row].row == row
    model.set_adapter("main")
    with torch.no_grad():
        lp_merged = completion_logprobs(model, merged.batch.sequences, merged.batch.attention_mask,
                                        merged.batch.prompt_width)[0]  # fmt: skip
        lp_new = completion_logprobs(
            model, new.batch.sequences, new.batch.attention_mask, new.batch.prompt_width
        )[0]
        lp_ro = completion_logprobs(
            model, ro.batch.sequences, ro.batch.attention_mask, ro.batch.prompt_width
        )[0]
    assert torch.allclose(lp_merged[8:], lp_new, atol=1e-4) and torch.allclose(
        lp_merged[:8], lp_ro[:8], atol=1e-4
    )
    assert merged.details[4:] == new.details and merged.details[:4] == ro.details[:4]


def test_step_record_collaboration_and_truncation_rates(embedded_tokenizer, tiny_llama, tmp_path, one_thread):
    """Real reward on real (random) completions: the new per-sample fields and per-step rates are there."""
    tok = embedded_tokenizer
    problems = load_problems()[:1]
    sampling = SamplingParams(max_completion_length=3, temperature=1.0, top_p=1.0)
    cfg = TrainMagrpoParams(num_steps=1, num_generations=2, bf16_update=False)
    model = attach_adapters(tiny_llama(len(tok), seed=5), AGENTS, r=4, alpha=8, seed=2)
    trainer = MAGRPOTrainer(
        model, tok, problems, None, cfg, sampling, tmp_path / "ck", reward_fn=_LengthReward()
    )
    (rec,) = trainer.train(progress=False)
    for s in trainer.samples:
        assert s["helper_tokens"] <= 3 and s["main_tokens"] <= 3 and s["attempt"] == 0
        assert s["truncated"] == (s["helper_tokens"] == 3 or s["main_tokens"] == 3)
        assert {"aux_defined", "aux_called", "aux_used", "scheme"} <= set(s)
    n = len(trainer.samples)
    assert rec["truncation_rate"] == sum(s["truncated"] for s in trainer.samples) / n
    assert rec["truncation_rate/main"] == sum(s["main_tokens"] == 3 for s in trainer.samples) / n
    assert rec["aux_called_rate"] == rec["aux_used_rate"] == rec["aux_defined_rate"] == 0.0
    assert sum(v for k, v in rec.items() if k.startswith("scheme/")) == pytest.approx(1.0)
    assert rec["zero_variance_groups"] in (0.0, 1.0) and rec["skipped_groups"] == 0.0
    # every column of reports/train/magrpo_steps.csv is in the step record (none left blank)
    spec = importlib.util.spec_from_file_location("train_magrpo_stage", ROOT / "stages" / "train_magrpo.py")
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    assert set(stage.CSV_FIELDS) <= set(rec), set(stage.CSV_FIELDS) - set(rec)


def test_zero_variance_groups_share():
    from orchestry.training.magrpo import flat_groups

    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.5, 0.0], [2.1, 2.1 + 1e-9, 2.1], [0.4 + 0.6 + 0.5, 1.5, 1.5]])
    assert flat_groups(r).tolist() == [True, False, True, True]


def test_curriculum_orders_problems_by_base_reward(embedded_tokenizer, tiny_llama, tmp_path, one_thread):
    tok = embedded_tokenizer
    problems = load_problems()[:3]
    ids = [p.task_id for p in problems]
    base = {ids[0]: [0.1, 0.2], ids[1]: [1.0, 0.8], ids[2]: [0.5, 0.5]}  # means 0.15, 0.9, 0.5
    reward = _ScriptedReward([base])
    sampling = SamplingParams(max_completion_length=4, temperature=1.0, top_p=1.0)
    cfg = TrainMagrpoParams(num_steps=3, problems_per_step=1, num_generations=2, bf16_update=False,
                            checkpoint_every=1, curriculum="base_reward")  # fmt: skip

    def make(num_steps):
        model = attach_adapters(tiny_llama(len(tok), seed=5), AGENTS, r=4, alpha=8, seed=2)
        c = cfg.model_copy(update={"num_steps": num_steps})
        return MAGRPOTrainer(model, tok, problems, None, c, sampling, tmp_path / "ck", reward_fn=reward)

    t = make(2)
    adapters_seen = []
    import orchestry.training.magrpo.rollouts as mg

    real_generate = mg.generate

    def spy(model, tokenizer, prompts, adapters, **kw):
        adapters_seen.append(sorted(set(adapters)))
        return real_generate(model, tokenizer, prompts, adapters, **kw)

    mg.generate = spy
    try:
        hist = t.train(progress=False)
    finally:
        mg.generate = real_generate
    assert reward.calls[:3] == [[ids[0]] * 2, [ids[1]] * 2, [ids[2]] * 2]  # one base rollout per problem
    assert adapters_seen[:3] == [["__base__"]] * 3 and adapters_seen[3] == ["helper", "main"]
    assert t.curriculum["order"] == [ids[1], ids[2], ids[0]]  # easiest first
    assert t.curriculum["base_reward"] == {
        ids[1]: pytest.approx(0.9),
        ids[2]: 0.5,
        ids[0]: pytest.approx(0.15),
    }
    assert [h["problems"] for h in hist] == [[ids[1]], [ids[2]]]
    # resuming keeps the recorded order without a new base rollout
    calls = len(reward.calls)
    resumed = make(3)
    hist = resumed.train(progress=False)
    assert len(reward.calls) == calls + 1 and [h["problems"] for h in hist][-1] == [ids[0]]
    assert resumed.curriculum == t.curriculum
