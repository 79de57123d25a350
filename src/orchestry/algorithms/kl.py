"""Per-token estimates of the KL divergence of the policy to the frozen reference, from the sampled tokens'
log-probs (Schulman 2020, "Approximating KL divergence": k1, k2, k3): REINFORCE++'s per-token reward penalty and
MAGRPO's loss term use this one function."""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")
KL_CLAMP = 10.0


def token_kl(
    logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k1", clamp: float | None = KL_CLAMP
) -> torch.Tensor:
    """Per-token KL estimate of pi to pi_ref from the sampled tokens' log-probs (Schulman's k1/k2/k3).

    With ``d = logp - ref_logp``: ``k1 = d`` (unbiased, the paper's choice), ``k2 = d^2 / 2``,
    ``k3 = exp(-d) - 1 + d`` (GRPO's). Clamped to [-clamp, clamp]: [-10, 10] as OpenRLHF does; ``clamp=None``
    leaves it unclamped (MAGRPO's loss term, as TRL's GRPO, :func:`orchestry.algorithms.magrpo.k3_kl`).

    Args:
        logp, ref_logp: ``[B, T]`` log-probs (nats) of the sampled tokens under the policy and the frozen base.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        ``[B, T]`` float tensor (padding positions are whatever the inputs give; mask them downstream).

    Raises:
        ValueError: unknown estimator or shape mismatch.
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(f"shape mismatch: logp {tuple(logp.shape)} vs ref_logp {tuple(ref_logp.shape)}")
    d = logp.float() - ref_logp.float()
    if estimator == "k1":
        kl = d
    elif estimator == "k2":
        kl = d.pow(2) / 2
    elif estimator == "k3":
        kl = torch.exp(-d) - 1 + d
    else:
        raise ValueError(f"unknown KL estimator {estimator!r} (allowed: {', '.join(KL_ESTIMATORS)})")
    return kl if clamp is None else kl.clamp(-clamp, clamp)
