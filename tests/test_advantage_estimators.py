"""The advantage estimators beside the group mean (``train_magrpo.advantage``: rloo, reinforce, agent_turn, remax)
against hand-computed values, and one trainer update with each (docs/algorithms.md, section 3.1; remax's and the
critic's trainer runs: tests/test_value_baselines.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from orchestry.algorithms.magrpo import (
    agent_turn_advantages,
    group_advantages,
    reinforce_advantages,
    remax_advantages,
    reward_sum_count,
    rloo_advantages,
    running_baseline,
)
from orchestry.config import ADVANTAGE_ESTIMATORS, SamplingParams, TrainMagrpoParams
from orchestry.llm.loading import attach_adapters
from orchestry.llm.local import Generation, GenerationBatch
from orchestry.problems import load_problems
from orchestry.rewards.code import LevelReward
from orchestry.training.magrpo import AGENTS, Rollout
from orchestry.training.magrpo.trainer import MAGRPOTrainer

R = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
NEW = ("rloo", "reinforce", "agent_turn")


# ---- rloo --------------------------------------------------------------------------------------------------------
def test_rloo_is_the_reward_minus_the_mean_of_the_other_three():
    # group 1: 1 - (0+0+1)/3 = 2/3, 0 - (1+0+1)/3 = -2/3; group 2: 2 - 2 = 0
    expected = torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(rloo_advantages(R), expected, atol=1e-7)
    assert torch.equal(group_advantages(R, "rloo"), rloo_advantages(R))  # the mode is this function
    # the leave-one-out form, written out, on a group with four different rewards
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    loo = torch.tensor([[r[0, g] - (r.sum() - r[0, g]) / 3 for g in range(4)]])
    assert torch.allclose(rloo_advantages(r), loo, atol=1e-6)
    # G/(G-1) times the group-mean advantage, and no std division
    assert torch.allclose(rloo_advantages(r), group_advantages(r, "mean") * 4 / 3, atol=1e-6)


def test_rloo_needs_groups_of_two():
    with pytest.raises(ValueError, match="G >= 2"):
        rloo_advantages(torch.ones(3, 1))
    with pytest.raises(ValueError, match=r"\[N, G\]"):
        rloo_advantages(torch.ones(4))


# ---- reinforce ---------------------------------------------------------------------------------------------------
def test_reinforce_with_a_running_baseline_over_two_steps():
    total, count = reward_sum_count(R)
    assert (total, count) == (10.0, 8)
    b0, state = running_baseline(None, total / count, decay=0.9)  # first step: its own mean, 1.25
    assert (b0, state) == (1.25, 1.25)
    assert torch.equal(
        reinforce_advantages(R, b0), torch.tensor([[-0.25, -1.25, -1.25, -0.25], [0.75, 0.75, 0.75, 0.75]])
    )
    step1 = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # mean 0.5
    b1, state = running_baseline(state, reward_sum_count(step1)[0] / 8, decay=0.9)
    assert b1 == 1.25  # earlier steps' rewards only
    assert state == pytest.approx(0.9 * 1.25 + 0.1 * 0.5)  # 1.175
    assert torch.equal(reinforce_advantages(step1, b1), torch.tensor([[-1.25] * 4, [-0.25] * 4]))
    # decay 0: the baseline is the previous step's mean
    assert running_baseline(0.25, 0.75, decay=0.0) == (0.25, 0.75)
    with pytest.raises(ValueError, match="decay"):
        running_baseline(None, 1.0, decay=1.0)


def test_reward_sum_count_counts_only_the_active_samples():
    active = torch.tensor([[True, True, False, True], [False, False, False, False]])
    assert reward_sum_count(R, active) == (2.0, 3)
    with pytest.raises(ValueError, match="active"):
        reward_sum_count(R, active[:, :2])


# ---- remax ------------------------------------------------------------------------------------------------------
def test_remax_is_the_reward_minus_the_greedy_rollouts_reward():
    greedy = torch.tensor([0.5, 3.0])  # each problem's greedy (argmax) joint rollout's reward
    # group 1: 1 - 0.5, 0 - 0.5; group 2: 2 - 3 (a flat group still gets a signal against its greedy rollout)
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [-1.0, -1.0, -1.0, -1.0]])
    assert torch.equal(remax_advantages(R, greedy), expected)
    assert torch.equal(remax_advantages(R, greedy.view(2, 1)), expected)  # [N, 1] (a G = 1 rollout's rewards)
    # the greedy reward equal to the group mean gives the MAGRPO advantage
    assert torch.equal(remax_advantages(R, R.mean(dim=1)), group_advantages(R, "mean"))
    with pytest.raises(ValueError, match=r"\[N\] = \[2\]"):
        remax_advantages(R, torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=r"\[N, G\]"):
        remax_advantages(torch.ones(4), torch.ones(4))


# ---- agent_turn (AT-GRPO) ----------------------------------------------------------------------------------------
def test_agent_turn_with_every_sample_active_is_the_mean_std_mode():
    # group 1: mean 0.5, population std 0.5 -> +-1; group 2 flat -> 0
    expected = torch.tensor([[1.0, -1.0, -1.0, 1.0], [0.0] * 4]) * (0.5 / (0.5 + 1e-6))
    assert torch.allclose(agent_turn_advantages(R), expected, atol=1e-7)
    assert torch.allclose(agent_turn_advantages(R), group_advantages(R, "mean_std"), atol=1e-6)


def test_agent_turn_groups_only_the_samples_acting_at_the_turn():
    active = torch.tensor([[True, True, False, True], [True, True, True, True]])
    # group 1 over {1, 0, 1}: mean 2/3, std sqrt(2)/3 -> 1/sqrt 2, -sqrt 2, (inactive) 0, 1/sqrt 2
    s = math.sqrt(2)
    expected = torch.tensor([[1 / s, -s, 0.0, 1 / s], [0.0] * 4])
    assert torch.allclose(agent_turn_advantages(R, active), expected, atol=1e-5)
    # a group with one active sample has no relative baseline: 0
    one = torch.tensor([[False, True, False, False], [True, True, True, True]])
    assert torch.equal(agent_turn_advantages(R, one)[0], torch.zeros(4))
    # the group mean with the carried rewards is another thing: here sample 1 is compared with all four
    assert not torch.allclose(group_advantages(R, "mean_std")[0] * active[0], expected[0], atol=1e-3)
    with pytest.raises(ValueError, match="active"):
        agent_turn_advantages(R, active[:1])
    with pytest.raises(ValueError, match="G >= 2"):
        agent_turn_advantages(torch.ones(2, 1))


# ---- the trainer -------------------------------------------------------------------------------------------------
def test_the_config_takes_each_new_value_and_keeps_the_paper_default():
    assert TrainMagrpoParams().advantage == "mean"
    description = TrainMagrpoParams.model_fields["advantage"].description
    for name in NEW:
        assert name in ADVANTAGE_ESTIMATORS and name in description
        assert TrainMagrpoParams(advantage=name).advantage == name
    with pytest.raises(ValueError):
        TrainMagrpoParams(baseline_decay=1.0)


def _rollout(vocab: int, problems, G: int, rewards: torch.Tensor, active=None, turn=0) -> Rollout:
    """Fixed token ids: N problems x 2 agents x G rows, prompt width 6, 5 completion tokens."""
    g = torch.Generator().manual_seed(0)
    B = len(problems) * len(AGENTS) * G
    seqs = torch.randint(3, vocab, (B, 11), generator=g)
    mask = torch.ones(B, 11, dtype=torch.long)
    items = [Generation("", 6, 5, i) for i in range(B)]
    details = [LevelReward().to_dict() for _ in range(len(problems) * G)]
    return Rollout(list(problems), GenerationBatch(seqs, mask, 6, items, 0.0), rewards, details, G,
                   active=active, turn=turn, shared_prompt=turn == 0)  # fmt: skip


def _trainer(tiny_llama, advantage: str, **kw) -> MAGRPOTrainer:
    problems = load_problems()[:2]
    model = attach_adapters(tiny_llama(64), AGENTS, r=4, alpha=8)
    cfg = TrainMagrpoParams(
        num_generations=4,
        problems_per_step=2,
        learning_rate=1e-2,
        bf16_update=False,
        advantage=advantage,
        **kw,
    )
    return MAGRPOTrainer(model, None, problems, None, cfg, SamplingParams(), checkpoint_dir="/nonexistent")


@pytest.mark.parametrize("advantage", NEW)
def test_the_trainer_runs_one_update_with_each_new_estimator(
    tiny_llama, only_adapters_changed, one_thread, advantage
):
    trainer = _trainer(tiny_llama, advantage)
    model = trainer.model
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    lora_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    out = trainer.update(_rollout(64, trainer.problems, 4, R))
    assert out["loss/helper"] != 0.0 and out["loss/main"] != 0.0
    # rloo and agent_turn: the flat group adds no row; reinforce: every row differs from the baseline 1.25
    assert out["rows_updated/helper"] == {"rloo": 4, "agent_turn": 4, "reinforce": 8}[advantage]
    only_adapters_changed(model, base_before, lora_before, AGENTS)
    if advantage == "reinforce":
        assert trainer.reward_baseline == {"helper/turn_0": 1.25, "main/turn_0": 1.25}
    else:
        assert trainer.reward_baseline == {}


def test_reinforce_keeps_one_baseline_per_agent_and_turn_over_the_active_samples(tiny_llama, one_thread):
    trainer = _trainer(tiny_llama, "reinforce", baseline_decay=0.5, turns=2)
    ro = _rollout(64, trainer.problems, 4, R)
    active = torch.tensor([[True, True, False, True], [False, False, False, False]])  # mean of {1, 0, 1}: 2/3
    later = _rollout(64, trainer.problems, 4, R, active=active, turn=1)
    b = trainer.reinforce_baselines([ro, later])
    assert b == pytest.approx(
        {"helper/turn_0": 1.25, "main/turn_0": 1.25, "helper/turn_1": 2 / 3, "main/turn_1": 2 / 3}
    )
    assert torch.equal(trainer.advantages("main", ro, R, b), R - 1.25)
    assert torch.allclose(trainer.advantages("main", later, R, b), R - 2 / 3)
    # the next step ran one turn, all rewards 0: turn 0's baseline is the earlier step's, turn 1's state stays
    b = trainer.reinforce_baselines([_rollout(64, trainer.problems, 4, torch.zeros(2, 4))])
    assert b == {"helper/turn_0": 1.25, "main/turn_0": 1.25}
    assert trainer.reward_baseline == pytest.approx(
        {"helper/turn_0": 0.625, "main/turn_0": 0.625, "helper/turn_1": 2 / 3, "main/turn_1": 2 / 3}
    )
    # a turn where no sample acted has no baseline and trains nothing
    nothing = _rollout(64, trainer.problems, 4, R, active=torch.zeros(2, 4, dtype=torch.bool), turn=1)
    assert trainer.reinforce_baselines([nothing]) == {}
    assert torch.equal(trainer.advantages("main", nothing, R, {}), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="turns=2"):
        trainer.reinforce_baselines([_rollout(64, trainer.problems, 4, R, turn=2)])


def test_agent_turn_in_a_later_turn_trains_only_the_continued_samples(tiny_llama, one_thread):
    trainer = _trainer(tiny_llama, "agent_turn")
    active = torch.tensor([[True, True, False, True], [True, True, True, True]])
    ro = _rollout(64, trainer.problems, 4, R, active=active, turn=1)
    assert torch.allclose(trainer.advantages("helper", ro, R), agent_turn_advantages(R, active))
    out = trainer.update(ro)
    assert out["rows_updated/helper"] == 3 and out["rows_updated/main"] == 3


def test_the_reinforce_baseline_is_kept_in_the_checkpoint(tmp_path, tiny_llama, one_thread):
    problems = load_problems()[:2]
    cfg = TrainMagrpoParams(num_steps=3, num_generations=4, problems_per_step=2, bf16_update=False,
                            advantage="reinforce")  # fmt: skip

    def make():
        model = attach_adapters(tiny_llama(64), AGENTS, r=4, alpha=8)
        return MAGRPOTrainer(
            model, None, problems, None, cfg, SamplingParams(), checkpoint_dir=tmp_path / "c"
        )

    trainer = make()
    trainer.update(_rollout(64, problems, 4, R))
    trainer.save_checkpoint(1)
    saved = json.loads((tmp_path / "c" / "trainer.json").read_text())["reward_baseline"]
    assert saved == {"helper/turn_0": 1.25, "main/turn_0": 1.25}
    fresh = make()
    assert fresh.reward_baseline == {}
    assert fresh.load_checkpoint() == 1
    assert fresh.reward_baseline == trainer.reward_baseline


def test_the_one_entry_point_knows_the_new_names():
    from orchestry.algorithms.reinforce_pp import ESTIMATORS, estimate_advantages

    assert {"rloo", "reinforce", "agent_turn"} <= set(ESTIMATORS)
    assert torch.equal(estimate_advantages("rloo", R), rloo_advantages(R))
    assert torch.equal(estimate_advantages("reinforce", R, baseline=1.0), R - 1.0)
    active = torch.tensor([[True, True, False, True], [True, True, True, True]])
    assert torch.equal(estimate_advantages("agent_turn", R, active=active), agent_turn_advantages(R, active))
    with pytest.raises(ValueError, match="baseline"):
        estimate_advantages("reinforce", R)
    with pytest.raises(ValueError, match="takes only"):
        estimate_advantages("agent_turn", R, beta=0.1)
    assert {"remax", "critic"} <= set(ESTIMATORS)
    greedy = torch.tensor([0.5, 3.0])
    assert torch.equal(estimate_advantages("remax", R, greedy_rewards=greedy), remax_advantages(R, greedy))
    assert torch.equal(estimate_advantages("critic", R, values=torch.full_like(R, 0.25)), R - 0.25)
    with pytest.raises(ValueError, match="greedy_rewards"):
        estimate_advantages("remax", R)
    with pytest.raises(ValueError, match="values"):
        estimate_advantages("critic", R, baseline=1.0)
