"""Loss math: KL estimators and the grouped policy-gradient loss, against values derived here."""

import math

import pytest
import torch

from teacli.train.loss import kl_estimate, policy_loss


def test_kl_estimators_closed_forms():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    d = logp - ref  # 0.5, -1.0
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), d)
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), 0.5 * d**2)
    # k3 = exp(-d) - (-d) - 1
    expected = torch.tensor([math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1])
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), expected)
    assert (kl_estimate(torch.randn(100), torch.randn(100), "k3") >= 0).all()
    with pytest.raises(ValueError, match="kl.estimator"):
        kl_estimate(logp, ref, "k7")


def test_policy_gradient_is_advantage_weighted_sequence_score():
    # Two sequences of 3 tokens; the second has only 2 valid tokens.
    theta = torch.tensor([[-0.5, -1.0, -2.0], [-0.3, -0.7, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([2.0, -1.0])
    loss, stats = policy_loss(theta, mask, adv, None, beta=0.0, estimator="k3", denominator=4)
    # loss = -(1/4) sum_i A_i sum_t mask * logp  ->  d loss / d logp_it = -A_i mask_it / 4
    expected_loss = -(2.0 * (-3.5) + (-1.0) * (-1.0)) / 4
    assert loss.item() == pytest.approx(expected_loss)
    loss.backward()
    torch.testing.assert_close(theta.grad, -(adv[:, None] * mask) / 4)
    assert stats["loss"] == pytest.approx(expected_loss) and "kl" not in stats


def test_kl_term_adds_beta_times_sequence_kl():
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -2.0]])
    mask = torch.tensor([[1, 1]])
    loss, stats = policy_loss(logp, mask, torch.zeros(1), ref, beta=0.5, estimator="k1", denominator=1)
    assert stats["kl"] == pytest.approx(1.0)  # k1 summed over tokens: 0 + 1
    assert loss.item() == pytest.approx(0.5)
