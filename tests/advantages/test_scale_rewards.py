"""advantage.scale_rewards: advantages divided by a reward std, as TRL's scale_rewards does."""

import math

import pytest
import torch

from teacli.advantages import compute_advantages, scale_advantages

D = torch.float64


def test_grpo_scaled_by_group_is_grpo_z_exactly():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(5, 16, generator=g, dtype=D)
    rewards[2] = 0.5  # a constant group: both give 0, not 0/0
    scaled = scale_advantages(compute_advantages("grpo", rewards), rewards, "group")
    assert torch.equal(scaled, compute_advantages("grpo_z", rewards))
    assert torch.equal(scaled[2], torch.zeros(16, dtype=D))


def test_group_scale_by_hand():
    # rewards (0, 2): mean 1, population std 1 -> GRPO (−1, 1) / (1 + 1e-6); (0, 4): std 2 -> (−2, 2) / (2 + 1e-6)
    rewards = torch.tensor([[0.0, 2.0], [0.0, 4.0]], dtype=D)
    out = scale_advantages(compute_advantages("grpo", rewards), rewards, "group")
    assert out[0, 1].item() == pytest.approx(1 / (1 + 1e-6), abs=1e-15)
    assert out[1, 1].item() == pytest.approx(2 / (2 + 1e-6), abs=1e-15)


def test_batch_scale_by_hand_and_the_given_std():
    # all four rewards 0, 2, 0, 4: mean 1.5, E[r²] = 5, population std sqrt(5 − 2.25) = sqrt(2.75)
    rewards = torch.tensor([[0.0, 2.0], [0.0, 4.0]], dtype=D)
    adv = compute_advantages("grpo", rewards)
    out = scale_advantages(adv, rewards, "batch")
    assert torch.allclose(out, adv / (math.sqrt(2.75) + 1e-6), rtol=0, atol=1e-15)
    # over several ranks the loop passes the std of every rank's rewards
    assert torch.allclose(scale_advantages(adv, rewards, "batch", batch_std=3.0), adv / (3.0 + 1e-6), rtol=0, atol=1e-15)


def test_none_is_the_rule_unchanged():
    rewards = torch.rand(3, 8, generator=torch.Generator().manual_seed(1), dtype=D)
    adv = compute_advantages("tea", rewards, alpha=0.25, n_target=128)
    assert scale_advantages(adv, rewards, "none") is adv


@pytest.mark.parametrize("how", ["group", "batch"])
def test_tea_keeps_each_groups_ordering_and_signs(how):
    rewards = torch.randn(6, 64, generator=torch.Generator().manual_seed(2), dtype=D)
    adv = compute_advantages("tea", rewards, alpha=0.25, n_target=128)
    out = scale_advantages(adv, rewards, how)
    assert torch.equal(torch.sign(out), torch.sign(adv))
    for a, b in zip(adv, out):
        assert torch.equal(torch.argsort(a, stable=True), torch.argsort(b, stable=True))
    # the factor is 1/(std + eps) per group: TEA's spread relative to GRPO-Z's is what is left
    ratio = out / adv.where(adv != 0, torch.ones_like(adv))
    stds = rewards.std(dim=-1, keepdim=True, correction=0) if how == "group" else rewards.std(correction=0).expand(6, 1)
    expected = (1 / (stds + 1e-6)).expand_as(adv)
    assert torch.allclose(ratio[adv != 0], expected[adv != 0], rtol=1e-12, atol=0)


def test_unknown_scale_names_the_options():
    with pytest.raises(ValueError, match="none, group, batch"):
        scale_advantages(torch.zeros(1, 2), torch.zeros(1, 2), "std")
