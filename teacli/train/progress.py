"""One rank-0 metrics sink (metrics.jsonl always, TensorBoard when installed) and the progress bar."""

from __future__ import annotations

from typing import Any


class _Sink:
    def __init__(self, run, recipe, enabled: bool):
        self.run, self.enabled, self.tb = run, enabled, None
        if enabled and recipe.logging.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(log_dir=str(run.path / "tensorboard"))
            except Exception:  # tensorboard not installed: JSONL only
                self.tb = None

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.run.append(self.run.metrics, record)
        if self.tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, record["step"])

    def note(self, text: str) -> None:
        if self.enabled:
            from rich.console import Console

            Console(stderr=True).print(f"[dim]{text}[/dim]")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def metrics_sink(run, recipe, enabled: bool) -> _Sink:
    return _Sink(run, recipe, enabled)


class Progress:
    """A rich progress bar: step, reward, KL, seconds per step and ETA (rank 0 only)."""

    def __init__(self, total: int, start: int, enabled: bool, name: str):
        self.enabled = enabled
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.bar = RichProgress(
            TextColumn(f"[bold]{name}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), transient=False,
        )
        self.bar.start()
        self.task = self.bar.add_task("train", total=total, completed=start, info="")

    def update(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        info = f"reward {record['reward_mean']:.4f} (max {record['reward_max']:.4f})  kl {record.get('kl', 0.0):.4f}  {record['time_step']:.1f}s/step"
        self.bar.update(self.task, completed=record["step"], info=info)
        if not self.bar.console.is_terminal:  # logs and CI: one line per step
            self.bar.console.print(f"step {record['step']}: {info}")

    def close(self) -> None:
        if self.enabled:
            self.bar.stop()
