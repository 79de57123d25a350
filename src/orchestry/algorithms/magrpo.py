"""MAGRPO — Multi-Agent Group Relative Policy Optimization: the advantage and the loss, nothing else.

Source: "LLM Collaboration with Multi-Agent Reinforcement Learning" (arXiv 2508.04652) and the authors'
CoMLRL library. Per problem, each agent i samples G completions; the g-th completions of all agents form
joint action g, which receives one joint reward R_g. Then

    A_g = R_g - mean_g(R)                                       (group-relative advantage, no std division)
    L_i = -(1/G) * sum_g A_g * sum_t log pi_i(y_{i,g,t} | x_i, y_{i,g,<t})      (on-policy, no ratio/clip)

Every agent gets the same joint advantage; gradients flow only through its own log-probs. With several
problems in one update, the per-problem losses are averaged. Optional: a KL penalty to the reference policy
(k3 estimator, per token, weight beta), other advantage modes of later CoMLRL versions, and the estimators
:func:`rloo_advantages` (leave-one-out baseline), :func:`reinforce_advantages` with :func:`running_baseline`
(REINFORCE with a running-mean baseline), :func:`agent_turn_advantages` (AT-GRPO's agent- and turn-wise
groups) and :func:`remax_advantages` (ReMax: the greedy rollout's reward as the baseline; the learned critic's
baseline is in :mod:`orchestry.algorithms.critic`), each with its formula and source in its docstring and in
docs/algorithms.md.

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
        return rloo_advantages(rewards)
    if mode == "max":
        return rewards - rewards.max(dim=1, keepdim=True).values
    raise ValueError(f"unknown advantage mode {mode!r} (allowed: {', '.join(ADVANTAGE_MODES)})")


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO: each sample's baseline is the mean reward of the OTHER G - 1 samples of its group (no std division).

    Source: W. Kool, H. van Hoof, M. Welling, "Buy 4 REINFORCE Samples, Get a Baseline for Free!" (ICLR 2019
    workshop); A. Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
    Human Feedback in LLMs" (arXiv 2402.14740), eq. for the RLOO estimator; CoMLRL's ``advantage_mode="rloo"``.

        A_{n,g} = R_{n,g} - (1 / (G - 1)) * sum_{j != g} R_{n,j}  =  G / (G - 1) * (R_{n,g} - mean_j R_{n,j})

    (the second form is the one computed). The baseline does not depend on the sample itself, so the estimator
    is unbiased; it is the group mean advantage scaled by G / (G - 1).

    Args:
        rewards: ``[N, G]`` rewards, N groups (problems) x G samples.

    Returns:
        ``[N, G]`` advantages.

    Raises:
        ValueError: ``rewards`` not ``[N, G]`` or G < 2.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, G], got shape {tuple(rewards.shape)}")
    G = rewards.shape[1]
    if G < 2:
        raise ValueError("group-relative advantages need G >= 2 completions per problem")
    return (rewards - rewards.mean(dim=1, keepdim=True)) * G / (G - 1)


def reward_sum_count(rewards: torch.Tensor, active: torch.Tensor | None = None) -> tuple[float, int]:
    """``(sum, count)`` of the rewards of the ``active`` samples (all when None): a batch's share of the mean
    :func:`running_baseline` is fed with (data-parallel processes add theirs up before dividing).

    Args:
        rewards: ``[N, G]``; active: optional ``[N, G]`` bool.
    """
    if active is None:
        return float(rewards.sum()), rewards.numel()
    if active.shape != rewards.shape:
        raise ValueError(f"active {tuple(active.shape)} must match rewards {tuple(rewards.shape)}")
    return float(rewards[active].sum()), int(active.sum())


def running_baseline(previous: float | None, batch_mean: float, decay: float) -> tuple[float, float]:
    """The REINFORCE baseline of this step and the running state after it: an exponential moving average of the
    mean rewards of the steps before.

        b_s     = state_{s-1}                     (the first step, without a state: b_0 = this batch's mean)
        state_s = decay * b_s + (1 - decay) * mean_s

    So b_s = (1 - decay) * sum_{k < s} decay^(s-1-k) * mean_k + decay^s * mean_0 for s >= 1: a baseline made of
    earlier steps' rewards only (Williams 1992's "reinforcement baseline", as a moving average), which does not
    depend on this step's samples after the first step.

    Args:
        previous: the state after the previous step (None: none yet).
        batch_mean: this step's mean reward (:func:`reward_sum_count`, over every process).
        decay: in [0, 1); 0 makes the baseline the previous step's mean.

    Returns:
        ``(b_s, state_s)``.
    """
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay must be in [0, 1), got {decay}")
    b = batch_mean if previous is None else float(previous)
    return b, decay * b + (1.0 - decay) * batch_mean


def reinforce_advantages(rewards: torch.Tensor, baseline: float) -> torch.Tensor:
    """REINFORCE with one scalar baseline and no per-group statistic: ``A_{n,g} = R_{n,g} - b``.

    Source: R. J. Williams, "Simple Statistical Gradient-Following Algorithms for Connectionist Reinforcement
    Learning" (Machine Learning 8, 1992), the REINFORCE estimator with a reinforcement baseline; Ahmadian et al.
    (arXiv 2402.14740) use REINFORCE with a moving-average baseline as the RLOO paper's "vanilla PG" arm; CoMLRL
    ships it as MAREINFORCE. The trainer's b is :func:`running_baseline`; ``baseline=0`` is plain REINFORCE.

    Args:
        rewards: ``[N, G]`` (or any shape) rewards.
        baseline: the scalar b.

    Returns:
        advantages, the shape of ``rewards``.
    """
    return rewards - float(baseline)


def remax_advantages(rewards: torch.Tensor, greedy_rewards: torch.Tensor) -> torch.Tensor:
    """ReMax: each problem's baseline is the reward of ONE greedy (argmax) rollout of that problem by the current
    policy: ``A_{n,g} = R_{n,g} - R^greedy_n``.

    Source: Z. Li et al., "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning
    Large Language Models" (arXiv 2310.10505), Algorithm 1: the baseline of a sampled response is the reward of
    the greedy response to the same prompt. The greedy decode does not depend on the samples of the group, so
    the estimator stays unbiased; it costs one extra (unsampled, never trained) rollout per problem. Here the
    greedy rollout is joint: both agents decode greedily from the same prompts (and, in a multi-turn run, the
    same turns, each on the greedy pair's own feedback) and the pair is scored with the same reward.

    Args:
        rewards: ``[N, G]`` rewards, N problems x G samples.
        greedy_rewards: ``[N]`` (or ``[N, 1]``) the reward of each problem's greedy rollout.

    Returns:
        ``[N, G]`` advantages.

    Raises:
        ValueError: ``rewards`` not ``[N, G]`` or ``greedy_rewards`` not one value per problem.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, G], got shape {tuple(rewards.shape)}")
    b = (
        greedy_rewards.reshape(-1)
        if greedy_rewards.dim() == 2 and greedy_rewards.shape[1] == 1
        else greedy_rewards
    )
    if b.shape != (rewards.shape[0],):
        raise ValueError(
            f"greedy_rewards must be [N] = [{rewards.shape[0]}], got shape {tuple(greedy_rewards.shape)}"
        )
    return rewards - b.to(rewards.dtype).unsqueeze(1)


def agent_turn_advantages(
    rewards: torch.Tensor, active: torch.Tensor | None = None, eps: float = 1e-6
) -> torch.Tensor:
    """AT-GRPO's agent- and turn-wise group advantages: GRPO's mean/std normalisation within the group of samples
    ONE agent took at ONE turn of one problem; samples that did not act at this turn are not in the group.

    Source: Y. Zhao et al., "Stronger Together: On-Policy Reinforcement Learning for Collaborative LLMs"
    (AT-GRPO; the PettingLLMs code, arXiv 2510.11062), the agent- and turn-wise grouping; GRPO's normalised
    outcome advantage (Shao et al., arXiv 2402.03300, section 4.1). The trainer calls this once per agent (on that
    agent's own rewards) and per turn (each turn is its own rollout), so each call's ``rewards`` already belong to
    one agent and one turn. For group n with active set S_n (|S_n| = m):

        A_{n,g} = (R_{n,g} - mean_{j in S_n} R_{n,j}) / (std_{j in S_n} R_{n,j} + eps)   for g in S_n
        A_{n,g} = 0                                                                    for g not in S_n, or m < 2

    (population std). With every sample active (turn 1, one-turn runs) this is ``group_advantages(.., "mean_std")``.
    Unlike AT-GRPO's tree sampling, a later turn's group here holds the continuations of different samples of the
    same problem (one continuation each), not K branches from one shared state.

    Args:
        rewards: ``[N, G]`` one agent's rewards at one turn.
        active: optional ``[N, G]`` bool, the samples that acted at this turn (None: all).
        eps: added to the std.

    Returns:
        ``[N, G]`` advantages, 0 outside the active samples.

    Raises:
        ValueError: bad shapes, or G < 2.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, G], got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        raise ValueError("group-relative advantages need G >= 2 completions per problem")
    if active is None:
        m = torch.ones_like(rewards, dtype=torch.float32)
    elif active.shape != rewards.shape:
        raise ValueError(f"active {tuple(active.shape)} must match rewards {tuple(rewards.shape)}")
    else:
        m = active.to(torch.float32)
    r = rewards.to(torch.float32)
    count = m.sum(dim=1, keepdim=True)
    mean = (r * m).sum(dim=1, keepdim=True) / count.clamp(min=1)
    std = (((r - mean) ** 2) * m).sum(dim=1, keepdim=True).div(count.clamp(min=1)).sqrt()
    adv = (r - mean) / (std + eps) * m
    return torch.where(count >= 2, adv, torch.zeros_like(adv))


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
