"""Writing a checkpoint: the HF model `from_pretrained` loads, the trainer state a resume reads, all or nothing (the
run directory itself is `teacli.rundir`, shared by every stage)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any, Callable

from teacli.rundir import RunDir, step_dir_name, write_text_atomic, writing
from teacli.train.errors import TrainError


def save_hf_model(module, state: dict[str, Any], tokenizer, directory: Path, lora: bool) -> None:
    """An HF-format checkpoint loadable by `from_pretrained`: weights as safetensors, config, tokenizer.

    With LoRA the adapters are merged into the base weights (W + scale·B·A) and PEFT names are
    mapped back to the base model's, so the checkpoint is a plain model.
    """
    from teacli.lora import merged_state_dict

    model = module.get_base_model() if lora else module
    if lora:
        state = merged_state_dict(module, state)
    model.save_pretrained(directory, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(directory)


def save_checkpoint(run: RunDir, engine, tokenizer, recipe, world, step: int, extra_state: dict[str, Any],
                    keep: Callable[[Path], None] | None = None) -> Path:
    """checkpoints/step_XXXXXX: the HF model, the trainer state (weights, optimizer, RNG, data position), the recipe;
    written into a temporary directory and renamed, so a failure (a full disk) leaves the last complete one.
    keep(directory): every rank's own files into it (a one-step-off-policy run's batch in flight), before the rest."""
    import torch

    from teacli.config import to_yaml
    from teacli.models import umask_modes
    from teacli.train import backend

    tmp = run.tmp_checkpoint(step)
    if world.is_main:
        with writing(tmp):
            tmp.mkdir(parents=True, exist_ok=True)
    backend.barrier()
    state = backend.full_state_dict(engine.module, recipe.backend.zero_stage, world.is_main)
    try:
        with writing(tmp):
            if keep is not None:
                keep(tmp)
                backend.barrier()  # every rank's files are in before the main rank commits
            backend.save_engine_state(engine, str(tmp / "trainer"), tag="state")
            if world.is_main:
                save_hf_model(engine.module, state, tokenizer, tmp, recipe.policy.lora.enabled)
                (tmp / "recipe.yaml").write_text(to_yaml(recipe))
                torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / "rng.pt")
                write_text_atomic(tmp / "trainer_state.json", json.dumps({"step": step, **extra_state}, indent=2))
                umask_modes(tmp)  # safetensors writes 0600 whatever the umask: the checkpoint reads like any file written
                run.commit_checkpoint(step)
    except Exception as exc:
        # A full disk fails torch.save and safetensors with their own errors (not OSError); either way the
        # half-written checkpoint goes now (it would hold the space), and the run keeps its last complete one.
        if world.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) or not _is_write_error(exc):
            raise
        free = shutil.disk_usage(run.path).free / 2**20
        raise TrainError(
            f"writing checkpoint {tmp.name.removeprefix('.tmp_')} into {run.checkpoints} failed ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); {free:,.0f} MiB free on that disk. The partial "
            f"checkpoint was removed: free space and run the same command to resume from the last complete checkpoint"
        ) from None
    backend.barrier()
    return run.checkpoints / step_dir_name(step)


def _is_write_error(exc: Exception) -> bool:
    """torch.save's and safetensors' failures to write a file (a full disk gives 'unexpected pos' or 'os error 28')."""
    return type(exc).__name__ == "SafetensorError" or isinstance(exc, RuntimeError) and any(
        s in str(exc) for s in ("PytorchStreamWriter", "inline_container", "unexpected pos", "file write failed")
    )
