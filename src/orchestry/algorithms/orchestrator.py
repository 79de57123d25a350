"""A learned orchestrator: which agent acts next, trained by REINFORCE against task reward minus cost.

Source: Dang et al., "Multi-Agent Collaboration via Evolving Orchestration" (Puppeteer, arXiv 2505.19591),
section "Adaptive Evolution". Notation as in the paper:

* a centralised policy ("puppeteer") picks at each step t the next agent a_t ~ pi(a | S_t, tau) from the agent
  pool plus a ``terminate`` action, given the global state S_t (the task tau and the history so far);
* the episode ends at the step T where ``terminate`` is chosen (or forced, at ``max_steps``);
* reward (cost-aware): R_t = -lambda * c_t for t < T, and R_T = r - lambda * C_T at the end, where r is the
  task score (the level reward, or a success bonus / failure penalty), c_t the cost of step t and
  C_T = sum_t c_t the episode's total cost. As in the paper, the running penalties say *where* cost was spent
  and the terminal term prices the whole episode, so an undiscounted episode returns r - 2 * lambda * C_T;
* REINFORCE (Williams 1992): grad J = E[ sum_t grad log pi(a_t | S_t) * (G_t - b_t) ], with the discounted
  return G_t = sum_{k >= t} gamma^(k - t) R_k, a baseline b_t (here a moving average of G_t per step
  index t), plus an entropy bonus beta_H * H(pi(. | S_t)) and gradient-norm clipping.

The policy is a small MLP over a state vector (the paper: an MLP over a frozen encoder's embedding of the
state); masking makes ``terminate`` impossible before ``min_steps`` agent actions and the only choice once
``max_steps`` agents have acted, and removes agents that cannot act in a state.

This module knows nothing about LLMs: an environment gives state vectors, masks and step costs
(``orchestry.training.orchestrator`` for the code task; tests use a synthetic one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn


# ---- 1. the policy pi(a | S_t) ---------------------------------------------------------------------------------
class OrchestratorPolicy(nn.Module):
    """MLP policy over the agent pool + ``terminate``: state ``[B, obs_dim]`` -> logits ``[B, n_actions]``.

    Architecture: Linear(obs_dim, hidden) -> tanh -> Linear(hidden, hidden) -> tanh -> Linear(hidden,
    n_actions); the last layer starts at zero, so the initial policy is uniform over the allowed actions.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.obs_dim, self.n_actions, self.hidden = obs_dim, n_actions, hidden
        self.net = nn.Sequential(
            nn.Linear(obs_dim, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, n_actions),
        )
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, obs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Masked logits ``[B, n_actions]``: ``-inf`` where ``mask`` (bool ``[B, n_actions]``) is False.

        Raises:
            ValueError: a row of ``mask`` allows no action.
        """
        if not bool(mask.any(-1).all()):
            raise ValueError("every state needs at least one allowed action")
        return self.net(obs).masked_fill(~mask, float("-inf"))

    def distribution(self, obs: torch.Tensor, mask: torch.Tensor) -> torch.distributions.Categorical:
        """pi(. | S_t) for each row."""
        return torch.distributions.Categorical(logits=self.forward(obs, mask))


def action_mask(
    n_steps: int, n_agents: int, min_steps: int, max_steps: int, available: Sequence[bool] | None = None
) -> torch.Tensor:
    """Allowed actions after ``n_steps`` agent actions: bool ``[n_agents + 1]`` (the last entry is ``terminate``).

    * ``n_steps < min_steps``: ``terminate`` is masked (unless no agent is available: then it is the only choice);
    * ``n_steps >= max_steps``: only ``terminate``;
    * otherwise the ``available`` agents (default: all) and ``terminate``.
    """
    mask = torch.zeros(n_agents + 1, dtype=torch.bool)
    if n_steps >= max_steps:
        mask[-1] = True
        return mask
    avail = torch.tensor(list(available) if available is not None else [True] * n_agents, dtype=torch.bool)
    mask[:-1] = avail
    mask[-1] = n_steps >= min_steps or not bool(avail.any())
    return mask


# ---- 2. rewards and returns ------------------------------------------------------------------------------------
def step_rewards(costs: Sequence[float], task_reward: float, cost_lambda: float) -> list[float]:
    """Puppeteer's cost-aware rewards of one episode: ``[T + 1]``.

    Args:
        costs: c_0 .. c_{T-1}, the cost of each agent action (the cost unit: tokens or USD).
        task_reward: r, the task score of the final state.
        cost_lambda: lambda, reward units per cost unit.

    Returns:
        R_t = -lambda * c_t for t < T, then R_T = r - lambda * C_T with C_T = sum(costs) (the ``terminate`` step).
    """
    total = float(sum(costs))
    return [-cost_lambda * float(c) for c in costs] + [float(task_reward) - cost_lambda * total]


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_t = R_t + gamma * G_{t+1} (G_T = R_T), for t = 0 .. T."""
    out = [0.0] * len(rewards)
    g = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        g = float(rewards[t]) + gamma * g
        out[t] = g
    return out


@dataclass
class MovingAverageBaseline:
    """b_t: an exponential moving average of the returns G_t seen at step index t.

    ``value(t)`` is the current b_t (a step index never seen before: the mean of the batch being updated,
    see :meth:`advantages`). ``update`` moves each b_t towards the batch mean of G_t:
    b_t <- (1 - momentum) * b_t + momentum * mean_batch(G_t), or b_t <- mean_batch(G_t) the first time.
    """

    momentum: float = 0.1
    values: dict[int, float] = field(default_factory=dict)

    def advantages(self, returns: Sequence[Sequence[float]]) -> list[list[float]]:
        """A_t = G_t - b_t for each episode's returns, with b_t taken *before* this batch updates it (an unseen t:
        the batch mean of G_t); then updates the baseline with this batch."""
        means = _step_means(returns)
        base = {t: self.values.get(t, m) for t, m in means.items()}
        adv = [[g - base[t] for t, g in enumerate(ep)] for ep in returns]
        for t, m in means.items():
            self.values[t] = (
                m if t not in self.values else (1 - self.momentum) * self.values[t] + self.momentum * m
            )
        return adv


def _step_means(returns: Sequence[Sequence[float]]) -> dict[int, float]:
    sums: dict[int, list[float]] = {}
    for ep in returns:
        for t, g in enumerate(ep):
            sums.setdefault(t, []).append(g)
    return {t: sum(v) / len(v) for t, v in sums.items()}


# ---- 3. the REINFORCE update -----------------------------------------------------------------------------------
@dataclass
class Trajectory:
    """One episode as the update sees it.

    Attributes:
        obs: states S_0 .. S_T, ``[T + 1, obs_dim]``. masks: allowed actions, bool ``[T + 1, n_actions]``.
        actions: a_0 .. a_T (a_T = ``terminate``), long ``[T + 1]``. rewards: R_0 .. R_T (:func:`step_rewards`).
    """

    obs: torch.Tensor
    masks: torch.Tensor
    actions: torch.Tensor
    rewards: list[float]


def reinforce_loss(
    policy: OrchestratorPolicy,
    trajectories: Sequence[Trajectory],
    advantages: Sequence[Sequence[float]],
    entropy_coef: float,
) -> tuple[torch.Tensor, dict]:
    """L = -(1/N) sum_{i,t} A_{i,t} log pi(a_{i,t} | S_{i,t}) - beta_H * (1/N) sum_{i,t} H(pi(. | S_{i,t})),
    N the number of steps in the batch.

    Steps with a single allowed action (a forced ``terminate``) have log-probability 0 and entropy 0: they add
    nothing to the gradient.

    Returns:
        ``(loss, stats)``: stats ``policy_loss``, ``entropy`` (mean nats per step), ``steps``.
    """
    obs = torch.cat([t.obs for t in trajectories])
    masks = torch.cat([t.masks for t in trajectories])
    actions = torch.cat([t.actions for t in trajectories])
    adv = torch.tensor([a for ep in advantages for a in ep], dtype=obs.dtype)
    dist = policy.distribution(obs, masks)
    logp = dist.log_prob(actions)  # [N]
    p = dist.probs
    entropy = -(p * torch.where(masks, dist.logits, torch.zeros_like(dist.logits))).sum(
        -1
    )  # [N], 0 * -inf safe
    policy_loss = -(adv * logp).mean()
    loss = policy_loss - entropy_coef * entropy.mean()
    return loss, {
        "policy_loss": policy_loss.item(),
        "entropy": entropy.mean().item(),
        "steps": int(len(actions)),
    }


class Reinforce:
    """REINFORCE with discounted returns, a moving-average baseline, entropy bonus and gradient clipping.

    Args:
        policy: the orchestrator policy. learning_rate: Adam's step size. gamma: discount.
        entropy_coef: beta_H. max_grad_norm: gradient-norm clip. baseline_momentum: see
            :class:`MovingAverageBaseline`.
    """

    def __init__(
        self,
        policy: OrchestratorPolicy,
        learning_rate: float = 0.01,
        gamma: float = 0.99,
        entropy_coef: float = 0.01,
        max_grad_norm: float = 1.0,
        baseline_momentum: float = 0.1,
    ):
        self.policy, self.gamma = policy, gamma
        self.entropy_coef, self.max_grad_norm = entropy_coef, max_grad_norm
        self.baseline = MovingAverageBaseline(baseline_momentum)
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=learning_rate)

    @torch.no_grad()
    def act(
        self,
        obs: torch.Tensor,
        mask: torch.Tensor,
        generator: torch.Generator | None = None,
        greedy: bool = False,
    ) -> torch.Tensor:
        """Actions ``[B]`` for states ``[B, obs_dim]``: sampled from pi (seeded by ``generator``) or its argmax."""
        logits = self.policy(obs, mask)
        if greedy:
            return logits.argmax(-1)
        return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)

    def update(self, trajectories: Sequence[Trajectory]) -> dict:
        """One gradient step on a batch of episodes.

        Returns:
            stats: ``loss``, ``policy_loss``, ``entropy``, ``grad_norm`` (before clipping), ``mean_return`` (G_0),
            ``steps``.
        """
        returns = [discounted_returns(t.rewards, self.gamma) for t in trajectories]
        advantages = self.baseline.advantages(returns)
        loss, stats = reinforce_loss(self.policy, trajectories, advantages, self.entropy_coef)
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        self.optimizer.step()
        stats.update(
            loss=loss.item(),
            grad_norm=float(grad_norm),
            mean_return=sum(r[0] for r in returns) / len(returns),
        )
        return stats
