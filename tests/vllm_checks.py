"""Checks shared by the vllm engine's tests on vLLM's CPU build (tests/rollout/test_vllm_engine.py) and on
a GPU (tests/gpu/test_gpu_vllm.py): sampling settings, the trainer's log-probs of sampled tokens, the
largest gap to vLLM's, one real optimizer step, and the sampling contract's exact first-token law."""

from __future__ import annotations

import torch

from teacli.logprobs import token_logprobs
from teacli.types import SamplingConfig


QUESTIONS = ["what is the capital of france", "write a short poem about the sea", "one two three"]


def chat_prompts(tok) -> list[list[int]]:
    """The vllm tests' three prompts, chat-templated and tokenized."""
    from teacli.models import encode_chat

    return [encode_chat(tok, [{"role": "user", "content": q}], add_generation_prompt=True) for q in QUESTIONS]


def sample(**kw) -> SamplingConfig:
    return SamplingConfig(**{"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8, **kw})


def ids_of(out):
    return [[c.token_ids for c in row] for row in out]


def device_of(model) -> torch.device:
    return next(model.parameters()).device


def trainer_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens], device=device_of(model))
    with torch.no_grad():
        return token_logprobs(model, ids, torch.ones_like(ids), len(prompt))[0].float().cpu()


def logprob_gaps(model, prompts, out) -> torch.Tensor:
    """|vLLM log-prob − trainer log-prob| of every sampled token of `out` (flat)."""
    gaps = []
    for prompt, row in zip(prompts, out):
        for c in row:
            if c.token_ids:
                ref = trainer_logprobs(model, prompt, c.token_ids)
                gaps.append((ref - torch.tensor(c.logprobs)).abs())
    return torch.cat(gaps)


def max_logprob_gap(model, prompts, out) -> float:
    """Largest |vLLM log-prob − transformers log-prob| over every sampled token of `out`."""
    return float(logprob_gaps(model, prompts, out).max())


def optimizer_step(model, tok, prompts, lr=3e-2) -> None:
    """One real AdamW step on a log-likelihood loss: every trained weight moves."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    ids = torch.tensor([prompts[0] + [tok.eos_token_id]], device=device_of(model))
    model.train()
    loss = -token_logprobs(model, ids, torch.ones_like(ids), 1).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    model.eval()


def exact_first_token_probs(model, prompt, temperature, top_k, top_p) -> torch.Tensor:
    """The hf engine's contract written out: softmax(logits / T), then top-k, then top-p (renormalized)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt], device=device_of(model))).logits[0, -1].double().cpu() / temperature
    if top_k:
        logits[logits < logits.topk(top_k).values[-1]] = -float("inf")
    probs = logits.softmax(-1)
    order = probs.argsort(descending=True)
    keep = probs[order].cumsum(0) - probs[order] < top_p  # smallest prefix whose mass reaches top_p
    mask = torch.zeros_like(probs, dtype=torch.bool)
    mask[order[keep]] = True
    probs = torch.where(mask, probs, torch.zeros_like(probs))
    return probs / probs.sum()


def first_token_tv(engine, model, prompt, temperature, top_k, top_p, n=2000, seed=11) -> tuple[float, float, float]:
    """n first tokens from `engine` against the contract: (total variation, its expected value for a correct
    sampler, the share of draws outside the contract's support)."""
    exact = exact_first_token_probs(model, prompt, temperature, top_k, top_p)
    out = engine.generate([prompt], n=n, sampling=sample(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=1), seed=seed)
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in out[0]]), minlength=exact.numel()).double()
    outside = float(counts[exact == 0].sum() / counts.sum())
    tv = 0.5 * float((counts / counts.sum() - exact).abs().sum())
    noise = 0.5 * float((2 * exact * (1 - exact) / (torch.pi * counts.sum())).sqrt().sum())  # E[TV] of a correct sampler
    return tv, noise, outside
