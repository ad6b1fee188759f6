"""Copy what the GPU study's report and diagnostics read from run directories into results/gpu/runs/,
small enough to commit: recipe.yaml, data.json, metrics.jsonl, validation.jsonl, selected.json, and under
eval/ the .bon.json, .run.json and .prompts.jsonl files and the completion records without their text
(prompt_id, sample, reward, tokens: what `tea report` and `tea diagnose tail-fit` read), gzipped
(~0.5 MB for 144 prompts x 256 samples instead of 26 MB with the text), and beside them, per prompt,
the best sample's record with its text (`<split>-M<M>.best.json.gz`: what best-of-M deploys, to read).

    python results/gpu/collect.py SRC_RUNS_DIR RUN_NAME [RUN_NAME ...]   # runs -> results/gpu/runs/
    python results/gpu/collect.py --restore DEST_RUNS_DIR                # results/gpu/runs/ -> plain run dirs

`--restore` writes run directories that `tea report` and `tea diagnose tail-fit` read as they are; their
records' `response` is null (the texts were not kept, so `tea judge` cannot run on them). A last
`--records DIR` uses DIR instead of results/gpu/runs/ (the embedded study's are in results/runs/):

    python results/gpu/collect.py SRC_RUNS_DIR embedded_tea-s0 ... --records results/runs
    python results/gpu/collect.py --restore DEST_RUNS_DIR --records results/runs
"""

import gzip
import json
import shutil
import sys
from pathlib import Path

DEST = Path(__file__).resolve().parent / "runs"
TOP = ("recipe.yaml", "data.json", "metrics.jsonl", "validation.jsonl", "selected.json")
KEEP = ("prompt_id", "sample", "reward", "tokens")


def strip_records(src: Path, dst: Path) -> int:
    """The records without their text into dst (gzipped); beside it, `<name>.best.json.gz`: per prompt the
    record of its highest reward (the first such sample) with its text, what best-of-M would deploy."""
    n = 0
    best: dict[str, dict] = {}
    tmp = dst.with_name(dst.name + ".tmp")
    with src.open() as fin, tmp.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as fout:
        for line in fin:
            record = json.loads(line)
            fout.write((json.dumps({k: record[k] for k in KEEP if k in record}) + "\n").encode())
            n += 1
            held = best.get(record["prompt_id"])
            if record.get("response") is not None and (held is None or record["reward"] > held["reward"]):
                best[record["prompt_id"]] = {k: record[k] for k in (*KEEP, "response") if k in record}
    tmp.replace(dst)
    if best:
        best_path = dst.with_name(dst.name[: -len(".jsonl.gz")] + ".best.json.gz")
        tmp = best_path.with_name(best_path.name + ".tmp")
        with tmp.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as fout:
            fout.write(json.dumps([best[k] for k in sorted(best)], indent=0).encode())
        tmp.replace(best_path)
    return n


def restore(dest_runs: Path, records: Path | None = None) -> None:
    """The committed records under `records` (default results/gpu/runs/) as plain run directories in dest_runs."""
    records = records or DEST
    for f in sorted(records.rglob("*")):
        if not f.is_file():
            continue
        out = dest_runs / f.relative_to(records)
        out.parent.mkdir(parents=True, exist_ok=True)
        if f.name.endswith(".jsonl.gz"):  # the record format's text field comes back as null: the texts were not kept
            out = out.with_name(f.name[: -len(".gz")])
            with gzip.open(f, "rt") as fin, out.open("w") as fout:
                for line in fin:
                    fout.write(json.dumps({**json.loads(line), "response": None}) + "\n")
        else:
            shutil.copy2(f, out)
    print(f"restored {len(list(records.iterdir()))} run(s) into {dest_runs}")


def collect(src_runs: Path, name: str, records: Path | None = None) -> None:
    records = records or DEST
    src, dst = src_runs / name, records / name
    dst.mkdir(parents=True, exist_ok=True)
    for f in TOP:
        if (src / f).exists():
            shutil.copy2(src / f, dst / f)
    for f in sorted((src / "eval").rglob("*")) if (src / "eval").exists() else []:
        if not f.is_file():
            continue
        out = dst / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        if f.name.endswith((".bon.json", ".run.json", ".prompts.jsonl")):
            shutil.copy2(f, out)
        elif f.suffix == ".jsonl":
            out = out.with_name(out.name + ".gz")
            print(f"{out.relative_to(records)}: {strip_records(f, out)} records")


if __name__ == "__main__":
    args, records = sys.argv[1:], DEST
    if args[-2:-1] == ["--records"]:
        args, records = args[:-2], Path(args[-1]).resolve()
    if args[:1] == ["--restore"]:
        restore(Path(args[1]), records)
    else:
        for run in args[1:]:
            collect(Path(args[0]), run, records)
