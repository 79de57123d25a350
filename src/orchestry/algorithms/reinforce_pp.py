"""REINFORCE++ advantages (per-token KL in the reward, discounted returns, global whitening) and a dispatcher.

Source: Hu et al., "REINFORCE++: Stabilizing Critic-Free Policy Optimization with Global Normalization"
(arXiv 2501.03262), checked against the authors' OpenRLHF code (``openrlhf/models/utils.py``:
``compute_approx_kl``, ``compute_reward``; ``openrlhf/trainer/ppo_utils/experience_maker.py``:
``get_cumulative_returns`` and the advantage normalisation for the ``reinforce`` estimator). Per token t of
completion i (the paper's token-level KL penalty, global advantage normalisation; numbered (8)-(10) in the
RLinf rendering of the paper, the numbering shifts between arXiv versions):

    KL_t   = log pi(y_t | x, y_<t) - log pi_ref(y_t | x, y_<t)           (k1 estimator, as the paper)
    r_t    = -beta * KL_t + [t = last valid token] * R_i                (R_i: the scalar outcome reward)
    G_t    = sum_{k >= t} gamma^(k - t) * r_k                           (reward-to-go over valid tokens)
    A_t    = (G_t - mean(G)) / std(G)                                   (mean/std over ALL valid tokens of the batch)

As in OpenRLHF: the std is the population one (divide by the token count) floored at 1e-4 (``var`` clamped
at 1e-8), and KL_t is clamped to [-10, 10]. Unlike OpenRLHF, padding gets advantage 0 (not the whitened 0).
With ``gamma = 1`` and ``beta = 0`` every valid token of completion i gets the same G_t = R_i.
"""

from __future__ import annotations

import torch

from orchestry.algorithms.critic import critic_advantages
from orchestry.algorithms.kl import token_kl
from orchestry.algorithms.magrpo import (
    ADVANTAGE_MODES,
    agent_turn_advantages,
    group_advantages,
    reinforce_advantages,
    remax_advantages,
)

ESTIMATORS = ("magrpo", "magrpo_std", "rloo", "reinforce", "agent_turn", "reinforce_pp", "remax", "critic")


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(max(var, eps))`` with mean and population var over the positions where mask is 1.

    Args:
        x, mask: ``[B, T]``; mask 1 for valid tokens, 0 for padding.

    Returns:
        ``[B, T]``; 0 at padding.

    Raises:
        ValueError: shape mismatch or no valid token.
    """
    if x.shape != mask.shape:
        raise ValueError(f"shape mismatch: x {tuple(x.shape)} vs mask {tuple(mask.shape)}")
    m = mask.to(x.dtype)
    n = m.sum()
    if n <= 0:
        raise ValueError("whitening needs at least one valid token (mask is all 0)")
    mean = (x * m).sum() / n
    var = ((x - mean).pow(2) * m).sum() / n
    return (x - mean) * var.clamp(min=eps).rsqrt() * m


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.0,
    gamma: float = 1.0,
    kl_estimator: str = "k1",
    whiten: bool = True,
) -> torch.Tensor:
    """REINFORCE++ per-token advantages of a batch of B completions (see the module docstring for the math).

    Args:
        rewards: ``[B]`` scalar outcome reward of each completion (placed at its last valid token).
        logp: ``[B, T]`` log-probs of the sampled tokens under the policy that sampled them (no grad needed).
        ref_logp: ``[B, T]`` log-probs of the same tokens under the frozen base (reference) model.
        mask: ``[B, T]`` 1 for completion tokens, 0 for padding (right padding or any holes).
        beta: KL weight (>= 0; 0 drops the KL term). gamma: discount in [0, 1].
        kl_estimator: see :func:`orchestry.algorithms.kl.token_kl` (paper: ``"k1"``).
        whiten: normalise over all valid tokens of the batch (paper: yes); False returns the raw returns.

    Returns:
        ``[B, T]`` float advantages (detached), 0 at padding.

    Raises:
        ValueError: bad shapes, ``beta < 0``, ``gamma`` outside [0, 1], a completion with no valid token.
    """
    if logp.dim() != 2 or logp.shape != mask.shape:
        raise ValueError(
            f"logp and mask must be the same [B, T], got {tuple(logp.shape)}, {tuple(mask.shape)}"
        )
    if rewards.shape != (logp.shape[0],):
        raise ValueError(f"rewards must be [B]={logp.shape[0]}, got {tuple(rewards.shape)}")
    if beta < 0 or not 0.0 <= gamma <= 1.0:
        raise ValueError(f"need beta >= 0 and 0 <= gamma <= 1, got beta={beta}, gamma={gamma}")
    valid = mask.bool()
    if not valid.any(dim=1).all():
        raise ValueError("every completion needs at least one valid token in mask")
    with torch.no_grad():
        m = valid.float()
        r = -beta * token_kl(logp, ref_logp, kl_estimator) * m if beta else torch.zeros_like(m)
        T = m.shape[1]
        last = T - 1 - valid.long().fliplr().argmax(dim=1)  # index of the last valid token per row
        r = r.scatter_add(1, last.unsqueeze(1), rewards.float().unsqueeze(1))
        returns = torch.zeros_like(r)
        running = torch.zeros(r.shape[0], dtype=r.dtype)
        for t in range(T - 1, -1, -1):
            running = r[:, t] + gamma * running
            returns[:, t] = running
        returns = returns * m
        return masked_whiten(returns, m) if whiten else returns


def token_policy_loss(
    advantages: torch.Tensor, token_logprobs: torch.Tensor, mask: torch.Tensor, n_tokens: float
) -> torch.Tensor:
    """REINFORCE++ loss of a micro-batch: ``-sum_t A_t * log pi(y_t | x, y_<t) / n_tokens`` over its valid tokens.

    Args:
        advantages: ``[K, T]`` per-token advantages (:func:`reinforce_pp_advantages`; no grad).
        token_logprobs: ``[K, T]`` log-probs of the sampled tokens (with grad).
        mask: ``[K, T]`` 1 on completion tokens.
        n_tokens: valid tokens of ALL the agent's rows of the rollout, so that the micro-batches' losses sum to
            the token mean over the whole rollout.

    Returns:
        scalar loss.
    """
    return -(advantages * token_logprobs.float() * mask.float()).sum() / n_tokens


def estimate_advantages(name: str, rewards: torch.Tensor, **kwargs) -> torch.Tensor:
    """One entry point for the advantage estimators selectable in params.

    - ``"magrpo"``: ``R - mean_group(R)`` (MAGRPO paper); ``"magrpo_std"``: divided by the group std;
      ``"rloo"``: leave-one-out baseline. These three take ``rewards`` ``[N, G]`` and return ``[N, G]``
      (:func:`orchestry.algorithms.magrpo.group_advantages`); any other mode of that function (``max``,
      ``raw``, ``mean``, ``mean_std``) is accepted by its own name too.
    - ``"reinforce"``: ``rewards`` minus the scalar ``baseline`` (keyword, required;
      :func:`orchestry.algorithms.magrpo.reinforce_advantages`; the trainer's is a running mean).
    - ``"agent_turn"``: ``rewards`` ``[N, G]`` of one agent at one turn, optional ``active`` ``[N, G]`` and ``eps``
      (:func:`orchestry.algorithms.magrpo.agent_turn_advantages`, AT-GRPO).
    - ``"remax"``: ``rewards`` ``[N, G]`` minus ``greedy_rewards`` ``[N]`` (keyword, required; each problem's greedy
      rollout's reward; :func:`orchestry.algorithms.magrpo.remax_advantages`, ReMax).
    - ``"critic"``: ``rewards`` minus ``values`` (keyword, required; V(s) of each sample, the same shape;
      :func:`orchestry.algorithms.critic.critic_advantages`).
    - ``"reinforce_pp"``: ``rewards`` ``[B]`` plus ``logp``, ``ref_logp``, ``mask`` (``[B, T]``) and optional
      ``beta``, ``gamma``, ``kl_estimator``, ``whiten``; returns ``[B, T]`` (:func:`reinforce_pp_advantages`).

    Raises:
        ValueError: unknown name, or arguments the estimator does not take.
    """
    group = {"magrpo": "mean", "magrpo_std": "mean_std", "rloo": "rloo"}
    if name == "reinforce_pp":
        return reinforce_pp_advantages(rewards, **kwargs)
    if name == "reinforce":
        if set(kwargs) != {"baseline"}:
            raise ValueError(f"estimator 'reinforce' takes rewards and baseline=, got {sorted(kwargs)}")
        return reinforce_advantages(rewards, kwargs["baseline"])
    if name in ("remax", "critic"):
        key = "greedy_rewards" if name == "remax" else "values"
        if set(kwargs) != {key}:
            raise ValueError(f"estimator {name!r} takes rewards and {key}=, got {sorted(kwargs)}")
        if name == "remax":
            return remax_advantages(rewards, kwargs[key])
        return critic_advantages(rewards, kwargs[key])
    if name == "agent_turn":
        if set(kwargs) - {"active", "eps"}:
            raise ValueError(
                f"estimator 'agent_turn' takes only rewards, active and eps, got {sorted(kwargs)}"
            )
        return agent_turn_advantages(rewards, **kwargs)
    mode = group.get(name, name if name in ADVANTAGE_MODES else None)
    if mode is None:
        allowed = ", ".join(ESTIMATORS + ADVANTAGE_MODES)
        raise ValueError(f"unknown advantage estimator {name!r} (allowed: {allowed})")
    if set(kwargs) - {"eps"}:
        raise ValueError(f"estimator {name!r} takes only rewards [N, G] (and eps), got {sorted(kwargs)}")
    return group_advantages(rewards, mode, **kwargs)


__all__ = [
    "ESTIMATORS",
    "estimate_advantages",
    "masked_whiten",
    "reinforce_pp_advantages",
]
