"""The metrics sink (rank 0), the experiment trackers of `logging.report_to`, and the progress bar.

Every step's record (averaged over ranks) is appended to `metrics.jsonl` and every validation
result to `validation.jsonl`, first and always; then the same numbers go to each tracker of
`logging.report_to` (transformers' `report_to` convention), from rank 0 only:

  tensorboard  torch's SummaryWriter in <run>/tensorboard/; scalars named as in metrics.jsonl,
               validation as validation/<field>; the resolved recipe and the run directory as text.
  wandb        wandb.init(project=logging.project, name=recipe name, dir=<run> or $WANDB_DIR,
               config=the resolved recipe + run_dir); wandb.log(record, step=step).
  mlflow       MlflowClient on $MLFLOW_TRACKING_URI, experiment logging.project: params = the
               flattened recipe (values cut to 500 characters; the whole recipe is the artifact
               recipe.yaml), tag tea.run_dir, metrics with their step.

`logging.report_to: null` (the default) means TensorBoard when it is installed, as before the
option existed; a tracker named explicitly must be installed (the error names the extra).

Resume. `trackers.json` in the run directory keeps W&B's and MLflow's run ids (and the tracking
URI) and, for every tracker, the last step it logged. A resumed run continues the same tracker
runs. W&B's and MLflow's histories cannot be rewound, so the steps between the checkpoint and the
interruption, which tea re-runs, are not logged to them a second time: tea's resume replays them
exactly, so the values already there equal the re-run's, timings (time_*, tokens_per_s) aside.
TensorBoard purges its events after the checkpoint (SummaryWriter's purge_step) and gets the
re-run steps afresh.

A tracker that raises while logging is reported once on stderr and dropped for the rest of the
run: metrics.jsonl is complete regardless, and a tracker outage does not stop a training run.

`logging.per_rank`: each step, every rank's own record (before averaging) with its rank and host
is gathered to rank 0 and appended to `ranks.jsonl` (one writer: no shared file system needed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import time
from typing import Any

from teacli.rundir import write_text_atomic

TRACKERS = ("tensorboard", "wandb", "mlflow")
_EXTRA_HINT = {
    "tensorboard": "pip install 'teacli[tensorboard]'",
    "wandb": "pip install 'teacli[wandb]'",
    "mlflow": "pip install 'teacli[mlflow]'",
}
MAX_PARAM_CHARS = 500  # MLflow params are for filtering runs; the whole recipe is the artifact recipe.yaml


class TrackerError(ValueError):
    """A tracker that cannot start (not installed, not logged in, another store): names it and what to do."""


def resolve_report_to(report_to: list[str] | None) -> list[str]:
    """The trackers a run logs to: `report_to`, each checked to be installed; None = tensorboard if installed."""
    if report_to is None:
        return ["tensorboard"] if importlib.util.find_spec("tensorboard") is not None else []
    for name in report_to:
        if importlib.util.find_spec(name) is None:
            raise TrackerError(f"logging.report_to: {name} is not installed; {_EXTRA_HINT[name]} (or remove it from the list)")
    return list(report_to)


def numeric(record: dict[str, Any]) -> dict[str, float]:
    """The fields of a metrics/validation record that a tracker can plot (all but step and strings; a flag as 0/1)."""
    return {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, (int, float))}


# ------------------------------------------------------------------------------------------------
# trackers.json


class _State:
    """trackers.json: {tracker: {run ids..., "metrics_step": s, "validation_step": s}}, rewritten atomically."""

    def __init__(self, path):
        self.path = path
        self.data: dict[str, dict[str, Any]] = {}
        if path.exists():
            try:
                self.data = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise TrackerError(f"{path}: not valid JSON ({exc}); delete it to start new tracker runs") from None

    def of(self, name: str) -> dict[str, Any]:
        return self.data.setdefault(name, {})

    def save(self) -> None:
        write_text_atomic(self.path, json.dumps(self.data, indent=2) + "\n")


# ------------------------------------------------------------------------------------------------
# The trackers: metrics(step, values), validation(step, values), close(status)


def recorded_tree(recipe) -> dict:
    """The recipe as recipe.yaml holds it (`tea_schema` first, teacli/config/schema.py): what the trackers record."""
    from teacli.config import SCHEMA_KEY, SCHEMA_VERSION

    return {SCHEMA_KEY: SCHEMA_VERSION, **recipe.to_dict()}


class _TensorBoard:
    name = "tensorboard"
    rewinds = True  # purge_step hides the events after the checkpoint; re-run steps are logged again

    def __init__(self, run, recipe, state: _State, start: int):
        from torch.utils.tensorboard import SummaryWriter

        from teacli.config import to_yaml

        self.writer = SummaryWriter(log_dir=str(run.path / "tensorboard"), purge_step=start + 1 if start else None)
        st = state.of(self.name)
        if not st.get("config_logged"):
            yaml_text = "\n".join("    " + line for line in to_yaml(recipe).splitlines())  # markdown code block
            self.writer.add_text("recipe", yaml_text, 0)
            self.writer.add_text("run_dir", str(run.path.resolve()), 0)
            st["config_logged"] = True

    def metrics(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def validation(self, step: int, values: dict[str, float]) -> None:
        self.metrics(step, {f"validation/{k}": v for k, v in values.items()})

    def close(self, status: str) -> None:
        self.writer.close()


class _Wandb:
    name = "wandb"
    rewinds = False

    def __init__(self, run, recipe, state: _State, start: int):
        import wandb

        st = state.of(self.name)
        project = recipe.logging.project or os.environ.get("WANDB_PROJECT") or "tea"
        try:  # first start: W&B picks the id; a resume passes the kept one
            self.run = wandb.init(
                project=project, name=recipe.name, id=st.get("id"), resume="allow" if st.get("id") else None,
                dir=os.environ.get("WANDB_DIR") or str(run.path),
                config={**recorded_tree(recipe), "run_dir": str(run.path.resolve())},
            )
        except Exception as exc:  # wandb raises its own errors (UsageError, CommError, ...) for login and network problems
            raise TrackerError(
                f"logging.report_to: wandb could not start a run ({type(exc).__name__}: {exc}); run `wandb login`, "
                f"set WANDB_API_KEY, or log offline with WANDB_MODE=offline"
            ) from None
        st.update(id=self.run.id, project=self.run.project, entity=getattr(self.run, "entity", None) or None)
        state.save()

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def validation(self, step: int, values: dict[str, float]) -> None:
        self.run.log({f"validation/{k}": v for k, v in values.items()}, step=step)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


class _Mlflow:
    name = "mlflow"
    rewinds = False

    def __init__(self, run, recipe, state: _State, start: int):
        import mlflow
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        from teacli.config import flatten, to_yaml

        st = state.of(self.name)
        uri = mlflow.get_tracking_uri()
        try:
            self.client = MlflowClient(uri)
            if st.get("run_id"):
                if st.get("tracking_uri") != uri:
                    raise TrackerError(
                        f"{state.path}: MLflow run {st['run_id']} is in {st.get('tracking_uri')}, but the tracking URI is now "
                        f"{uri}; set MLFLOW_TRACKING_URI back, or delete the mlflow entry of {state.path.name} to start a new MLflow run"
                    )
                self.client.get_run(st["run_id"])
                self.client.update_run(st["run_id"], status="RUNNING")
                self.run_id = st["run_id"]
                return
            name = recipe.logging.project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "tea"
            experiment = self.client.get_experiment_by_name(name)
            if experiment is None:
                try:
                    experiment_id = self.client.create_experiment(name)
                except MlflowException:  # another run created it meanwhile
                    experiment_id = self.client.get_experiment_by_name(name).experiment_id
            else:
                experiment_id = experiment.experiment_id
            created = self.client.create_run(experiment_id, run_name=recipe.name, tags={"tea.run_dir": str(run.path.resolve())})
            self.run_id = created.info.run_id
            st.update(run_id=self.run_id, experiment_id=experiment_id, tracking_uri=uri)
            state.save()
            params = [Param(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in flatten(recorded_tree(recipe)).items()]
            params = [Param(p.key, p.value[:MAX_PARAM_CHARS]) for p in params]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(self.run_id, params=params[i : i + 100])
            self.client.log_text(self.run_id, to_yaml(recipe), "recipe.yaml")
        except TrackerError:
            raise
        except Exception as exc:  # MlflowException for a store it cannot reach or open; ImportError for a missing backend
            first = (exc.message if isinstance(exc, MlflowException) else str(exc)).strip().splitlines()
            raise TrackerError(
                f"logging.report_to: mlflow could not start a run at {uri} ({type(exc).__name__}: {first[0] if first else ''}); "
                f"set MLFLOW_TRACKING_URI to a tracking server or store (docs/training.md)"
            ) from None

    def metrics(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def validation(self, step: int, values: dict[str, float]) -> None:
        self.metrics(step, {f"validation/{k}": v for k, v in values.items()})

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)


_OPEN = {"tensorboard": _TensorBoard, "wandb": _Wandb, "mlflow": _Mlflow}


# ------------------------------------------------------------------------------------------------
# The sink


class MetricsSink:
    """metrics.jsonl, validation.jsonl, ranks.jsonl and the trackers. Every rank calls `write` (the
    per-rank gather is collective); files and trackers are written by rank 0 only."""

    def __init__(self, run, recipe, world, start: int = 0):
        self.run, self.recipe = run, recipe
        self.is_main, self.rank = world.is_main, world.rank
        self.per_rank = recipe.logging.per_rank
        self.trackers: list[Any] = []
        self.state: _State | None = None
        if not self.is_main:
            return
        if self.per_rank:
            run.truncate_after(run.ranks, start, self.note)
        names = resolve_report_to(recipe.logging.report_to)
        if names:
            self.state = _State(run.trackers)
        try:
            for name in names:
                tracker = _OPEN[name](run, recipe, self.state, start)
                if tracker.rewinds:  # steps after the checkpoint are logged again
                    st, floor = self.state.of(name), start if start else -1
                    for kind in ("metrics", "validation"):
                        st[f"{kind}_step"] = min(st.get(f"{kind}_step", floor), floor)
                self.trackers.append(tracker)
        except BaseException:
            self.close()
            raise
        if self.state is not None:
            self.state.save()

    def write(self, record: dict[str, Any], local: dict[str, Any] | None = None) -> None:
        """One step: `record` averaged over ranks (metrics.jsonl, trackers); `local` this rank's own values."""
        rows = _gather({"step": record["step"], "rank": self.rank, "host": socket.gethostname(),
                        **{k: v for k, v in (local or record).items() if k != "step"}}) if self.per_rank else []
        if not self.is_main:
            return
        self.run.append(self.run.metrics, record)
        if rows:
            with open(self.run.ranks, "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
                f.flush()
                os.fsync(f.fileno())
        self._log("metrics", record)

    def validation(self, record: dict[str, Any]) -> None:
        """One validation result (rank 0): validation.jsonl, then the trackers as validation/<field>."""
        if not self.is_main:
            return
        self.run.append(self.run.validation, record)
        self._log("validation", record)

    def note(self, text: str) -> None:
        if self.is_main:
            from rich.console import Console

            Console(stderr=True).print(f"[dim]{text}[/dim]")

    def close(self) -> None:
        # Called from train()'s `finally`: an exception on its way out means the run failed.
        exc = sys.exc_info()[0]
        status = "FINISHED" if exc is None else ("KILLED" if issubclass(exc, KeyboardInterrupt) else "FAILED")
        for tracker in self.trackers:
            try:
                tracker.close(status)
            except Exception as err:  # closing must not hide the run's own error
                self.note(f"warning: closing the {tracker.name} tracker failed: {type(err).__name__}: {err}")
        self.trackers = []
        if self.state is not None:
            self.state.save()

    def _log(self, kind: str, record: dict[str, Any]) -> None:
        if not self.trackers:
            return
        step, values = int(record["step"]), numeric(record)
        for tracker in list(self.trackers):
            st = self.state.of(tracker.name)
            if step <= st.get(f"{kind}_step", -1):
                continue  # logged before an interruption; see the module docstring
            try:
                getattr(tracker, kind)(step, values)
            except Exception as exc:
                self.trackers.remove(tracker)
                self.note(f"warning: the {tracker.name} tracker failed at step {step} ({type(exc).__name__}: {exc}); "
                          f"it gets nothing more in this run, metrics.jsonl stays complete")
                continue
            st[f"{kind}_step"] = step
        self.state.save()


def _gather(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's `row`, in rank order, on every rank (collective)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [row]
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    return rows


def check_trackers(recipe) -> None:
    """Fail before any model is loaded when a tracker of logging.report_to is not installed."""
    resolve_report_to(recipe.logging.report_to)


def metrics_sink(run, recipe, world, start: int = 0) -> MetricsSink:
    return MetricsSink(run, recipe, world, start)


class Progress:
    """Training progress on stderr (rank 0 only): step, reward, KL, seconds per step and ETA.

    On a terminal, a rich bar, with a second bar for a validation while it runs. Elsewhere (a log file, CI, a
    cluster job's output) rich would draw its bar once, at the end, cut to 80 columns, so plain lines instead:
    one per step, and for a validation one when it starts, at its first progress, every TEA_PROGRESS_EVERY
    seconds (default 30; 0 = at every report) and when it completes."""

    def __init__(self, total: int, start: int, enabled: bool, name: str):
        self.enabled = enabled
        if not enabled:
            return
        from rich.console import Console

        self.console = Console(stderr=True)  # progress on stderr; stdout carries results only
        self.stages: dict[str, dict[str, Any]] = {}
        try:
            self.every = max(0.0, float(os.environ.get("TEA_PROGRESS_EVERY", "30")))
        except ValueError:
            self.every = 30.0
        self.bar: Any = None
        if not self.console.is_terminal:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.bar = RichProgress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), transient=False, console=self.console,
        )
        self.bar.start()
        self.task = self.bar.add_task(name, total=total, completed=start, info="")

    def update(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        info = f"reward {record['reward_mean']:.4f} (max {record['reward_max']:.4f})  kl {record.get('kl', 0.0):.4f}  {record['time_step']:.1f}s/step"
        if self.bar is not None:
            self.bar.update(self.task, completed=record["step"], info=info)
        else:  # logs and CI: one line per step
            self._line(f"step {record['step']}: {info}")

    def stage(self, name: str, done: int, total: int, what: str = "") -> None:
        """Progress of a phase inside training (a validation): `done` of `total` sequences generated."""
        if not self.enabled:
            return
        now = time.monotonic()
        st = self.stages.get(name)
        if st is None or done < st["done"]:  # a new run of this stage
            st = self.stages[name] = {"t0": now, "last": now, "done": done, "printed_progress": False, "task": None}
            if self.bar is not None:
                st["task"] = self.bar.add_task(name, total=total, completed=done, info=what)
            else:
                self._line(f"{name}: {what}, {total:,} sequences" if what else f"{name}: {total:,} sequences")
            return
        st["done"] = done
        if self.bar is not None:
            self.bar.update(st["task"], completed=done)
            if done >= total:
                self.bar.remove_task(st["task"])
                del self.stages[name]
            return
        finished = done >= total
        if finished or not st["printed_progress"] or now - st["last"] >= self.every:
            st.update(last=now, printed_progress=True)
            elapsed = now - st["t0"]
            self._line(f"{name}: {done:,}/{total:,} sequences ({100 * done / max(total, 1):.0f}%), {elapsed:.0f}s elapsed")
        if finished:
            del self.stages[name]

    def _line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self.enabled and self.bar is not None:
            self.bar.stop()
