"""Which gradient checkpointing is fastest where it fits (issue 21): benchmarks/train_step.py once per setting.

    # the issue-21 workload on one GPU: layers checkpointed 0, 2, 4, 6 and the rule's own choice, at two micro-batches
    python benchmarks/grad_ckpt.py --settings 0,2,4,6,auto --micro-batches 64,32 --json grad_ckpt.json -- --attn sdpa --kernels liger
    # CPU smoke run: the tiny model
    python benchmarks/grad_ckpt.py --small --settings 0,1,auto --micro-batches 8

For each micro-batch and each `--settings` value (`policy.gradient_checkpointing`: a number of layers k,
checkpointing the first k, `true`, `false` or `auto`), one process of train_step.py with `--micro-batch`,
`--grad-ckpt` and `--json` set here and whatever follows `--`, one after the other on the same device, so
the rows are comparable. A setting that runs out of memory is a row saying so (the issue's question is the
fastest configuration *that fits*); any other failure is a row with the first exception of its log, which
is kept, and the exit status is 1. Progress goes to stderr, the table to stdout, every setting's train_step
JSON to --json, rewritten after every setting: stopped part-way (Ctrl-C, or SIGTERM from `timeout` or a
scheduler), the script ends the setting it is waiting for and --json keeps the ones that finished. A
setting that ran leaves nothing in --logs when --json is given, its train_step JSON otherwise.

Columns (medians over the measured steps, after train_step's warm-up step):

  layers            the decoder layers checkpointed (what `auto` resolved to, for `auto`)
  step s, generate s, ref log-probs s, backward+step s, MFU
                    train_step's phases; MFU over backward + step
  estimate GiB      the `auto` rule's estimated training peak for this micro-batch and these layers
  peak train GiB    torch.cuda.max_memory_allocated of the training phase (reference, backward, step)
  peak step GiB     the same over the whole step, generation included

The last line names the fastest setting that fitted and what `auto` chose, for each micro-batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_engines import prompt_counts  # noqa: E402  (a comma list of positive counts)
from scaling import SMALL_ARGS, add_run_options, first_error_line, passthrough_clash, run_one, split_passthrough  # noqa: E402  (the same launch and failure handling)

from teacli.rundir import write_text_atomic  # noqa: E402

TRAIN_STEP = Path(__file__).resolve().parent / "train_step.py"
SET_HERE = ("--micro-batch", "--grad-ckpt", "--json")


def settings_arg(text: str) -> list[str]:
    """--settings: a comma list of layer counts (0, 1, ...), true, false or auto."""
    values = [v.strip() for v in text.split(",")]
    bad = [v for v in values if not (v.isdigit() or v in ("true", "false", "auto"))]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: each setting is a number of layers, true, false or auto (bad: {', '.join(bad) or 'none given'})")
    return values


def summarise(result: dict) -> dict:
    """One row's values from train_step.py's JSON."""
    measured = result["rows"][1:] or result["rows"]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in measured)

    return {"layers": result["grad_ckpt_layers"], "step_s": med("step_s"), "generate_s": med("generate_s"),
            "ref_logprobs_s": med("ref_logprobs_s"), "backward_step_s": med("backward_step_s"),
            "mfu_pct": 100 * med("mfu_backward_step"), "estimate_gib": result.get("mem_estimate_gib"),
            "peak_train_gib": med("peak_train_gib"), "peak_gib": med("peak_mem_gib")}


COLUMNS = [("micro-batch", "micro_batch", "{}"), ("--grad-ckpt", "setting", "{}"), ("layers", "layers", "{}"),
           ("step s", "step_s", "{:.3f}"), ("generate s", "generate_s", "{:.3f}"), ("ref log-probs s", "ref_logprobs_s", "{:.3f}"),
           ("backward+step s", "backward_step_s", "{:.3f}"), ("MFU", "mfu_pct", "{:.1f}%"), ("estimate GiB", "estimate_gib", "{:.1f}"),
           ("peak train GiB", "peak_train_gib", "{:.1f}"), ("peak step GiB", "peak_gib", "{:.1f}"), ("result", "result", "{}")]


def cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and value != value):  # not applicable, or NaN (no CUDA)
        return ""
    return fmt.format(value)


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(title for title, _, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(key), fmt) for _, key, fmt in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def verdicts(rows: list[dict]) -> list[str]:
    """Per micro-batch: the fastest setting that ran, and what `auto` chose."""
    out = []
    for mb in dict.fromkeys(r["micro_batch"] for r in rows):
        ran = [r for r in rows if r["micro_batch"] == mb and r["result"] == "ok"]
        if not ran:
            out.append(f"micro-batch {mb}: no setting ran")
            continue
        best = min(ran, key=lambda r: r["step_s"])
        auto = next((r for r in ran if r["setting"] == "auto"), None)
        said = f"micro-batch {mb}: fastest {best['layers']} layers checkpointed ({best['step_s']:.3f} s a step)"
        if auto is not None:
            said += f"; auto chose {auto['layers']} ({auto['step_s']:.3f} s)"
        out.append(said)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    argv, extra = split_passthrough(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", type=settings_arg, default=settings_arg("0,2,4,6,auto"),
                   help="policy.gradient_checkpointing values, comma-separated (default 0,2,4,6,auto)")
    p.add_argument("--micro-batches", type=prompt_counts, default=[64], help="comma-separated (default 64)")
    p.add_argument("--small", action="store_true", help="train_step.py's tiny model and workload (CPU smoke run)")
    add_run_options(p, "setting", "settings", "every setting's train_step JSON")
    args = p.parse_args(argv)
    if clash := passthrough_clash(extra, SET_HERE, f"grad_ckpt.py sets {', '.join(SET_HERE)} itself"):
        print(clash, file=sys.stderr)
        return 2
    small = list(SMALL_ARGS) if args.small else []
    if "--micro-batch" in small:  # set here, per row
        i = small.index("--micro-batch")
        del small[i : i + 2]
    fixed = small + extra
    logs = Path(args.logs or tempfile.mkdtemp(prefix="tea-grad-ckpt-"))
    logs.mkdir(parents=True, exist_ok=True)
    rows, results, status = [], [], 0

    def save() -> None:
        if args.json:
            write_text_atomic(Path(args.json), json.dumps({"train_step_args": fixed, "rows": rows, "results": results}, indent=2))

    for mb in args.micro_batches:
        for setting in args.settings:
            name = f"mb{mb}_ckpt_{setting}"
            out, log = logs / f"{name}.json", logs / f"{name}.log"
            cmd = [sys.executable, str(TRAIN_STEP), "--micro-batch", str(mb), "--grad-ckpt", setting, "--json", str(out)] + fixed
            print(f"[grad_ckpt] micro-batch {mb}, --grad-ckpt {setting}: {' '.join(cmd)}", file=sys.stderr, flush=True)
            rc, seconds = run_one(cmd, log, args.timeout)
            row = {"micro_batch": mb, "setting": setting}
            if rc == 0 and out.exists():
                result = json.loads(out.read_text())
                results.append({"micro_batch": mb, "setting": setting, "train_step": result})
                rows.append(row | summarise(result) | {"result": "ok"})
                save()
                log.unlink()
                if args.json:  # kept there
                    out.unlink()
            else:
                line = first_error_line(log) if rc is not None else f"ran past --timeout {args.timeout:g} s"
                fits = "OutOfMemoryError" not in line and "out of memory" not in line
                rows.append(row | {"result": f"failed: {line} (log: {log})" if fits else "out of memory"})
                status = status or (1 if fits else 0)
                save()
            print(f"[grad_ckpt] micro-batch {mb}, --grad-ckpt {setting}: {rows[-1]['result']} in {seconds:.0f} s", file=sys.stderr, flush=True)
    print(table(rows))
    for line in verdicts(rows):
        print(line)
    return status


if __name__ == "__main__":
    sys.exit(main())
