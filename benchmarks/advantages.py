"""Time every advantage rule on P prompts x m rollouts and print a table.

    python benchmarks/advantages.py [--P 1024] [--m 64] [--repeats 20] [--dtype float32]

Target on a 2-core CPU: < 20 ms per rule at P = 1024, m = 64 (see docs/advantages.md).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--P", type=int, default=1024)
    parser.add_argument("--m", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = parser.parse_args()

    import torch

    from teacli.advantages import ADVANTAGE_RULES, compute_advantages

    rewards = torch.randn(args.P, args.m, dtype=getattr(torch, args.dtype), generator=torch.Generator().manual_seed(0))
    print(f"P={args.P} m={args.m} dtype={args.dtype} threads={torch.get_num_threads()} repeats={args.repeats}")
    print(f"| {'rule':<15} | {'median ms':>9} | {'min ms':>7} | {'< 20 ms':>7} |")
    print(f"|{'-' * 17}|{'-' * 11}|{'-' * 9}|{'-' * 9}|")
    for name in ADVANTAGE_RULES:
        compute_advantages(name, rewards)  # warm-up: constants, caches
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            compute_advantages(name, rewards)
            times.append((time.perf_counter() - start) * 1e3)
        med = statistics.median(times)
        print(f"| {name:<15} | {med:9.2f} | {min(times):7.2f} | {'yes' if med < 20 else 'NO':>7} |")


if __name__ == "__main__":
    main()
