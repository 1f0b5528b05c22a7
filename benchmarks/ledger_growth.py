"""Speed at scale (issue 15): the ledger grown to 1k, 10k, 100k verdicts on both stores, against the
plain database in the same run.

    .venv/bin/python benchmarks/ledger_growth.py                          # 1k, 10k, 100k; DuckDB and Postgres
    .venv/bin/python benchmarks/ledger_growth.py --sizes 1000,10000 --stores duckdb

What a verdict is here: the rows `tica.records.record_verdict` builds (a verdict row of about 3 KB,
its three required checks, a reruns row when it reruns an earlier verdict), on candidates recorded
as `record_candidate` records them (a candidates row and five components rows, one candidate per
ten verdicts over seven items on twenty tracks) and invalidations as `record_invalidations` writes
them (two per candidate that replaces another on its track): about 5 chain rows per verdict.

The ledger is grown in bulk through the product's hashing path (`Ledger._payload`, then
`extend_chain` from the ledger's head, exactly as an append chains rows) and loaded in one bulk
insert per table (DuckDB from Arrow, Postgres by COPY): the appends' own path (a connection per
append) would take about two hours for 100k verdicts on DuckDB. At each size it measures:

- append: a batch of verdicts appended through the product's API, one `append_many` per verdict
  (what `record_verdict` calls: writer lock, connect, head query, chained inserts, commit); the
  peer inserts the same rows into the plain tables on one open connection, one transaction per
  verdict. Reported per chain row.
- report: the track's current verdicts (`SELECT * FROM track_verdicts WHERE track = ?`, the view a
  person queries) on an open read-only connection: one warm-up run, then the median of up to
  --repeats runs within 30 s, a run cancelled after --query-timeout counting as a MISS; the peer runs
  the same SELECT over the same views on plain tables (same rows and `seq`, no prev_hash, row_hash,
  recorded_at). `report()`: `tica.acceptance.report` of the track whole (every read it makes, each
  through `ledger.rows`, which connects per call, and its logic; not the verify it starts with, timed
  as `verify`), which reads the track's verdict history to list earlier non-pass verdicts.
- verify: `ledger.verify()`, what `tica ledger verify` runs (every row re-hashed, every view
  compared; in batches of columns, tica.ledger.batches, in one process per CPU from 200,000 chain
  rows), median of --verify-repeats; its other paths apart: `in-db` the chain re-hashed by the
  database itself (`verify(in_db=True)`: tica.ledger.in_db.in_db_report, the Python path's report),
  `serial` the row-by-row Python path in one process (TICA_VERIFY_IN_DB=0, TICA_VERIFY_BATCHES=0,
  TICA_VERIFY_WORKERS=1), split into fetching the rows (`chain_entries`) and recomputing the chain
  (`verify_entries`), `par` the row-by-row path in one process per CPU (`procs`, each re-hashing a seq range: tica.ledger.parallel; from
  200,000 chain rows, else `-`); the peer fetches the same rows from the plain tables into Python
  (`SELECT *` of each).

Postgres 15 is started by the script (tests/postgres_server.py's fixture: fsync off, loopback) and
stopped at the end; its tables get `VACUUM ANALYZE` after each bulk load (autovacuum's job on a
live server), the plain ones too. Prints a table per store, the ratios to the plain peer, the
growth exponent of each time (least-squares slope of log time on log verdicts), and PASS/MISS
for the issue's targets at 100,000 verdicts: report query < 50 ms, verify < 2 s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.postgres_server

from tica.checks import CANARIES, FROZEN, RECEIPTS, CheckOutcome  # noqa: E402
from tica.evidence import Component, EvidenceItem  # noqa: E402
from tica.ledger import (CHAIN_COLUMNS, GENESIS, INDEXES, TABLES, TRACK_VERDICTS_SQL, VIEWS, Ledger,  # noqa: E402
                         extend_chain, verify_entries)
from tica.ledger.parallel import workers_for  # noqa: E402
from tica.records import record_verdict  # noqa: E402
from tica.verdict import Verdict, VerdictCell  # noqa: E402

REPORT_SQL = TRACK_VERDICTS_SQL  # what tica.acceptance.report reads for one track (Ledger.track_verdicts)
TRACKS = 20
VERDICTS_PER_CANDIDATE = 10
ITEMS = list(EvidenceItem)
COMPONENTS = list(Component)[:5]
REPORT_TARGET_S, VERIFY_TARGET_S, TARGET_AT = 0.050, 2.0, 100_000

_NUMBERS = {f"c={c}": {"rounds": [{"round": r, "bi1": 1234.5 + r, "bi0": 1500.25 - r, "loss": 0.177 + r / 1000}
                                  for r in range(1, 7)], "median_loss": 0.18, "tiers": 1.02} for c in (1, 8, 32)}
_SUMMARY = ("c=32: median per-round paired loss 0.181 over 6 crossed rounds (AB/BA/AB/BA/AB/BA); "
            "budget 0.30 with no statistical basis: reported, not passed. ") * 2


# ----------------------------------------------------------------------------------- workload
class _Collector:
    """Stands in for the ledger in `record_verdict`: keeps the rows it would append."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, dict]] = []

    def append_many(self, rows):
        self.rows += rows
        return []


def _track(c: int) -> str:
    return f"track-{c % TRACKS:02d}"


def _cand(c: int) -> str:
    return f"cand-{c:07d}"


class Workload:
    """The rows verdict i brings (its candidate's rows first when it is the candidate's first
    verdict), as the product's recorders build them. Deterministic apart from the ids
    `record_verdict` draws."""

    def __init__(self) -> None:
        self.verdict_ids: dict[tuple[int, int], str] = {}  # (candidate, slot) -> verdict_id

    def rows(self, i: int) -> list[tuple[str, dict]]:
        c, slot = divmod(i, VERDICTS_PER_CANDIDATE)
        out: list[tuple[str, dict]] = []
        if slot == 0:
            out += self._candidate(c)
        item = ITEMS[slot % len(ITEMS)]
        rerun_of = self.verdict_ids.get((c, slot - len(ITEMS))) if slot >= len(ITEMS) else None
        cell = VerdictCell(
            item=item, verdict=[Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE][i % 3], summary=_SUMMARY,
            question_hash="sha256:" + hashlib.sha256(f"{item.value}-{c // 50}".encode()).hexdigest(),
            reasons=("paired rounds crossed", "no statistical basis for the budget"),
            numbers={**_NUMBERS, "i": i},
            receipt_hashes={f"legs/r{k}/results.json": "sha256:" + hashlib.sha256(f"{i}-{k}".encode()).hexdigest()
                            for k in range(10)},
            judge_version="judge-3f2a9c1d")
        checks = [
            CheckOutcome(CANARIES, True, True, "every planted canary was caught", {"caught": 4, "planted": 4}),
            CheckOutcome(RECEIPTS, True, True, "receipts match their seals and the ledger", {"files": 10}),
            CheckOutcome(FROZEN, i % 97 != 0, True, "question frozen before the first leg started",
                         {"frozen_at": "2026-12-01T00:00:00+00:00"}),
        ]
        collector = _Collector()
        vid = record_verdict(collector, _cand(c), cell, rerun_of=rerun_of, checks=checks,
                             rerun_reason="rerun of the same item for the same candidate" if rerun_of else None)
        self.verdict_ids[(c, slot)] = vid
        return out + collector.rows

    def _candidate(self, c: int) -> list[tuple[str, dict]]:
        cid, track = _cand(c), _track(c)
        rows: list[tuple[str, dict]] = [("candidates", {
            "candidate_id": cid, "track": track, "manifest_path": f"manifests/{track}.yaml",
            "manifest_hash": hashlib.sha256(cid.encode()).hexdigest(),
            "manifest_json": {"track": track, "components": {k.value: f"{k.value}/{c}" for k in COMPONENTS},
                              "notes": "benchmark candidate"}})]
        rows += [("components", {"candidate_id": cid, "component": k.value,
                                 "fingerprint": "blake3:" + hashlib.sha256(f"{cid}{k.value}".encode()).hexdigest()})
                 for k in COMPONENTS]
        if c >= TRACKS:  # replaces the previous candidate on its track: record_invalidations' rows
            old = _cand(c - TRACKS)
            rows += [("invalidations", {
                "invalidation_id": f"inval-{c:07d}-{item.value}", "track": track, "old_candidate_id": old,
                "new_candidate_id": cid, "component": COMPONENTS[c % 5].value, "item": item.value,
                "cause": f"{COMPONENTS[c % 5].value} changed: fingerprint differs",
                "voided_verdict_ids_json": json.dumps([self.verdict_ids.get((c - TRACKS, 0), "")])})
                for item in (ITEMS[c % len(ITEMS)], ITEMS[(c + 3) % len(ITEMS)])]
        return rows

    def prepared(self, start: int, stop: int) -> list[tuple[str, dict]]:
        """Verdicts start..stop-1 as (table, payload), payloads as Ledger._payload makes them."""
        return [(t, Ledger._payload(t, r)) for i in range(start, stop) for t, r in self.rows(i)]


# ----------------------------------------------------------------------------------- stores
PLAIN_VIEW_NAMES = ("candidate_tracks", "verdict_check_status", "current_verdicts", "track_verdicts")


class Store:
    """One store's ledger and its plain twin: bulk growth, the product's appends, the peers."""

    name = ""
    views: dict[str, str] = VIEWS

    def plain_schema(self) -> list[str]:
        out = []
        for table, columns in TABLES.items():
            cols = ", ".join(f"{n} {self.type(t)}" for n, t in columns)
            out.append(f"CREATE TABLE {table} (seq BIGINT PRIMARY KEY, {cols})")
        out += [f"CREATE VIEW {n} AS {self.views[n]}" for n in PLAIN_VIEW_NAMES]
        out += [f"CREATE INDEX {n} ON {on}" for n, on in INDEXES.items()]  # the ledger's own, for a like peer
        return out

    def type(self, t: str) -> str:
        return t

    @staticmethod
    def by_table(chained) -> dict[str, list[list[Any]]]:
        out: dict[str, list[list[Any]]] = {}
        for table, chain, payload in chained:
            out.setdefault(table, []).append([*(chain[c] for c in CHAIN_COLUMNS), *payload.values()])
        return out


class DuckStore(Store):
    name = "DuckDB"

    def __init__(self, root: Path) -> None:
        import duckdb

        self.duckdb = duckdb
        self.path, self.plain_path = root / "ledger.duckdb", root / "plain.duckdb"
        self.ledger = Ledger(self.path).init()
        con = duckdb.connect(str(self.plain_path))
        for sql in self.plain_schema():
            con.execute(sql)
        con.close()

    def head(self) -> tuple[int, str]:
        with self.ledger.reader() as con:
            h = con.execute("SELECT seq, row_hash FROM ledger_chain ORDER BY seq DESC LIMIT 1").fetchone()
        return (h[0], h[1]) if h else (0, GENESIS)

    def bulk(self, chained) -> None:
        import pyarrow as pa

        for path, chain_cols in ((self.path, True), (self.plain_path, False)):
            con = self.duckdb.connect(str(path))
            con.execute("BEGIN TRANSACTION")
            for table, rows in self.by_table(chained).items():
                names = [*CHAIN_COLUMNS, *(n for n, _ in TABLES[table])]
                keep = [k for k, n in enumerate(names) if chain_cols or n not in CHAIN_COLUMNS[1:]]
                arrow = pa.table({names[k]: [r[k] for r in rows] for k in keep})
                con.register("batch", arrow)
                con.execute(f"INSERT INTO {table} ({', '.join(names[k] for k in keep)}) "
                            f"SELECT {', '.join(names[k] for k in keep)} FROM batch")
                con.unregister("batch")
            con.execute("COMMIT")
            con.execute("CHECKPOINT")
            con.close()

    def plain_appender(self):
        con = self.duckdb.connect(str(self.plain_path))

        def insert(group: list[tuple[str, dict]], seqs: Sequence[int]) -> None:
            con.execute("BEGIN TRANSACTION")
            for (table, payload), seq in zip(group, seqs):
                con.execute(f"INSERT INTO {table} (seq, {', '.join(payload)}) VALUES "
                            f"({', '.join(['?'] * (len(payload) + 1))})", [seq, *payload.values()])
            con.execute("COMMIT")
        return insert, con.close

    @contextmanager
    def reader(self, plain: bool, timeout_s: float) -> Iterator[Callable[[str, Sequence[Any]], list]]:
        """An open read-only connection; a query running past timeout_s is interrupted (QueryTimeout)."""
        import threading

        con = self.duckdb.connect(str(self.plain_path if plain else self.path), read_only=True)

        def q(sql: str, params: Sequence[Any]) -> list:
            timer = threading.Timer(timeout_s, con.interrupt)
            timer.start()
            try:
                return con.execute(sql, list(params)).fetchall()
            except self.duckdb.InterruptException:
                raise QueryTimeout from None
            finally:
                timer.cancel()
        try:
            yield q
        finally:
            con.close()

    def verify_parts(self) -> tuple[float, float, float]:
        """(fetch, recompute, views) seconds of one verify, the same calls Ledger.verify makes."""
        with self.ledger.reader() as con:
            t0 = time.perf_counter()
            entries = Ledger.chain_entries(con)
            t1 = time.perf_counter()
            views = Ledger._view_problems(con)
            t2 = time.perf_counter()
        report = verify_entries(entries, None, views)
        t3 = time.perf_counter()
        assert report.ok, report.problems[:3]
        return t1 - t0, t3 - t2, t2 - t1

    def plain_scan(self) -> None:
        con = self.duckdb.connect(str(self.plain_path), read_only=True)
        for table in TABLES:
            con.execute(f"SELECT * FROM {table}").fetchall()
        con.close()

    def close(self) -> None:
        pass


class PgStore(Store):
    name = "Postgres"

    def __init__(self, dsn_ledger: str, dsn_plain: str) -> None:
        import psycopg

        from tica.ledger import PG_VIEWS, PostgresLedger

        self.psycopg, self.views = psycopg, PG_VIEWS
        self.dsn, self.plain_dsn = dsn_ledger, dsn_plain
        self.ledger = PostgresLedger(dsn_ledger).init()
        with psycopg.connect(dsn_plain) as con:
            for sql in self.plain_schema():
                con.execute(sql)

    def type(self, t: str) -> str:
        return {"VARCHAR": "TEXT"}.get(t, t)

    def head(self) -> tuple[int, str]:
        with self.psycopg.connect(self.dsn) as con:
            h = con.execute("SELECT seq, row_hash FROM ledger_chain ORDER BY seq DESC LIMIT 1").fetchone()
        return (h[0], h[1]) if h else (0, GENESIS)

    def bulk(self, chained) -> None:
        for dsn, chain_cols in ((self.dsn, True), (self.plain_dsn, False)):
            with self.psycopg.connect(dsn) as con:
                for table, rows in self.by_table(chained).items():
                    names = [*CHAIN_COLUMNS, *(n for n, _ in TABLES[table])]
                    keep = [k for k, n in enumerate(names) if chain_cols or n not in CHAIN_COLUMNS[1:]]
                    with con.cursor().copy(f"COPY {table} ({', '.join(names[k] for k in keep)}) FROM STDIN") as cp:
                        for r in rows:
                            cp.write_row([r[k] for k in keep])
            with self.psycopg.connect(dsn, autocommit=True) as con:
                con.execute("VACUUM ANALYZE")

    def plain_appender(self):
        con = self.psycopg.connect(self.plain_dsn)

        def insert(group: list[tuple[str, dict]], seqs: Sequence[int]) -> None:
            for (table, payload), seq in zip(group, seqs):
                con.execute(f"INSERT INTO {table} (seq, {', '.join(payload)}) VALUES "
                            f"({', '.join(['%s'] * (len(payload) + 1))})", [seq, *payload.values()])
            con.commit()
        return insert, con.close

    @contextmanager
    def reader(self, plain: bool, timeout_s: float) -> Iterator[Callable[[str, Sequence[Any]], list]]:
        """An open read-only connection; a query running past timeout_s is cancelled (QueryTimeout)."""
        con = self.psycopg.connect(self.plain_dsn if plain else self.dsn, autocommit=True)
        con.execute(f"SET statement_timeout = {int(timeout_s * 1000)}")
        con.execute("SET default_transaction_read_only = on")

        def q(sql: str, params: Sequence[Any]) -> list:
            try:
                return con.execute(sql.replace("?", "%s"), list(params)).fetchall()
            except self.psycopg.errors.QueryCanceled:
                raise QueryTimeout from None
        try:
            yield q
        finally:
            con.rollback()
            con.close()

    def verify_parts(self) -> tuple[float, float, float]:
        from tica.ledger import PostgresLedger
        from tica.ledger.postgres_store import _view_problems

        with self.psycopg.connect(self.dsn) as con:
            t0 = time.perf_counter()
            entries = PostgresLedger.chain_entries(con)
            t1 = time.perf_counter()
            views = _view_problems(con)
            t2 = time.perf_counter()
            con.rollback()
        report = verify_entries(entries, None, views)
        t3 = time.perf_counter()
        assert report.ok, report.problems[:3]
        return t1 - t0, t3 - t2, t2 - t1

    def plain_scan(self) -> None:
        with self.psycopg.connect(self.plain_dsn) as con:
            for table in TABLES:
                con.execute(f"SELECT * FROM {table}").fetchall()
            con.rollback()


# ----------------------------------------------------------------------------------- measuring
class QueryTimeout(Exception):
    """A query ran past --query-timeout and was cancelled."""


def median_time(fn: Callable[[], Any], repeats: int, budget_s: float = float("inf")) -> tuple[float, int]:
    """(median seconds, runs): up to `repeats` runs, fewer once `budget_s` is spent (one at least);
    (inf, 0) when the first run times out."""
    times: list[float] = []
    while len(times) < repeats and sum(times) < budget_s:
        t0 = time.perf_counter()
        try:
            fn()
        except QueryTimeout:
            return (float("inf"), len(times)) if not times else (statistics.median(times), len(times))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(times)


@dataclass
class Row:
    verdicts: int
    chain_rows: int
    grow_s: float
    append_row_s: float
    plain_append_row_s: float
    report_s: float
    plain_report_s: float
    report_api_s: float
    verify_s: float
    plain_scan_s: float
    verify_parts: tuple[float, float, float]
    report_rows: int
    extra: dict = field(default_factory=dict)


def measure_store(store: Store, sizes: Sequence[int], appends: int, repeats: int, verify_repeats: int,
                  timeout_s: float, log: Callable[[str], None]) -> list[Row]:
    work = Workload()
    done, out = 0, []
    for size in sizes:
        t0 = time.perf_counter()
        if size > done:
            chained = extend_chain(store.head(), work.prepared(done, size))
            store.bulk(chained)
            done = size
        grow = time.perf_counter() - t0
        chain_rows = store.head()[0]
        log(f"{store.name}: {size} verdicts ({chain_rows} chain rows) grown in {grow:.1f} s")

        track = _track(size // VERDICTS_PER_CANDIDATE - 1)  # the track of the newest candidate
        found = {}
        report: dict[bool, tuple[float, int]] = {}
        for plain in (False, True):
            with store.reader(plain, timeout_s) as q:
                try:
                    found[plain] = len(q(REPORT_SQL, [track]))  # a first run, not timed: warms the caches
                except QueryTimeout:
                    report[plain] = (float("inf"), 0)
                    continue
                report[plain] = median_time(lambda: q(REPORT_SQL, [track]), repeats, budget_s=30)
        if len(found) == 2:
            assert found[False] == found[True] > 0, found
        report_api = median_time(_report_call(store.ledger, track), repeats, budget_s=30)

        assert store.ledger.verify().ok and store.ledger.verify(in_db=True).ok
        verify, _ = median_time(store.ledger.verify, verify_repeats)  # as `tica ledger verify` runs it
        verify_in_db, _ = median_time(lambda: store.ledger.verify(in_db=True), verify_repeats)
        with _python_verify(workers=1):
            verify_serial, _ = median_time(store.ledger.verify, verify_repeats)
        verify_parallel = math.nan
        if workers_for(chain_rows) > 1:
            with _python_verify(workers=None):
                verify_parallel, _ = median_time(store.ledger.verify, verify_repeats)
        parts = store.verify_parts()
        scan, _ = median_time(store.plain_scan, verify_repeats)
        log(f"{store.name}: {size}: report {report[False][0] * 1e3:.1f} ms, plain {report[True][0] * 1e3:.1f} ms, "
            f"verify {verify:.2f} s")

        # appends: the product's path (one append_many per verdict), then the same rows, plain
        groups = [work.rows(i) for i in range(done, done + appends)]
        groups = [[(t, Ledger._payload(t, r)) for t, r in g] for g in groups]
        head_before = store.head()[0]
        t0 = time.perf_counter()
        for g in groups:
            store.ledger.append_many(g)
        ledger_append = time.perf_counter() - t0
        n_rows = store.head()[0] - head_before
        assert n_rows == sum(len(g) for g in groups)
        insert, close = store.plain_appender()
        seq = head_before
        t0 = time.perf_counter()
        for g in groups:
            insert(g, range(seq + 1, seq + 1 + len(g)))
            seq += len(g)
        plain_append = time.perf_counter() - t0
        close()
        done += appends
        out.append(Row(size, chain_rows, grow, ledger_append / n_rows, plain_append / n_rows, report[False][0],
                       report[True][0], report_api[0], verify, scan, parts, found.get(False, -1),
                       {"report_runs": report[False][1], "plain_runs": report[True][1], "api_runs": report_api[1],
                        "verify_serial_s": verify_serial, "verify_in_db_s": verify_in_db,
                        "verify_parallel_s": verify_parallel, "verify_workers": workers_for(chain_rows)}))
    return out


def _report_call(ledger: Any, track: str) -> Callable[[], Any]:
    """`tica.acceptance.report` of the track as the report asset calls it (its reads and its logic;
    the verify it starts with is timed apart, as `verify`): for the newest candidate's components,
    under the questions of the newest verdicts."""
    from tica.acceptance import report
    from tica.candidate import CandidateIdentity

    newest = ledger.rows("SELECT candidate_id FROM candidates WHERE track = ? ORDER BY seq DESC LIMIT 1", [track])
    comps = ledger.rows("SELECT component, fingerprint FROM components WHERE candidate_id = ?",
                        [newest[0]["candidate_id"]]) if newest else []
    recorded = {Component(r["component"]): r["fingerprint"] for r in comps}
    current = CandidateIdentity(track=track, manifest_path="benchmark",  # the components the workload leaves out: new
                                components={c: recorded.get(c, f"benchmark:{c.value}") for c in Component})
    questions = {EvidenceItem(r["item"]): r["question_hash"] for r in ledger.rows(
        "SELECT item, question_hash FROM verdicts ORDER BY seq DESC LIMIT 50")}
    verified = ledger.verify()

    class _Verified:  # the ledger as report() reads it, its verify already done above
        def __getattr__(self, name: str) -> Any:
            return getattr(ledger, name)

        def verify_or_raise(self, expect=None):
            return verified

    return lambda: report(_Verified(), track, current, questions=questions)


@contextmanager
def _python_verify(workers: int | None) -> Iterator[None]:
    """Verify's row-by-row Python path only (TICA_VERIFY_IN_DB=0, TICA_VERIFY_BATCHES=0), in `workers`
    processes (None: as many as it picks)."""
    wanted = {"TICA_VERIFY_IN_DB": "0", "TICA_VERIFY_BATCHES": "0",
              "TICA_VERIFY_WORKERS": None if workers is None else str(workers)}
    saved = {k: os.environ.get(k) for k in wanted}
    for k, v in wanted.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def exponent(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log y on log x: time ~ rows^k."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def _ms(x: float, timeout_s: float) -> str:
    return f">{timeout_s * 1e3:.0f}" if math.isinf(x) else f"{x * 1e3:.1f}"


def _s(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def _ratio(a: float, b: float) -> str:
    return "?" if math.isinf(a) or math.isinf(b) else f"{a / b:.2f}x"


def _k(xs: Sequence[int], ys: Sequence[float], timeout_s: float) -> str:
    """The growth exponent; a run that timed out counts as the timeout, a lower bound (>=)."""
    got = [(x, y) for x, y in zip(xs, ys)]
    if len(got) < 2:
        return "n/a"
    bound = any(math.isinf(y) for _, y in got)
    k = exponent([x for x, _ in got], [timeout_s if math.isinf(y) else y for _, y in got])
    return f">={k:.2f}" if bound else f"{k:.2f}"


def print_table(name: str, rows: list[Row], timeout_s: float) -> None:
    print(f"\n{name}")
    head = (f"{'verdicts':>9} {'chain rows':>10} | {'append ms/row':>13} {'plain':>6} {'ratio':>6} | "
            f"{'report ms':>9} {'plain':>7} {'ratio':>6} {'runs':>4} {'report()':>8} | {'verify s':>8} {'plain':>6} "
            f"{'ratio':>6} {'in-db':>6} {'serial':>6} {'procs':>5} {'par':>6} | {'fetch s':>7} {'hash s':>6} "
            f"{'views s':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r.verdicts:>9} {r.chain_rows:>10} | {r.append_row_s * 1e3:>13.2f} {r.plain_append_row_s * 1e3:>6.2f} "
              f"{_ratio(r.append_row_s, r.plain_append_row_s):>6} | {_ms(r.report_s, timeout_s):>9} "
              f"{_ms(r.plain_report_s, timeout_s):>7} {_ratio(r.report_s, r.plain_report_s):>6} "
              f"{r.extra['report_runs']:>4} "
              f"{_ms(r.report_api_s, timeout_s) if r.extra['api_runs'] else 'skipped':>8} | "
              f"{r.verify_s:>8.2f} {r.plain_scan_s:>6.2f} {_ratio(r.verify_s, r.plain_scan_s):>6} "
              f"{r.extra['verify_in_db_s']:>6.2f} {r.extra['verify_serial_s']:>6.2f} {r.extra['verify_workers']:>5} "
              f"{_s(r.extra['verify_parallel_s']):>6} | "
              f"{r.verify_parts[0]:>7.2f} {r.verify_parts[1]:>6.2f} {r.verify_parts[2]:>7.2f}")
    xs = [r.verdicts for r in rows]
    if len(rows) >= 2:
        print(f"growth exponent k (time ~ verdicts^k, least-squares log-log over {xs[0]}..{xs[-1]} verdicts; "
              f"ms/row for appends, so 0 is constant per row):")
        for what, mine, plain in (("append per row", "append_row_s", "plain_append_row_s"),
                                  ("report query", "report_s", "plain_report_s"),
                                  ("verify / plain scan", "verify_s", "plain_scan_s")):
            print(f"  {what:<20} ledger {_k(xs, [getattr(r, mine) for r in rows], timeout_s):>7}   "
                  f"plain {_k(xs, [getattr(r, plain) for r in rows], timeout_s):>7}")
    at = [r for r in rows if r.verdicts == TARGET_AT]
    if not at:
        print(f"targets at {TARGET_AT} verdicts: not measured (give --sizes up to {TARGET_AT})")
        return
    r = at[0]
    for what, got, target, unit in (("report query", r.report_s * 1e3, REPORT_TARGET_S * 1e3, "ms"),
                                    ("report()", r.report_api_s * 1e3, REPORT_TARGET_S * 1e3, "ms"),
                                    ("verify", r.verify_s, VERIFY_TARGET_S, "s"),
                                    ("verify in-db", r.extra["verify_in_db_s"], VERIFY_TARGET_S, "s"),
                                    ("verify row by row, serial", r.extra["verify_serial_s"], VERIFY_TARGET_S, "s")):
        if math.isinf(got):
            verdict = f"MISS: cancelled after {timeout_s:g} s (over {timeout_s * 1e3 / target:.0f}x the target)"
            shown = "-"
        elif got < target:
            verdict, shown = "PASS", f"{got:.2f} {unit}"
        else:
            verdict, shown = f"MISS by {got - target:.2f} {unit} ({got / target:.1f}x the target)", f"{got:.2f} {unit}"
        print(f"target {what} < {target:g} {unit} at {TARGET_AT} verdicts: {shown}  {verdict}")


@contextmanager
def postgres() -> Iterator[tuple[str, str]]:
    """A fresh Postgres 15 server (tests/postgres_server.py's fixture, driven by hand) and two new
    databases on it: the ledger's and the plain peer's. Stopped and removed at the end."""
    from tests.postgres_server import pg_dsn, postgres_server

    server = postgres_server.__wrapped__()
    address = next(server)
    try:
        yield pg_dsn.__wrapped__(address), pg_dsn.__wrapped__(address)
    finally:
        server.close()  # runs the fixture's teardown: pg_ctl stop, folder removed


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000", help="verdict counts, comma-separated, increasing")
    ap.add_argument("--stores", default="duckdb,postgres", help="duckdb, postgres or both")
    ap.add_argument("--appends", type=int, default=50, help="verdicts appended through the API at each size")
    ap.add_argument("--repeats", type=int, default=9, help="runs of the report query (median)")
    ap.add_argument("--query-timeout", type=float, default=60.0,
                    help="seconds before a report query is cancelled (shown as >timeout, a MISS)")
    ap.add_argument("--verify-repeats", type=int, default=3, help="runs of verify and the plain scan (median)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if sizes != sorted(set(sizes)) or sizes[0] < VERDICTS_PER_CANDIDATE * TRACKS // 2:
        ap.error(f"--sizes must increase, from at least {VERDICTS_PER_CANDIDATE * TRACKS // 2}")
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if not stores or set(stores) - {"duckdb", "postgres"}:
        ap.error("--stores takes duckdb and/or postgres")

    import duckdb

    t_all = time.perf_counter()
    versions = f"Python {sys.version.split()[0]}, DuckDB {duckdb.__version__}"
    results: dict[str, list[Row]] = {}

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_all:6.1f} s] {msg}", flush=True)

    if "duckdb" in stores:
        with tempfile.TemporaryDirectory() as tmp:
            results["DuckDB " + duckdb.__version__ + " (file)"] = measure_store(
                DuckStore(Path(tmp)), sizes, args.appends, args.repeats, args.verify_repeats, args.query_timeout,
                log)
    if "postgres" in stores:
        import psycopg

        with postgres() as (dsn, plain_dsn):
            with psycopg.connect(dsn) as con:
                server = con.execute("SHOW server_version").fetchone()[0]
            versions += f", Postgres {server}, psycopg {psycopg.__version__}"
            results[f"Postgres {server} (local server, fsync off)"] = measure_store(
                PgStore(dsn, plain_dsn), sizes, args.appends, args.repeats, args.verify_repeats, args.query_timeout,
                log)

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{versions}; {os.cpu_count()} cores, load average at the end {load} (1/5/15 min)")
    print(f"{args.appends} verdicts appended per size; report query: median of up to {args.repeats} runs within 30 s "
          f"after one warm-up, cancelled after {args.query_timeout:g} s; verify and plain scan: median of "
          f"{args.verify_repeats}")
    for name, rows in results.items():
        print_table(name, rows, args.query_timeout)
    print(f"\nfull run: {time.perf_counter() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
