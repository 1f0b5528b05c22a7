"""The append-only evidence ledger in one DuckDB file.

Append-only by construction: this API has no update and no delete, readers open the file
read-only, and every row carries the hash of the row before it (one chain across all tables,
in `seq` order) so `verify()` names any row edited behind the API's back. Publishing the head
hash that `verify()` returns anchors the chain's tail as well.

DuckDB allows one writer process. Writers take an exclusive file lock beside the database,
open, append in one short transaction and close; readers retry while a writer holds the file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from tica.errors import InputError, LedgerIntegrityError
from tica.ledger import batches, parallel
from tica.ledger.chain import GENESIS, Head, VerifyReport, extend_chain, merge_chain, verify_entries
from tica.ledger.connect import connect_duckdb
from tica.ledger.in_db import DuckDBSql, in_db_enabled, in_db_report
from tica.ledger.interface import QUERY_MAX_ROWS, LedgerMissing, QueryRefused
from tica.ledger.locking import writer_lock
from tica.ledger.rows import OutOfOrder, by_table, checked_payload, gc_paused, table_stream
from tica.ledger.schema import CHAIN_COLUMNS, INDEXES, PREVIOUS_VIEWS, TABLES, TRACK_VERDICTS_SQL, VERIFY_CHUNK_ROWS, \
    VIEWS, dropped_tables, insert_sql

# SQL a person types (`tica ledger query`) runs on a copy, so it never holds writers out; it is
# still interrupted after this long and returns at most QUERY_MAX_ROWS rows.
QUERY_TIMEOUT_S = 60.0


_IMPORT_BATCH = 2000  # rows per Arrow batch in insert_chain
_ARROW = {"BIGINT": "int64", "VARCHAR": "string"}


def _insert_batch(con: duckdb.DuckDBPyConnection, table: str,
                  rows: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> int:
    """Rows of one table (chain columns, payload in TABLES' order), in one INSERT ... SELECT; the
    count DuckDB says it stored."""
    import pyarrow as pa

    columns = [("seq", "BIGINT"), *((c, "VARCHAR") for c in CHAIN_COLUMNS[1:]), *TABLES[table]]
    data = {name: [(chain if i < len(CHAIN_COLUMNS) else payload)[name] for chain, payload in rows]
            for i, (name, _) in enumerate(columns)}
    batch = pa.table({name: pa.array(data[name], type=getattr(pa, _ARROW[kind])()) for name, kind in columns})
    names = ", ".join(name for name, _ in columns)
    con.register("tica_import_batch", batch)
    try:
        stored = con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM tica_import_batch").fetchone()
    finally:
        con.unregister("tica_import_batch")
    return stored[0] if stored else -1


class Ledger:
    """Append-only access to one DuckDB ledger file."""

    def __init__(self, path: str | Path, lock_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._session: duckdb.DuckDBPyConnection | None = None
        self._head: tuple[int, str] | None = None  # the chain's head, known while a session holds the lock
        self._schema_checked = False
        self._reading: duckdb.DuckDBPyConnection | None = None  # reading(): one connection for a burst

    # -- connections -------------------------------------------------------------------
    @contextmanager
    def session(self) -> Iterator["Ledger"]:
        """Hold the writer lock and one connection for many appends (a batch of rows from one
        run): no reconnect, schema check or head query per append, each append still its own
        committed transaction. Other processes, readers included, wait while it is held: keep
        it to a burst of appends, never around a leg."""
        if self._session is not None:
            yield self
            return
        with self._writer() as con:
            self._session = con
            try:
                yield self
            finally:
                self._session, self._head = None, None

    @contextmanager
    def _writer(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self._session is not None:
            yield self._session
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked():
            con = self._connect(read_only=False)
            try:
                yield con
            finally:
                con.close()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The writers' lock, held for the block (waited for at most lock_timeout_s)."""
        with writer_lock(self._lock_path, self.lock_timeout_s, self.path):
            yield

    def _connect(self, read_only: bool, config: dict | None = None) -> duckdb.DuckDBPyConnection:
        return connect_duckdb(self.path, read_only, self.lock_timeout_s, config)

    @contextmanager
    def reader(self, sandboxed: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection; `sandboxed` also turns off every file access from SQL (COPY,
        EXPORT, read_text, INSTALL/LOAD, ATTACH), for SQL a person typed."""
        if not self.path.exists():
            self.init()
        con = self._connect(read_only=True, config={"enable_external_access": False} if sandboxed else None)
        try:
            yield con
        finally:
            con.close()

    def require_exists(self) -> "Ledger":
        """For reading verbs: a path that holds no ledger is an error, never an empty ledger."""
        if not self.path.is_file():
            raise LedgerMissing(f"{self.path}: no ledger here (check --ledger or TICA_LEDGER)")
        return self

    # -- schema ----------------------------------------------------------------------
    def init(self) -> "Ledger":
        with self._writer() as con:
            self._ensure_schema(con)
        return self

    @staticmethod
    def _has_schema(con: duckdb.DuckDBPyConnection) -> bool:
        names = {r[0] for r in con.execute(
            "SELECT view_name FROM system.main.duckdb_views() WHERE NOT internal").fetchall()}
        indexes = {r[0] for r in con.execute("SELECT index_name FROM system.main.duckdb_indexes()").fetchall()}
        return set(VIEWS) <= names and set(INDEXES) <= indexes

    @staticmethod
    def _ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
        for table, columns in TABLES.items():
            cols = ", ".join(f"{n} {t}" for n, t in columns)
            con.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (seq BIGINT PRIMARY KEY, prev_hash VARCHAR NOT NULL, "
                f"row_hash VARCHAR NOT NULL, recorded_at VARCHAR NOT NULL, {cols})"
            )
        for name, sql in VIEWS.items():
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
        for name, on in INDEXES.items():  # a ledger made before them gains them here
            con.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {on}")

    # -- appending -------------------------------------------------------------------
    def append(self, table: str, row: Mapping[str, Any]) -> int:
        return self.append_many([(table, row)])[0]

    def append_many(self, rows: Sequence[tuple[str, Mapping[str, Any]]]) -> list[int]:
        """Append rows in one short transaction; returns their seq numbers."""
        return self.check_and_append(lambda _: list(rows))[1]

    def check_and_append(
        self, decide: "Callable[[Callable[..., list[dict[str, Any]]]], Sequence[tuple[str, Mapping[str, Any]]]]"
    ) -> tuple[Any, list[int]]:
        """Read and append under one writer lock and transaction: `decide(rows)` may query (with
        `rows(sql, params)`) and returns the rows to append, so "check, then append" cannot race
        another writer. What `decide` raises aborts the transaction; nothing is written."""
        with self._writer() as con:
            # Checked once per Ledger object: the API never drops a table or view (verify names one
            # dropped behind it), and the check costs as much as the append.
            if not self._schema_checked and not self._has_schema(con):
                self._ensure_schema(con)
            self._schema_checked = True
            con.execute("BEGIN TRANSACTION")
            try:
                def rows(sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
                    cur = con.execute(sql, params or [])
                    cols = [d[0] for d in cur.description] if cur.description else []
                    return [dict(zip(cols, r)) for r in cur.fetchall()]

                wanted = decide(rows)
                with gc_paused(len(wanted)):
                    prepared = [(table, self._payload(table, row)) for table, row in wanted]
                    head = self._head or next(iter(con.execute(  # fetched whole: no result left open
                        "SELECT seq, row_hash FROM ledger_chain ORDER BY seq DESC LIMIT 1").fetchall()), None)
                    chained = extend_chain((head[0], head[1]) if head else (0, GENESIS), prepared)
                # each table's rows (in seq order) go in as one Arrow batch: a statement per row
                # costs DuckDB about a millisecond (as much as a plain executemany's)
                for table, run in by_table(chained).items():
                    if len(run) == 1:
                        chain, payload = run[0]
                        stored = con.execute(insert_sql(table, payload, "?"),
                                             [*(chain[c] for c in CHAIN_COLUMNS), *payload.values()]).fetchall()
                        stored = stored[0][0] if stored else -1
                    else:
                        stored = _insert_batch(con, table, run)
                    if stored != len(run):
                        raise LedgerIntegrityError(f"{self.path}: {table} seqs {run[0][0]['seq']} to {run[-1][0]['seq']}: "
                                                   f"{len(run)} rows sent, {stored} stored; nothing was written")
                seqs = [chain["seq"] for _, chain, _ in chained]
                con.execute("COMMIT")
                if self._session is not None and chained:  # the lock is held: nobody else moves the head
                    self._head = (chained[-1][1]["seq"], chained[-1][1]["row_hash"])
            except BaseException:
                con.execute("ROLLBACK")
                self._head = None
                raise
        return wanted, seqs

    def insert_chain(self, rows: Iterable[tuple[str, Mapping[str, Any], Mapping[str, Any]]]) -> None:
        """Write a whole chain checked elsewhere (tica.ledger.transfer: (table, chain columns,
        payload) in seq order) into this ledger, which must hold no rows: one transaction."""
        with self._writer() as con:
            if not self._has_schema(con):
                self._ensure_schema(con)
            self._schema_checked = True
            held = con.execute("SELECT count(*) FROM ledger_chain").fetchone()[0]
            if held:
                raise InputError(self.path, "<ledger>", f"holds {held} rows: a chain is imported whole into an empty "
                                 "ledger, never merged into another")
            con.execute("BEGIN TRANSACTION")
            try:
                # consecutive rows of one table go in as one Arrow batch: a statement per row costs
                # DuckDB about a millisecond, which an export of a million rows cannot afford
                batch: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = []
                current = None
                for table, chain, payload in rows:
                    if batch and (table != current or len(batch) >= _IMPORT_BATCH):
                        _insert_batch(con, current, batch)
                        batch = []
                    current = table
                    batch.append((chain, payload))
                if batch:
                    _insert_batch(con, current, batch)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            self._head = None

    _payload = staticmethod(checked_payload)  # the row as stored and hashed (tica.ledger.rows)

    # -- reading ---------------------------------------------------------------------
    @contextmanager
    def reading(self) -> Iterator["Ledger"]:
        """One read-only connection for a burst of reads (a report's): every `query` and `rows`
        inside uses it and sees one state of the ledger. Writers wait meanwhile: keep it short."""
        if self._reading is not None:
            yield self
            return
        with self.reader() as con:
            self._reading = con
            try:
                yield self
            finally:
                self._reading = None

    def query(self, sql: str, params: Sequence[Any] | None = None, sandboxed: bool = False) -> tuple[list[str], list[tuple]]:
        """Run SQL on a read-only connection: any attempt to write is refused by DuckDB;
        `sandboxed` also refuses any file access (for SQL a person typed)."""
        if self._reading is not None and not sandboxed:
            cur = self._reading.execute(sql, params or [])
            return ([d[0] for d in cur.description] if cur.description else []), cur.fetchall()
        if sandboxed:
            return self._typed_query(sql, params)
        with self.reader() as con:
            cur = con.execute(sql, params or [])
            columns = [d[0] for d in cur.description] if cur.description else []
            return columns, cur.fetchall()

    def _typed_query(self, sql: str, params: Sequence[Any] | None) -> tuple[list[str], list[tuple]]:
        """SQL a person typed, on a copy of the ledger taken under the writers' lock: however long
        it scans, no writer waits for it. Interrupted after QUERY_TIMEOUT_S, at most QUERY_MAX_ROWS
        rows, every file access refused."""
        if not self.path.exists():
            self.init()
        import shutil
        import tempfile

        with tempfile.TemporaryDirectory(prefix="tica-query-") as tmp:
            copy = Path(tmp) / "ledger.duckdb"
            with self._locked():  # no writer mid-transaction while the bytes are copied
                shutil.copyfile(self.path, copy)
                wal = self.path.with_name(self.path.name + ".wal")
                if wal.exists():
                    shutil.copyfile(wal, copy.with_name(copy.name + ".wal"))
            con = duckdb.connect(str(copy), read_only=True, config={"enable_external_access": False})
            timer = threading.Timer(QUERY_TIMEOUT_S, con.interrupt)
            timer.start()
            try:
                cur = con.execute(sql, params or [])
                rows = cur.fetchmany(QUERY_MAX_ROWS + 1)
                columns = [d[0] for d in cur.description] if cur.description else []
            finally:
                timer.cancel()
                con.close()
        if len(rows) > QUERY_MAX_ROWS:
            raise QueryRefused(f"the query returns more than {QUERY_MAX_ROWS} rows: narrow it (WHERE, LIMIT)")
        return columns, rows

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        columns, rows = self.query(sql, params)
        return [dict(zip(columns, r)) for r in rows]

    def verify(self, expect: Head | None = None, in_db: bool | None = None) -> VerifyReport:
        """Recompute the chain; name every row whose content or link does not match, every view
        whose definition is not the code's, and, given a published head, a chain that no longer
        holds it (truncated, or rewritten up to it). First re-hashed by DuckDB itself (`in_db`,
        else TICA_VERIFY_IN_DB; in_db_report), on a ledger with no problem in its views, functions
        or schemas and every table as the code creates it; then in batches (tica.ledger.batches;
        TICA_VERIFY_BATCHES=0 skips them): on such a ledger each row's body built by DuckDB and
        hashed in Python, on any other in batches of columns; any row out of place there, and any
        other ledger, is verified row by row in Python, which names the problems."""
        with self.reader() as con:
            present = {t for (t,) in con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'").fetchall()}
            if missing := dropped_tables(present):
                return VerifyReport(rows=0, head_hash="", problems=missing)
            views = self._view_problems(con)
            if not views and in_db_enabled(in_db) and self._tables_as_created(con):
                report = in_db_report(lambda sql: con.execute(sql).fetchall(), DuckDBSql(), expect)
                if report is not None:
                    return report
            workers = parallel.verify_workers(con)
            if batches.batches_enabled():  # in batches (tica.ledger.batches), ranges in processes when large
                # each row's body built by DuckDB where nothing stored can change what its SQL computes
                bodies = not views and self._tables_as_created(con)
                report = parallel.verify_batches("duckdb", con, str(self.path), expect, views, workers, bodies=bodies)
                if report is not None:
                    return report
            if workers > 1:  # a large chain: ranges re-hashed in processes of their own (tica.ledger.parallel)
                return parallel.verify_duckdb(str(self.path), con, expect, views, workers)
            try:  # each table as stored (in seq order unless rows were inserted behind the API)
                with self.streamed_chain_entries(con, ordered=False) as entries:
                    return verify_entries(entries, expect, views)
            except OutOfOrder:  # then each read sorted by seq: the same problems, named the same way
                with self.streamed_chain_entries(con) as entries:
                    return verify_entries(entries, expect, views)

    def track_verdicts(self, track: str) -> list[dict[str, Any]]:
        """`SELECT * FROM track_verdicts WHERE track = ?`, the same rows and columns, by the
        track-first query (TRACK_VERDICTS_SQL): what the acceptance report reads."""
        return self.rows(TRACK_VERDICTS_SQL, [track])

    @staticmethod
    def chain_entries(con: duckdb.DuckDBPyConnection) -> list[tuple[int, str, str, str, str, tuple]]:
        """Every row as (seq, table, prev_hash, row_hash, recorded_at, payload values in TABLES
        order), in seq order."""
        entries: list[tuple[int, str, str, str, str, tuple]] = []
        for table, columns in TABLES.items():
            names = [n for n, _ in columns]
            cur = con.execute(f"SELECT {', '.join((*CHAIN_COLUMNS, *names))} FROM {table}")
            entries += [(r[0], table, r[1], r[2], r[3], r[4:]) for r in cur.fetchall()]
        entries.sort(key=lambda e: e[0])
        return entries

    @staticmethod
    @contextmanager
    def streamed_chain_entries(con: duckdb.DuckDBPyConnection, chunk_rows: int = VERIFY_CHUNK_ROWS,
                               ordered: bool = True) -> Iterator[Iterator[tuple[int, str, str, str, str, tuple]]]:
        """`chain_entries` as a stream: each table read `chunk_rows` rows at a time (a cursor of
        its own per table), merged by seq; memory bounded by the chunks. `ordered=False` reads
        each table as stored, without a sort (DuckDB keeps insertion order, and the API inserts
        in seq order), and raises OutOfOrder at a table whose rows are not in seq order."""
        cursors = [con.cursor() for _ in TABLES]
        try:
            yield merge_chain([table_stream(cur, table, chunk_rows, ordered) for cur, table in zip(cursors, TABLES)])
        finally:
            for cur in cursors:
                cur.close()

    @staticmethod
    def _tables_as_created(con: duckdb.DuckDBPyConnection) -> bool:
        """Whether every table is defined exactly as _ensure_schema creates it (column types,
        collations, constraints): what the in-database verify's SQL assumes of each column."""
        found = dict(con.execute(
            "SELECT table_name, sql FROM system.main.duckdb_tables() WHERE NOT temporary AND schema_name = 'main' "
            "AND database_name = system.main.current_database()").fetchall())
        expected = _expected_sql()[1]
        return all(table in expected and found.get(table) == expected[table] for table in TABLES)

    @staticmethod
    def _view_problems(con: duckdb.DuckDBPyConnection) -> list[str]:
        """Views are part of what is verified: each must be defined exactly as this code defines it.
        The catalog is read through system.main's functions: a table macro stored in the file
        under a catalog function's name (duckdb_functions, say) would otherwise answer for it."""
        found = {r[0]: r[1] for r in con.execute(
            "SELECT view_name, sql FROM system.main.duckdb_views() WHERE NOT internal").fetchall()}
        expected = _expected_view_sql()
        out = []
        for name, sql in expected.items():
            if name not in found:
                out.append(f"view {name} is missing")
            elif found[name] != sql and found[name] not in _PREVIOUS_VIEW_SQL.get(name, ()):
                out.append(f"view {name} is not defined as the code defines it (changed behind the ledger)")
        # A view's text is only as good as the names in it: a macro or function stored in the file
        # (none is ever created by this code) can shadow one the views call (row_number, say).
        for name, kind, schema in con.execute(
                "SELECT function_name, function_type, schema_name FROM system.main.duckdb_functions() "
                "WHERE NOT internal ORDER BY function_name").fetchall():
            out.append(f"{kind} {schema}.{name} was created behind the ledger (it can change what the views compute)")
        for (schema,) in con.execute("SELECT schema_name FROM system.main.duckdb_schemas() WHERE NOT internal "
                                     "ORDER BY schema_name").fetchall():
            out.append(f"schema {schema} was created behind the ledger")
        return out

    def verify_or_raise(self, expect: Head | None = None) -> VerifyReport:
        report = self.verify(expect)
        if not report.ok:
            raise LedgerIntegrityError("; ".join(report.problems))
        return report


_VIEW_SQL: dict[str, str] = {}
_TABLE_SQL: dict[str, str] = {}
_PREVIOUS_VIEW_SQL: dict[str, tuple[str, ...]] = {}  # PREVIOUS_VIEWS as DuckDB stores them: verify accepts those


def _expected_sql() -> tuple[dict[str, str], dict[str, str]]:
    """Each view's and each table's definition as DuckDB stores it, made once in an empty
    in-memory ledger (and the views' previous texts, _PREVIOUS_VIEW_SQL)."""
    if not _VIEW_SQL:
        con = duckdb.connect(":memory:")
        try:
            Ledger._ensure_schema(con)
            _TABLE_SQL.update(con.execute("SELECT table_name, sql FROM duckdb_tables()").fetchall())
            views = {r[0]: r[1] for r in con.execute(
                "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal").fetchall()}
            previous: dict[str, tuple[str, ...]] = {}
            for name, texts in PREVIOUS_VIEWS.items():
                for text in texts:
                    con.execute(f"CREATE OR REPLACE VIEW {name} AS {text}")
                    previous[name] = (*previous.get(name, ()), con.execute(
                        "SELECT sql FROM duckdb_views() WHERE view_name = ?", [name]).fetchone()[0])
            _PREVIOUS_VIEW_SQL.update(previous)
            _VIEW_SQL.update(views)
        finally:
            con.close()
    return _VIEW_SQL, _TABLE_SQL


def _expected_view_sql() -> dict[str, str]:
    """Each view's definition as DuckDB stores it, made once in an empty in-memory ledger."""
    return _expected_sql()[0]
