"""Split placement (`rollout.colocated: false`): generation on ranks of its own, fed the trainer's weights over a
process group after every update.

A launch of N processes with `rollout.generation_ranks` k: ranks 0 … N−k−1 train (DeepSpeed, the loop of
teacli/train/loop.py, validation and checkpoints, exactly as a colocated launch of N−k), the last k generate and score
(an hf engine on a copy of the policy, the reward, the behaviour log-probs when `rollout.is_correction` is on). The two
sides meet only in the *transfer group*: trainer rank 0 (member 0) and the k generators (members 1 … k).

Why not one process group of all N ranks with DeepSpeed on a sub-group of it: DeepSpeed's engine, its checkpoints and
the loop's own reductions call collectives on the default group in many places (`deepspeed.comm.barrier()` in
save_checkpoint and load_checkpoint, the loop's all-reduces, `broadcast_object`), and one of them missed on a
generation rank is a deadlock. Here, as in OpenRLHF's and vLLM's "stateless" groups, the default group holds the
trainers only (backend.init_split_world), so nothing of DeepSpeed's or of the loop can reach a generation rank; the
transfer group is built beside it from the launch's TCPStore under a prefix of its own, and used only through its
own handles (gloo for objects; NCCL for the weights on GPUs, gloo on CPU).

The conversation, in one order on both sides (the k generators each hold their share of the step's P prompts,
`sharding.shares(P, k)`, seeded as a colocated launch's rank g would be):
    hello (trainer 0: first step, data position, whether it keeps a batch, optim.steps)   → generators
    W_s   the weights at the first step (version s)                                        → generators
    R_s   step s's batch: every generator's Selection, rewards, behaviour log-probs        → trainer 0
    then for t = s+1 … steps−1:  W_t after step t−1's update, then R_t.
Staleness 0: a generator waits for W_t, then generates R_t from it (on-policy: the colocated run's batches where
the seeds agree). Staleness 1: it generates R_t from W_{t−1} while the trainers train step t−1, then waits for W_t
before sending: every batch one version behind the trainer (`weights_version` = step − 1), the first from W_s.
Trainer 0 gathers the generators' groups in order, and the trainers take their shares of the step's prompts by
`backend.scatter_object` (then, where they hold unequal numbers, teacli/train/sharding.py shards the sequences).

Weights: every trainer walks `backend.named_weights` (ZeRO-3 gathers each parameter, collectively among the
trainers), trainer 0 merges LoRA adapters into their base weights (`teacli.lora.merged_named_tensors`) and
broadcasts each tensor with its name; a generator copies it into its model by name (offpolicy.copy_weights, which
fails on a missing or misshapen parameter). There is no log-prob check of this sync as the vllm engine has: the
tensors arrive bit for bit, in the dtype both sides hold.

Resume: staleness 0 keeps nothing in flight: the next batch is generated again from the checkpoint's weights with
the same seeds, the batch the uninterrupted run trained on. Staleness 1: at a checkpoint trainer 0 takes the batch in
flight (made from the weights before the checkpoint's, which the checkpoint does not hold) and writes it whole into
the checkpoint (`pending_split.pt`); a resumed run trains on it and its generators start one step ahead.

Timings per step in metrics.jsonl: `time_wait_rollouts` (trainer 0 waiting for the batch), `time_wait_weights`
(the slowest generator waiting for the weights of that batch's step), `time_sync` (the weight broadcast).
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from teacli.train.offpolicy import Batch, load_batch, make_batch, save_batch
from teacli.train.sharding import shares

if TYPE_CHECKING:
    from teacli.config import Recipe

PENDING = "pending_split.pt"


class Link:
    """The transfer group (module docstring): member 0 is trainer rank 0, members 1 … k the generators."""

    def __init__(self, store: Any, member: int, size: int, device: Any) -> None:
        import datetime

        import torch.distributed as dist

        from teacli.train.backend import SPLIT_TIMEOUT_S

        timeout = datetime.timedelta(seconds=SPLIT_TIMEOUT_S)
        self.member, self.size, self.device = member, size, device
        self.objects = dist.ProcessGroupGloo(dist.PrefixStore("tea/link/objects/", store), member, size, timeout)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.tensors = dist.ProcessGroupNCCL(dist.PrefixStore("tea/link/tensors/", store), member, size, options)
        else:
            self.tensors = self.objects

    def broadcast_tensor(self, tensor) -> None:
        """Member 0's `tensor` into every member's (same shape and dtype), over the weights' backend."""
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.tensors.broadcast([tensor], options).wait()

    def broadcast_object(self, obj: Any = None) -> Any:
        """Member 0's `obj` (picklable) on every member."""
        import torch
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0
        data = pickle.dumps(obj) if self.member == 0 else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        self.objects.broadcast([size], options).wait()
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if self.member == 0 else torch.empty(int(size), dtype=torch.uint8)
        self.objects.broadcast([buf], options).wait()
        return obj if self.member == 0 else pickle.loads(buf.numpy().tobytes())

    def send_object(self, obj: Any, dst: int) -> None:
        import torch

        data = pickle.dumps(obj)
        self.objects.send([torch.tensor([len(data)], dtype=torch.int64)], dst, 1).wait()
        self.objects.send([torch.frombuffer(bytearray(data), dtype=torch.uint8)], dst, 2).wait()

    def recv_object(self, src: int) -> Any:
        import torch

        size = torch.empty(1, dtype=torch.int64)
        self.objects.recv([size], src, 1).wait()
        buf = torch.empty(int(size), dtype=torch.uint8)
        self.objects.recv([buf], src, 2).wait()
        return pickle.loads(buf.numpy().tobytes())


# ------------------------------------------------------------------------------------------------
# The weights


def send_weights(link: Link, named, version: int, lora_module: Any = None) -> None:
    """Trainer rank 0: the version, then each (name, tensor) of `named` (LoRA merged into base names), then an end."""
    if lora_module is not None:
        from teacli.lora import merged_named_tensors

        named = merged_named_tensors(lora_module, named)
    link.broadcast_object(version)
    for name, tensor in named:
        tensor = tensor.detach().to(link.device).contiguous()
        link.broadcast_object((name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")))
        link.broadcast_tensor(tensor)
    link.broadcast_object(None)


def receive_weights(link: Link, model) -> int:
    """A generator: the trainer's weights into `model`, by name; returns their version (optimizer updates)."""
    import torch

    from teacli.train.offpolicy import copy_weights

    version = link.broadcast_object()

    def stream():
        while (head := link.broadcast_object()) is not None:
            name, shape, dtype = head
            buf = torch.empty(shape, dtype=getattr(torch, dtype), device=link.device)
            link.broadcast_tensor(buf)
            yield name, buf

    copy_weights(model, stream())
    return version


# ------------------------------------------------------------------------------------------------
# The batches


def merge(batches: list[Batch]) -> Batch:
    """The generators' batches of one step (in generator order: the step's prompts in data order) as one batch; its
    times are the slowest generator's."""
    import torch

    from teacli.train.dynamic import Selection

    sels = [b.sel for b in batches]
    sel = Selection([p for s in sels for p in s.prompts], [p for s in sels for p in s.prompt_ids], [g for s in sels for g in s.groups],
                    torch.cat([s.rewards for s in sels]), torch.cat([s.filled for s in sels]))
    times = {k: max(b.times.get(k, 0.0) for b in batches) for k in batches[0].times}
    return Batch(sel, batches[0].position, batches[0].version, times)


def share(batch: Batch, start: int, count: int) -> Batch:
    """The groups start … start+count−1 of `batch`: one trainer's share."""
    from teacli.train.dynamic import Selection

    s, end = batch.sel, start + count
    sel = Selection(s.prompts[start:end], s.prompt_ids[start:end], s.groups[start:end], s.rewards[start:end], s.filled[start:end])
    return Batch(sel, batch.position, batch.version, dict(batch.times))


class SplitRollouts:
    """The training ranks' side (module docstring): `take` a step's batch, `push` the weights after an update, `hold`
    and `save_pending` the batch in flight at a checkpoint. Trainer rank 0 talks to the generators; the other trainers
    get their shares from it and walk the weights with it (ZeRO-3 gathers collectively)."""

    def __init__(self, link: Link | None, world, staleness: int, steps: int, prompts: int, lora_module: Any = None) -> None:
        self.link = link  # None on trainer ranks other than 0
        self.world = world
        self.staleness = staleness
        self.steps = steps
        self.prompts = prompts
        self.lora_module = lora_module
        self.kept: Batch | None = None  # trainer 0: a whole batch received ahead (or read from a checkpoint)
        self.next = 0  # the step whose batch comes next

    def begin(self, start: int, position: int, named) -> None:
        """Tell the generators where the run starts and give them the weights it starts from."""
        self.next = start
        if self.link is not None:
            kept = self.kept is not None
            self.link.broadcast_object({"start": start, "steps": self.steps, "kept": kept,
                                        "position": self.kept.position if kept else position})
        self.push(named, start)

    def stop(self) -> None:
        """Trainer 0, a run with no step left to train: the generators go home."""
        if self.link is not None:
            self.link.broadcast_object({"stop": True})

    def push(self, named, version: int) -> float:
        """The weights after `version` updates to the generators (when a step is left to generate); the seconds it took."""
        if version >= self.steps:
            return 0.0
        t0 = time.perf_counter()
        if self.link is not None:
            send_weights(self.link, named, version, self.lora_module)
        else:
            for _ in named:  # ZeRO-3: the gathers are collective among the trainers
                pass
        return time.perf_counter() - t0

    def _receive(self) -> Batch:
        assert self.link is not None
        return merge([self.link.recv_object(g) for g in range(1, self.link.size)])

    def take(self, step: int) -> tuple[Batch, float]:
        """This trainer's share of step `step`'s batch, and the seconds trainer 0 waited for it."""
        from teacli.train import backend

        assert step == self.next, f"split placement: step {step}'s batch asked for, step {self.next}'s comes next"
        self.next = step + 1
        waited, parts = 0.0, None
        if self.link is not None:
            t0 = time.perf_counter()
            batch, self.kept = (self.kept, None) if self.kept is not None else (self._receive(), None)
            waited = time.perf_counter() - t0
            parts = [share(batch, a, c) for a, c in shares(self.prompts, self.world.world_size)]
        return backend.scatter_object(parts), waited

    def next_batch(self, step: int, position: int, weights: Callable[[], Any], more: bool) -> tuple[Batch, float]:
        """The loop's call, as `OneStepAhead.next_batch`: step `step`'s batch (the generators know its position and
        get the weights by `push`), and the seconds trainer 0 waited for it."""
        return self.take(step)

    def hold(self) -> None:
        """Staleness 1, at a checkpoint: trainer 0 takes the batch in flight now and keeps it for the next `take`."""
        if self.link is not None and self.staleness and self.kept is None and self.next < self.steps:
            self.kept = self._receive()

    def save_pending(self, directory: Path, rank: int) -> None:
        """The batch in flight, whole, into a checkpoint being made (trainer 0)."""
        self.hold()
        if self.link is not None and self.kept is not None:
            save_batch(self.kept, directory / PENDING)

    def load_pending(self, directory: Path) -> bool:
        """A checkpoint's batch in flight, kept by trainer 0 to train next; whether the checkpoint had one (every
        trainer gets the answer)."""
        from teacli.train import backend

        if self.link is not None and (directory / PENDING).exists():
            self.kept = load_batch(directory / PENDING)
        return bool(backend.broadcast_object(self.kept is not None))

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------------
# The generation ranks


def open_generator(recipe: "Recipe", world):
    """A generation rank's sampling session: the tokenizer, the encoded train prompts, the reward and (a copy of the
    policy, an hf engine on it); the train split is encoded and filtered as the trainers' is, so the data order agrees."""
    import torch

    from teacli.models import allow_cudnn_attention
    from teacli.rewards import build_reward
    from teacli.train import backend
    from teacli.train.offpolicy import open_sampler
    from teacli.train.setup import open_inputs

    precision = backend.resolve_precision(recipe.backend.precision, world.device)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    loaded, tokenizer, (train_prompts, _, _) = open_inputs(recipe)
    allow_cudnn_attention(recipe.backend.cudnn_attention)
    reward = build_reward(loaded.reward, device=world.device, tokenizer=tokenizer)
    model, rollout = open_sampler(recipe, loaded.policy, tokenizer, world.device, dtype, recipe.seed + world.rank, None)
    if recipe.rehearsal.enabled:
        from teacli import standins

        standins.end_responses(recipe, rollout)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return tokenizer, train_prompts, reward, model, rollout, pad_id


def run_generator(recipe: "Recipe", world, split, is_level: str, generate: Callable[..., tuple]) -> None:
    """A generation rank's whole run: the conversation of the module docstring, until optim.steps. generate(rollout,
    reward, train prompts, step, position) -> (Selection, position after, generation s, reward s): the loop's
    `generate_step` on this rank's share (its World: rank g of the k generators)."""
    import random

    import torch

    torch.manual_seed(recipe.seed + world.rank)
    random.seed(recipe.seed + world.rank)
    _, train_prompts, reward, model, rollout, pad_id = open_generator(recipe, world)
    link = Link(split.store, 1 + world.rank, 1 + split.generators, world.device)
    hello = link.broadcast_object()
    if hello.get("stop"):
        return

    def make(step: int, position: int, version: int) -> Batch:
        return make_batch(generate(rollout, reward, train_prompts, step, position), version,
                          model if is_level != "off" else None, pad_id, recipe.rollout.batch_size)

    def pull() -> tuple[int, float]:
        t0 = time.perf_counter()
        return receive_weights(link, model), time.perf_counter() - t0

    version, waited = pull()
    step, position, steps = hello["start"], hello["position"], hello["steps"]
    if hello["kept"]:  # trainer 0 holds this step's batch (a checkpoint's batch in flight): begin with the next one
        step += 1
    elif step < steps:
        batch = make(step, position, version)
        batch.times["time_wait_weights"] = waited
        link.send_object(batch, 0)
        step, position = step + 1, batch.position
    while step < steps:
        if recipe.rollout.max_staleness:  # generate from the weights one update back, then wait for the new ones
            batch = make(step, position, version)
            version_now, waited = pull()
        else:  # wait for the weights of this step, then generate from them
            version_now, waited = pull()
            batch = make(step, position, version_now)
        batch.times["time_wait_weights"] = waited
        link.send_object(batch, 0)
        version, step, position = version_now, step + 1, batch.position
