"""Time the training loop's tail check (`tail_check_stats`: the groups' upper-tail QQ R²) and print a table.

    python benchmarks/tail_check.py [--repeats 50]

Each row: the rewards of one step (P prompts x m rollouts, float32 tensor as the loop has them) →
tail_r2_median. Compare with a training step's seconds (metrics.jsonl time_step): the check is meant
to be a negligible share of it.
"""

from __future__ import annotations

import argparse
import statistics
import time

SIZES = ((4, 16), (8, 64), (64, 64), (256, 64), (1024, 128))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()

    import torch

    from teacli.advantages.tail import tail_check_stats

    print(f"threads={torch.get_num_threads()} repeats={args.repeats}")
    print(f"| {'P':>5} | {'m':>4} | {'median ms':>9} | {'min ms':>7} |")
    print(f"|{'-' * 7}|{'-' * 6}|{'-' * 11}|{'-' * 9}|")
    for P, m in SIZES:
        rewards = torch.randn(P, m, generator=torch.Generator().manual_seed(0))
        tail_check_stats(rewards)  # warm-up: the scipy import
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            tail_check_stats(rewards)
            times.append((time.perf_counter() - start) * 1e3)
        print(f"| {P:>5} | {m:>4} | {statistics.median(times):9.3f} | {min(times):7.3f} |")


if __name__ == "__main__":
    main()
