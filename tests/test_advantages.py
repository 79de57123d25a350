"""Advantage estimators against hand-computed values: REINFORCE++ (KL in reward, returns, whitening), dispatcher."""

from __future__ import annotations

import math

import pytest
import torch

from orchestry.algorithms.kl import token_kl
from orchestry.algorithms.reinforce_pp import (
    estimate_advantages,
    masked_whiten,
    reinforce_pp_advantages,
)

# A 2x3 batch: completion 0 has 3 tokens (reward 1), completion 1 has 2 tokens + 1 padding (reward 0).
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
REF = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -1.0, -3.0]])
LOGP = REF + torch.tensor([[0.2, -0.1, 0.4], [0.3, 0.5, 9.0]])  # log pi - log pi_ref; 9.0 sits in padding
REWARDS = torch.tensor([1.0, 0.0])
# By hand, beta = 0.1, gamma = 0.5, k1:
#   r   row 0: [-0.02, 0.01, -0.04 + 1] ; row 1: [-0.03, -0.05 + 0]
#   G   row 0: G2 = 0.96, G1 = 0.01 + 0.5 * 0.96 = 0.49, G0 = -0.02 + 0.5 * 0.49 = 0.225
#       row 1: G1 = -0.05, G0 = -0.03 + 0.5 * -0.05 = -0.055
#   mean over the 5 valid tokens = 1.57 / 5 = 0.314; population var = 0.72487 / 5 = 0.144974
RETURNS = torch.tensor([[0.225, 0.49, 0.96], [-0.055, -0.05, 0.0]])
MEAN, VAR = 0.314, 0.144974


def test_reinforce_pp_returns_by_hand() -> None:
    g = reinforce_pp_advantages(REWARDS, LOGP, REF, MASK, beta=0.1, gamma=0.5, whiten=False)
    torch.testing.assert_close(g, RETURNS, atol=1e-6, rtol=0)


def test_reinforce_pp_whitened_by_hand_and_padding_zero() -> None:
    a = reinforce_pp_advantages(REWARDS, LOGP, REF, MASK, beta=0.1, gamma=0.5)
    expected = (RETURNS - MEAN) / math.sqrt(VAR) * MASK
    torch.testing.assert_close(a, expected, atol=1e-5, rtol=0)
    valid = a[MASK.bool()]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert valid.pow(2).mean().sqrt().item() == pytest.approx(1.0, abs=1e-5)  # population std 1
    assert a[1, 2].item() == 0.0


def test_reinforce_pp_without_kl_and_discount_gives_the_reward_on_every_token() -> None:
    g = reinforce_pp_advantages(REWARDS, LOGP, REF, MASK, beta=0.0, gamma=1.0, whiten=False)
    torch.testing.assert_close(g, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))


def test_reward_goes_to_the_last_valid_token_with_left_holes() -> None:
    mask = torch.tensor([[0, 1, 1, 0]])
    g = reinforce_pp_advantages(torch.tensor([2.0]), torch.zeros(1, 4), torch.zeros(1, 4), mask, gamma=0.5,
                                whiten=False)  # fmt: skip
    torch.testing.assert_close(g, torch.tensor([[0.0, 1.0, 2.0, 0.0]]))


def test_kl_estimators() -> None:
    lp, ref = torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, 0.0]])  # d = [1, -1]
    torch.testing.assert_close(token_kl(lp, ref, "k1"), torch.tensor([[1.0, -1.0]]))
    torch.testing.assert_close(token_kl(lp, ref, "k2"), torch.tensor([[0.5, 0.5]]))
    torch.testing.assert_close(token_kl(lp, ref, "k3"), torch.tensor([[math.exp(-1), math.e - 2]]))
    assert token_kl(torch.tensor([[50.0]]), torch.tensor([[0.0]])).item() == 10.0  # clamped
    with pytest.raises(ValueError, match="unknown KL estimator"):
        token_kl(lp, ref, "k4")


def test_whiten_and_input_errors() -> None:
    with pytest.raises(ValueError, match="at least one valid token"):
        masked_whiten(torch.ones(2, 2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="every completion"):
        reinforce_pp_advantages(REWARDS, LOGP, REF, torch.tensor([[1, 1, 1], [0, 0, 0]]))
    with pytest.raises(ValueError, match="rewards must be"):
        reinforce_pp_advantages(torch.ones(3), LOGP, REF, MASK)
    with pytest.raises(ValueError, match="gamma"):
        reinforce_pp_advantages(REWARDS, LOGP, REF, MASK, gamma=1.5)


def test_dispatcher_group_estimators_by_hand() -> None:
    r = torch.tensor([[1.0, 2.0, 6.0]])  # mean 3; leave-one-out means: 4, 3.5, 1.5
    torch.testing.assert_close(estimate_advantages("magrpo", r), torch.tensor([[-2.0, -1.0, 3.0]]))
    torch.testing.assert_close(estimate_advantages("rloo", r), torch.tensor([[-3.0, -1.5, 4.5]]))
    std = math.sqrt((4 + 1 + 9) / 3)
    torch.testing.assert_close(
        estimate_advantages("magrpo_std", r, eps=0.0), torch.tensor([[-2.0, -1.0, 3.0]]) / std
    )
    a = estimate_advantages("reinforce_pp", REWARDS, logp=LOGP, ref_logp=REF, mask=MASK, beta=0.1, gamma=0.5)
    torch.testing.assert_close(a, (RETURNS - MEAN) / math.sqrt(VAR) * MASK, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        estimate_advantages("ppo", r)
    with pytest.raises(ValueError, match="takes only"):
        estimate_advantages("rloo", r, beta=0.1)


def test_magrpo_k3_is_the_shared_estimator_unclamped_and_masked():
    """MAGRPO's loss term sums the one k3 estimator over the completion's tokens, without REINFORCE++'s clamp;
    padding (mask 0) adds nothing, whatever its log-probs."""
    from orchestry.algorithms.magrpo import k3_kl

    logp = torch.tensor([[-20.0, -1.0, 7.0]])
    ref = torch.tensor([[0.0, -1.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    want = (math.exp(20.0) - 20.0 - 1) + (math.exp(-0.5) + 0.5 - 1)
    assert k3_kl(logp, ref, mask).item() == pytest.approx(want, rel=1e-6)
    assert token_kl(logp, ref, "k3")[0, 0].item() == 10.0  # the clamped form REINFORCE++ uses
