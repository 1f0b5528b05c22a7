"""Hash-chained ledger appends against plain DuckDB inserts of the same rows, side by side.

    .venv/bin/python benchmarks/ledger_append.py --rows 2000

Prints rows/s for: plain inserts on one connection (the peer), `Ledger.session()` appends (one
lock and connection for the burst, each append its own committed transaction, chained), and
single `Ledger.append` calls (lock, connect, append, close each time), with the ratios.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import duckdb

from tica.ledger import TABLES, Ledger


def _row(i: int) -> dict:
    return {"rerun_id": f"r{i}", "original_kind": "verdict", "original_id": f"v{i}", "new_id": f"v{i + 1}",
            "reason": "benchmark row"}


def plain(path: Path, n: int) -> float:
    con = duckdb.connect(str(path))
    cols = ", ".join(f"{c} {t}" for c, t in TABLES["reruns"])
    con.execute(f"CREATE TABLE reruns (seq BIGINT PRIMARY KEY, prev_hash VARCHAR, row_hash VARCHAR, "
                f"recorded_at VARCHAR, {cols})")
    t0 = time.perf_counter()
    for i in range(n):
        r = _row(i)
        con.execute("INSERT INTO reruns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [i + 1, "p", "h", "t", *r.values()])
    dt = time.perf_counter() - t0
    con.close()
    return n / dt


def session(path: Path, n: int) -> float:
    ledger = Ledger(path).init()
    t0 = time.perf_counter()
    with ledger.session():
        for i in range(n):
            ledger.append("reruns", _row(i))
    dt = time.perf_counter() - t0
    assert ledger.verify().ok
    return n / dt


def single(path: Path, n: int) -> float:
    ledger = Ledger(path).init()
    t0 = time.perf_counter()
    for i in range(n):
        ledger.append("reruns", _row(i))
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--single-rows", type=int, default=100, help="rows for the connect-per-append case")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        peer = plain(root / "plain.duckdb", args.rows)
        held = session(root / "session.duckdb", args.rows)
        each = single(root / "single.duckdb", args.single_rows)
    print(f"plain DuckDB inserts       {peer:10.0f} rows/s  (peer)")
    print(f"ledger session appends     {held:10.0f} rows/s  {held / peer:.2f}x the peer (target >= 0.5x)")
    print(f"ledger single appends      {each:10.1f} rows/s  {each / peer:.3f}x the peer (lock + connect each)")


if __name__ == "__main__":
    main()
