"""The run directory: resolved recipe, metrics, checkpoints, validation, selection, resume.

Layout (the contract in DESIGN.md):
    runs/<name>/recipe.yaml  metrics.jsonl  validation.jsonl  selected.json
    runs/<name>/checkpoints/step_000025/   HF model + tokenizer + recipe.yaml + trainer/ (resume state)

A checkpoint is written into `checkpoints/.tmp_step_XXXXXX/` and renamed into place once
complete, so a directory named `step_*` is always whole. On resume, metrics and validation lines
past the checkpoint's step are dropped, so a run killed mid-step never duplicates a line.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

CKPT_PREFIX = "step_"


def step_dir_name(step: int) -> str:
    return f"{CKPT_PREFIX}{step:06d}"


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.metrics = self.path / "metrics.jsonl"
        self.validation = self.path / "validation.jsonl"
        self.selected = self.path / "selected.json"
        self.recipe = self.path / "recipe.yaml"

    # -- checkpoints ------------------------------------------------------------------------
    def complete_checkpoints(self) -> list[tuple[int, Path]]:
        if not self.checkpoints.is_dir():
            return []
        found = []
        for d in self.checkpoints.iterdir():
            if d.is_dir() and d.name.startswith(CKPT_PREFIX) and (d / "trainer_state.json").exists():
                found.append((int(d.name[len(CKPT_PREFIX):]), d))
        return sorted(found)

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        found = self.complete_checkpoints()
        return found[-1] if found else None

    def tmp_checkpoint(self, step: int) -> Path:
        tmp = self.checkpoints / f".tmp_{step_dir_name(step)}"
        return tmp

    def commit_checkpoint(self, step: int) -> Path:
        tmp, final = self.tmp_checkpoint(step), self.checkpoints / step_dir_name(step)
        if final.exists():  # a re-run of the same step after resume: replace it whole
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final

    def clean_partial(self) -> None:
        if self.checkpoints.is_dir():
            for d in self.checkpoints.glob(".tmp_*"):
                shutil.rmtree(d, ignore_errors=True)

    def prune(self, keep_last: int | None) -> None:
        if keep_last is None:
            return
        keep_step = self.read_selected().get("step") if self.selected.exists() else None
        found = self.complete_checkpoints()
        for step, path in found[:-keep_last]:
            if step != keep_step:
                shutil.rmtree(path, ignore_errors=True)

    # -- jsonl logs -------------------------------------------------------------------------
    def append(self, path: Path, record: dict[str, Any]) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(record, sort_keys=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def truncate_after(self, path: Path, step: int) -> int:
        """Drop lines whose step is > `step` (and any torn last line); returns lines kept."""
        if not path.exists():
            return 0
        kept = []
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a kill
            if int(rec.get("step", 0)) <= step:
                kept.append(line)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(k + "\n" for k in kept))
        os.replace(tmp, path)
        return len(kept)

    def read_jsonl(self, path: Path) -> list[dict[str, Any]]:
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    # -- selection --------------------------------------------------------------------------
    def read_selected(self) -> dict[str, Any]:
        return json.loads(self.selected.read_text()) if self.selected.exists() else {}

    def update_selection(self) -> dict[str, Any] | None:
        """selected.json ← the validated checkpoint with the highest score (earliest on ties)."""
        rows = [r for r in self.read_jsonl(self.validation) if (self.checkpoints / step_dir_name(r["step"])).exists()]
        if not rows:
            return None
        best = max(rows, key=lambda r: (r["score"], -r["step"]))
        sel = {
            "step": best["step"],
            "path": f"checkpoints/{step_dir_name(best['step'])}",
            "score": best["score"],
            "rule": best.get("rule", ""),
        }
        tmp = self.selected.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(sel, indent=2) + "\n")
        os.replace(tmp, self.selected)
        return sel


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_hf_model(module, state: dict[str, Any], tokenizer, directory: Path, lora: bool) -> None:
    """An HF-format checkpoint loadable by `from_pretrained`: weights as safetensors, config, tokenizer.

    With LoRA the adapters are merged into the base weights (W + scale·B·A) and PEFT names are
    mapped back to the base model's, so the checkpoint is a plain model.
    """
    from teacli.train.lora import merged_state_dict

    model = module.get_base_model() if lora else module
    if lora:
        state = merged_state_dict(module, state)
    model.save_pretrained(directory, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(directory)
