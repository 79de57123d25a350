"""``train_magrpo.advantage`` remax and critic in the trainer, on a tiny random Llama with the embedded tokenizer:
the greedy joint rollout happens, is scored, counted in the step's tokens and never trained, and A = R - R_greedy;
the critic's advantages are R - V(s) with V from before the step's fit, its state is checkpointed and resumed; the
default estimator builds neither (orchestry.training.magrpo.value_baselines)."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
import torch

from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.loading import attach_adapters
from orchestry.llm.local import chat_prompt, generate
from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, load_problems
from orchestry.rewards.code import LevelReward
from orchestry.training.magrpo import AGENTS, value_baselines
from orchestry.training.magrpo.trainer import MAGRPOTrainer

SAMPLING = SamplingParams(max_completion_length=6, temperature=1.0, top_p=1.0)


class _Recorder:
    """Longer completions score higher (a real function of the texts); every call's texts and totals recorded."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, problems, helpers, mains):
        out = [
            LevelReward(structure=min(1.0, (len(h) + len(m)) / 50.0))
            for h, m in zip(helpers, mains, strict=True)
        ]
        self.calls.append({"helpers": list(helpers), "mains": list(mains), "totals": [r.total for r in out]})
        return out


class _HashEncoder:
    """A stand-in for the MiniLM encoder: a fixed random 16-d vector per text (seeded by its hash)."""

    dim = 16

    def __init__(self):
        self.texts: list[str] = []

    def encode(self, texts):
        self.texts += list(texts)
        vecs = []
        for t in texts:
            g = torch.Generator().manual_seed(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16))
            vecs.append(torch.randn(self.dim, generator=g))
        return torch.stack(vecs) if vecs else torch.zeros(0, self.dim)


def _trainer(tok, tiny_llama, ckpt, reward, encoder=None, problems=2, **kw) -> MAGRPOTrainer:
    cfg = TrainMagrpoParams(
        **{
            "num_steps": 2,
            "problems_per_step": 2,
            "num_generations": 2,
            "learning_rate": 5e-2,
            "bf16_update": False,
        }
        | kw
    )
    model = attach_adapters(tiny_llama(len(tok), seed=5), AGENTS, r=4, alpha=8, seed=2)
    return MAGRPOTrainer(
        model, tok, load_problems()[:problems], None, cfg, SAMPLING, ckpt, reward_fn=reward, encoder=encoder
    )


def _spy_advantages(trainer) -> list[tuple]:
    """Record every ``advantages`` call: (agent, rollout, rewards, advantages)."""
    seen = []
    real = trainer.advantages

    def spy(agent, ro, rewards, baselines=None):
        a = real(agent, ro, rewards, baselines)
        seen.append((agent, ro, rewards.clone(), a.clone()))
        return a

    trainer.advantages = spy
    return seen


# ---- remax ------------------------------------------------------------------------------------------------------
def test_remax_decodes_one_greedy_pair_per_problem_and_takes_its_reward_as_the_baseline(
    embedded_tokenizer, tiny_llama, tmp_path, one_thread
):
    tok, reward = embedded_tokenizer, _Recorder()
    trainer = _trainer(tok, tiny_llama, tmp_path / "ck", reward, advantage="remax")
    # step 0's greedy pair, decoded beforehand (argmax, the untrained adapters, the same prompts)
    prompts, adapters = [], []
    for p in trainer.problems_for_step(0):
        prompts += [
            chat_prompt(tok, p.helper_prompt(), HELPER_SYSTEM),
            chat_prompt(tok, p.main_prompt(), MAIN_SYSTEM),
        ]
        adapters += list(AGENTS)
    expected = generate(trainer.model, tok, prompts, adapters, max_new_tokens=6, temperature=0.0)
    seen = _spy_advantages(trainer)
    hist = trainer.train(progress=False)

    # per step: the sampled rollout (N*G = 4 pairs), then the greedy one (N = 2 pairs), scored by the same reward
    assert [len(c["totals"]) for c in reward.calls] == [4, 2, 4, 2]
    greedy0 = reward.calls[1]
    assert greedy0["helpers"] == [expected.items[0].text, expected.items[2].text]
    assert greedy0["mains"] == [expected.items[1].text, expected.items[3].text]
    for step, rec in enumerate(hist):
        g_totals = reward.calls[2 * step + 1]["totals"]
        assert rec["remax/greedy_reward"] == pytest.approx(sum(g_totals) / 2)
        assert rec["remax/greedy_turns"] == 1
        # its tokens count in the step's cost, beside the samples' (which alone are in the samples table)
        samples = [s for s in trainer.samples if s["step"] == step]
        assert len(samples) == 4  # the greedy pairs are never samples
        assert (
            rec["tokens/completion"]
            == sum(s["helper_tokens"] + s["main_tokens"] for s in samples) + rec["tokens/completion/greedy"]
        )
        assert rec["tokens/prompt/greedy"] > 0 and rec["seconds/greedy"] >= 0
    assert hist[0]["tokens/completion/greedy"] == sum(i.completion_tokens for i in expected.items)
    assert hist[0]["tokens/prompt/greedy"] == sum(i.prompt_tokens for i in expected.items)
    # A = R - R_greedy, per problem, for both agents and both steps
    assert len(seen) == 4
    for agent, ro, rewards, adv in seen:
        assert ro.greedy is not None and ro.greedy.G == 1 and agent in AGENTS
        assert torch.equal(adv, rewards - ro.greedy.rewards)  # [N, G] - [N, 1]
    # step 0's update: its baseline is the greedy pair decoded above
    for _agent, ro, _rewards, _adv in seen[:2]:
        assert ro.greedy.rewards.flatten().tolist() == pytest.approx(greedy0["totals"])


def test_remax_in_a_two_turn_episode_compares_each_turn_with_the_greedy_pairs_turn(
    embedded_tokenizer, tiny_llama, tmp_path, one_thread
):
    tok, reward = (
        embedded_tokenizer,
        _Recorder(),
    )  # no assert ever passes: every sample and the greedy pair go on
    trainer = _trainer(tok, tiny_llama, tmp_path / "ck", reward, advantage="remax", turns=2, num_steps=1)
    seen = _spy_advantages(trainer)
    (rec,) = trainer.train(progress=False)
    # sampled turn 1, sampled turn 2, then the greedy pair's turn 1 and turn 2 (on its own feedback)
    assert [len(c["totals"]) for c in reward.calls] == [4, 4, 2, 2]
    assert rec["remax/greedy_turns"] == 2
    assert rec["remax/greedy_reward"] == pytest.approx(sum(reward.calls[2]["totals"]) / 2)
    assert rec["remax/greedy_reward/turn_2"] == pytest.approx(sum(reward.calls[3]["totals"]) / 2)
    for _agent, ro, rewards, adv in seen:
        assert ro.greedy.turn == ro.turn
        assert ro.greedy.rewards.flatten().tolist() == pytest.approx(reward.calls[2 + ro.turn]["totals"])
        assert torch.equal(adv, rewards - ro.greedy.rewards)


# ---- critic -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["centralized", "per_agent"])
def test_critic_advantages_are_r_minus_v_from_before_the_steps_fit(
    embedded_tokenizer, tiny_llama, tmp_path, one_thread, mode
):
    tok, enc = embedded_tokenizer, _HashEncoder()
    trainer = _trainer(tok, tiny_llama, tmp_path / "ck", _Recorder(), enc, advantage="critic", critic=mode)
    critic = trainer.critic
    assert critic.mode == mode and critic.heads == 1
    assert {k: critic.input_dim(k) for k in critic.nets} == (
        {"joint": 32} if mode == "centralized" else {"helper": 16, "main": 16}
    )
    snapshots = []
    real_update = trainer.update

    def update(episode):
        snapshots.append(copy.deepcopy(trainer.critic.state_dict()))  # the critic the step's advantages see
        return real_update(episode)

    trainer.update = update
    seen = _spy_advantages(trainer)
    hist = trainer.train(progress=False)

    assert set(enc.texts) <= {p.helper_prompt() for p in trainer.problems} | {
        p.main_prompt() for p in trainer.problems
    }
    for step, rec in enumerate(hist):
        assert rec["critic/value_loss_after"] < rec["critic/value_loss"]
        before = value_baselines.new_critic(trainer, enc)
        before.load_state_dict(snapshots[step])
        for agent, ro, rewards, adv in seen[2 * step : 2 * step + 2]:
            emb = {a: enc.encode([getattr(p, f"{a}_prompt")() for p in ro.problems]) for a in AGENTS}
            x = torch.cat([emb[a] for a in AGENTS], -1) if mode == "centralized" else emb[agent]
            v = before.values(agent, x)  # [N], one state per problem at turn 1
            assert torch.allclose(adv, rewards - v.unsqueeze(1), atol=1e-6)
            if step == 0:
                assert torch.equal(adv, rewards)  # an untrained critic's V is 0
            else:
                assert not torch.equal(adv, rewards)  # fitted on step 0's returns
        if mode == "centralized":  # one shared V: both agents get the same advantages
            assert torch.equal(seen[2 * step][3], seen[2 * step + 1][3])
    # the fit moved the value net after the last step too
    last = trainer.critic.state_dict()["nets"]
    assert any(not torch.equal(t, snapshots[-1]["nets"][k][n]) for k in last for n, t in last[k].items())


def test_critic_states_of_a_later_turn_are_that_turns_prompts(
    embedded_tokenizer, tiny_llama, tmp_path, one_thread
):
    tok, enc = embedded_tokenizer, _HashEncoder()
    trainer = _trainer(tok, tiny_llama, tmp_path / "ck", _Recorder(), enc, advantage="critic", critic="per_agent",
                       turns=2, num_steps=1, problems=1, problems_per_step=1)  # fmt: skip
    episodes = []
    real_update = trainer.update
    trainer.update = lambda episode: episodes.append(episode) or real_update(episode)
    (rec,) = trainer.train(progress=False)
    first, second = episodes[0]
    texts = value_baselines.prompt_texts(trainer, second, first)
    for a, system in zip(AGENTS, (HELPER_SYSTEM, MAIN_SYSTEM), strict=True):
        for j, row in enumerate(second.rows(a)):
            assert "Feedback on the last attempt" in texts[a][j]
            want = tok(chat_prompt(tok, texts[a][j], system), add_special_tokens=False)["input_ids"]
            P, mask = second.batch.prompt_width, second.batch.attention_mask[row]
            got = second.batch.sequences[row, :P][mask[:P].bool()].tolist()
            assert got == want  # the very prompt the agent answered at turn 2
    assert set(texts["helper"]) <= set(enc.texts) and "critic/value_loss" in rec


def test_the_critic_is_checkpointed_and_a_resumed_run_matches_an_uninterrupted_one(
    embedded_tokenizer, tiny_llama, tmp_path, one_thread
):
    tok = embedded_tokenizer

    def make(ckpt):
        return _trainer(
            tok, tiny_llama, ckpt, _Recorder(), _HashEncoder(), advantage="critic", checkpoint_every=1
        )

    full = make(tmp_path / "full")
    full.train(progress=False)
    part = make(tmp_path / "part")
    part.cfg = part.cfg.model_copy(update={"num_steps": 1})
    part.train(progress=False)
    saved = torch.load(tmp_path / "part" / "state.pt", weights_only=False)["critic"]
    assert saved["mode"] == "centralized" and set(saved["nets"]) == {"joint"}
    resumed = make(tmp_path / "part")
    assert resumed.load_checkpoint() == 1
    for k, t in resumed.critic.state_dict()["nets"]["joint"].items():
        assert torch.equal(t, part.critic.state_dict()["nets"]["joint"][k])  # weights restored
    assert resumed.critic.optimizers["joint"].state_dict()["state"]  # Adam's moments restored
    resumed = make(tmp_path / "part")
    hist = resumed.train(progress=False)
    assert [h["step"] for h in hist] == [0, 1]
    a, b = full.critic.state_dict(), resumed.critic.state_dict()
    for k, t in a["nets"]["joint"].items():
        assert torch.allclose(t, b["nets"]["joint"][k], atol=1e-6), k
    pf, pr = dict(full.model.named_parameters()), dict(resumed.model.named_parameters())
    for n in pf:
        if "lora_" in n:
            assert torch.allclose(pf[n], pr[n], atol=1e-6), n


# ---- the default and the config ---------------------------------------------------------------------------------
def test_the_default_estimator_builds_no_encoder_critic_or_greedy_rollout(
    embedded_tokenizer, tiny_llama, tmp_path, one_thread, monkeypatch
):
    def boom(*a, **k):
        raise AssertionError("called under advantage mean")

    for name in ("default_encoder", "new_critic", "attach_greedy", "step_baselines"):
        monkeypatch.setattr(value_baselines, name, boom)
    reward = _Recorder()
    trainer = _trainer(embedded_tokenizer, tiny_llama, tmp_path / "ck", reward, num_steps=1)
    (rec,) = trainer.train(progress=False)
    assert trainer.encoder is None and trainer.critic is None
    assert [len(c["totals"]) for c in reward.calls] == [4]  # no greedy rollout
    assert not any(k.startswith(("remax/", "critic/", "tokens/prompt/", "seconds/greedy")) for k in rec)
    assert "critic" not in torch.load(tmp_path / "ck" / "state.pt", weights_only=False)
    assert json.loads((tmp_path / "ck" / "trainer.json").read_text())["next_step"] == 1


def test_the_config_takes_remax_and_critic_and_refuses_what_they_cannot_do():
    from pydantic import ValidationError

    from orchestry.config import ADVANTAGE_ESTIMATORS

    assert {"remax", "critic"} <= set(ADVANTAGE_ESTIMATORS)
    cfg = TrainMagrpoParams()
    assert (cfg.advantage, cfg.critic, cfg.critic_lr, cfg.critic_hidden, cfg.critic_steps) == (
        "mean", "centralized", 0.01, 128, 8
    )  # fmt: skip
    description = TrainMagrpoParams.model_fields["advantage"].description
    assert "remax" in description and "critic" in description
    assert TrainMagrpoParams(advantage="critic", critic="per_agent").critic == "per_agent"
    with pytest.raises(ValidationError, match="'critic'.*'remax'"):  # the message lists the allowed values
        TrainMagrpoParams(advantage="remx")
    with pytest.raises(ValidationError, match="'centralized' or 'per_agent'"):
        TrainMagrpoParams(advantage="critic", critic="shared")
    for bad in ({"critic_lr": 0.0}, {"critic_hidden": 0}, {"critic_steps": 0}):
        with pytest.raises(ValidationError):
            TrainMagrpoParams(**bad)
    for adv in ("remax", "critic"):
        with pytest.raises(ValidationError, match="helper_main only"):
            TrainMagrpoParams(advantage=adv, workflow="writer_tester_fixer")
    with pytest.raises(ValidationError, match="one process"):
        TrainMagrpoParams(advantage="critic", num_processes=2)
    assert TrainMagrpoParams(advantage="remax", num_processes=2).num_processes == 2
