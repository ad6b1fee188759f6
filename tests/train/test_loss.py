"""Loss math: KL estimators and the grouped policy-gradient loss, against values derived here."""

import math

import pytest
import torch

from teacli.train.loss import kl_loss_term, policy_loss, sequence_log_ratio


def test_kl_loss_terms_closed_forms():
    # Two sequences of 2 tokens; the second's last token is masked out.
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    ref = torch.tensor([[-1.5, -1.0], [-1.0, -9.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    d = torch.tensor([0.5 - 1.0, 0.5])  # sequence log-ratios: (−1+1.5) + (−2+1), and (−0.5+1) only
    torch.testing.assert_close(sequence_log_ratio(logp, ref, mask), d)
    torch.testing.assert_close(kl_loss_term(logp, ref, mask, "k2"), 0.5 * d**2)
    torch.testing.assert_close(kl_loss_term(logp, ref, mask, "k1_penalty"), d * torch.tensor([-3.0, -0.5]))
    # grpo_k3 = Σ_t exp(−d_t) + d_t − 1 over unmasked tokens
    k3 = lambda x: math.exp(-x) + x - 1  # noqa: E731
    torch.testing.assert_close(kl_loss_term(logp, ref, mask, "grpo_k3"), torch.tensor([k3(0.5) + k3(-1.0), k3(0.5)]))
    assert (kl_loss_term(torch.randn(100, 3), torch.randn(100, 3), torch.ones(100, 3), "grpo_k3") >= 0).all()
    with pytest.raises(ValueError, match="kl.estimator"):
        kl_loss_term(logp, ref, mask, "k3")


def test_policy_gradient_is_advantage_weighted_sequence_score():
    # Two sequences of 3 tokens; the second has only 2 valid tokens.
    theta = torch.tensor([[-0.5, -1.0, -2.0], [-0.3, -0.7, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([2.0, -1.0])
    loss, stats = policy_loss(theta, mask, adv, None, beta=0.0, estimator="k2", denominator=4)
    # loss = -(1/4) sum_i A_i sum_t mask * logp  ->  d loss / d logp_it = -A_i mask_it / 4
    expected_loss = -(2.0 * (-3.5) + (-1.0) * (-1.0)) / 4
    assert loss.item() == pytest.approx(expected_loss)
    loss.backward()
    torch.testing.assert_close(theta.grad, -(adv[:, None] * mask) / 4)
    assert float(stats["loss"]) == pytest.approx(expected_loss) and "kl" not in stats


def test_kl_term_adds_beta_times_sequence_k2_and_records_the_log_ratio():
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -2.0]])
    mask = torch.tensor([[1, 1]])
    loss, stats = policy_loss(logp, mask, torch.zeros(1), ref, beta=0.5, estimator="k2", denominator=1)
    assert float(stats["kl"]) == pytest.approx(1.0)  # the sequence log-ratio: 0 + 1
    assert float(stats["kl_loss"]) == pytest.approx(0.5)  # ½ · 1²
    assert loss.item() == pytest.approx(0.25)  # β · ½ · 1²
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.5, 0.5]]))  # β · d · ∂(Σ_t log π_t)


def test_stats_stay_on_the_device_until_the_step_reads_them():
    """Reading a statistic back waits for the device: policy_loss returns them as detached 0-d tensors, which
    train_step adds up over its micro-batches and reads once."""
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    _, stats = policy_loss(logp, torch.ones(1, 2), torch.tensor([1.0]), logp.detach() - 1.0, beta=0.5, estimator="k2", denominator=1)
    assert set(stats) == {"pg_loss", "kl", "kl_loss", "loss"}
    for value in stats.values():
        assert isinstance(value, torch.Tensor) and value.dim() == 0 and not value.requires_grad
    assert float(stats["pg_loss"]) == pytest.approx(3.0) and float(stats["kl"]) == pytest.approx(2.0)  # -(1 * -3); 2 tokens x 1
