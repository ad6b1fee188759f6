"""DeepSpeed ZeRO backend: process group, engine, parameter gathering, save/load.

The only module that imports deepspeed. A plain `tea train` starts a one-process group itself
(gloo on CPU, NCCL on GPU); the `deepspeed` launcher or `torchrun` provide RANK/WORLD_SIZE/
LOCAL_RANK/MASTER_ADDR for multi-process runs and the same code path is used.

Precision: bf16 keeps fp32 master weights and optimizer state inside DeepSpeed's optimizer
wrappers (plain bf16 AdamW updates fall below bf16 resolution at RL learning rates).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from teacli.memory import activation_budget, activation_bytes, auto_checkpoint_layers, state_bytes
from teacli.memory import activation_share as share_of_engine

if TYPE_CHECKING:
    import torch

    from teacli.config import Recipe


@dataclass
class World:
    rank: int
    world_size: int
    local_rank: int
    device: "torch.device"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send whatever is written to file descriptor 1 inside the block to stderr: DeepSpeed prints its
    notes on stdout (`print`, its ops' compiler output), and stdout holds results only (docs/cli.md)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _deepspeed():
    """deepspeed, imported with its output on stderr: the accelerator note it logs at import, and its
    logger's handler, which it points at stdout, moved to stderr for the rest of the process."""
    if "deepspeed" not in sys.modules:
        with _stdout_to_stderr():
            import deepspeed  # noqa: F401
    import deepspeed
    from deepspeed.utils import logger

    for handler in logger.handlers:
        if type(handler) is logging.StreamHandler and handler.stream is not sys.stderr:  # not a test runner's capture
            handler.setStream(sys.stderr)
    return deepspeed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_device() -> "torch.device":
    """The launch's rendezvous settings (a one-process launch where none gave them) and this rank's device: its
    LOCAL_RANK's GPU, else the CPU."""
    import torch

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return device


def init_world() -> World:
    """Initialise torch.distributed through DeepSpeed (a one-process group when not launched)."""
    import torch.distributed as dist

    device = _launch_device()
    local_rank = int(os.environ["LOCAL_RANK"])
    deepspeed = _deepspeed()
    if not dist.is_initialized():
        cpu_peers = device.type == "cpu" and int(os.environ["WORLD_SIZE"]) > 1  # ranks that share memory through SHM_OP
        if cpu_peers:
            _clear_stale_build_lock(SHM_OP)
        with _stdout_to_stderr(), _without_shm_op(deepspeed, skip=device.type == "cpu" and not cpu_peers):  # "... built successfully" of SHM_OP
            deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo", verbose=False)
        if cpu_peers:
            dist.barrier()  # every rank has mapped every peer's shared-memory segment
            _unlink_shm_segment(dist.get_rank())
    return World(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, device=device)


def init_split_world(generation_ranks: int) -> tuple[World, "Split"]:
    """Split placement (rollout.colocated: false; teacli/train/split.py): the launch's last `generation_ranks` ranks
    generate, the others train. The trainers' process group is the default one and holds the trainers only, so
    DeepSpeed and every collective of the loop (initialize, all-reduces, save_checkpoint's barriers) run among them as
    in a colocated launch, and no rank that generates can leave one of them waiting. Both sides meet through one
    TCPStore on the launch's MASTER_ADDR:MASTER_PORT (served by rank 0, as `env://` would): the trainers' group under
    one prefix, the transfer group (teacli/train/split.py) under another. A generation rank joins no default group:
    its World is its place among the generators (rank g of k), which is what sharding its prompts needs."""
    import datetime

    import torch.distributed as dist

    device = _launch_device()
    rank, size, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    trainers = size - generation_ranks
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, rank == 0,
                          timeout=datetime.timedelta(seconds=SPLIT_TIMEOUT_S), wait_for_workers=False)
    split = Split(trainers, generation_ranks, rank - trainers if rank >= trainers else None, store)
    if split.generator is not None:
        return World(rank=split.generator, world_size=generation_ranks, local_rank=local_rank, device=device), split
    os.environ["WORLD_SIZE"] = str(trainers)  # what DeepSpeed and the loop read: the trainers' group
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.PrefixStore("tea/trainers/", store),
                                rank=rank, world_size=trainers)
    deepspeed = _deepspeed()
    with _stdout_to_stderr(), _without_shm_op(deepspeed, skip=device.type == "cpu"):  # gloo's all-reduce among the trainers
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo", verbose=False)
    return World(rank=rank, world_size=trainers, local_rank=local_rank, device=device), split


SPLIT_TIMEOUT_S = 6 * 3600  # a generation rank waits for weights through the trainers' validation and checkpoints


@dataclass
class Split:
    """Where this rank stands in a split launch (init_split_world)."""

    trainers: int  # ranks 0 … trainers − 1 train
    generators: int  # the last ranks generate
    generator: int | None  # this rank's index among the generators; None on a training rank
    store: Any  # the launch's TCPStore: the transfer group's rendezvous


SHM_OP = "deepspeed_shm_comm"  # DeepSpeed's CPU shared-memory all-reduce op: its name for torch's JIT build and in its ops table


@contextlib.contextmanager
def _without_shm_op(deepspeed: Any, skip: bool) -> Iterator[None]:
    """DeepSpeed's CPU backend JIT-builds (or re-checks, under a file lock) its shared-memory all-reduce op in every
    process it starts; a one-process run has nobody to share memory with. With `skip`, the op reads as incompatible
    while the process group starts (`deepspeed.ops.__compatible_ops__`, which `build_shm_op` consults), and torch's
    gloo does the (no-op) collectives. This also spares a one-process run the lock of the op's build directory: a
    process killed while holding it (a SIGKILLed `tea train`) left a lock that made every later CPU run wait forever."""
    ops = getattr(getattr(deepspeed, "ops", None), "__compatible_ops__", None)
    if not skip or not isinstance(ops, dict):
        yield
        return
    saved = ops.get(SHM_OP, False)
    ops[SHM_OP] = False
    try:
        yield
    finally:
        ops[SHM_OP] = saved


STALE_LOCK_S = 600  # a build of DeepSpeed's shm op takes well under a minute on 2 cores


def _clear_stale_build_lock(name: str) -> None:
    """Remove the lock of torch's JIT-build directory for op `name` when it is older than `STALE_LOCK_S`: torch waits
    on it forever, and one is left behind whenever a process is killed while it loads the op. One line on stderr
    says so."""
    import time

    from torch.utils.cpp_extension import _get_build_directory  # the directory torch's `load` builds `name` in

    lock = Path(_get_build_directory(name, verbose=False)) / "lock"
    with contextlib.suppress(OSError):
        age = time.time() - lock.stat().st_mtime
        if age > STALE_LOCK_S:
            lock.unlink()
            print(f"note: removed a stale build lock ({lock}, {age / 60:.0f} minutes old, left by a killed process)", file=sys.stderr)


def _unlink_shm_segment(rank: int) -> None:
    """DeepSpeed's CPU shared-memory all-reduce (its deepspeed_shm_comm_op, used when its launcher sets LOCAL_SIZE)
    creates one /dev/shm segment per rank, `deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>`
    (66 MB), and never unlinks it: every multi-process CPU run left 132 MB of memory behind until reboot (a CI
    machine's /dev/shm filled up and the kernel killed a later run). Once every rank has mapped every peer's segment
    (DeepSpeed's init waits for them; the barrier before this call waits for every rank), a rank can unlink its own
    name: the mappings stay valid and the memory is freed when the last process exits, crashed or not. A name
    DeepSpeed did not create is simply not there."""
    name = f"deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_{os.environ.get('MASTER_PORT', '')}_{rank}"
    with contextlib.suppress(OSError):
        (Path("/dev/shm") / name).unlink(missing_ok=True)


def bf16_supported(device: "torch.device") -> bool:
    import torch

    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_precision(precision: str, device: "torch.device") -> str:
    if precision == "auto":
        return "bf16" if bf16_supported(device) else "fp32"
    return precision


@dataclass(frozen=True)
class Checkpointing:
    """policy.gradient_checkpointing resolved: the first `layers` of the model's `of` decoder layers are
    checkpointed. On CUDA, with the model's shape known, also the estimates behind it (bytes): `activations`
    of one micro-batch with those layers checkpointed, `states` (model_state_bytes), and `budget`, the share
    (`activation_share`) of the memory this process may use (`total`: the device's free memory plus what the
    process holds already) that the model states and the other models it holds (`held`: a reward model on the
    device) leave, which `auto` fits the activations into."""

    setting: "bool | int | str"
    layers: int
    of: int
    activations: int | None = None
    states: int | None = None
    budget: int | None = None
    total: int | None = None
    held: int = 0

    @property
    def estimate(self) -> int | None:
        """Estimated peak bytes of the training phase: model states + activations (None off CUDA)."""
        return None if self.activations is None or self.states is None else self.states + self.activations

    def describe(self) -> str:
        """The line `tea train` prints at start."""
        what = {0: "off", self.of: f"all {self.of} decoder layers"}.get(self.layers, f"the first {self.layers} of {self.of} decoder layers")
        line = f"gradient checkpointing: {what} (policy.gradient_checkpointing: {str(self.setting).lower()})"
        if self.estimate is not None:
            gib = 2**30
            held = f" and {self.held / gib:.1f} GiB of reward model" if self.held else ""
            line += (f"; estimated activations of one micro-batch {self.activations / gib:.1f} GiB (budget {self.budget / gib:.1f} GiB: "
                     f"{self.budget / max(self.total - self.states - self.held, 1):.0%} of the {self.total / gib:.1f} GiB this process may use "
                     f"less {self.states / gib:.1f} GiB of model states{held}), training peak ~{self.estimate / gib:.1f} GiB")
        return line


def activation_share(recipe: "Recipe") -> float:
    """The share of the memory the model states leave that `auto` fits the activations into, for the recipe's engine
    (`teacli.memory.activation_share`)."""
    return share_of_engine(recipe.rollout.engine, recipe.rollout.sleep)


def resolve_checkpointing(recipe: "Recipe", model, world: World, held: int = 0) -> Checkpointing:
    """policy.gradient_checkpointing for `model` (before LoRA and ZeRO-3 wrap it): true = every decoder
    layer, false = none, an integer k = the first k; `auto` = the fewest that fit (`auto_checkpoint_layers`).

    The rule for `auto`: none on CPU (there it only costs time). On CUDA, the smallest k whose estimated
    activations of one micro-batch (`activation_bytes` of micro_batch_size × (data.max_prompt_tokens +
    rollout.max_new_tokens) tokens: the recipe's worst case, not a batch's actual lengths) fit in
    `activation_share` (3/4; 1/2 beside an awake vllm engine) of the memory this process may use (what is free on
    the device plus what the process holds already: another process's memory is not) left after the model states
    (`model_state_bytes`) and `held` (bytes of other models on the device the states do not count: the reward
    model); every layer for an architecture whose shape it cannot read. k above the model's layer count is a
    ValueError naming the key.
    """
    from teacli.models import checkpointable_layers

    setting = recipe.policy.gradient_checkpointing
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden, n_config = getattr(text, "hidden_size", None), getattr(text, "num_hidden_layers", None)
    of = len(checkpointable_layers(model)) or n_config or 0
    if isinstance(setting, bool):
        layers = of if setting else 0
    elif isinstance(setting, int):
        if setting > of:
            raise ValueError(f"policy.gradient_checkpointing: {setting} layers, but {type(model).__name__} has {of} decoder "
                             f"layers; use 0 to {of}, true (all), false or auto")
        layers = setting
    elif world.device.type != "cuda":
        layers = 0
    elif not hidden or not of:
        return Checkpointing(setting, of, of)  # unknown architecture: the safe choice
    else:
        layers = -1  # chosen below, from the estimates
    if world.device.type != "cuda" or not hidden or not of:
        return Checkpointing(setting, layers, of)
    import torch

    inter = getattr(text, "intermediate_size", None) or 4 * hidden
    tokens = recipe.optim.micro_batch_size * (recipe.data.max_prompt_tokens + recipe.rollout.max_new_tokens)
    free, _ = torch.cuda.mem_get_info(world.device)
    total = min(torch.cuda.get_device_properties(world.device).total_memory, free + torch.cuda.memory_allocated(world.device))
    states = model_state_bytes(recipe, model, world)
    budget = activation_budget(total, states + held, recipe.rollout.engine, recipe.rollout.sleep)
    if layers < 0:
        layers = auto_checkpoint_layers(budget, tokens, of, hidden, inter)
    return Checkpointing(setting, layers, of, activation_bytes(tokens, of, hidden, inter, layers), states, budget, total, held)


def model_state_bytes(recipe: "Recipe", model, world: World) -> int:
    """Estimated bytes this rank's trainer holds between steps: weights (bf16; a reference model another
    copy), gradients and fp32 master weights + AdamW moments, as the ZeRO stage partitions them.

    Per parameter: 2 bytes of weights, and for trainable ones 2 of gradient and 12 of optimizer state
    (`teacli.memory.state_bytes` of the model's parameter counts). Some of it (AdamW's moments without ZeRO,
    gradient buffers) is allocated only at the first step, which is why the vllm engine sizes itself from this
    and not only from what is allocated when it is built.
    """
    n_all = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return state_bytes(n_all, n_train, world.world_size, zero_stage=recipe.backend.zero_stage, kl_beta=recipe.kl.beta,
                       lora=recipe.policy.lora.enabled, offload_optimizer=recipe.backend.offload_optimizer)


def peak_memory_gib(device: "torch.device") -> float | None:
    """The most memory torch's allocator had allocated on `device` since the last call (or the start), in
    GiB (torch.cuda.max_memory_allocated); the count starts again from what is allocated now. None off CUDA."""
    import torch

    if device.type != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    torch.cuda.reset_peak_memory_stats(device)
    return peak


def deepspeed_config(recipe: "Recipe", world: World, grad_accum: int, precision: str) -> dict[str, Any]:
    b = recipe.backend
    zero: dict[str, Any] = {"stage": b.zero_stage}
    if b.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": world.device.type == "cuda"}
    if b.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": world.device.type == "cuda"}
    if b.zero_stage == 3:
        # Gather whole layers for generation and saving; keep the defaults otherwise.
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "train_micro_batch_size_per_gpu": recipe.optim.micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": recipe.optim.max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def build_engine(model, recipe: "Recipe", world: World, grad_accum: int, precision: str):
    """Wrap the policy in a DeepSpeed engine with AdamW and the recipe's schedule."""
    import torch

    deepspeed = _deepspeed()

    o = recipe.optim
    params = [p for p in model.parameters() if p.requires_grad]
    with _stdout_to_stderr():  # building or loading an op (CPU Adam) prints on stdout
        if recipe.backend.offload_optimizer:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        else:
            optimizer = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lr_schedule(o.scheduler, o.warmup_steps, o.steps))
        engine, optimizer, _, scheduler = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=deepspeed_config(recipe, world, grad_accum, precision),
        )
    return engine


def pre_step_grad_norm(engine) -> float | None:
    """The global gradient norm before clipping, for an engine whose optimizer does not report it.

    Call after the accumulation boundary's backward and before its `step()`. ZeRO and the bf16
    optimizer compute the pre-clip norm themselves (`get_global_grad_norm()` after the step); plain
    fp32 without ZeRO clips with torch and keeps no norm, so it is taken here from the gradients,
    which the boundary's backward has already averaged over ranks. None when the engine reports it.
    """
    import torch

    if engine.zero_optimization() or engine.bfloat16_enabled() or engine.fp16_enabled():
        return None
    grads = [p.grad.detach().float() for p in engine.module.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def optimizer_steps(engine) -> int:
    """The optimizer updates the engine has applied (DeepSpeed's global_steps, restored on resume)."""
    return int(engine.global_steps)


def lr_schedule(kind: str, warmup: int, total: int):
    import math

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1.0 - progress

    return factor


@contextlib.contextmanager
def gathered_parameters(model, zero_stage: int) -> Iterator[None]:
    """Full weights available inside the block (ZeRO-3 gathers them; other stages hold them already)."""
    if zero_stage != 3:
        yield
        return
    deepspeed = _deepspeed()

    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
        yield


@contextlib.contextmanager
def generation_weights(engine, zero_stage: int, rollout: Any = None) -> Iterator[None]:
    """Whole, hook-free weights for generating with the training module (a `rollout` engine whose
    `shares_weights` is False, the vllm engine, generates with its own copy: nothing is gathered for it).

    Under ZeRO-3 every forward all-gathers parameters through module hooks, so ranks that generate
    different numbers of tokens would deadlock (and each step would gather again). For generation
    we gather all parameters once and detach ZeRO-3's module hooks, then re-attach them. This
    uses DeepSpeed's parameter-offload internals (`_remove_module_hooks`, `setup_zero_stage3_hooks`),
    checked against deepspeed 0.19.
    """
    if zero_stage != 3 or not getattr(rollout, "shares_weights", True):
        yield
        return
    deepspeed = _deepspeed()

    offload = getattr(engine.optimizer, "parameter_offload", None) or engine.optimizer
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        for p in params:
            p.ds_active_sub_modules.clear()
        offload._remove_module_hooks()
        offload.forward_hooks, offload.backward_hooks = [], []
        try:
            yield
        finally:
            offload.setup_zero_stage3_hooks()


def named_weights(model, zero_stage: int) -> Iterator[tuple[str, "torch.Tensor"]]:
    """(name, full tensor) for each parameter in turn: what the trainer pushes to a rollout engine.

    ZeRO-0/1/2 yield the parameters themselves (detached, no copy). ZeRO-3 gathers one parameter
    at a time and yields a copy, so a push needs one parameter's worth of extra memory, not a
    model's; the gather is collective, so every rank must consume the iterator, in the same order.
    """
    if zero_stage != 3:
        for name, p in model.named_parameters():
            yield name, p.detach()
        return
    deepspeed = _deepspeed()

    for name, p in model.named_parameters():
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
            full = p.detach().clone()
        yield name, full  # outside the gather: a consumer that stops early cannot leave a collective open


def full_state_dict(model, zero_stage: int, is_main: bool) -> dict[str, "torch.Tensor"] | None:
    """A CPU copy of the full state dict on the main rank (collective under ZeRO-3: every rank calls it)."""
    state: dict[str, Any] = {}
    with gathered_parameters(model, zero_stage):
        if is_main:
            state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    return state if is_main else None


def save_engine_state(engine, directory: str, tag: str) -> None:
    """Optimizer, scheduler and (partitioned) model state for exact resume; every rank calls it."""
    engine.save_checkpoint(directory, tag=tag, save_latest=False)


def load_engine_state(engine, directory: str, tag: str) -> None:
    """Restore what save_engine_state wrote; ValueError naming the folder when it is missing or damaged
    (DeepSpeed itself fails with a bare AssertionError or an unpickling error)."""
    import pickle

    state = os.path.join(directory, tag)
    if not os.path.isdir(state) or not os.listdir(state):
        raise ValueError(f"the trainer state {state} is missing")
    try:
        path, _ = engine.load_checkpoint(directory, tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
    except (AssertionError, RuntimeError, EOFError, OSError, KeyError, ValueError, pickle.UnpicklingError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"the trainer state in {state} cannot be read (damaged or truncated?): {type(exc).__name__}: {first}") from None
    if path is None:
        raise ValueError(f"could not load the trainer state {tag!r} from {directory}")


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def close_world() -> None:
    """Wait for every rank, then tear the process group down (no-op alone). Without it a rank can abort at
    interpreter exit ("terminate called without an active exception") while the group's threads still run."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _all_reduce_stats(values: dict[str, float], op: str) -> dict[str, float]:
    """Reduce scalar stats over ranks in one float64 all-reduce: op "mean" or "max"; the dict as given when alone."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1 or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    if op == "mean":
        t /= dist.get_world_size()
    return {k: float(v) for k, v in zip(keys, t.tolist())}


def all_reduce_mean(values: dict[str, float]) -> dict[str, float]:
    """Average scalar stats over ranks."""
    return _all_reduce_stats(values, "mean")


def all_reduce_max_stats(values: dict[str, float]) -> dict[str, float]:
    """The largest of the ranks' values of each scalar stat: the slowest rank's time, which the mean hides."""
    return _all_reduce_stats(values, "max")


def all_reduce_max(value: int) -> int:
    """The largest of the ranks' integers (every rank gets it): how ranks agree on a shared decision
    (exact through the float64 reduce for any |value| below 2**53)."""
    return int(_all_reduce_stats({"value": value}, "max")["value"])


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order, on every rank; `[obj]` without a process group of several."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def scatter_object(objs: list[Any] | None, src: int = 0) -> Any:
    """Rank r's item of `objs` (given on `src`, None elsewhere); `objs[0]` without a process group of several."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return objs[0]
    out: list[Any] = [None]
    dist.scatter_object_list(out, objs if dist.get_rank() == src else None, src=src)
    return out[0]


def broadcast_object(obj: Any, src: int = 0) -> Any:
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
