"""KL estimators and the grouped policy-gradient loss (token log-probs: `teacli.logprobs`).

The paper's training interface ("Training interface", Experiments §Setup) is
ĝ_x = (1/m)·Σ_i A_i ∇_θ log π_θ(y_i | x), with A_i a stop-gradient weight, plus β·KL to the
reference policy. We implement it literally:

    loss = (1/B) Σ_i [ −A_i · Σ_t log π(y_i,t) + β · Σ_t KL̂_t ]

over the B = P·m sequences of a step: log π(y_i | x) is the *sum* of the completion's token
log-probs (the sequence score function), and averaging over all sequences gives the 1/P·1/m of
eq. `eq:prompt_batch_gradient_estimator`. The KL is the sequence-level estimate Σ_t KL̂_t with
Schulman's per-token estimators (default k3, unbiased and non-negative):
    k1 = log π − log π_ref,  k2 = ½(log π − log π_ref)²,  k3 = exp(log π_ref − log π) − (log π_ref − log π) − 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def kl_estimate(logp: "Tensor", ref_logp: "Tensor", estimator: str) -> "Tensor":
    """Per-token KL(π ‖ π_ref) estimate from samples of π (Schulman's k1/k2/k3)."""
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    if estimator == "k3":
        neg = -log_ratio
        return neg.exp() - neg - 1.0
    raise ValueError(f"kl.estimator: unknown estimator {estimator!r} (use k1, k2 or k3)")


def policy_loss(
    logp: "Tensor",  # [B, T] token log-probs under the current policy (with grad)
    mask: "Tensor",  # [B, T] 1 for completion tokens up to and including the first EOS
    advantages: "Tensor",  # [B] stop-gradient advantage per sequence
    ref_logp: "Tensor | None",  # [B, T] reference log-probs, or None when beta = 0
    beta: float,
    estimator: str,
    denominator: int,  # number of sequences the step averages over (P·m on this rank)
    is_weights: "Tensor | None" = None,  # [B, T] detached TIS weights (teacli.train.importance), or None
) -> tuple["Tensor", dict[str, float]]:
    """The grouped policy-gradient loss of one micro-batch and its detached stats.

    With `is_weights` w, the policy-gradient term is −A_i · Σ_t w_t log π(y_i,t) (the KL term is not reweighted).
    """
    mask = mask.to(logp.dtype)
    weighted = mask if is_weights is None else mask * is_weights.detach().to(logp.dtype)
    seq_logp = (logp * weighted).sum(-1)  # [B]
    pg = -(advantages.detach().to(logp.dtype) * seq_logp)
    loss_terms = pg
    stats: dict[str, float] = {"pg_loss": float(pg.detach().sum()) / denominator}
    if ref_logp is not None and beta > 0:
        kl_tok = kl_estimate(logp, ref_logp.detach(), estimator) * mask
        seq_kl = kl_tok.sum(-1)
        loss_terms = loss_terms + beta * seq_kl
        stats["kl"] = float(seq_kl.detach().sum()) / denominator
    loss = loss_terms.sum() / denominator
    stats["loss"] = float(loss.detach())
    return loss, stats
