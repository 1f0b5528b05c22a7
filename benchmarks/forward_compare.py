"""TICA's forward compare against `np.array_equal` over the same float32 logprob arrays, side by side.

    .venv/bin/python benchmarks/forward_compare.py --n 100000000 --repeats 5

Builds n trainer/rollout logprob pairs twice over: bit-identical (a BI=1 step) and every value
nudged (a BI=0 step). For each, times `np.array_equal` (the peer), `n_bitwise_diff` and the full
`forward_metrics` (best of the repeats, interleaved), prints their speed relative to the peer, and the peak
extra memory each allocates (tracemalloc sees numpy's allocations; the inputs are made before).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from tica.metrics import CHUNK, forward_metrics, n_bitwise_diff

TARGETS = {"n_bitwise_diff": "  (target >= 0.8x)"}


def best_seconds(cases: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best of `repeats` per case, the cases interleaved so that a busy neighbour slows them alike."""
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def peak_bytes(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def pair(n: int, identical: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = -rng.exponential(2.0, n).astype(np.float32)  # logprobs: <= 0, mostly near 0
    if identical:
        return a, a.copy()
    return a, (a * np.float32(1 + 1e-4)).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000_000, help="logprob pairs (two float32 arrays of n)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"n = {args.n:,} float32 pairs ({2 * 4 * args.n / 2**20:.0f} MiB of input), chunk = {CHUNK:,}, "
          f"best of {args.repeats}")
    for label, identical in (("bit-identical (BI=1)", True), ("all differ (BI=0)", False)):
        a, b = pair(args.n, identical)
        cases: dict[str, Callable[[], object]] = {
            "np.array_equal": lambda: np.array_equal(a, b),
            "n_bitwise_diff": lambda: n_bitwise_diff(a, b),
            "forward_metrics": lambda: forward_metrics(a, b),
        }
        seconds = best_seconds(cases, args.repeats)
        peer = seconds["np.array_equal"]
        print(f"\n{label}: {n_bitwise_diff(a, b):,} bitwise diffs")
        for name, fn in cases.items():
            dt, peak = seconds[name], peak_bytes(fn)
            print(f"  {name:16s} {dt * 1e3:9.1f} ms  {args.n / dt / 1e6:8.0f} M/s  {peer / dt:6.3f}x the peer  "
                  f"peak extra {peak / 2**20:8.1f} MiB{TARGETS.get(name, '')}")
        del a, b


if __name__ == "__main__":
    main()
