"""Writes results/seed_spread.md from the study's report/summary.json (run from the repo root:
`python results/seed_spread.py`): TEA − GRPO seed by seed at every N (each seed's run against
GRPO's run of the same seed; one run each, so the interval is the paired prompt bootstrap the report
wrote for it), so docs/results.md quotes the seeds' agreement from a file rather than typed numbers.
`table(SUMMARY_JSON)` reads any report's summary.json (a recomputed one, in tests/test_results_doc.py)."""

import json
from pathlib import Path

HERE = Path(__file__).parent


def cell(d: list[float]) -> str:
    return f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"


def table(summary_path: Path) -> str:
    summary = json.loads(summary_path.read_text())
    seeds = summary["runs"]["embedded_tea"]["seeds"]
    lines = ["| N | " + " | ".join(f"TEA − GRPO, seed {s['seed']} [95% CI]" for s in seeds)
             + " | seeds below 0 | seeds whose CI is below 0 |", "| --- |" + " ---: |" * (len(seeds) + 2)]
    for j, n in enumerate(summary["N"]):
        deltas = [s["delta"][j] for s in seeds]
        lines.append(f"| {n} | " + " | ".join(cell(d) for d in deltas)
                     + f" | {sum(d[0] < 0 for d in deltas)} of {len(deltas)} | {sum(d[2] < 0 for d in deltas)} of {len(deltas)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    text = table(HERE / "report" / "summary.json")
    (HERE / "seed_spread.md").write_text(text)
    print(text, end="")
