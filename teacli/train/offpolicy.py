"""One step off-policy rollouts (`rollout.max_staleness: 1`): the batch for step k+1 is generated and scored while
step k trains.

On-policy, a step waits for its rollouts and generation waits for the update. One step off, a second copy of the
policy (the sampler) holds the weights step k starts from; right before step k's update, the trainer copies its
weights into the sampler and a background thread generates, scores and computes the behaviour log-probs of step
k+1's batch from them, while the main thread trains step k on the batch generated the step before. So every batch
is one optimizer update older than the weights it trains (its `weights_version` is the trainer's minus one), except
the first, which is generated from the initial weights before the first update (staleness 0). The policy gradient
is taken at the trainer's weights from samples of the sampler's, so `rollout.is_correction` (auto = token) weights
each token by the truncated ratio π_θ/π_sampler (teacli/train/importance.py); its ratios are in metrics.jsonl.

Weight transfer is in-process: `load_weights` copies the trainer's tensors (`backend.named_weights`: ZeRO-3 gathered
one at a time, LoRA adapters merged into the base weights by `teacli.lora.merged_named_tensors`) into the sampler's
parameters, by name. On CUDA the background work runs on a stream of its own, ordered after that copy.

Validation waits for the batch in flight first (sampling seeds the process's random generator, which two threads
sampling at once would share). A checkpoint keeps the batch in flight: at a save, the pending batch is awaited and written into the checkpoint
(`pending_rank<r>.pt`) with the data position after it, so a resumed run trains on exactly the batch the
uninterrupted run would have (the same samples from the same stale weights). A checkpoint without one (written
on-policy) resumes by generating that batch from the checkpoint's weights.

The thread joins no collective (no process-group call is made from it), which is why `rollout.dynamic_sampling`
(whose rounds agree across ranks by all-reduce) and the vllm engine (which sleeps while the trainer updates) are
refused with it (teacli/config/validate.py).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from teacli.train.dynamic import Selection

PENDING = "pending_rank{rank}.pt"


@dataclass
class Batch:
    """A step's rollouts, what they were sampled from, and what making them cost."""

    sel: "Selection"
    position: int  # the data position after this batch's prompts
    version: int  # optimizer updates of the weights it was sampled from
    times: dict[str, float] = field(default_factory=dict)  # time_generate, time_reward, time_behaviour (seconds)


def copy_weights(model, named: Any, lora_module: Any = None) -> int:
    """Copy (name, tensor) pairs into `model`'s parameters of the same names (LoRA: merged into base names first);
    returns how many were copied. ValueError naming a parameter the trainer does not have or whose shape differs."""
    import torch

    if lora_module is not None:
        from teacli.lora import merged_named_tensors

        named = merged_named_tensors(lora_module, named)
    params = dict(model.named_parameters())
    copied = 0
    with torch.no_grad():
        for name, tensor in named:
            p = params.get(name)
            if p is None:
                continue  # a tied parameter listed under its other name
            if p.shape != tensor.shape:
                raise ValueError(f"weight transfer: {name} has shape {tuple(tensor.shape)} in the trainer, {tuple(p.shape)} in the sampler")
            p.copy_(tensor, non_blocking=True)
            copied += 1
    missing = len(params) - copied
    if missing:
        raise ValueError(f"weight transfer: {missing} of the sampler's {len(params)} parameters got no weights from the trainer")
    return copied


def behaviour_logprobs(model, sel: "Selection", pad_id: int, batch_size: int) -> None:
    """Each completion's per-token log-probs under `model` (the raw model's, as the trainer's are), into
    `Completion.logprobs`: what `rollout.is_correction` divides by."""
    import torch

    from teacli.logprobs import token_logprobs
    from teacli.train.batching import pack

    device = next(model.parameters()).device
    rows = [(p, c) for p, g in zip(sel.prompt_ids, sel.groups) for c in g]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(rows), batch_size):
                chunk = rows[start : start + batch_size]
                input_ids, attn, cmask, n_prompt = pack([p for p, _ in chunk], [c.token_ids for _, c in chunk], pad_id, device)
                lp = token_logprobs(model, input_ids, attn, n_prompt).float().cpu()
                for (_, c), row in zip(chunk, lp):
                    c.logprobs = row[: len(c.token_ids)].tolist()
    finally:
        model.train(was_training)


def make_batch(generated: tuple, version: int, model, pad_id: int, batch_size: int) -> Batch:
    """A Batch of `generated` (the loop's `generate_step`: Selection, position after, generation s, reward s) sampled
    from weights `version` updates old, with its behaviour log-probs under `model` where one is given (the correction
    is on)."""
    sel, after, t_gen, t_rew = generated
    t0 = time.perf_counter()
    if model is not None:
        behaviour_logprobs(model, sel, pad_id, batch_size)
    return Batch(sel, after, version, {"time_generate": t_gen, "time_reward": t_rew, "time_behaviour": time.perf_counter() - t0})


def save_batch(batch: Batch, path: Path) -> None:
    """A batch in flight into a checkpoint being made (read back by `load_batch`)."""
    import torch

    torch.save({"sel": batch.sel, "position": batch.position, "version": batch.version, "times": batch.times}, path)


def load_batch(path: Path) -> Batch:
    import torch

    state = torch.load(path, weights_only=False)
    return Batch(state["sel"], state["position"], state["version"], state["times"])


class OneStepAhead:
    """The rollouts of a one-step-off-policy run (module docstring): `take` the step's batch, `start` the next one."""

    def __init__(self, sampler_model, rollout, generate: Callable[[Any, int, int], tuple], pad_id: int, batch_size: int,
                 behaviour: bool, lora_module: Any = None) -> None:
        """sampler_model: the policy's copy the background generation samples from; rollout: an engine generating
        with it; generate(rollout, step, position) -> (Selection, position after, generation s, reward s) (the loop's
        `generate_step`); behaviour: compute the behaviour log-probs (rollout.is_correction is on)."""
        self.model = sampler_model
        self.rollout = rollout
        self.generate = generate
        self.pad_id = pad_id
        self.batch_size = batch_size
        self.behaviour = behaviour
        self.lora_module = lora_module
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tea-rollout", initializer=own_cudagraph_state)
        self.pending: Future | None = None
        self.kept: Batch | None = None  # a resumed run's batch in flight, read from its checkpoint

    def _make(self, step: int, position: int, version: int, stream: Any) -> Batch:
        import contextlib

        import torch

        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            batch = make_batch(self.generate(self.rollout, step, position), version, self.model if self.behaviour else None,
                               self.pad_id, self.batch_size)
            if stream is not None:
                stream.synchronize()
        return batch

    def start(self, step: int, position: int, weights: Any, version: int) -> None:
        """Copy `weights` (the trainer's, `version` updates old) into the sampler and begin step `step`'s batch from
        data position `position` in the background."""
        import torch

        copy_weights(self.model, weights, self.lora_module)
        stream = None
        device = next(self.model.parameters()).device
        if device.type == "cuda":
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))  # after the copy
        self.pending = self.pool.submit(self._make, step, position, version, stream)

    def take(self, step: int, position: int, weights: Callable[[], Any], version: int) -> tuple[Batch, float]:
        """Step `step`'s batch and the seconds the trainer waited for it: the one generated ahead, a resumed run's
        kept batch, or (the first step; a resume without a kept batch) one generated now from `weights()`."""
        if self.kept is not None:
            batch, self.kept = self.kept, None
            return batch, 0.0
        t0 = time.perf_counter()
        if self.pending is None:
            self.start(step, position, weights(), version)
        batch = self.settle()
        return batch, time.perf_counter() - t0

    def next_batch(self, step: int, position: int, weights: Callable[[], Any], more: bool) -> tuple[Batch, float]:
        """The loop's call: step `step`'s batch (`take`) and the seconds the trainer waited for it, and, where `more`
        steps follow, the next one begun from `weights()` (the weights this step starts from: one version behind the
        update it is trained with)."""
        batch, waited = self.take(step, position, weights, version=step)
        if more:
            self.start(step + 1, batch.position, weights(), version=step)
        return batch, waited

    def settle(self) -> Batch:
        """Wait for the batch in flight (an error in its generation or reward is raised here, in the trainer)."""
        assert self.pending is not None, "no batch in flight"
        future, self.pending = self.pending, None
        return future.result()

    def hold(self) -> None:
        """Wait for the batch in flight and keep it for the next `take`: before the main thread samples itself
        (validation), since the engines' sampling seeds the process's random generator (`HFEngine._seeded`)."""
        if self.pending is not None:
            self.kept = self.settle()

    # -- checkpoints -----------------------------------------------------------------------------------------

    def save_pending(self, directory: Path, rank: int) -> None:
        """The batch in flight, awaited and written into a checkpoint being made (it becomes `kept` again, so the
        run goes on with it)."""
        self.hold()
        if self.kept is not None:
            save_batch(self.kept, directory / PENDING.format(rank=rank))

    def load_pending(self, directory: Path, rank: int) -> int | None:
        """A checkpoint's kept batch for this rank, to train next; returns the data position after it (None: the
        checkpoint has none, so the next batch is generated on resume)."""
        path = directory / PENDING.format(rank=rank)
        if not path.exists():
            return None
        self.kept = load_batch(path)
        return self.kept.position

    def close(self) -> None:
        """Stop: a batch still in flight is left to finish on its own (a stopped run does not wait for it)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pending = None


def own_cudagraph_state() -> None:
    """Give this thread its own CUDA-graph tree managers (the rollout thread's initializer).

    The hf engine's compiled decode step replays CUDA graphs (`torch.compile` mode reduce-overhead), whose managers
    torch keeps in thread-local state. torch before 2.13 sets that state up only in the thread that first imported
    `torch._inductor.cudagraph_trees` and fails an assertion (`torch._C._is_key_in_tls`) in any other: on an H200
    with torch 2.11, a staleness-1 run whose step-0 validation compiled the decode step on the main thread stopped at
    the rollout thread's first generation. The sampler generates only from this thread, so its graphs live here."""
    import threading
    from collections import defaultdict

    from torch._inductor import cudagraph_trees

    state = cudagraph_trees.local  # a threading.local: attributes set here belong to this thread only
    if not hasattr(state, "tree_manager_containers"):
        state.tree_manager_containers = {}
        state.tree_manager_locks = defaultdict(threading.Lock)


def open_sampler(recipe, loaded_policy, tokenizer, device, dtype, seed: int, kernels: Any):
    """The sampler's copy of the policy (plain HF, eval, no gradients; LoRA merged in at each transfer) and an hf
    rollout engine generating with it. kernels: policy.kernels as resolved for the trainer's copy; None: resolved here
    (a generation rank of split placement, which holds no other copy)."""
    import dataclasses

    from teacli import models
    from teacli.kernels import apply_kernels, resolve_kernels
    from teacli.rollout.factory import build_engine

    model = models.load_policy(dataclasses.replace(loaded_policy, lora=dataclasses.replace(loaded_policy.lora, enabled=False)),
                               dtype=dtype, device=device)
    if recipe.policy.attn_implementation is None and device.type == "cpu":
        model.set_attn_implementation(models.register_sdpa_gqa())
    model.eval().requires_grad_(False)
    if kernels is None:
        kernels = resolve_kernels(recipe.policy.kernels, model, device)
    apply_kernels(model, kernels, generates=True)
    rollout = build_engine(dataclasses.replace(recipe.rollout, engine="hf"), model, tokenizer, policy=recipe.policy, seed=seed,
                           max_model_len=recipe.data.max_prompt_tokens + recipe.rollout.max_new_tokens)
    return model, rollout
