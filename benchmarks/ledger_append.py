"""Hash-chained ledger appends against plain inserts of the same rows, side by side.

    .venv/bin/python benchmarks/ledger_append.py --rows 2000
    .venv/bin/python benchmarks/ledger_append.py --parts batch --batch-rows 100000   # ~3 min, DuckDB's peer most of it

`session`: rows/s for plain DuckDB inserts on one connection (the peer), `Ledger.session()`
appends (one lock and connection for the burst, each append its own committed transaction,
chained), and single `Ledger.append` calls (lock, connect, append, close each time), with the ratios.

`batch` (issue 32: at least 0.8x the peer): one `append_many` of --batch-rows chain rows (the mix
`record_verdict` and `record_candidate` write, benchmarks/ledger_growth.py's workload: verdicts,
checks, reruns, candidates, components, invalidations) into an empty ledger, against the peer: the
same rows, their chain columns already computed, into tables of the same shape and primary key by a
plain `executemany` per table in one transaction. Ours includes what the peer is given: numbering,
timing and hashing every row. On DuckDB (a file) and on Postgres 15 (started by the script:
tests/postgres_server.py's fixture, fsync off, loopback); --stores picks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tica.ledger import CHAIN_COLUMNS, GENESIS, TABLES, Ledger, extend_chain  # noqa: E402


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


def batch_rows(n: int) -> list[tuple[str, dict]]:
    """n chain rows of the product's mix (benchmarks/ledger_growth.py's workload), as payloads."""
    from ledger_growth import Workload

    work, out, i = Workload(), [], 0
    while len(out) < n:
        out += work.prepared(i, i + 1000)
        i += 1000
    return out[:n]


def _plain_tables(kind: dict[str, str]) -> list[str]:
    out = []
    for table, columns in TABLES.items():
        cols = ", ".join(f"{n} {kind[t]}" for n, t in columns)
        out.append(f"CREATE TABLE {table} (seq BIGINT PRIMARY KEY, prev_hash {kind['VARCHAR']} NOT NULL, "
                   f"row_hash {kind['VARCHAR']} NOT NULL, recorded_at {kind['VARCHAR']} NOT NULL, {cols})")
    return out


def _by_table(rows: list[tuple[str, dict]]) -> dict[str, list[list]]:
    out: dict[str, list[list]] = {}
    for table, chain, payload in extend_chain((0, GENESIS), rows):
        out.setdefault(table, []).append([*(chain[c] for c in CHAIN_COLUMNS), *payload.values()])
    return out


def _insert(table: str, mark: str) -> str:
    names = [*CHAIN_COLUMNS, *(n for n, _ in TABLES[table])]
    return f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join([mark] * len(names))})"


def batch_duckdb(root: Path, rows: list[tuple[str, dict]], run: int) -> tuple[float, float]:
    """(peer seconds, ours seconds) on new DuckDB files."""
    con = duckdb.connect(str(root / f"plain-batch-{run}.duckdb"))
    for sql in _plain_tables({"VARCHAR": "VARCHAR", "BIGINT": "BIGINT"}):
        con.execute(sql)
    grouped = _by_table(rows)
    t0 = time.perf_counter()
    con.execute("BEGIN TRANSACTION")
    for table, values in grouped.items():
        con.executemany(_insert(table, "?"), values)
    con.execute("COMMIT")
    peer = time.perf_counter() - t0
    con.close()
    ledger = Ledger(root / f"batch-{run}.duckdb").init()
    t0 = time.perf_counter()
    ledger.append_many(rows)
    ours = time.perf_counter() - t0
    report = ledger.verify()
    assert report.ok and report.rows == len(rows), report.problems[:3]
    return peer, ours


def batch_postgres(new_database, rows: list[tuple[str, dict]]) -> tuple[float, float]:
    """(peer seconds, ours seconds) in two new databases on the server."""
    import psycopg

    from tica.ledger import PostgresLedger

    dsn_ledger, dsn_plain = new_database(), new_database()
    with psycopg.connect(dsn_plain) as con:
        for sql in _plain_tables({"VARCHAR": "TEXT", "BIGINT": "BIGINT"}):
            con.execute(sql)
        con.commit()
        grouped = _by_table(rows)
        t0 = time.perf_counter()
        cur = con.cursor()
        for table, values in grouped.items():
            cur.executemany(_insert(table, "%s"), values)
        con.commit()
        peer = time.perf_counter() - t0
    ledger = PostgresLedger(dsn_ledger).init()
    t0 = time.perf_counter()
    ledger.append_many(rows)
    ours = time.perf_counter() - t0
    report = ledger.verify()
    assert report.ok and report.rows == len(rows), report.problems[:3]
    return peer, ours


@contextmanager
def postgres_server():
    """A function making a new database on a fresh Postgres 15 server (tests/postgres_server.py's
    fixtures, driven by hand), stopped and removed at the end."""
    from tests.postgres_server import pg_dsn, postgres_server

    server = postgres_server.__wrapped__()
    address = next(server)
    try:
        yield lambda: pg_dsn.__wrapped__(address)
    finally:
        server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--single-rows", type=int, default=100, help="rows for the connect-per-append case")
    ap.add_argument("--parts", default="session,batch", help="session, batch or both")
    ap.add_argument("--batch-rows", type=int, default=100_000, help="chain rows in the one append_many")
    ap.add_argument("--stores", default="duckdb,postgres", help="for the batch part: duckdb, postgres or both")
    ap.add_argument("--repeats", type=int, default=3, help="batch runs per store, each into new tables (median)")
    args = ap.parse_args()
    parts, stores = args.parts.split(","), args.stores.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if "session" in parts:
            peer = plain(root / "plain.duckdb", args.rows)
            held = session(root / "session.duckdb", args.rows)
            each = single(root / "single.duckdb", args.single_rows)
            print(f"plain DuckDB inserts       {peer:10.0f} rows/s  (peer)")
            print(f"ledger session appends     {held:10.0f} rows/s  {held / peer:.2f}x the peer (target >= 0.5x)")
            print(f"ledger single appends      {each:10.1f} rows/s  {each / peer:.3f}x the peer (lock + connect each)")
        if "batch" in parts:
            rows = batch_rows(args.batch_rows)
            tables = sorted({t for t, _ in rows})
            print(f"\none append_many of {len(rows)} chain rows ({len(tables)} tables) vs a plain executemany per "
                  f"table of the same rows in one transaction, each into empty tables, median of {args.repeats} "
                  "(target >= 0.8x the peer's rate)")
            for store in stores:
                with (postgres_server() if store == "postgres" else nullcontext()) as new_database:
                    runs = [batch_duckdb(root, rows, k) if store == "duckdb" else batch_postgres(new_database, rows)
                            for k in range(args.repeats)]
                peer_s = statistics.median(p for p, _ in runs)
                ours_s = statistics.median(o for _, o in runs)
                n = len(rows)
                print(f"  {store:<9} plain executemany {n / peer_s:9.0f} rows/s ({peer_s:6.2f} s, peer)   "
                      f"append_many {n / ours_s:9.0f} rows/s ({ours_s:6.2f} s)   {peer_s / ours_s:.2f}x the peer "
                      f"{'PASS' if peer_s / ours_s >= 0.8 else 'MISS'}   (runs: "
                      f"{', '.join(f'{p / o:.2f}x' for p, o in runs)})")

if __name__ == "__main__":
    main()
