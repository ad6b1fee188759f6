"""The policy's token log-probabilities: what the trainer differentiates, the reference model
scores, and the vllm engine's sync check compares against. Shared by train/, rollout/ and the
diagnostics, so it lives below all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def token_logprobs(model, input_ids: "Tensor", attention_mask: "Tensor", n_prompt: int) -> "Tensor":
    """Log-probs of the completion tokens: input_ids [B, L] (left-padded prompt of n_prompt tokens,
    then completion) → [B, L − n_prompt], the log-prob of token t given everything before it.
    """
    import torch

    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    n_completion = input_ids.shape[1] - n_prompt
    # Only the last n_completion + 1 positions need the LM head (it is a large share of a small model's FLOPs).
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
        logits_to_keep=n_completion + 1,
    ).logits
    logits = logits[:, -(n_completion + 1) : -1]  # predictions for the completion positions
    targets = input_ids[:, n_prompt:]
    # Row by row: log_softmax over a large vocabulary in fp32 for the whole batch would dominate memory.
    out = []
    for row_logits, row_targets in zip(logits, targets):
        row = row_logits.float()
        out.append(row.gather(-1, row_targets[:, None]).squeeze(-1) - torch.logsumexp(row, dim=-1))
    return torch.stack(out)
