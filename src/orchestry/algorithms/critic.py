"""A learned state-value baseline for MAGRPO's policy gradient: ``A = R - V(s)``, V a small MLP on a fixed state
encoding, fitted by MSE to the observed returns.

Source: the actor-critic baseline (Sutton & Barto, "Reinforcement Learning", 2nd ed., section 13.5; Williams 1992's
reinforcement baseline as a learned function of the state). Two ways to share it between agents:

* ``centralized`` (MAAC-style: S. Iqbal, F. Sha, "Actor-Attention-Critic for Multi-Agent Reinforcement Learning",
  ICML 2019, arXiv 1810.02912; centralised training, decentralised execution): ONE value network on the joint
  state, the concatenation of every agent's state encoding, shared by the agents. With the shared joint reward it
  has one output, so every agent gets the same advantage (as in MAGRPO); with per-agent rewards (counterfactual
  credit, the coach) it has one output head per agent on the shared trunk, as MAAC's critic shares its
  parameters between the agents' heads.
* ``per_agent`` (IAC-style: independent actor-critic, each agent its own critic on its own observation; the
  CoMLRL library's IAC trainer): each agent its own value network on its own state encoding, fitted to its own
  reward.

The functions here are pure torch: the state encoding (in the trainer: the MiniLM sentence embedding of each
agent's prompt of the turn, :mod:`orchestry.llm.encoder`) comes in as tensors. ``tests/test_critic.py`` checks
the value loss falls on a fixed toy set, ``A = R - V``, the input shapes of both modes and a state round trip.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch
from torch import nn

CRITIC_MODES = ("centralized", "per_agent")
JOINT = "joint"  # the key of the centralized critic's one network


class ValueNet(nn.Module):
    """``V(s)``: Linear(d_in, hidden) -> tanh -> Linear(hidden, hidden) -> tanh -> Linear(hidden, heads).

    The output layer starts at 0 (weights and bias), so an untrained critic's baseline is 0 and its first
    advantages are the rewards themselves (plain REINFORCE) rather than noise."""

    def __init__(self, d_in: int, hidden: int, heads: int = 1):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, heads)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, d_in]`` -> ``[B, heads]``."""
        return self.head(self.body(x))


def critic_input(
    embeddings: Mapping[str, torch.Tensor], agents: Sequence[str], mode: str, agent: str
) -> torch.Tensor:
    """The value network's input for ``agent``.

    Args:
        embeddings: ``{agent: [..., D]}`` every agent's state encoding of the same samples.
        agents: the agents in their fixed order (the joint state's layout).
        mode: ``centralized``: the joint state ``cat_a embeddings[a]`` ``[..., k*D]`` (the same for every agent);
            ``per_agent``: ``embeddings[agent]`` ``[..., D]``.
    """
    if mode == "centralized":
        return torch.cat([embeddings[a] for a in agents], dim=-1)
    if mode == "per_agent":
        return embeddings[agent]
    raise ValueError(f"unknown critic {mode!r} (allowed: {', '.join(CRITIC_MODES)})")


def critic_advantages(rewards: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``A = R - V(s)``: the rewards minus the critic's values of the samples' states (no grad).

    Args:
        rewards: ``[N, G]`` (any shape); values: the same shape, V computed BEFORE the critic is fitted on these
            rewards (so a sample's own reward never enters its baseline through this step's fit).
    """
    if values.shape != rewards.shape:
        raise ValueError(f"values {tuple(values.shape)} must match rewards {tuple(rewards.shape)}")
    return rewards - values.detach().to(rewards.dtype)


def value_loss(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error ``mean (V - R)^2`` over the entries where ``mask`` is true (all when None)."""
    err = (pred - target.to(pred.dtype)) ** 2
    if mask is None:
        return err.mean()
    m = mask.to(err.dtype)
    return (err * m).sum() / m.sum().clamp(min=1.0)


class Critic:
    """The value networks of one run and their Adam optimizers.

    Args:
        agents: the agents, in the joint state's order.
        dim: the size D of one agent's state encoding.
        mode: ``centralized`` (one network ``"joint"`` on ``[k*D]``) | ``per_agent`` (one per agent on ``[D]``).
        hidden: hidden width of each :class:`ValueNet`.
        lr: Adam learning rate.
        steps: full-batch Adam steps per :meth:`fit` call (one call per network per training step).
        per_agent_rewards: the agents' rewards differ (credit, coach): the centralized network gets one head per
            agent; otherwise one head shared by all.
        seed: initialises the weights inside ``torch.random.fork_rng``: torch's global random stream is left
            as it was (the policy's sampling and dropout do not move).
    """

    def __init__(
        self,
        agents: Sequence[str],
        dim: int,
        mode: str = "centralized",
        hidden: int = 128,
        lr: float = 1e-2,
        steps: int = 8,
        per_agent_rewards: bool = False,
        seed: int = 0,
    ):
        if mode not in CRITIC_MODES:
            raise ValueError(f"unknown critic {mode!r} (allowed: {', '.join(CRITIC_MODES)})")
        self.agents, self.dim, self.mode, self.steps = tuple(agents), int(dim), mode, int(steps)
        self.heads = len(self.agents) if (mode == "centralized" and per_agent_rewards) else 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if mode == "centralized":
                self.nets = {JOINT: ValueNet(len(self.agents) * self.dim, hidden, self.heads)}
            else:
                self.nets = {a: ValueNet(self.dim, hidden, 1) for a in self.agents}
        self.optimizers = {k: torch.optim.Adam(n.parameters(), lr=lr) for k, n in self.nets.items()}

    def slot(self, agent: str) -> tuple[str, int]:
        """``(network key, output head)`` that gives ``agent``'s value."""
        if self.mode == "per_agent":
            return agent, 0
        return JOINT, self.agents.index(agent) if self.heads > 1 else 0

    def input_dim(self, key: str) -> int:
        """The input size of network ``key``: k*D (centralized) or D (per agent)."""
        return self.nets[key].body[0].in_features

    @torch.no_grad()
    def values(self, agent: str, x: torch.Tensor) -> torch.Tensor:
        """``V(s)`` for ``agent``: ``x [B, d_in]`` (:func:`critic_input`) -> ``[B]``."""
        key, head = self.slot(agent)
        net = self.nets[key]
        if x.shape[-1] != self.input_dim(key):
            raise ValueError(f"critic {key!r} takes inputs of size {self.input_dim(key)}, got {x.shape[-1]}")
        net.eval()
        return net(x.float())[:, head]

    def fit(
        self, key: str, x: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[float, float]:
        """``steps`` full-batch Adam steps on the MSE of network ``key``'s outputs to ``targets``.

        Args:
            x: ``[B, d_in]``; targets: ``[B, heads]`` (or ``[B]`` for one head); mask: optional ``[B, heads]``.

        Returns:
            ``(loss before, loss after)`` the steps, on this data.
        """
        net, opt = self.nets[key], self.optimizers[key]
        y = targets.float().reshape(x.shape[0], -1)
        if y.shape[1] != net.head.out_features:
            raise ValueError(
                f"critic {key!r} has {net.head.out_features} head(s), targets {tuple(targets.shape)}"
            )
        m = None if mask is None else mask.reshape(y.shape)
        x = x.float()
        net.train()
        with torch.no_grad():
            before = float(value_loss(net(x), y, m))
        for _ in range(self.steps):
            opt.zero_grad(set_to_none=True)
            loss = value_loss(net(x), y, m)
            loss.backward()
            opt.step()
        with torch.no_grad():
            after = float(value_loss(net(x), y, m))
        net.eval()
        return before, after

    def state_dict(self) -> dict:
        """Every network's weights and its Adam state (for the trainer's checkpoints)."""
        return {
            "mode": self.mode,
            "heads": self.heads,
            "nets": {k: n.state_dict() for k, n in self.nets.items()},
            "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`'s output; a state of another mode or head count is refused."""
        if (
            state.get("mode") != self.mode
            or state.get("heads") != self.heads
            or set(state["nets"]) != set(self.nets)
        ):
            raise ValueError(
                f"critic state of mode {state.get('mode')!r} with heads {state.get('heads')} does not fit this "
                f"critic ({self.mode!r}, {self.heads} head(s))"
            )
        for k, n in self.nets.items():
            n.load_state_dict(state["nets"][k])
            # a copy: torch's Optimizer.load_state_dict keeps the given tensors, which the source keeps updating
            self.optimizers[k].load_state_dict(copy.deepcopy(state["optimizers"][k]))
