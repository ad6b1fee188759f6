"""Bad input: clear ValueErrors naming the rule, the parameter and the smallest valid value."""

import sys
import types

import pytest
import torch

from teacli.advantages import compute_advantages


def test_nan_and_inf_rewards_are_named():
    r = torch.zeros(2, 8)
    r[1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"'tea'.*non-finite.*prompt 1, rollout 3"):
        compute_advantages("tea", r)
    r[1, 3] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        compute_advantages("grpo", r)


def test_wrong_rank_and_dtype():
    with pytest.raises(ValueError, match=r"shape \[P, m\]"):
        compute_advantages("grpo", torch.zeros(8))
    with pytest.raises(ValueError, match="floating point"):
        compute_advantages("grpo", torch.zeros(2, 8, dtype=torch.long))


def test_group_too_small_for_tea_names_smallest_m():
    with pytest.raises(ValueError, match=r"tea: group size m=4 .*smallest valid m is 5"):
        compute_advantages("tea", torch.randn(2, 4))


def test_no_prefix_plan_names_smallest_m():
    with pytest.raises(ValueError, match=r"prefix_tea: no valid prefix plan for group size m=16.*not distinct.*smallest valid m is 24"):
        compute_advantages("prefix_tea", torch.randn(2, 16))
    with pytest.raises(ValueError, match=r"J .*smallest valid J is 3"):
        compute_advantages("prefix_tea", torch.randn(2, 64), k=3, J=2)


def test_bon_mean_k_and_chow_split_and_alpha():
    with pytest.raises(ValueError, match=r"bon_mean: k must be .* k < m=8"):
        compute_advantages("bon_mean", torch.randn(2, 8), k=8)
    with pytest.raises(ValueError, match=r"chow: n_sel and m_corr .* m=8"):
        compute_advantages("chow", torch.randn(2, 8), n_sel=5, m_corr=5)
    with pytest.raises(ValueError, match=r"alpha must lie in \(0, 0.5\)"):
        compute_advantages("tea", torch.randn(2, 8), alpha=0.6)


def test_unknown_rule_and_parameter():
    with pytest.raises(ValueError, match="unknown advantage rule 'nope'"):
        compute_advantages("nope", torch.randn(2, 8))
    with pytest.raises(ValueError, match=r"'grpo' does not take parameter\(s\) alpha"):
        compute_advantages("grpo", torch.randn(2, 8), alpha=0.1)


def test_dotted_path_user_rule(monkeypatch):
    module = types.ModuleType("my_rules")

    def rank_rule(rewards, *, scale=1.0):
        return scale * (rewards.argsort(-1).argsort(-1).to(rewards.dtype) - (rewards.shape[-1] - 1) / 2)

    module.rank_rule = rank_rule
    monkeypatch.setitem(sys.modules, "my_rules", module)
    adv = compute_advantages("my_rules:rank_rule", torch.tensor([[0.3, 0.1, 0.2]]), scale=2.0)
    torch.testing.assert_close(adv, torch.tensor([[2.0, -2.0, 0.0]]))
    with pytest.raises(ValueError, match="has no callable 'missing'"):
        compute_advantages("my_rules:missing", torch.randn(2, 3))
    with pytest.raises(ValueError, match="cannot import module"):
        compute_advantages("no_such_module_xyz:f", torch.randn(2, 3))
