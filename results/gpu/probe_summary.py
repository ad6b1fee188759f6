"""The GPU study's probe as a table (results/gpu/probe.md), from the probe's committed files:
per run, the median of steps 2-6 (step 1 includes warm-up) of each phase of `tea train`'s metrics.jsonl,
and from events.txt the wall time of each process and the evaluation rate.

    python results/gpu/probe_summary.py > results/gpu/probe.md
"""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent / "probe"
PHASES = ("time_step", "time_generate", "time_reward", "time_ref_logprobs", "time_train")


def events() -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = {}
    for line in (HERE / "events.txt").read_text().splitlines():
        t, gpu, name, *rest = line.split()
        out.setdefault(name, []).append((int(t), " ".join(rest)))
    return out


def main() -> None:
    ev = events()

    def wall(key: str) -> int:  # seconds from a process's first event to its last
        return ev[key][-1][0] - ev[key][0][0]

    print("| run | GPU shared with | steps | step (s) | generate | reward | reference | update | grad norm (max) | wall, start to exit (s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    shared = {"probe1": "probe2, probe3", "probe2": "probe1, probe3", "probe3": "probe1, probe2",
              "probe_judge": "the rule alignment diagnostic"}
    for run in ("probe1", "probe2", "probe3", "probe_judge"):
        rows = [json.loads(x) for x in (HERE / run / "metrics.jsonl").read_text().splitlines()]
        steady = [r for r in rows if r["step"] >= 2]
        med = [statistics.median(r[k] for r in steady) for k in PHASES]
        print(f"| {run} | {shared[run]} | {len(rows)} | " + " | ".join(f"{m:.1f}" for m in med)
              + f" | {max(r['grad_norm'] for r in rows):.0f} | {wall('judge' if run == 'probe_judge' else run)} |")
    recs = [int(ev[f"eval{i}"][-1][1].split()[-1]) for i in (1, 2, 3)]
    secs = [wall(f"eval{i}") for i in (1, 2, 3)]
    print()
    print(f"Evaluation (`tea eval-bon --n 256 --split heldout_ext`, three processes on one GPU, stopped by a "
          f"{secs[0]} s timeout): {', '.join(map(str, recs))} completions each, "
          f"{sum(recs) / secs[0]:.0f} completions/s for the GPU ({recs[0] / secs[0]:.0f} per process), start-up included.")
    for arm, key in (("rule", "base_rule"), ("judge", "base_judge")):
        print(f"Base arm, {arm} reward: 36,864 completions in {wall(key)} s ({36864 / wall(key):.0f}/s; the two base arms shared one GPU).")


if __name__ == "__main__":
    main()
