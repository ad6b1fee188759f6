"""The KL term's expected gradient, computed exactly by enumerating every outcome of a small policy.

An autoregressive categorical policy over a vocabulary of 3 with 2 tokens: token 1 from softmax(θ₀),
token 2 from softmax(θ₁[token 1]); the logits tables are the parameters. In the "eos" variant,
token 2 is an end-of-sequence token: a sequence that starts with it has length 1 (the completion
mask drops its second position), so sequences have different lengths.

For each `kl.estimator`, the loss of every sequence y is built by `policy_loss` (A = 0, β = 1) with
the samples held fixed, as in training; Σ_y π(y)·∇loss(y) is its exact expected gradient. It must
equal the analytic gradient of the KL the estimator claims: autograd of
KL(π ‖ π_ref) = Σ_y π(y) log(π(y)/π_ref(y)) for k2 and k1_penalty (the paper's), and for grpo_k3
the per-position reverse KL Σ_t E_{prefix∼π}[KL(π_ref(·|prefix) ‖ π(·|prefix))] with the prefix
distribution held fixed.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from teacli.config import RecipeError, load_recipe
from teacli.train.loss import KL_ESTIMATORS, policy_loss

V, EOS = 3, 2


class Policy:
    def __init__(self, seed: int, requires_grad: bool):
        g = torch.Generator().manual_seed(seed)
        self.first = (1.5 * torch.randn(V, generator=g, dtype=torch.float64)).requires_grad_(requires_grad)
        self.second = (1.5 * torch.randn(V, V, generator=g, dtype=torch.float64)).requires_grad_(requires_grad)

    def params(self) -> list[torch.Tensor]:
        return [self.first, self.second]

    def token_logprobs(self, y: tuple[int, ...]) -> torch.Tensor:
        """[1, 2] log-probs of y's tokens (0 at a position past the end)."""
        lp1 = torch.log_softmax(self.first, -1)[y[0]]
        lp2 = torch.log_softmax(self.second[y[0]], -1)[y[1]] if len(y) == 2 else torch.zeros((), dtype=torch.float64)
        return torch.stack([lp1, lp2])[None]

    def next_logprobs(self, prefix: tuple[int, ...]) -> torch.Tensor:
        return torch.log_softmax(self.first if not prefix else self.second[prefix[0]], -1)


def sequences(variant: str) -> list[tuple[int, ...]]:
    if variant == "fixed":
        return list(itertools.product(range(V), repeat=2))
    return [(EOS,)] + [(a, b) for a in range(V) if a != EOS for b in range(V)]


def mask_of(y: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor([[1, 1 if len(y) == 2 else 0]])


def seq_logprob(policy: Policy, y: tuple[int, ...]) -> torch.Tensor:
    return (policy.token_logprobs(y) * mask_of(y)).sum()


def expected_loss_gradient(pi: Policy, ref: Policy, variant: str, estimator: str, *, per_token_k2: bool = False):
    """Σ_y π(y)·∇loss(y), and Σ_y π(y)·(recorded kl of y)."""
    total, kl_value = 0.0, 0.0
    for y in sequences(variant):
        prob = seq_logprob(pi, y).exp().detach()
        logp, ref_logp, mask = pi.token_logprobs(y), ref.token_logprobs(y).detach(), mask_of(y)
        if per_token_k2:  # ½ Σ_t d_t², the token-level k2 (not offered: see the test below)
            loss = 0.5 * (((logp - ref_logp) * mask) ** 2).sum()
        else:
            loss, stats = policy_loss(logp, mask, torch.zeros(1), ref_logp, beta=1.0, estimator=estimator, denominator=1)
            kl_value += float(prob) * float(stats["kl"])
        total = total + prob * loss
    return torch.autograd.grad(total, pi.params()), kl_value


def exact_kl(pi: Policy, ref: Policy, variant: str) -> torch.Tensor:
    """KL(π ‖ π_ref) = Σ_y π(y) log(π(y)/π_ref(y)), differentiable in π's parameters."""
    out = torch.zeros((), dtype=torch.float64)
    for y in sequences(variant):
        lp, lr = seq_logprob(pi, y), seq_logprob(ref, y).detach()
        out = out + lp.exp() * (lp - lr)
    return out


def per_position_reverse_kl(pi: Policy, ref: Policy, variant: str) -> torch.Tensor:
    """Σ_t Σ_prefix π(prefix)·KL(π_ref(·|prefix) ‖ π(·|prefix)), prefix probabilities held fixed."""
    prefixes = [()] + [(a,) for a in range(V) if variant == "fixed" or a != EOS]
    out = torch.zeros((), dtype=torch.float64)
    for prefix in prefixes:
        weight = torch.log_softmax(pi.first, -1)[prefix[0]].exp().detach() if prefix else 1.0
        lp, lr = pi.next_logprobs(prefix), ref.next_logprobs(prefix).detach()
        out = out + weight * (lr.exp() * (lr - lp)).sum()
    return out


def flat(grads) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads])


@pytest.mark.parametrize("variant", ["fixed", "eos"])
@pytest.mark.parametrize("estimator", ["k2", "k1_penalty"])
def test_expected_gradient_is_the_papers_kl_gradient(estimator, variant):
    pi, ref = Policy(0, requires_grad=True), Policy(1, requires_grad=False)
    got, kl_value = expected_loss_gradient(pi, ref, variant, estimator)
    kl = exact_kl(pi, ref, variant)
    want = torch.autograd.grad(kl, pi.params())
    assert flat(want).abs().max() > 0.1  # a gradient worth matching
    torch.testing.assert_close(flat(got), flat(want), rtol=1e-10, atol=1e-12)
    # The recorded value: Σ_y π(y)·d(y) = KL(π ‖ π_ref).
    assert kl_value == pytest.approx(float(kl.detach()), rel=1e-10)


@pytest.mark.parametrize("variant", ["fixed", "eos"])
def test_grpo_k3_has_the_per_position_reverse_kl_gradient(variant):
    pi, ref = Policy(0, requires_grad=True), Policy(1, requires_grad=False)
    got, kl_value = expected_loss_gradient(pi, ref, variant, "grpo_k3")
    want = torch.autograd.grad(per_position_reverse_kl(pi, ref, variant), pi.params())
    torch.testing.assert_close(flat(got), flat(want), rtol=1e-10, atol=1e-12)
    # ... which is not the paper's gradient: the direction differs.
    papers = flat(torch.autograd.grad(exact_kl(pi, ref, variant), pi.params()))
    assert (flat(got) - papers).abs().max() > 0.1
    assert kl_value == pytest.approx(float(exact_kl(pi, ref, variant).detach()), rel=1e-10)  # the value is still KL(π‖π_ref)


def test_per_token_k2_is_not_exact_on_two_tokens():
    """The test can fail: ½Σ_t d_t² drops how token 1 changes token 2's KL; only one token makes it exact."""
    pi, ref = Policy(0, requires_grad=True), Policy(1, requires_grad=False)
    got, _ = expected_loss_gradient(pi, ref, "fixed", "k2", per_token_k2=True)
    want = flat(torch.autograd.grad(exact_kl(pi, ref, "fixed"), pi.params()))
    assert (flat(got) - want).norm() > 0.05 * want.norm()  # 10 orders of magnitude beyond the exact options' agreement
    # The terms it drops sit in the first token's logits: token 2's logits get the exact gradient.
    torch.testing.assert_close(got[1].reshape(-1), want[V:], rtol=1e-10, atol=1e-12)


def test_k1_in_the_loss_would_have_zero_expected_gradient():
    """Why `k1` is refused: E_y[∇(log π(y) − log π_ref(y))] = Σ_y ∇π(y) = 0."""
    pi, ref = Policy(0, requires_grad=True), Policy(1, requires_grad=False)
    total = sum(seq_logprob(pi, y).exp().detach() * (seq_logprob(pi, y) - seq_logprob(ref, y)) for y in sequences("eos"))
    assert flat(torch.autograd.grad(total, pi.params())).abs().max() < 1e-12


def test_k1_penalty_is_the_advantage_minus_beta_times_the_log_ratio():
    pi, ref = Policy(0, requires_grad=True), Policy(1, requires_grad=False)
    y = (0, 1)
    logp, ref_logp, mask = pi.token_logprobs(y), ref.token_logprobs(y).detach(), mask_of(y)
    beta, adv = 0.3, torch.tensor([0.7], dtype=torch.float64)
    loss, stats = policy_loss(logp, mask, adv, ref_logp, beta=beta, estimator="k1_penalty", denominator=1)
    d = float((seq_logprob(pi, y) - seq_logprob(ref, y)).detach())
    plain, _ = policy_loss(logp, mask, adv - beta * d, None, beta=0.0, estimator="k1_penalty", denominator=1)
    torch.testing.assert_close(flat(torch.autograd.grad(loss, pi.params(), retain_graph=True)),
                               flat(torch.autograd.grad(plain, pi.params())))
    assert float(stats["kl"]) == pytest.approx(d) and "kl_loss" not in stats


@pytest.mark.parametrize("value, says", [
    ("k1", r"expected gradient zero.*use k2"),
    ("k3", r"renamed grpo_k3.*KL\(π_ref‖π\).*use k2"),
])
def test_k1_and_k3_are_refused_with_the_reason(tmp_path, value, says):
    path = Path(tmp_path / "r.yaml")
    path.write_text(f"kl: {{estimator: {value}}}\n")
    with pytest.raises(RecipeError, match=rf"^kl.estimator: '{value}' \(set in .*r.yaml\) .*{says}"):
        load_recipe(path, runnable=False)


def test_default_estimator_is_k2_and_every_option_loads(tmp_path):
    path = Path(tmp_path / "r.yaml")
    path.write_text("name: r\n")
    assert load_recipe(path, runnable=False).kl.estimator == "k2"
    for estimator in KL_ESTIMATORS:
        path.write_text(f"kl: {{estimator: {estimator}}}\n")
        assert load_recipe(path, runnable=False).kl.estimator == estimator
