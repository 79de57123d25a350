"""MAGRPO — Multi-Agent Group Relative Policy Optimization: the advantage and the loss, nothing else.

Source: "LLM Collaboration with Multi-Agent Reinforcement Learning" (arXiv 2508.04652) and the authors'
CoMLRL library. Per problem, each agent i samples G completions; the g-th completions of all agents form
joint action g, which receives one joint reward R_g. Then

    A_g = R_g - mean_g(R)                                       (group-relative advantage, no std division)
    L_i = -(1/G) * sum_g A_g * sum_t log pi_i(y_{i,g,t} | x_i, y_{i,g,<t})      (on-policy, no ratio/clip)

Every agent gets the same joint advantage; gradients flow only through its own log-probs. With several
problems in one update, the per-problem losses are averaged. Optional: a KL penalty to the reference policy
(k3 estimator, per token, weight beta) and other advantage modes of later CoMLRL versions.

The trainer never holds the whole batch's graph: it back-propagates :func:`micro_batch_loss` (one micro-batch's
rows written on the ``[N, G]`` grid of :func:`policy_loss`, the other rows 0) once per micro-batch, and skips the
rows with a zero advantage when beta = 0; the shares sum to :func:`policy_loss` (``tests/test_magrpo_loss.py``).
"""

from __future__ import annotations

import torch

from orchestry.algorithms.kl import token_kl

ADVANTAGE_MODES = ("mean", "mean_std", "rloo", "max", "raw")


def group_advantages(rewards: torch.Tensor, mode: str = "mean", eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages of joint rewards.

    Args:
        rewards: ``[N, G]`` joint rewards, N problems (groups) x G joint actions.
        mode: ``"mean"`` (paper: R - mean R), ``"mean_std"`` (÷ group std + eps), ``"rloo"``
            (leave-one-out mean baseline), ``"max"`` (R - max R), ``"raw"`` (R itself).

    Returns:
        ``[N, G]`` advantages.

    Raises:
        ValueError: unknown mode or a group of size < 2 for the relative modes.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, G], got shape {tuple(rewards.shape)}")
    G = rewards.shape[1]
    if mode == "raw":
        return rewards.clone()
    if G < 2:
        raise ValueError("group-relative advantages need G >= 2 completions per problem")
    mean = rewards.mean(dim=1, keepdim=True)
    if mode == "mean":
        return rewards - mean
    if mode == "mean_std":
        return (rewards - mean) / (rewards.std(dim=1, keepdim=True, unbiased=False) + eps)
    if mode == "rloo":
        return (rewards - mean) * G / (G - 1)  # R_g - mean of the other G-1
    if mode == "max":
        return rewards - rewards.max(dim=1, keepdim=True).values
    raise ValueError(f"unknown advantage mode {mode!r} (allowed: {', '.join(ADVANTAGE_MODES)})")


def policy_loss(
    seq_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_kl: torch.Tensor | None = None,
    beta: float = 0.0,
) -> torch.Tensor:
    """MAGRPO loss of ONE agent, averaged over problems.

    Args:
        seq_logprobs: ``[N, G]`` sum over completion tokens of log pi_i(y_t | x, y_<t) (with grad).
        advantages: ``[N, G]`` joint advantages (no grad; shared by all agents).
        token_kl: optional ``[N, G]`` per-completion sum of per-token KL estimates to the reference policy.
        beta: KL weight (0 disables).

    Returns:
        scalar loss ``mean_N( -(1/G) sum_g A_g * logp_g ) + beta * mean(KL)``.
    """
    if seq_logprobs.shape != advantages.shape:
        raise ValueError(
            f"shape mismatch: logprobs {tuple(seq_logprobs.shape)} vs advantages {tuple(advantages.shape)}"
        )
    loss = -(advantages.detach() * seq_logprobs).mean(dim=1).mean()
    if beta and token_kl is not None:
        loss = loss + beta * token_kl.mean()
    return loss


def micro_batch_loss(
    seq_logprobs: torch.Tensor,
    rows: torch.Tensor,
    advantages: torch.Tensor,
    token_kl: torch.Tensor | None = None,
    beta: float = 0.0,
    groups: torch.Tensor | None = None,
) -> torch.Tensor:
    """One micro-batch's share of :func:`policy_loss`: the loss the trainer back-propagates for K of the N*G rows.

    The rows' log-probs are written on the ``[N, G]`` grid, every other row's log-prob and KL as 0, and the grid
    goes through :func:`policy_loss`. Row (n, g) of the micro-batch thus adds

        -A_{n,g} * logp_{n,g} / (G * N')  +  beta * KL_{n,g} / (G * N')

    (N' = N, or the number of ``groups``), so over micro-batches that partition the rows the shares sum to
    :func:`policy_loss` of the whole batch (up to float summation order), and a row with A = 0 and no KL term
    adds nothing: the trainer skips such rows (beta = 0) and never computes their log-probs.

    Args:
        seq_logprobs: ``[K]`` the micro-batch rows' sums of completion-token log-probs (with grad).
        rows: ``[K]`` long, each row's flat index ``n * G + g`` in the grid.
        advantages: ``[N, G]`` the agent's advantages.
        token_kl: optional ``[K]`` the rows' per-completion KL sums (:func:`k3_kl`).
        beta: KL weight.
        groups: optional ``[N']`` long: the groups the loss averages over (dynamic sampling leaves the flat
            ones out); None: all N.

    Returns:
        scalar loss.
    """
    dev = seq_logprobs.device
    adv = advantages.to(dev)
    full = torch.zeros(adv.numel(), device=dev).index_put((rows,), seq_logprobs.float())
    kl_full = None
    if token_kl is not None:
        kl_full = torch.zeros(adv.numel(), device=dev).index_put((rows,), token_kl.float()).view_as(adv)
    if groups is None:
        return policy_loss(full.view_as(adv), adv, kl_full, beta)
    return policy_loss(
        full.view_as(adv)[groups], adv[groups], kl_full[groups] if kl_full is not None else None, beta
    )


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-completion sum of the k3 KL estimator exp(r) - r - 1, r = ref_logp - logp, over masked tokens
    (:func:`orchestry.algorithms.kl.token_kl`, unclamped; masked positions count 0).

    Args:
        logp, ref_logp, mask: ``[B, T]``. Returns ``[B]``.
    """
    return (token_kl(logp * mask, ref_logp * mask, "k3", clamp=None) * mask).sum(dim=1)
