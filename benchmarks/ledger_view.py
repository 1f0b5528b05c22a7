"""The `track_verdicts` view a person queries (issue 32: 2.1 s on Postgres at 100,000 verdicts, 192 ms on
DuckDB; target < 300 ms on Postgres), on a ledger grown as benchmarks/ledger_growth.py grows it,
beside its peers, side by side.

    .venv/bin/python benchmarks/ledger_view.py                     # 100,000 verdicts (~2-4 min)
    .venv/bin/python benchmarks/ledger_view.py --verdicts 10000 --no-previous

Postgres 15 is started by the script (tests/postgres_server.py's fixture: fsync off, loopback, the
server's defaults otherwise, JIT on) and stopped at the end; each database gets `VACUUM ANALYZE`
after the bulk load (autovacuum's job on a live server). Times, on an open read-only connection,
one warm-up run then the median of --repeats, for the whole view (`SELECT * FROM track_verdicts`)
and one track's rows (`... WHERE track = ?`, what a person types for one track):

- `ledger`: the Postgres ledger's view as the code defines it now (PG_VIEWS);
- `plain`: the same view and indexes over plain tables holding the same rows without the chain's
  columns (the peer: what the view costs without the ledger);
- `previous`: the view's text before issue 32 (PG_PREVIOUS_VIEWS) run as a subquery on the ledger,
  once, cancelled after --previous-timeout (--no-previous skips it);
- `DuckDB`: DuckDB's view on the same rows in a DuckDB ledger, beside its own plain peer (DuckDB's
  view over plain tables), and its text before issue 32 (PREVIOUS_VIEWS) as a subquery, once.

Prints each figure, its ratio to the plain peer, and PASS/MISS for the target (< 300 ms on Postgres).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ledger_growth import DuckStore, PgStore, QueryTimeout, Workload, postgres  # noqa: E402

from tica.ledger import extend_chain  # noqa: E402
from tica.ledger.postgres_store import PG_PREVIOUS_VIEWS  # noqa: E402
from tica.ledger.schema import PREVIOUS_VIEWS  # noqa: E402

TARGET_MS = 300.0
WHOLE = "SELECT * FROM track_verdicts"
ONE = "SELECT * FROM track_verdicts WHERE track = ?"


def grow(stores, verdicts: int, step: int = 20_000) -> None:
    work = Workload()
    for start in range(0, verdicts, step):
        prepared = work.prepared(start, min(verdicts, start + step))
        for store in stores:
            store.bulk(extend_chain(store.head(), prepared))


def timed(q, sql: str, params, repeats: int) -> tuple[float, int]:
    """(median ms, rows) after one warm-up run; inf when cancelled."""
    try:
        rows = len(q(sql, params))
    except QueryTimeout:
        return float("inf"), -1
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        q(sql, params)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), rows


def once(q, sql: str, params) -> tuple[float, int]:
    t0 = time.perf_counter()
    try:
        rows = len(q(sql, params))
    except QueryTimeout:
        return float("inf"), -1
    return (time.perf_counter() - t0) * 1e3, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verdicts", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--track", default="track-03")
    ap.add_argument("--previous-timeout", type=float, default=120.0)
    ap.add_argument("--no-previous", action="store_true", help="skip the view's text before issue 32")
    args = ap.parse_args()
    import duckdb
    import psycopg

    previous = f"SELECT * FROM ({PG_PREVIOUS_VIEWS['track_verdicts'][0]}) previous"
    duck_previous = f"SELECT * FROM ({PREVIOUS_VIEWS['track_verdicts'][0]}) previous"
    results: dict[str, tuple[float, int]] = {}
    with tempfile.TemporaryDirectory() as tmp, postgres() as (dsn_ledger, dsn_plain):
        t0 = time.perf_counter()
        pg, duck = PgStore(dsn_ledger, dsn_plain), DuckStore(Path(tmp))
        grow([pg, duck], args.verdicts)
        print(f"grew {args.verdicts} verdicts on both stores in {time.perf_counter() - t0:.0f} s")
        with pg.reader(plain=False, timeout_s=600) as q:
            server = q("SHOW server_version", [])[0][0]
            jit = q("SHOW jit", [])[0][0]
        for name, (sql, params) in {"whole": (WHOLE, []), "track": (ONE, [args.track])}.items():
            with pg.reader(plain=False, timeout_s=600) as q:
                results[f"ledger {name}"] = timed(q, sql, params, args.repeats)
            with pg.reader(plain=True, timeout_s=600) as q:
                results[f"plain {name}"] = timed(q, sql, params, args.repeats)
            with duck.reader(plain=False, timeout_s=600) as q:
                results[f"duckdb {name}"] = timed(q, sql, params, args.repeats)
            with duck.reader(plain=True, timeout_s=600) as q:
                results[f"duckplain {name}"] = timed(q, sql, params, args.repeats)
            if not args.no_previous:
                where = " WHERE track = ?" if params else ""
                with pg.reader(plain=False, timeout_s=args.previous_timeout) as q:
                    results[f"previous {name}"] = once(q, previous + where, params)
                with duck.reader(plain=False, timeout_s=args.previous_timeout) as q:
                    results[f"duckprev {name}"] = once(q, duck_previous + where, params)
    print(f"Postgres {server} (jit {jit}), DuckDB {duckdb.__version__}, psycopg {psycopg.__version__}; "
          f"{args.verdicts} verdicts; median of {args.repeats} after a warm-up (previous: one run)")
    for name, label in (("whole", WHOLE), ("track", ONE.replace("?", repr(args.track)))):
        print(f"\n{label}")
        for key, what in (("ledger", "Postgres ledger, this code's view"), ("plain", "Postgres plain tables (peer)"),
                          ("previous", "Postgres ledger, the view before issue 32"),
                          ("duckdb", "DuckDB ledger's view"), ("duckplain", "DuckDB plain tables (peer)"),
                          ("duckprev", "DuckDB ledger, the view before issue 32")):
            if f"{key} {name}" not in results:
                continue
            ms, rows = results[f"{key} {name}"]
            peer_ms = results[f"{'duckplain' if key.startswith('duck') else 'plain'} {name}"][0]
            shown = f">{args.previous_timeout * 1e3:.0f}" if ms == float("inf") else f"{ms:.1f}"
            ratio = "" if key in ("plain", "duckplain") or ms == float("inf") else f"  {ms / peer_ms:.2f}x its peer"
            print(f"  {what:<44} {shown:>9} ms  {rows:>4} rows{ratio}")
        ms = results[f"ledger {name}"][0]
        prev = results.get(f"previous {name}", (None,))[0]
        faster = f", {prev / ms:.0f}x faster than before" if prev and prev != float("inf") else ""
        print(f"  target < {TARGET_MS:g} ms on Postgres: {ms:.1f} ms  {'PASS' if ms < TARGET_MS else 'MISS'}{faster}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
