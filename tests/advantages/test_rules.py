"""Every advantage rule against values worked out by hand for small groups."""

import math

import pytest
import torch

from teacli.advantages import ADVANTAGE_RULES, compute_advantages, rule_parameters
from teacli.advantages.baselines import chow_lambda, maxk_transformed_rewards
from teacli.advantages.tail import c_tilde
from teacli.advantages.tea import cancellation_weights, check_prefix_plan, prefix_sizes

D = torch.float64


def t(*rows):
    return torch.tensor(rows, dtype=D)


def test_registry_names_are_the_papers():
    assert set(ADVANTAGE_RULES) == {
        "tea", "tea_raw", "prefix_tea", "grpo", "grpo_z",
        "bon_max_mean", "bon_max_second", "bon_mean", "chow", "cat_bon",
    }


def test_tea_raw_and_tea_by_hand_q3():
    # m = 12, alpha = 0.25 -> q = 3. Top three: 10, 7, 6 -> r = 6, mu = 23/3, sigma^2 = 78/27.
    r = t([3.0, 10.0, 6.0, 1.0, 7.0, 0.0, 2.0, 5.0, 4.0, -1.0, 0.5, 1.5])
    ct = c_tilde(128, 0.25)
    mu, sigma = 23 / 3, math.sqrt(78 / 27)

    def shaped(u):
        return (u - 6.0) + ct / (2 * sigma) * ((u - mu) ** 2 - (6.0 - mu) ** 2)

    raw = compute_advantages("tea_raw", r)
    expected_raw = torch.zeros(1, 12, dtype=D)
    expected_raw[0, 1] = 4 * shaped(10.0)  # 1/alpha = 4
    expected_raw[0, 4] = 4 * shaped(7.0)  # negative: the quadratic term pulls it down
    # index 2 (reward 6 = r_hat) gets shaped(6) = 0
    torch.testing.assert_close(raw, expected_raw)
    assert raw[0, 4] < 0 < raw[0, 1]

    adv = compute_advantages("tea", r)
    pos = expected_raw.clamp_min(0)
    torch.testing.assert_close(adv, pos - pos.mean())
    assert adv.sum().abs() < 1e-12


def test_tea_q2_reduces_to_best_vs_runner_up():
    # m = 8 -> q = 2: the quadratic term vanishes, A_raw(top) = (R_1 - R_2)/alpha.
    r = t([0.2, 0.9, 0.4, 0.5, 0.1, 0.7, 0.3, 0.0])
    adv = compute_advantages("tea", r)
    top = 4 * (0.9 - 0.7)
    expected = torch.full((1, 8), -top / 8, dtype=D)
    expected[0, 1] += top
    torch.testing.assert_close(adv, expected)


def test_prefix_plan_and_published_weights():
    sizes = check_prefix_plan(64, 0.25, 2, 4, "prefix_tea")
    assert sizes == (40, 48, 56, 64)
    w = cancellation_weights(sizes, 64, 2)
    for got, published in zip(w, (-1.82946, -0.15392, 1.04289, 1.94050)):
        assert got == pytest.approx(published, abs=1e-5)
    z = [64 / s for s in sizes]
    assert sum(w) == pytest.approx(1.0)
    assert sum(wi * zi for wi, zi in zip(w, z)) == pytest.approx(0.0, abs=1e-12)
    assert [round(64 / s, 3) for s in sizes] == [1.6, 1.333, 1.143, 1.0]  # the published rho_j
    assert prefix_sizes(128, 0.25, 4) == (80, 96, 112, 128)


def test_prefix_tea_by_hand_m24():
    # (k, J) = (2, 4) at m = 24 -> prefixes 12, 16, 20, 24 (q = 3, 4, 5, 6).
    g = torch.Generator().manual_seed(3)
    r = torch.randn(2, 24, generator=g, dtype=D)
    sizes = (12, 16, 20, 24)
    z = torch.tensor([24 / s for s in sizes], dtype=D)
    # minimum-norm solution of [1 1 1 1; z] w = (1, 0), derived here via the pseudo-inverse
    A = torch.stack([torch.ones(4, dtype=D), z])
    w = torch.linalg.pinv(A) @ torch.tensor([1.0, 0.0], dtype=D)
    ct = c_tilde(128, 0.25)
    combined = torch.zeros_like(r)
    for s, wj in zip(sizes, w):
        q = math.ceil(s / 4)
        for p in range(2):
            vals = r[p, :s]
            top = torch.sort(vals, descending=True).values[:q]
            rh, mu = top[-1], top.mean()
            sig = ((top - mu) ** 2).mean().sqrt()
            shaped = (vals - rh) + ct / (2 * sig) * ((vals - mu) ** 2 - (rh - mu) ** 2)
            raw = 4 * (vals >= rh) * shaped
            combined[p, :s] += wj * (24 / s) * raw.clamp_min(0)
    expected = combined - combined.mean(dim=1, keepdim=True)
    torch.testing.assert_close(compute_advantages("prefix_tea", r), expected)


def test_grpo_and_grpo_z_by_hand():
    r = t([1.0, 2.0, 3.0, 6.0])  # mean 3, population std sqrt((4+1+0+9)/4) = sqrt(3.5)
    torch.testing.assert_close(compute_advantages("grpo", r), t([-2.0, -1.0, 0.0, 3.0]))
    torch.testing.assert_close(
        compute_advantages("grpo_z", r, eps=0.0), t([-2.0, -1.0, 0.0, 3.0]) / math.sqrt(3.5)
    )


def test_bon_max_rules_by_hand_with_tied_maximum():
    r = t([1.0, 3.0, 2.0, 3.0, 0.0])  # tied max at 1 and 3: first index wins; mean 1.8
    torch.testing.assert_close(compute_advantages("bon_max_mean", r), t([0.0, 1.2, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(compute_advantages("bon_max_second", r), torch.zeros(1, 5, dtype=D))
    r2 = t([1.0, 4.0, 2.5, 3.0])
    torch.testing.assert_close(compute_advantages("bon_max_second", r2), t([0.0, 1.0, 0.0, 0.0]))


def test_maxk_transform_by_hand():
    # m = 4, k = 2, C(4,2) = 6. Sorted 1,2,3,4:
    # B_1 = (2+3+4)/6, B_2 = 2*1/6 + (3+4)/6, B_3 = 3*2/6 + 4/6, B_4 = 4*3/6
    r = t([3.0, 1.0, 4.0, 2.0])
    expected = t([10 / 6, 9 / 6, 12 / 6, 9 / 6])
    torch.testing.assert_close(maxk_transformed_rewards(r, 2), expected)
    # Sum of B = k * E[max of a random k-subset] = 2 * (2+3+3+4+4+4)/6
    assert maxk_transformed_rewards(r, 2).sum().item() == pytest.approx(2 * 20 / 6)
    # ties share the average of their transformed values
    tied = maxk_transformed_rewards(t([1.0, 2.0, 2.0, 4.0]), 2)
    assert tied[0, 1] == tied[0, 2]
    adv = compute_advantages("bon_mean", r, k=2, eps=0.0)
    b = expected - expected.mean()
    torch.testing.assert_close(adv, b / b.pow(2).mean().sqrt())


def test_cat_bon_by_hand():
    r = t([1.0, 3.0, 2.0, 3.0, 0.0])
    # F_<: fraction strictly below: 1 -> 1/5, 3 -> 3/5, 2 -> 2/5, 0 -> 0; N_target = 4: w = 4 F^3
    F = torch.tensor([0.2, 0.6, 0.4, 0.6, 0.0], dtype=D)
    w = 4 * F**3
    wt = w / w.mean()
    z = (r - r.mean()) / r.std(correction=0)
    torch.testing.assert_close(compute_advantages("cat_bon", r, n_target=4, eps=0.0), wt * z)


def test_chow_by_hand_and_lambda():
    # lambda_N solves KL(tilted uniform) = log N - (N-1)/N; check the equation at the solution.
    for n in (2, 32):
        lam = chow_lambda(n)
        mean_u = 1 / (1 - math.exp(-lam)) - 1 / lam
        kl = lam * mean_u - math.log((math.exp(lam) - 1) / lam)
        assert kl == pytest.approx(math.log(n) - (n - 1) / n, abs=1e-9)
    r = t([0.5, 2.0, 1.0, 3.0, 0.2, 1.5])
    g = torch.Generator().manual_seed(0)
    perm = torch.rand(1, 6, generator=g).argsort(dim=-1)[0].tolist()
    sel, corr = perm[:3], perm[3:]
    i_star = max(sel, key=lambda i: (r[0, i].item(), -i))
    r_star = r[0, i_star].item()
    lam = chow_lambda(3)
    expected = torch.zeros(1, 6, dtype=D)
    expected[0, i_star] = 6 * r_star
    for i in corr:
        if r[0, i] > r_star:
            expected[0, i] = -6 * lam / 3 * r_star
    got = compute_advantages("chow", r, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_RULES))
def test_equal_rewards_give_finite_advantages(name):
    r = torch.full((3, 64), 0.7, dtype=D)
    adv = compute_advantages(name, r)
    assert torch.isfinite(adv).all()
    assert adv.shape == r.shape and adv.dtype == D


SHIFT_INVARIANT = ["tea", "tea_raw", "prefix_tea", "grpo", "grpo_z", "bon_max_mean", "bon_max_second", "bon_mean", "cat_bon"]
SCALE_EQUIVARIANT = ["tea", "tea_raw", "prefix_tea", "grpo", "bon_max_mean", "bon_max_second"]
SCALE_INVARIANT = ["grpo_z", "bon_mean", "cat_bon"]


@pytest.mark.parametrize("name", SHIFT_INVARIANT)
def test_shift_invariance(name):
    r = torch.randn(4, 64, generator=torch.Generator().manual_seed(1), dtype=D)
    torch.testing.assert_close(compute_advantages(name, r + 5.0), compute_advantages(name, r), atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("name", SCALE_EQUIVARIANT + SCALE_INVARIANT)
def test_scale(name):
    r = torch.randn(4, 64, generator=torch.Generator().manual_seed(2), dtype=D)
    factor = 3.0 if name in SCALE_EQUIVARIANT else 1.0
    params = {} if name in SCALE_EQUIVARIANT else {"eps": 0.0}  # the +eps in a z-score breaks exact invariance
    torch.testing.assert_close(
        compute_advantages(name, 3.0 * r, **params), factor * compute_advantages(name, r, **params), atol=1e-9, rtol=1e-9
    )


def test_tea_rewards_the_best_and_both_tea_rules_centre():
    r = torch.randn(8, 64, generator=torch.Generator().manual_seed(4), dtype=D)
    for name in ("tea", "prefix_tea"):
        adv = compute_advantages(name, r)
        torch.testing.assert_close(adv.sum(dim=1), torch.zeros(8, dtype=D), atol=1e-9, rtol=0)
    # TEA's raw advantage at the group maximum is (R1 - r) + c~/(2 sigma)((R1 - mu)^2 - (r - mu)^2) > 0.
    # (Prefix-TEA can be negative there: the first prefix carries weight w_1 < 0.)
    best = r.argmax(dim=1)
    assert (compute_advantages("tea", r).gather(1, best[:, None]) > 0).all()


def test_rule_parameters_expose_defaults():
    assert rule_parameters("tea") == {"alpha": 0.25, "n_target": 128, "eps_sigma": 1e-6}
    assert rule_parameters("prefix_tea")["J"] == 4 and rule_parameters("prefix_tea")["k"] == 2
    assert rule_parameters("bon_mean")["k"] is None
