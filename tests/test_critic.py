"""The learned value baseline (``train_magrpo.advantage: critic``; orchestry.algorithms.critic) on fixed toy data:
A = R - V by hand, the value loss falls, the input shapes of the centralized and per-agent critics, a state round
trip, and the global random stream left alone."""

from __future__ import annotations

import pytest
import torch

from orchestry.algorithms.critic import (
    CRITIC_MODES,
    JOINT,
    Critic,
    critic_advantages,
    critic_input,
    value_loss,
)

AGENTS = ("helper", "main")
D = 8


def _toy(n: int = 16, seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """n states: each agent's fixed random embedding, and a return that depends on both (a + b of two coordinates)."""
    g = torch.Generator().manual_seed(seed)
    emb = {a: torch.randn(n, D, generator=g) for a in AGENTS}
    returns = 1.0 + emb["helper"][:, 0] + 0.5 * emb["main"][:, 1]
    return emb, returns


def test_the_modes_are_the_configs():
    from orchestry.config import CRITIC_MODES as CONFIG_MODES

    assert CRITIC_MODES == CONFIG_MODES == ("centralized", "per_agent")


def test_advantages_are_the_rewards_minus_the_values_by_hand():
    R = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    V = torch.tensor([[0.5, 0.5, 0.5, 0.5], [2.5, 1.0, 2.0, 0.0]])
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [-0.5, 1.0, 0.0, 2.0]])
    assert torch.equal(critic_advantages(R, V), expected)
    with pytest.raises(ValueError, match="match"):
        critic_advantages(R, V[:, :2])


def test_value_loss_by_hand():
    pred, target = torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0.0, 2.0, 2.0])
    assert value_loss(pred, target) == pytest.approx((1 + 0 + 4) / 3)
    assert value_loss(pred, target, torch.tensor([True, True, False])) == pytest.approx(0.5)


def test_an_untrained_critic_values_every_state_at_zero():
    emb, _ = _toy()
    c = Critic(AGENTS, D, "centralized", hidden=16)
    assert torch.equal(c.values("main", critic_input(emb, AGENTS, "centralized", "main")), torch.zeros(16))


@pytest.mark.parametrize("mode", CRITIC_MODES)
def test_the_value_loss_falls_on_a_fixed_toy_set(mode):
    emb, returns = _toy()
    c = Critic(AGENTS, D, mode, hidden=32, lr=1e-2, steps=200, seed=3)
    for agent in AGENTS:
        key, head = c.slot(agent)
        if mode == "centralized" and agent == "main":
            break  # one shared network, fitted once
        x = critic_input(emb, AGENTS, mode, agent)
        before, after = c.fit(key, x, returns)
        assert before == pytest.approx(float((returns**2).mean()))  # V = 0 at first
        assert after < 0.05 * before
        assert value_loss(c.values(agent, x), returns) == pytest.approx(after, rel=1e-5)


def test_centralized_takes_the_joint_state_and_per_agent_each_its_own():
    emb, _ = _toy(n=5)
    joint = critic_input(emb, AGENTS, "centralized", "helper")
    assert joint.shape == (5, 2 * D) and torch.equal(joint, critic_input(emb, AGENTS, "centralized", "main"))
    assert torch.equal(joint[:, :D], emb["helper"]) and torch.equal(joint[:, D:], emb["main"])
    assert torch.equal(critic_input(emb, AGENTS, "per_agent", "main"), emb["main"])
    with pytest.raises(ValueError, match="unknown critic"):
        critic_input(emb, AGENTS, "shared", "main")

    central = Critic(AGENTS, D, "centralized", hidden=16)
    assert set(central.nets) == {JOINT} and central.input_dim(JOINT) == 2 * D and central.heads == 1
    assert central.slot("helper") == central.slot("main") == (JOINT, 0)  # one V shared by the agents
    assert central.values("helper", joint).shape == (5,)
    with pytest.raises(ValueError, match="inputs of size 16"):
        central.values("helper", emb["helper"])
    # per-agent rewards (credit, coach): one head per agent on the shared joint trunk
    heads = Critic(AGENTS, D, "centralized", hidden=16, per_agent_rewards=True)
    assert heads.heads == 2 and heads.slot("main") == (JOINT, 1)
    with pytest.raises(ValueError, match="2 head"):
        heads.fit(JOINT, joint, torch.zeros(5))

    per = Critic(AGENTS, D, "per_agent", hidden=16, per_agent_rewards=True)
    assert set(per.nets) == set(AGENTS) and per.heads == 1
    assert all(per.input_dim(a) == D and per.slot(a) == (a, 0) for a in AGENTS)
    with pytest.raises(ValueError, match="unknown critic"):
        Critic(AGENTS, D, "shared")


@pytest.mark.parametrize("mode", CRITIC_MODES)
def test_the_state_round_trip_restores_weights_and_adam(mode):
    emb, returns = _toy()
    a = Critic(AGENTS, D, mode, hidden=16, steps=5, seed=1)
    x = {ag: critic_input(emb, AGENTS, mode, ag) for ag in AGENTS}
    a.fit(a.slot("helper")[0], x["helper"], returns)
    b = Critic(AGENTS, D, mode, hidden=16, steps=5, seed=2)  # other initial weights
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.values("main", x["main"]), b.values("main", x["main"]))
    # the Adam moments came along: the next fit is the same step on both
    assert a.fit(a.slot("main")[0], x["main"], returns) == b.fit(b.slot("main")[0], x["main"], returns)
    assert torch.equal(a.values("helper", x["helper"]), b.values("helper", x["helper"]))
    other = Critic(AGENTS, D, "per_agent" if mode == "centralized" else "centralized", hidden=16)
    with pytest.raises(ValueError, match="does not fit"):
        other.load_state_dict(a.state_dict())


def test_building_a_critic_leaves_the_global_random_stream_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    c1 = Critic(AGENTS, D, "centralized", hidden=16, seed=7)
    assert torch.equal(torch.rand(3), expected)
    c2 = Critic(AGENTS, D, "centralized", hidden=16, seed=7)  # seeded: the same weights again
    pairs = zip(c1.nets[JOINT].parameters(), c2.nets[JOINT].parameters(), strict=True)
    assert all(torch.equal(p, q) for p, q in pairs)
