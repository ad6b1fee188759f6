"""The grouped policy-gradient loss with the KL term of the paper's gradient (token log-probs: `teacli.logprobs`).

The paper's prompt-batch estimator (eq. `prompt_batch_gradient_estimator`) is

    Ĝ = (1/P) Σ_p [ ĝ(x_p) − β ∇KL(π(·|x_p) ‖ π_ref(·|x_p)) ],   ĝ = (1/m) Σ_i A_i ∇log π(y_i | x),

with A_i a stop-gradient weight. We minimise a loss whose gradient, with the on-policy samples
held fixed, has expectation −Ĝ:

    loss = (1/B) Σ_i [ −A_i · log π(y_i | x) + β · KLterm(y_i) ]

over the B = P·m sequences of a step, where log π(y | x) = Σ_t log π(y_t | x, y_<t) is the *sum* of
the completion's token log-probs (averaging over all sequences gives the 1/P·1/m). The KL term
(`kl.estimator`), with d(y) = log π(y|x) − log π_ref(y|x) the SEQUENCE log-ratio:

- `k2` (default): ½ d(y)². Its gradient is d(y) ∇log π(y), and
  E_{y∼π}[d(y) ∇log π(y)] = ∇ Σ_y π(y) d(y) = ∇KL(π ‖ π_ref) exactly (E[∇log π] = 0): the
  paper's gradient. Per-token ½ Σ_t d_t² is NOT: its gradient Σ_t d_t ∇log π(y_t) drops the
  terms by which an earlier token changes the KL of the later ones.
- `k1_penalty`: the stop-gradient reward penalty of OpenRLHF ("KL in the reward"): A_i − β·d(y_i)
  multiplies ∇log π(y_i). Same expected gradient as k2 (same per-sample gradient, in fact).
- `grpo_k3`: GRPO/DeepSeekMath's per-token k3 = exp(−d_t) + d_t − 1 summed over tokens, in the
  loss. ∇k3_t = (1 − π_ref(y_t)/π(y_t)) ∇log π(y_t), whose expectation over y_t ∼ π(·|prefix) is
  ∇ KL(π_ref(·|prefix) ‖ π(·|prefix)) — the OTHER direction, per position, with the prefix
  distribution held fixed. Its value is an unbiased, non-negative estimate of KL(π ‖ π_ref); its
  gradient is not that KL's.

Estimators that are refused (teacli.config): `k1` in the loss (log π − log π_ref; expected
gradient E[∇log π] = 0: no regularisation at all) and the old name `k3` (now `grpo_k3`).

Whatever the estimator, the recorded `kl` is the mean over sequences of d(y), the unbiased
sequence-level (k1) estimate of KL(π ‖ π_ref) per prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

KL_ESTIMATORS = ("k2", "k1_penalty", "grpo_k3")


def kl_loss_term(logp: "Tensor", ref_logp: "Tensor", mask: "Tensor", estimator: str) -> "Tensor":
    """The per-sequence KL term [B] of the loss (before β), differentiable in `logp`.

    `k1_penalty` returns d(y).detach() · log π(y): the gradient of β·(that) is the reward penalty's
    −(−β d)∇log π. Its value is not a KL; the recorded KL value comes from `sequence_log_ratio`.
    """
    mask = mask.to(logp.dtype)
    ref_logp = ref_logp.detach().to(logp.dtype)
    if estimator == "k2":
        return 0.5 * sequence_log_ratio(logp, ref_logp, mask).pow(2)
    if estimator == "k1_penalty":
        return sequence_log_ratio(logp, ref_logp, mask).detach() * (logp * mask).sum(-1)
    if estimator == "grpo_k3":
        neg = (ref_logp - logp) * mask  # masked positions: neg = 0 → k3 = 0
        return (neg.exp() - neg - 1.0).sum(-1)
    raise ValueError(f"kl.estimator: unknown estimator {estimator!r} (use one of {', '.join(KL_ESTIMATORS)})")


def sequence_log_ratio(logp: "Tensor", ref_logp: "Tensor", mask: "Tensor") -> "Tensor":
    """d(y) = log π(y|x) − log π_ref(y|x) per sequence [B]: the k1 estimate of KL(π ‖ π_ref)."""
    mask = mask.to(logp.dtype)
    return ((logp - ref_logp.to(logp.dtype)) * mask).sum(-1)


def policy_loss(
    logp: "Tensor",  # [B, T] token log-probs under the current policy (with grad)
    mask: "Tensor",  # [B, T] 1 for completion tokens up to and including the first EOS
    advantages: "Tensor",  # [B] stop-gradient advantage per sequence
    ref_logp: "Tensor | None",  # [B, T] reference log-probs, or None when beta = 0
    beta: float,
    estimator: str,
    denominator: int,  # number of sequences the step averages over (P·m on this rank)
    is_weights: "Tensor | None" = None,  # [B, T] detached TIS weights (teacli.train.importance), or None
) -> tuple["Tensor", dict[str, "Tensor"]]:
    """The grouped policy-gradient loss of one micro-batch and its detached stats.

    With `is_weights` w, the policy-gradient term is −A_i · Σ_t w_t log π(y_i,t) (the KL term is not reweighted).
    Stats are sums over this micro-batch divided by `denominator`, so they add up over a step:
    `pg_loss`, `loss`, and with a reference `kl` (mean sequence log-ratio, KL(π ‖ π_ref)) and
    `kl_loss` (the mean KL term of the loss, before β). They are detached 0-d tensors on the loss's device:
    reading one (`float`) waits for the device, so the trainer adds them up and reads them once a step.
    """
    mask_f = mask.to(logp.dtype)
    weighted = mask_f if is_weights is None else mask_f * is_weights.detach().to(logp.dtype)
    seq_logp = (logp * weighted).sum(-1)  # [B]
    pg = -(advantages.detach().to(logp.dtype) * seq_logp)
    loss_terms = pg
    stats = {"pg_loss": pg.detach().sum() / denominator}
    if ref_logp is not None and beta > 0:
        kl_term = kl_loss_term(logp, ref_logp, mask_f, estimator)
        loss_terms = loss_terms + beta * kl_term
        stats["kl"] = sequence_log_ratio(logp.detach(), ref_logp, mask_f).sum() / denominator
        if estimator != "k1_penalty":  # the penalty's loss value is not a KL estimate
            stats["kl_loss"] = kl_term.detach().sum() / denominator
    loss = loss_terms.sum() / denominator
    stats["loss"] = loss.detach()
    return loss, stats
