"""Truncated importance sampling (rollout.is_correction): the weights, their statistics, and their
place in the loss's gradient, against values derived here."""

import math

import pytest
import torch

from teacli.config import RecipeError, load_recipe
from teacli.train.importance import is_stats, is_weights, merge_log_ratios, pack_rollout_logprobs, resolve_is_correction
from teacli.train.loss import policy_loss

# Trainer and sampler log-probs whose ratios are chosen: 0.5, 1.5, 3.0 on sequence 0; 3.0, 3.0 on sequence 1
# (its third token is padding, where the ratio 100 must be ignored).
RATIOS = torch.tensor([[0.5, 1.5, 3.0], [3.0, 3.0, 100.0]], dtype=torch.float64)
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]])
TRAIN = (ROLLOUT.double() + RATIOS.log()).float()
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_auto_is_token_for_vllm_and_off_for_hf():
    assert resolve_is_correction("auto", "vllm") == "token"
    assert resolve_is_correction("auto", "hf") == "off"
    assert resolve_is_correction("sequence", "vllm") == "sequence"
    assert resolve_is_correction("off", "vllm") == "off"
    with pytest.raises(ValueError, match="rollout.is_correction.*vllm engine"):
        resolve_is_correction("token", "hf")  # engine: auto resolved to hf at run time


def test_token_weights_are_the_ratio_truncated_at_the_cap():
    w, lr = is_weights(TRAIN, ROLLOUT, MASK, "token", cap=2.0)
    expected = torch.tensor([[0.5, 1.5, 2.0], [2.0, 2.0, 1.0]])  # min(ratio, 2); padding → 1
    torch.testing.assert_close(w, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lr.exp().double(), torch.tensor([0.5, 1.5, 3.0, 3.0, 3.0], dtype=torch.float64), atol=1e-5, rtol=1e-5)
    w4, _ = is_weights(TRAIN, ROLLOUT, MASK, "token", cap=4.0)  # a higher cap truncates nothing here
    torch.testing.assert_close(w4[MASK.bool()], torch.tensor([0.5, 1.5, 3.0, 3.0, 3.0]), atol=1e-5, rtol=1e-5)


def test_sequence_weights_are_the_product_of_token_ratios_truncated():
    w, lr = is_weights(TRAIN, ROLLOUT, MASK, "sequence", cap=2.0)
    # sequence 0: 0.5 · 1.5 · 3 = 2.25 → 2; sequence 1: 3 · 3 = 9 → 2 (the padded 100 is not a factor)
    torch.testing.assert_close(lr.exp().double(), torch.tensor([2.25, 9.0], dtype=torch.float64), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(w, torch.full((2, 3), 2.0), atol=1e-5, rtol=1e-5)
    w10, _ = is_weights(TRAIN, ROLLOUT, MASK, "sequence", cap=10.0)
    torch.testing.assert_close(w10, torch.tensor([[2.25] * 3, [9.0] * 3]), atol=1e-4, rtol=1e-5)


def test_weights_are_detached_and_one_when_the_models_agree():
    logp = ROLLOUT.clone().requires_grad_(True)
    w, lr = is_weights(logp, ROLLOUT, MASK, "token", cap=2.0)
    assert not w.requires_grad and not lr.requires_grad
    torch.testing.assert_close(w, torch.ones(2, 3))


def test_stats_mean_min_max_and_truncated_fraction():
    _, lr = is_weights(TRAIN, ROLLOUT, MASK, "token", cap=2.0)
    s = is_stats(merge_log_ratios([lr[:2], lr[2:]]), cap=2.0)  # two micro-batches
    ratios = [0.5, 1.5, 3.0, 3.0, 3.0]
    assert s["is_ratio_mean"] == pytest.approx(sum(ratios) / 5, rel=1e-5)
    assert s["is_ratio_min"] == pytest.approx(0.5, rel=1e-5) and s["is_ratio_max"] == pytest.approx(3.0, rel=1e-5)
    assert s["is_weight_mean"] == pytest.approx((0.5 + 1.5 + 2 + 2 + 2) / 5, rel=1e-5)
    assert s["is_truncated_frac"] == pytest.approx(3 / 5)
    huge = is_stats(torch.tensor([1000.0, 0.0]), cap=2.0)  # an overflowing ratio stays finite in the record
    assert math.isfinite(huge["is_ratio_mean"]) and huge["is_truncated_frac"] == 0.5


def test_loss_gradient_is_the_weighted_score_function():
    """d loss / d log π(y_i,t) = −A_i · w_t · mask / denominator: the ratio scales each token's term."""
    adv = torch.tensor([2.0, -1.0])
    w, _ = is_weights(TRAIN, ROLLOUT, MASK, "token", cap=2.0)
    theta = TRAIN.clone().requires_grad_(True)
    loss, stats = policy_loss(theta, MASK, adv, None, beta=0.0, estimator="k2", denominator=4, is_weights=w)
    loss.backward()
    expected = -(adv[:, None] * w * MASK) / 4
    torch.testing.assert_close(theta.grad, expected)
    want = -(2.0 * (0.5 * TRAIN[0, 0] + 1.5 * TRAIN[0, 1] + 2.0 * TRAIN[0, 2]) - 1.0 * (2.0 * TRAIN[1, 0] + 2.0 * TRAIN[1, 1])) / 4
    assert float(loss.detach()) == pytest.approx(float(want), rel=1e-5)
    # The KL term is not reweighted: with beta > 0 the loss grows by exactly the unweighted KL.
    ref = TRAIN - 0.1
    # k2 on the sequence log-ratios d = 0.1 · (3, 2 completion tokens): β · Σ ½d² / 4.
    loss_kl, s = policy_loss(TRAIN, MASK, adv, ref, beta=0.5, estimator="k2", denominator=4, is_weights=w)
    assert float(loss_kl) - float(loss.detach()) == pytest.approx(0.5 * (0.5 * 0.3**2 + 0.5 * 0.2**2) / 4, rel=1e-4)
    # Unit weights change nothing.
    plain, _ = policy_loss(TRAIN, MASK, adv, None, beta=0.0, estimator="k2", denominator=4)
    ones, _ = policy_loss(TRAIN, MASK, adv, None, beta=0.0, estimator="k2", denominator=4, is_weights=torch.ones(2, 3))
    assert float(plain) == float(ones)


def test_pack_rollout_logprobs_pads_and_refuses_missing():
    packed = pack_rollout_logprobs([[-1.0, -2.0], [], [-0.5]], width=3)
    torch.testing.assert_close(packed, torch.tensor([[-1.0, -2.0, 0.0], [0.0, 0.0, 0.0], [-0.5, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="rollout.is_correction: off"):
        pack_rollout_logprobs([[-1.0], None], width=3)


def test_recipe_refuses_a_correction_the_hf_engine_cannot_make(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("policy: {name_or_path: x}\ndata: {dir: builtin}\nrollout: {engine: hf, is_correction: sequence}\n")
    with pytest.raises(RecipeError, match=r"rollout.is_correction.*r.yaml"):
        load_recipe(path)
    path.write_text("policy: {name_or_path: x}\ndata: {dir: builtin}\nrollout: {engine: vllm, is_correction: sequence, is_cap: 0.5}\n")
    with pytest.raises(RecipeError, match="rollout.is_cap"):
        load_recipe(path)
    path.write_text("policy: {name_or_path: x}\ndata: {dir: builtin}\nrollout: {engine: vllm, is_correction: sequence, is_cap: 5}\n")
    r = load_recipe(path).rollout
    assert (r.is_correction, r.is_cap, r.dynamic_sampling, r.max_resample_rounds) == ("sequence", 5.0, False, 10)


def test_masked_tokens_picked_by_host_positions_are_the_same():
    """is_weights(index=): the token log-ratios picked by the mask's flat positions (found on the host, so the device
    is not waited for) are the ones the boolean mask picks, in the same order."""
    from teacli.logprobs import completion_index

    for level in ("token", "sequence"):
        w, lr = is_weights(TRAIN, ROLLOUT, MASK, level, cap=2.0)
        w2, lr2 = is_weights(TRAIN, ROLLOUT, MASK, level, cap=2.0, index=completion_index(MASK))
        assert torch.equal(w, w2) and torch.equal(lr, lr2)
    assert lr2.shape == (2,) and is_weights(TRAIN, ROLLOUT, MASK, "token", cap=2.0)[1].shape == (int(MASK.sum()),)
    picked = is_weights(TRAIN, ROLLOUT, MASK, "token", cap=2.0, index=completion_index(MASK))[1]
    assert torch.equal(picked, (TRAIN - ROLLOUT).float()[MASK.bool()])  # the boolean mask's tokens, in its order
