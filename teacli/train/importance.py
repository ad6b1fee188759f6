"""Truncated importance sampling (TIS) for the rollout/trainer mismatch (`rollout.is_correction`).

The vllm engine samples y ~ π_rollout: the same weights as the trainer's π_θ, but vLLM's kernels,
batching and precision, so π_rollout(y_t | ·) ≠ π_θ(y_t | ·) slightly (much more in bf16, or with a
stale or quantized engine). The policy gradient E_{y~π_θ}[A ∇log π_θ(y)] estimated from samples of
π_rollout is biased; reweighting by the ratio ρ = π_θ/π_rollout removes the bias, and truncating it
at a cap C bounds the variance (Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"; TRL `vllm_importance_sampling_correction`, verl `rollout_correction`,
OpenRLHF `is_correction`):

    token:     loss_i = −A_i · Σ_t w_t · log π_θ(y_i,t),   w_t = min(ρ_t, C),  ρ_t = π_θ(y_t|·)/π_rollout(y_t|·)
    sequence:  loss_i = −A_i · w_i · Σ_t log π_θ(y_i,t),   w_i = min(Π_t ρ_t, C)

The weights are detached (no gradient flows through ρ), so the gradient is −A_i Σ_t w_t ∇log π_θ(y_i,t).
The KL term is not reweighted (as in TRL and verl). Both log-probs are the raw model's (before
temperature / top-k / top-p: vLLM's `logprobs_mode="raw_logprobs"`), the quantity the loss differentiates.

The ratio's statistics go to metrics.jsonl: `is_ratio_mean`, `is_ratio_min`, `is_ratio_max` (of ρ
before truncation, per token or per sequence; values above e^80 count as e^80), `is_weight_mean`
(after truncation) and `is_truncated_frac` (the share with ρ > C).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

LEVELS = ("off", "token", "sequence")
_STAT_LOG_CAP = 80.0  # e^80 ≈ 5.5e34: large ratios stay finite (and JSON-writable) in the statistics


def resolve_is_correction(setting: str, engine: str, staleness: int = 0) -> str:
    """`rollout.is_correction` for the engine that actually runs: auto → token for vllm or one step off-policy
    (`rollout.max_staleness` 1: the stale sampler's log-probs are the behaviour policy's), off for hf on-policy."""
    if setting == "auto":
        return "token" if engine == "vllm" or staleness > 0 else "off"
    if setting not in LEVELS:
        raise ValueError(f"rollout.is_correction: {setting!r} is not one of auto, off, token, sequence")
    if setting != "off" and engine != "vllm" and staleness == 0:
        raise ValueError(
            f"rollout.is_correction: {setting!r} needs the sampler's log-probs, which only the vllm engine returns "
            f"(this run's engine is {engine}) or an off-policy run (rollout.max_staleness 1); use auto or off"
        )
    return setting


def pack_rollout_logprobs(logprobs: Sequence[Sequence[float] | None], width: int, device=None) -> "Tensor":
    """The sampler's per-token log-probs of B completions → [B, width], zero-padded on the right
    (aligned with `teacli.train.batching.pack`'s completion mask)."""
    import torch

    out = torch.zeros((len(logprobs), width), dtype=torch.float32)
    for i, row in enumerate(logprobs):
        if row is None:
            raise ValueError(
                "rollout.is_correction: the rollout engine returned no log-probs for the sampled tokens; "
                "set rollout.is_correction: off"
            )
        if len(row) > width:
            raise ValueError(f"rollout.is_correction: {len(row)} sampler log-probs for a completion of at most {width} tokens")
        if row:
            out[i, : len(row)] = torch.tensor(list(row), dtype=torch.float32)
    return out.to(device) if device is not None else out


def is_weights(logp: "Tensor", rollout_logp: "Tensor", mask: "Tensor", level: str, cap: float,
               index: "Tensor | None" = None) -> tuple["Tensor", "Tensor"]:
    """The detached TIS weights [B, T] and the log-ratios they come from.

    logp: [B, T] the trainer's token log-probs (any grad is ignored); rollout_logp: [B, T] the
    sampler's; mask: [B, T] 1 on completion tokens. Returns (weights, log_ratios): for `token`
    weights[b, t] = min(exp(logp − rollout_logp), cap) and log_ratios are the masked tokens' [N];
    for `sequence` every token of sequence b gets min(exp(Σ_t mask·(logp − rollout_logp)), cap) and
    log_ratios are the sequences' [B]. Weights off the mask are 1 (the loss masks them anyway).
    `index`: the mask's flat positions (`teacli.logprobs.completion_index`), where the caller found them on the
    host: picking the masked tokens by them does not wait for the device (without it they are found here).
    """
    import math

    import torch

    from teacli.logprobs import completion_index

    if level not in ("token", "sequence"):
        raise ValueError(f"is_weights: level must be token or sequence, got {level!r}")
    m = mask.to(torch.bool)
    log_ratio = (logp.detach().float() - rollout_logp.float()).masked_fill(~m, 0.0)
    log_cap = math.log(cap)
    if level == "token":
        weights = log_ratio.clamp(max=log_cap).exp().masked_fill(~m, 1.0)
        if index is None:
            index = completion_index(mask)
        return weights, log_ratio.reshape(-1).index_select(0, index)
    seq = log_ratio.sum(-1)  # [B]
    weights = seq.clamp(max=log_cap).exp()[:, None].expand_as(log_ratio).contiguous()
    return weights, seq


def is_stats(log_ratios: "Tensor", cap: float) -> dict[str, float]:
    """Statistics of the ratio ρ = exp(log_ratios) over the units it weighted (tokens or sequences)."""
    if log_ratios.numel() == 0:
        return {"is_ratio_mean": 1.0, "is_ratio_min": 1.0, "is_ratio_max": 1.0, "is_weight_mean": 1.0, "is_truncated_frac": 0.0}
    lr = log_ratios.detach().double().clamp(max=_STAT_LOG_CAP)
    ratio = lr.exp()
    return {
        "is_ratio_mean": float(ratio.mean()),
        "is_ratio_min": float(ratio.min()),
        "is_ratio_max": float(ratio.max()),
        "is_weight_mean": float(ratio.clamp(max=cap).mean()),
        "is_truncated_frac": float((ratio > cap).double().mean()),
    }


def merge_log_ratios(chunks: list["Tensor"]) -> "Tensor":
    """The log-ratios of a step's micro-batches as one tensor (empty when there were none)."""
    import torch

    return torch.cat([c.detach().cpu() for c in chunks]) if chunks else torch.zeros(0)
