"""Verify a large ledger in parallel: the chain cut into contiguous seq ranges, each range re-hashed
by a process of its own, the pieces joined in chain order.

Each row's hash depends only on its own content and its stored link (prev_hash), so a range can be
re-hashed without the rows before it; what a range cannot check alone is its first row's link, its
rows' chain positions and the published head, and `tica.ledger.chain.join_segments` checks those from
what every range reports (the rows before a range are counted first). The report is the one the
serial verify makes of the same chain, problem for problem (tests/core/test_ledger_parallel_verify.py).

Every process reads the same state: DuckDB readers hold the file shared, so no writer commits while
they read; on Postgres the parent exports its REPEATABLE READ snapshot and every range imports it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from tica.errors import TicaError
from tica.ledger import batches
from tica.ledger.chain import ChainSegment, Head, VerifyReport, check_segment, join_segments, merge_chain
from tica.ledger.connect import connect_duckdb
from tica.ledger.rows import OutOfOrder
from tica.ledger.schema import TABLES

PARALLEL_MIN_ROWS = 200_000  # below this a process start costs more than it saves
MAX_WORKERS = 16
FETCH_ROWS = 20_000
WORKER_MODULE = "tica.ledger.range_worker"  # what a range's process runs: `python -m WORKER_MODULE KIND JOB`
READ_TIMEOUT_S = 30.0  # a range's wait for the DuckDB file, as a Ledger's reader waits by default


def workers_for(rows: int) -> int:
    """How many processes verify `rows` chain rows: TICA_VERIFY_WORKERS if set (1: serial), else one
    per CPU (at most MAX_WORKERS) once the chain holds PARALLEL_MIN_ROWS rows."""
    from tica.settings import setting

    chosen: int | None = setting("verify_workers")
    if chosen is not None:
        return chosen
    if rows < PARALLEL_MIN_ROWS:
        return 1
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else
                      os.cpu_count() or 1))


def verify_workers(con: Any) -> int:
    """workers_for the chain on `con` (a store's connection), as its highest seq counts its rows:
    only a choice of speed hangs on it."""
    return workers_for(con.execute(max_seq_sql()).fetchone()[0] or 0)


def cut_points(seqs: Sequence[int], pieces: int) -> list[int]:
    """Seq values that cut the chain into `pieces` ranges of about equal rows: range k holds the rows
    with cuts[k-1] <= seq < cuts[k] (the first range from below any seq, the last to above any)."""
    if pieces <= 1 or not seqs:
        return []
    ordered = sorted(seqs)
    cuts = sorted({ordered[len(ordered) * k // pieces] for k in range(1, pieces)})
    return [c for c in cuts if c > ordered[0]]


def ranges_of(cuts: Sequence[int]) -> list[tuple[int | None, int | None]]:
    bounds: list[int | None] = [None, *cuts, None]
    return list(zip(bounds[:-1], bounds[1:]))


def range_sql(table: str, lo: int | None, hi: int | None, ordered: bool, placeholder: str = "?") -> tuple[str, list]:
    sql, params = batches.range_sql(table, lo, hi, placeholder)
    return sql + (" ORDER BY seq" if ordered else ""), params


def range_entries(execute: Callable[[Any, str, list], None], cursors: Sequence[Any], lo: int | None, hi: int | None,
                  ordered: bool) -> Iterator[tuple[int, str, str, str, str, tuple]]:
    """The chain rows with lo <= seq < hi, every table's merged by seq (as the serial stream is)."""
    def stream(cur, table):
        sql, params = range_sql(table, lo, hi, ordered)
        execute(cur, sql, params)
        last = None
        while True:
            rows = cur.fetchmany(FETCH_ROWS)
            if not rows:
                return
            for r in rows:
                if not ordered:
                    if last is not None and not last < r[0]:
                        raise OutOfOrder(table)
                    last = r[0]
                yield (r[0], table, r[1], r[2], r[3], tuple(r[4:]))

    return merge_chain([stream(cur, table) for cur, table in zip(cursors, TABLES)])


# ----------------------------------------------------------------------------------- DuckDB
def _duckdb_reader(path: str) -> closing[Any]:
    """A read-only connection to the DuckDB file the caller verifies (and holds open meanwhile)."""
    return closing(connect_duckdb(Path(path), read_only=True, timeout_s=READ_TIMEOUT_S))


def _duckdb_range(path: str, lo: int | None, hi: int | None, start: int, want: int | None) -> ChainSegment:
    with _duckdb_reader(path) as con:
        def execute(cur, sql, params):
            cur.execute(sql, params)

        for ordered in (False, True):  # as stored (DuckDB keeps insertion order), else sorted
            cursors = [con.cursor() for _ in TABLES]
            try:
                return check_segment(range_entries(execute, cursors, lo, hi, ordered), start, want, None)
            except OutOfOrder:
                continue
            finally:
                for cur in cursors:
                    cur.close()
    raise AssertionError("unreachable")


def counts_before(count: Callable[[str], Sequence[int]], cuts: Sequence[int]) -> list[int]:
    """Chain position of each range's first row: 1 + the rows of every table below its cut."""
    per = [0] * len(cuts)
    for table in TABLES:
        for k, n in enumerate(count(table)):
            per[k] += n
    return [1] + [1 + n for n in per]


def count_sql(table: str, cuts: Sequence[int], placeholder: str = "?") -> str:
    return "SELECT " + ", ".join(f"count(*) FILTER (WHERE seq < {placeholder})" for _ in cuts) + f" FROM {table}"


def seq_sample_sql() -> str:
    return " UNION ALL ".join(f"SELECT seq FROM {t}" for t in TABLES)


def verify_duckdb(path: str, con, expect: Head | None, views: Sequence[str], workers: int) -> VerifyReport:
    """`con`: the caller's read-only connection (held open: writers wait until every range is read)."""
    seqs = [r[0] for r in con.execute(seq_sample_sql()).fetchall()]
    cuts = cut_points(seqs, workers)
    starts = counts_before(lambda t: con.execute(count_sql(t, cuts), list(cuts)).fetchone(), cuts)
    jobs = [(path, lo, hi, start, expect.seq if expect else None) for (lo, hi), start in zip(ranges_of(cuts), starts)]
    return join_segments(_run("duckdb", jobs), expect, views)


# ----------------------------------------------------------------------------------- Postgres
def _postgres_range(dsn: str, snapshot: str, lo: int | None, hi: int | None, start: int,
                    want: int | None) -> ChainSegment:
    with batches.on_snapshot(dsn, snapshot) as con:
        cursors = [con.cursor(name=f"tica_range_{table}") for table in TABLES]

        def execute(cur, sql, params):
            cur.execute(sql.replace("?", "%s"), params)
        try:
            return check_segment(range_entries(execute, cursors, lo, hi, True), start, want, None)
        finally:
            for cur in cursors:
                cur.close()


def verify_postgres(dsn: str, con, expect: Head | None, views: Sequence[str], workers: int) -> VerifyReport:
    """`con`: the caller's connection, inside a REPEATABLE READ transaction whose snapshot every range reads."""
    snapshot = con.execute("SELECT pg_export_snapshot()").fetchone()[0]
    seqs = [r[0] for r in con.execute(seq_sample_sql()).fetchall()]
    cuts = cut_points(seqs, workers)
    starts = counts_before(lambda t: con.execute(count_sql(t, cuts, "%s"), list(cuts)).fetchone(), cuts)
    jobs = [(dsn, snapshot, lo, hi, start, expect.seq if expect else None)
            for (lo, hi), start in zip(ranges_of(cuts), starts)]
    return join_segments(_run("postgres", jobs), expect, views)


# ----------------------------------------------------------------------------------- in batches
def _duckdb_read(con, lo: int | None, hi: int | None, bodies: bool, threads: int | None = None) -> Iterator[tuple]:
    """A range's batches on DuckDB: with `bodies`, the rows' bodies built by DuckDB (on `threads`
    threads) and hashed here (batches.duckdb_body_batches, only for a ledger the caller checked),
    else columns."""
    if bodies:
        return batches.duckdb_body_batches(con, lo, hi, threads=threads)
    return batches.duckdb_batches(con, lo, hi)


def _duckdb_batch_range(path: str, lo: int | None, hi: int | None, start: int, want: int | None,
                        bodies: bool = False) -> ChainSegment | None:
    with _duckdb_reader(path) as con:  # one of several ranges at once: DuckDB on one thread each
        return batches.range_segment(_duckdb_read(con, lo, hi, bodies, threads=1), start, want)


def _postgres_batch_range(dsn: str, snapshot: str, lo: int | None, hi: int | None, start: int,
                          want: int | None) -> ChainSegment | None:
    return batches.range_segment(batches.postgres_hashed_batches(dsn, snapshot, lo, hi), start, want)


def verify_batches(kind: str, con, source: str, expect: Head | None, views: Sequence[str], workers: int,
                   snapshot: str | None = None, bodies: bool = False) -> VerifyReport | None:
    """The chain verified in batches (tica.ledger.batches), in `workers` seq ranges each in a
    process of its own (one range: in this process); None when any range is out of place. DuckDB:
    `source` the file, read on `con` for one range, with `bodies` each row's body built by DuckDB
    (only for a ledger whose tables, functions and schemas the caller found as the code makes them);
    Postgres: `source` the DSN, every read on the caller's exported `snapshot`."""
    want = expect.seq if expect else None
    if workers <= 1:
        read = (_duckdb_read(con, None, None, bodies) if kind == "duckdb"
                else batches.postgres_hashed_batches(source, snapshot))
        return batches.join_or_none([batches.range_segment(read, 1, want)], expect, views)
    cuts = even_cuts(con.execute(max_seq_sql()).fetchone()[0] or 0, workers)
    head = (source,) if kind == "duckdb" else (source, snapshot)
    tail = (bodies,) if kind == "duckdb" else ()
    # A range's rows must hold exactly the seqs from its cut up (join_or_none checks that the ranges
    # meet): no count of the rows below each cut is needed, as the row-by-row ranges need one.
    jobs = [(*head, lo, hi, 1 if lo is None else lo, want, *tail) for lo, hi in ranges_of(cuts)]
    return batches.join_or_none(_run(f"{kind}-batches", jobs), expect, views)


def max_seq_sql() -> str:
    return "SELECT max(m) FROM (" + " UNION ALL ".join(f"SELECT max(seq) AS m FROM {t}" for t in TABLES) + ") AS top"


def even_cuts(top: int, pieces: int) -> list[int]:
    """Seq values that cut 1..`top` into `pieces` ranges of about equal rows (the rows of a chain
    that holds each seq once), as cut_points does from every seq."""
    return sorted({1 + top * k // pieces for k in range(1, pieces)} - {1}) if pieces > 1 and top > 1 else []


# ----------------------------------------------------------------------------------- processes
_WORKERS = {"duckdb": _duckdb_range, "postgres": _postgres_range,
            "duckdb-batches": _duckdb_batch_range, "postgres-batches": _postgres_batch_range}


def _run(kind: str, jobs: list[tuple]) -> list[ChainSegment | None]:
    """Each range in a process of its own (`python -m tica.ledger.range_worker`, so nothing depends on
    how the caller's program was started), one in this process; results in range order."""
    if len(jobs) == 1:
        return [_WORKERS[kind](*jobs[0])]
    procs = [subprocess.Popen([sys.executable, "-m", WORKER_MODULE, kind, json.dumps(job)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for job in jobs[1:]]
    try:
        first = _WORKERS[kind](*jobs[0])
        out = [first]
        for p in procs:
            stdout, stderr = p.communicate()
            if p.returncode != 0:
                raise TicaError(f"ledger verify: a range's process failed (exit {p.returncode}): "
                                f"{stderr.decode(errors='replace').strip()[-2000:]}")
            out.append(_segment_from_json(stdout))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _segment_from_json(data: bytes) -> ChainSegment | None:
    d = json.loads(data)
    if d is None:  # a range out of place (the batch path)
        return None
    return ChainSegment(start=d["start"], linked=d["linked"], count=d["count"],
                        first=tuple(d["first"]) if d["first"] is not None else None, last_hash=d["last_hash"],
                        last_at=d["last_at"], held=d["held"], problems=[tuple(p) for p in d["problems"]])


def main(argv: Sequence[str]) -> int:
    """One range's process (tica.ledger.range_worker): KIND JOB in, its segment as JSON out."""
    kind, job = argv[0], json.loads(argv[1])
    seg = _WORKERS[kind](*job)
    sys.stdout.write(json.dumps(None if seg is None else dataclasses.asdict(seg)))
    return 0

