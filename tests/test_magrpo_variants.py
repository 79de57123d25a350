"""The trainer's options of issue 10 on a tiny random Llama: REINFORCE++ advantages, per-agent rewards
(counterfactual credit, coach mix), multi-turn episodes with sandbox feedback and the writer/tester/fixer workflow.

Real parts: the embedded tokenizer, the real sandbox and level reward, the real OpenAI-compatible client against
the local fake server (tests/fake_llm_servers.py) for the coach.
"""

from __future__ import annotations

import re

import pytest
import torch
from fake_llm_servers import FakeOpenAI

from orchestry.algorithms.reinforce_pp import reinforce_pp_advantages
from orchestry.config import CoachParams, SamplingParams, TrainMagrpoParams
from orchestry.llm.backends import OpenAICompatibleChat
from orchestry.llm.cache import CachedChat, ResponseCache
from orchestry.llm.cost import CostTracker, Price
from orchestry.llm.loading import adapter_parameters, attach_adapters
from orchestry.llm.local import Generation, GenerationBatch
from orchestry.problems import load_problems
from orchestry.rewards.coach import Coach
from orchestry.rewards.code import LevelReward
from orchestry.sandbox import Sandbox
from orchestry.tasks.multi_turn import feedback_text, next_turn_prompts
from orchestry.training.magrpo import AGENTS, Rollout
from orchestry.training.magrpo.trainer import MAGRPOTrainer

WTF = ("writer", "tester", "fixer")


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(timeout_s=3.0) as sb:
        yield sb


def _lora(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def _changed(model, before, agent):
    return any(
        not torch.equal(p, before[n])
        for n, p in model.named_parameters()
        if f".{agent}." in n and n in before
    )


def _randomize_lora_b(model, seed=7):
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.3)


def _crafted(problems, G, rewards, agent_rewards=None, vocab=64):
    g = torch.Generator().manual_seed(0)
    B = len(problems) * 2 * G
    seqs = torch.randint(3, vocab, (B, 11), generator=g)
    mask = torch.ones(B, 11, dtype=torch.long)
    mask[1, -2:] = 0  # a completion that ended early
    batch = GenerationBatch(seqs, mask, 6, [Generation("", 6, 5, i) for i in range(B)], 0.0)
    details = [LevelReward().to_dict() for _ in range(len(problems) * G)]
    return Rollout(list(problems), batch, rewards, details, G, agent_rewards=agent_rewards)


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_reinforce_pp_update_matches_the_hand_written_token_loss(tiny_llama, beta):
    """One update equals an AdamW step on -sum_t A_t log pi(y_t) / #tokens with A from reinforce_pp_advantages
    (policy and base log-probs from before the update: the KL is not 0 since LoRA B is random)."""
    problems = load_problems()[:2]
    G, rewards = 2, torch.tensor([[1.0, 0.0], [0.5, 2.0]])
    model_a = attach_adapters(tiny_llama(64, seed=3), AGENTS, r=4, alpha=8, seed=1)
    _randomize_lora_b(model_a)
    model_b = attach_adapters(tiny_llama(64, seed=3), AGENTS, r=4, alpha=8, seed=1)
    model_b.load_state_dict(model_a.state_dict())
    cfg = TrainMagrpoParams(num_generations=G, problems_per_step=2, learning_rate=1e-2, bf16_update=False,
                            max_grad_norm=1e6, advantage="reinforce_pp", beta=beta, gamma=0.9)  # fmt: skip
    ro = _crafted(problems, G, rewards)
    out = MAGRPOTrainer(model_a, None, problems, None, cfg, SamplingParams(), checkpoint_dir="/x").update(ro)
    assert out["rows_updated/helper"] == 4 and out["advantage_abs/main"] > 0
    model_b.train()
    for agent in AGENTS:
        model_b.set_adapter(agent)
        rows = ro.rows(agent)
        seqs, mask = ro.batch.sequences[rows], ro.batch.attention_mask[rows]
        pos = (mask.cumsum(1) - 1).clamp(min=0)

        def token_logp(m, seqs=seqs, mask=mask, pos=pos):
            logits = m(input_ids=seqs, attention_mask=mask, position_ids=pos).logits[:, 5:-1].float()
            return torch.log_softmax(logits, -1).gather(-1, seqs[:, 6:].unsqueeze(-1)).squeeze(-1)

        cmask = mask[:, 6:].float()
        with torch.no_grad():
            lp0 = token_logp(model_b) * cmask
            with model_b.disable_adapter():
                ref = token_logp(model_b) * cmask
        adv = reinforce_pp_advantages(rewards.flatten(), lp0, ref, cmask, beta=beta, gamma=0.9)
        opt = torch.optim.AdamW(adapter_parameters(model_b, agent), lr=1e-2, weight_decay=0.0)
        loss = -(adv * token_logp(model_b) * cmask).sum() / cmask.sum()
        loss.backward()
        opt.step()
    pa, pb = dict(model_a.named_parameters()), dict(model_b.named_parameters())
    assert all(torch.allclose(pa[n], pb[n], atol=1e-5) for n in pa if "lora_" in n)


def test_per_agent_rewards_give_each_agent_its_own_advantage(tiny_llama):
    """With per-agent rewards (credit, coach), a helper whose own rewards are flat gets no update while main,
    whose rewards vary, does: the joint reward (which varies) is not used for either."""
    problems = load_problems()[:2]
    model = attach_adapters(tiny_llama(64), AGENTS, r=4, alpha=8)
    before = _lora(model)
    cfg = TrainMagrpoParams(num_generations=2, problems_per_step=2, learning_rate=1e-2, bf16_update=False)
    joint = torch.tensor([[1.0, 0.0], [0.5, 2.0]])
    per_agent = {
        "helper": torch.tensor([[3.0, 3.0], [1.0, 1.0]]),
        "main": torch.tensor([[0.0, 1.0], [1.0, 1.0]]),
    }
    trainer = MAGRPOTrainer(model, None, problems, None, cfg, SamplingParams(), checkpoint_dir="/x")
    out = trainer.update(_crafted(problems, 2, joint, per_agent))
    assert out["loss/helper"] == 0.0 and "rows_updated/helper" not in out
    assert out["rows_updated/main"] == 2  # only the first problem's two rows have non-zero advantages
    assert not _changed(model, before, "helper") and _changed(model, before, "main")


class _PassFirst:
    """Level reward stand-in: generation 0 of every problem passes its asserts, the others score by length."""

    def __init__(self):
        self.calls = []

    def __call__(self, problems, helpers, mains):
        self.calls.append((list(problems), list(helpers), list(mains)))
        out = []
        for k, (h, m) in enumerate(zip(helpers, mains, strict=True)):
            first = len(self.calls) == 1 and k % 2 == 0
            out.append(LevelReward(structure=(len(h) + 2 * len(m)) / 1000.0, passed=1 if first else 0,
                                   total_asserts=1, reasons=[] if first else ["tests: 0/1 passed; assert 1: AssertionError"]))  # fmt: skip
        return out


def test_two_turn_episode_feeds_back_stops_early_and_weights_turns(embedded_tokenizer, tiny_llama, tmp_path,
                                                                   one_thread):  # fmt: skip
    tok = embedded_tokenizer
    problems = load_problems()[:1]
    sampling = SamplingParams(max_completion_length=6, temperature=1.0, top_p=1.0)
    cfg = TrainMagrpoParams(num_steps=1, num_generations=4, bf16_update=False, turns=2, turn_weights=[1.0, 0.5],
                            learning_rate=1e-2)  # fmt: skip
    model = attach_adapters(tiny_llama(len(tok), seed=5), AGENTS, r=4, alpha=8, seed=2)
    before = _lora(model)
    reward = _PassFirst()
    trainer = MAGRPOTrainer(model, tok, problems, None, cfg, sampling, tmp_path / "ck", reward_fn=reward)
    episode = trainer.episode(problems, 0)
    assert [r.turn for r in episode] == [0, 1] and [r.weight for r in episode] == [1.0, 0.5]
    t1, t2 = episode
    # generations 0 and 2 passed in turn 1: they stop; 1 and 3 go on with the test feedback
    assert t2.active.tolist() == [[False, True, False, True]]
    (_, helpers2, mains2) = reward.calls[1]
    assert len(helpers2) == 2  # only the two continued samples were generated and scored
    prompts = [tok.decode(t2.batch.sequences[r, : t2.batch.prompt_width], skip_special_tokens=True)
               for r in t2.rows("main")]  # fmt: skip
    mask_rows = [int(t2.batch.attention_mask[r].sum()) for r in t2.rows("main")]
    assert mask_rows[0] == mask_rows[2] == 0 and mask_rows[1] > 0  # placeholders of stopped samples: empty
    for g in (1, 3):
        assert "Feedback on the last attempt" in prompts[g] and "AssertionError" in prompts[g]
        assert problems[0].asserts[0].strip() in prompts[g]  # the failing assert is quoted
        d = t1.details[g]
        _, main_prompt = next_turn_prompts(problems[0], d["helper"], d["main"], feedback_text(problems[0], d))
        assert re.sub(r"\s+", "", main_prompt) in re.sub(
            r"\s+", "", prompts[g]
        )  # the helper's aux, main's code
    assert t2.rewards[0, 0] == t1.rewards[0, 0] and t2.details[0].get("carried")  # carried over
    rec = trainer._step_record(0, episode, trainer.update(episode), 0.0, 0.0, 0.0)
    assert rec["turns_run"] == 2 and "reward/turn_2" in rec
    assert rec["rows_updated/main"] <= 4 + 2  # turn 2 trains at most the two continued rows
    assert _changed(model, before, "helper") and _changed(model, before, "main")


def test_a_zero_weighted_second_turn_changes_nothing(embedded_tokenizer, tiny_llama, tmp_path, one_thread):
    """turns=2 with turn_weights [1, 0] trains exactly as one turn (same first-turn samples, same update)."""
    tok = embedded_tokenizer
    problems = load_problems()[:1]
    sampling = SamplingParams(max_completion_length=6, temperature=1.0, top_p=1.0)

    def run(**kw):
        model = attach_adapters(tiny_llama(len(tok), seed=5), AGENTS, r=4, alpha=8, seed=2)
        cfg = TrainMagrpoParams(num_steps=1, num_generations=2, bf16_update=False, learning_rate=1e-2,
                                max_grad_norm=1e6, **kw)  # fmt: skip
        t = MAGRPOTrainer(
            model, tok, problems, None, cfg, sampling, tmp_path / str(kw), reward_fn=_PassFirst()
        )
        t.train(progress=False)
        return _lora(model), t

    one, _ = run()
    two, t2 = run(turns=2, turn_weights=[1.0, 0.0])
    assert {s["turn"] for s in t2.samples} == {0, 1}
    assert all(torch.allclose(one[n], two[n], atol=1e-6) for n in one)
    three, _ = run(turns=2, turn_weights=[1.0, 1.0])
    assert any(not torch.allclose(one[n], three[n], atol=1e-6) for n in one)  # the second turn does count


def test_counterfactual_credit_in_the_trainer(embedded_tokenizer, tiny_llama, tmp_path, sandbox, one_thread):
    tok = embedded_tokenizer
    problems = load_problems()[:1]
    sampling = SamplingParams(max_completion_length=8, temperature=1.0, top_p=1.0)
    cfg = TrainMagrpoParams(num_steps=1, num_generations=2, bf16_update=False, credit="counterfactual")
    model = attach_adapters(tiny_llama(len(tok), seed=5), AGENTS, r=4, alpha=8, seed=2)
    trainer = MAGRPOTrainer(model, tok, problems, sandbox, cfg, sampling, tmp_path / "ck")
    ro = trainer.rollout(problems, 0)
    from orchestry.rewards.credit import counterfactual_credit

    expect = counterfactual_credit([problems[0]] * 2, [d["helper"] for d in ro.details],
                                   [d["main"] for d in ro.details], sandbox)  # fmt: skip
    assert [d["credit_main"] for d in ro.details] == [c.main for c in expect]
    assert ro.agent_rewards["helper"].flatten().tolist() == pytest.approx([c.helper for c in expect])
    assert ro.agent_rewards["main"].flatten().tolist() == pytest.approx([c.main for c in expect])
    # garbage from a random model and the default main both fail every assert: both score 0 (format points
    # need a passing assert), so main's credit is 0
    assert all(c.main == 0 for c in expect)
    assert ro.metrics["credit/main"] == pytest.approx(sum(c.main for c in expect) / 2)


def _coach_server():
    """Scores by role: the helper 8, main 2; other roles by the length of the judged output (so they vary)."""

    def reply(body):
        text = body["messages"][-1]["content"]
        if "output of the helper" in text:
            return "FEEDBACK: good helper.\nPROCESS_SCORE: 8"
        if "output of the main" in text:
            return "FEEDBACK: call aux.\nPROCESS_SCORE: 2"
        return f"FEEDBACK: ok.\nPROCESS_SCORE: {len(text) % 11}"

    return FakeOpenAI(reply=reply)


def _coach(srv):
    chat = OpenAICompatibleChat("coach-model", srv.url + "/v1", price=Price(1.0, 1.0))
    return Coach(CachedChat(chat, ResponseCache(":memory:"), CostTracker(budget_usd=1.0)), max_tokens=32)


def test_coach_scores_are_mixed_into_each_agents_reward(embedded_tokenizer, tiny_llama, tmp_path, one_thread):
    tok = embedded_tokenizer
    problems = load_problems()[:1]
    sampling = SamplingParams(max_completion_length=6, temperature=1.0, top_p=1.0)
    coach_cfg = CoachParams(enabled=True, backend="openai_compatible", w_process=0.1, w_outcome=1.0)
    cfg = TrainMagrpoParams(
        num_steps=1, problems_per_step=1, num_generations=2, bf16_update=False, coach=coach_cfg
    )
    model = attach_adapters(tiny_llama(len(tok), seed=5), AGENTS, r=4, alpha=8, seed=2)
    with pytest.raises(ValueError, match="needs a Coach"):
        MAGRPOTrainer(model, tok, problems, None, cfg, sampling, tmp_path / "x", reward_fn=_PassFirst())
    srv = _coach_server()
    with srv.running():
        trainer = MAGRPOTrainer(model, tok, problems, None, cfg, sampling, tmp_path / "ck", reward_fn=_PassFirst(),
                                coach=_coach(srv))  # fmt: skip
        (rec,) = trainer.train(progress=False)
    joint = torch.tensor([s["total"] for s in trainer.samples])
    assert rec["reward/helper"] == pytest.approx(float((joint + 0.8).mean()))
    assert rec["reward/main"] == pytest.approx(float((joint + 0.2).mean()))
    assert rec["coach/score/helper"] == 8.0 and rec["coach/calls"] == 4 and rec["coach/failures"] == 0
    assert all(s["coach_main_feedback"] == "call aux." for s in trainer.samples)
    assert len(srv.posts) == 4  # one call per agent action


def test_writer_tester_fixer_workflow_trains_three_adapters(embedded_tokenizer, tiny_llama, tmp_path, sandbox,
                                                            one_thread):  # fmt: skip
    """Three agents in sequence on the real sandbox; rewards vary only through the coach (a random model's code
    scores 0), so each adapter's change comes from its own coach-mixed reward."""
    tok = embedded_tokenizer
    problems = load_problems()[:1]
    sampling = SamplingParams(max_completion_length=8, temperature=1.0, top_p=1.0)
    coach_cfg = CoachParams(enabled=True, backend="openai_compatible", w_process=1.0, w_outcome=1.0)
    cfg = TrainMagrpoParams(num_steps=1, problems_per_step=1, num_generations=2, bf16_update=False,
                            workflow="writer_tester_fixer", coach=coach_cfg, learning_rate=1e-2)  # fmt: skip
    model = attach_adapters(tiny_llama(len(tok), seed=5), WTF, r=4, alpha=8, seed=2)
    before = _lora(model)
    srv = _coach_server()
    with srv.running():
        trainer = MAGRPOTrainer(
            model, tok, problems, sandbox, cfg, sampling, tmp_path / "ck", coach=_coach(srv)
        )
        assert trainer.agents == WTF
        (rec,) = trainer.train(progress=False)
    assert len(trainer.samples) == 2
    s = trainer.samples[0]
    assert {"writer", "tester", "fixer", "report"} <= set(s) and s["report"]
    assert rec["coach/calls"] == 6 and "tester_pass_rate" in rec
    for agent in WTF:
        assert f"reward/{agent}" in rec
        if rec[f"advantage_abs/{agent}"] > 0:
            assert _changed(model, before, agent), agent
    assert any(rec[f"advantage_abs/{a}"] > 0 for a in WTF)
    trainer.save_adapters(tmp_path / "adapters")
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == sorted(WTF)
    # the evaluate stage's comparison: the same episodes without, then with the adapters
    from orchestry.config import IntervalsParams
    from orchestry.evaluation.agents import evaluate_workflow

    model.eval()
    out = {n: (recs, summ) for n, recs, summ in evaluate_workflow(problems, model, tok, sandbox, sampling, 2, 0,
                                                                   IntervalsParams(resamples=100))}  # fmt: skip
    assert list(out) == ["base", "magrpo"]
    for name, (recs, summ) in out.items():
        assert len(recs) == 2 and all(
            r["method"] == name and r["main"] == r["fixer"] and r["helper"] == "" for r in recs
        )
        assert summ["reward"] == pytest.approx(sum(r["total"] for r in recs) / 2) and summ["n_samples"] == 2
    texts = {n: [(r["writer"], r["tester"], r["fixer"]) for r in recs] for n, (recs, _) in out.items()}
    assert texts["base"] != texts["magrpo"]  # the trained adapters are used (at least one of them changed)
    # `evaluate_base`: the base episodes from the bare base model (no peft) are the ones above
    bare = tiny_llama(len(tok), seed=5)  # the weights under the adapters
    ((name, recs, _),) = evaluate_workflow(problems, bare, tok, sandbox, sampling, 2, 0, IntervalsParams(resamples=100),
                                           pairs=("base",))  # fmt: skip
    strip = lambda rs: [{k: v for k, v in r.items() if "seconds" not in k} for r in rs]  # noqa: E731
    assert name == "base" and strip(recs) == strip(out["base"][0])


def test_params_reject_inconsistent_options():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="turn_weights has 1"):
        TrainMagrpoParams(turns=2, turn_weights=[1.0])
    with pytest.raises(ValidationError, match="one turn"):
        TrainMagrpoParams(workflow="writer_tester_fixer", turns=2)
    with pytest.raises(ValidationError, match="reinforce_pp has none"):
        TrainMagrpoParams(advantage="reinforce_pp", dynamic_sampling="skip")
    with pytest.raises(ValidationError, match="both be 0"):
        CoachParams(w_process=0, w_outcome=0)
