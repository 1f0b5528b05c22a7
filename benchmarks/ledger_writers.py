"""Concurrent writers on one ledger: per-append latency, rows lost, the chain afterwards.

    .venv/bin/python benchmarks/ledger_writers.py --writers 8 --appends 1000

Each writer is its own process appending single rows with `Ledger.append` (take the writer lock,
connect, append, close: what separate runs of one host do). Prints p50/p99/max latency of an
append (target p99 < 1 s with 8 writers on two cores), appends/s in all, rows lost (target 0),
whether the chain verifies, and the peer: one process inserting the same rows into plain DuckDB.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

from ledger_append import plain  # the peer: the same plain-insert loop as the append benchmark
from tica.ledger import Ledger


def _row(writer: int, i: int) -> dict:
    return {"rerun_id": f"w{writer}-{i}", "original_kind": "verdict", "original_id": f"v{i}",
            "new_id": f"v{i + 1}", "reason": f"writer {writer} append {i}"}


def writer(path: str, w: int, n: int, out: str, start_at: float) -> None:
    ledger = Ledger(path, lock_timeout_s=60)
    while time.time() < start_at:  # every writer starts together
        time.sleep(0.001)
    latencies = []
    for i in range(n):
        t0 = time.perf_counter()
        ledger.append("reruns", _row(w, i))
        latencies.append(time.perf_counter() - t0)
    Path(out).write_text("\n".join(f"{x:.6f}" for x in latencies))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--appends", type=int, default=1000, help="appends per writer")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = str(root / "ledger.duckdb")
        Ledger(path).init()
        ctx = mp.get_context("spawn")
        start_at = time.time() + 3.0
        procs = [ctx.Process(target=writer, args=(path, w, args.appends, str(root / f"lat{w}"), start_at))
                 for w in range(args.writers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        wall = time.time() - start_at
        latencies = sorted(float(x) for w in range(args.writers)
                           if (root / f"lat{w}").exists() for x in (root / f"lat{w}").read_text().split())
        ledger = Ledger(path)
        rows = ledger.rows("SELECT count(*) AS n FROM reruns")[0]["n"]
        report = ledger.verify()
        peer = plain(root / "plain.duckdb", args.appends)
    want = args.writers * args.appends
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else float("nan")
    print(f"{args.writers} writers x {args.appends} appends: {rows}/{want} rows, lost {want - rows}, "
          f"failed writers {sum(p.exitcode != 0 for p in procs)}, chain {'verifies' if report.ok else 'BROKEN'}")
    if latencies:
        print(f"append latency  p50 {statistics.median(latencies) * 1e3:7.1f} ms   p99 {p99 * 1e3:7.1f} ms "
              f"(target < 1000 ms)   max {latencies[-1] * 1e3:7.1f} ms")
    print(f"appends/s in all  {rows / wall:8.1f}   plain DuckDB inserts, one process  {peer:8.0f}/s (peer)   "
          f"ratio {rows / wall / peer:.3f}")


if __name__ == "__main__":
    main()
