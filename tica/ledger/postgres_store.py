"""The ledger on a Postgres server, for runs on many nodes: the same tables, hash chain, views and
verbs as the DuckDB ledger (tica.ledger.duckdb_store), selected by a `postgresql://` address wherever
a ledger path is taken (`--ledger`, TICA_LEDGER; tica.ledger.store.open_ledger).

- Appends: one transaction each, holding a transaction-level advisory lock on the chain's head,
  so writers on any number of hosts extend one chain in turn (bounded wait, LedgerLockTimeout).
- Reads a person types (`tica ledger query`) run in a read-only transaction as the role
  `tica_reader` (SELECT on the ledger's tables and views, nothing else: no server file access),
  which `init` creates, with `tica_writer` (SELECT and INSERT only): whoever runs `init` owns the
  schema, and a writer's login made a member of `tica_writer` alone cannot change it
  (docs/deployment.md).
- Verify recomputes the chain (tica.ledger.chain.verify_entries) and compares each view's stored
  definition with the definition Postgres gives the code's SQL, made as temporary views in a
  transaction that is rolled back. With TICA_VERIFY_IN_DB=1 the chain is re-hashed by the server
  first (PostgresSql, tica.ledger.in_db.in_db_report), Python re-verifying any chain with a row out of
  place (off by default: slower than the Python path so far, IN_DB_DEFAULT).

Rows hash exactly as in DuckDB (text and integer columns only), so `tica ledger export/import`
moves a chain between the two stores with every hash kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from operator import itemgetter
from typing import Any

from tica.errors import InputError, LedgerIntegrityError
from tica.ledger import batches, parallel
from tica.ledger.chain import GENESIS, Head, VerifyReport, extend_chain, merge_chain, verify_entries
from tica.ledger.connect import connect_postgres, psycopg_module, redacted
from tica.ledger.in_db import DuckDBSql, in_db_enabled, in_db_report
from tica.ledger.interface import QUERY_MAX_ROWS, LedgerLockTimeout, LedgerMissing, QueryRefused
from tica.ledger.rows import by_table, checked_payload, gc_paused, table_stream
from tica.ledger.schema import (CHAIN_COLUMNS, INDEXES, TABLES, TRACK_VERDICTS_SQL, VERIFY_CHUNK_ROWS, VIEWS,
                                dropped_tables, insert_sql)

READER_ROLE = "tica_reader"
# Appending needs SELECT and INSERT, nothing else: a login that is only a member of this role cannot
# add a rule, a trigger or a policy (each needs ownership), nor UPDATE, DELETE or DROP anything.
WRITER_ROLE = "tica_writer"
# What init grants each role on every ledger relation (tables and views), and all verify accepts.
ROLE_GRANTS = {READER_ROLE: ("LOGIN", ("SELECT",)), WRITER_ROLE: ("NOLOGIN", ("SELECT", "INSERT"))}
# SQL a person types runs for at most this long (under the writers' 30 s lock timeout, so a reader
# holding their lock cannot make a writer give up); at most QUERY_MAX_ROWS rows (tica.ledger.interface).
QUERY_TIMEOUT_S = 10.0
_LOCK_KEY = 7_315_063_431  # the advisory lock every writer takes before it reads the head

# DuckDB's dialect where Postgres has none: any_value (Postgres 16+), and SELECT * EXCLUDE in the
# previous track_verdicts text.
_TRACK_VERDICT_COLUMNS = ("track, candidate_id, item, verdict, summary, question_hash, judge_version, verdict_seq, "
                          "verdict_id, stale_cause, failed_checks, after_the_fact, checks, stale")
PG_VIEWS: dict[str, str] = dict(VIEWS) | {
    "candidate_tracks": """
        SELECT candidate_id, (array_agg(track ORDER BY seq))[1] AS track, min(seq) AS first_seq
        FROM candidates GROUP BY candidate_id""",
}
# A view's earlier text on Postgres, the same rows (tested): verify accepts it (tica.ledger.schema's
# PREVIOUS_VIEWS are DuckDB's) until the owner's next write re-creates the views (it finds the index
# INDEXES gained with the new text missing) or `init` does.
PG_PREVIOUS_VIEWS: dict[str, tuple[str, ...]] = {
    "track_verdicts": (f"""
        SELECT {_TRACK_VERDICT_COLUMNS} FROM (
            SELECT c.*, row_number() OVER (PARTITION BY track, item ORDER BY verdict_seq DESC) AS rn
            FROM current_verdicts c) latest WHERE rn = 1""",),
}
_PG_TYPES = {"VARCHAR": "TEXT", "BIGINT": "BIGINT"}
_PG_TYPE_OIDS = {"VARCHAR": 25, "BIGINT": 20}  # pg_catalog.text, pg_catalog.int8: fixed in every Postgres
# Whether verify re-hashes on the server when TICA_VERIFY_IN_DB is unset: not yet. At 100,000
# verdicts on a 2-core host the server's SQL (a body built by ~50 expressions per row, the regex
# test, sha256) took 12.8 s where the Python path took 10.1 s (benchmarks/ledger_growth.py, `in-db`).
IN_DB_DEFAULT = False


class PostgresSql(DuckDBSql):
    """The in-database verify's pieces in Postgres's SQL: every function and operator named in
    pg_catalog (a function or operator in another schema cannot stand in for one), every text
    value compared and matched in the "C" collation (byte for byte, whatever a column's)."""

    fn = "pg_catalog."

    def literal(self, text: str) -> str:
        return f"CAST({super().literal(text)} AS pg_catalog.text)"

    def text(self, expr: str) -> str:
        return f'({expr} COLLATE pg_catalog."C")'

    def printable(self, expr: str) -> str:
        return f"({expr} OPERATOR(pg_catalog.~) CAST('^[ -~]*$' AS pg_catalog.text))"

    def int_text(self, expr: str) -> str:
        return f"pg_catalog.textin(pg_catalog.int8out({expr}))"  # no cast: a cast can be created

    def sha256_hex(self, expr: str) -> str:
        return f"pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to({expr}, 'UTF8')), 'hex')"

    def eq(self, a: str, b: str) -> str:
        return f"({a} OPERATOR(pg_catalog.=) {b})"


def portable(sql: str, params: Sequence[Any] | None) -> tuple[str, Sequence[Any] | None]:
    """TICA's SQL takes DuckDB's `?` placeholders; psycopg takes `%s` (and `%` doubled) when
    there are parameters. Quoted text and identifiers are left as they are."""
    if not params:
        return sql, None
    out, quote = [], None
    for ch in sql:
        if quote:
            quote = None if ch == quote else quote
            out.append("%%" if ch == "%" else ch)
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        else:
            out.append("%s" if ch == "?" else "%%" if ch == "%" else ch)
    return "".join(out), params


class PostgresLedger:
    """Append-only access to the ledger in one Postgres database (its `public` schema)."""

    def __init__(self, dsn: str, lock_timeout_s: float = 30.0) -> None:
        self.dsn = dsn
        self.path = redacted(dsn)  # what messages and Dagster metadata name: never a password
        self.lock_timeout_s = lock_timeout_s
        self._reading: Any = None  # reading(): one read-only transaction for a burst of reads

    # -- connections -----------------------------------------------------------------
    def _connect(self, **kw: Any) -> Any:
        return connect_postgres(self.dsn, **kw)

    @contextmanager
    def reader(self, sandboxed: bool = False) -> Iterator[Any]:
        """A read-only transaction; `sandboxed` runs it as the role tica_reader."""
        con = self._connect(**({"user": READER_ROLE} if sandboxed else {}))
        try:
            if sandboxed:  # session-wide, before the transaction: a typed COMMIT cannot shed it
                con.execute(f"SET statement_timeout = '{int(QUERY_TIMEOUT_S * 1000)}ms'")
                con.commit()
            con.execute("SET TRANSACTION READ ONLY")
            yield con
        finally:
            con.rollback()
            con.close()

    # -- schema ----------------------------------------------------------------------
    def _has_schema(self, con) -> bool:
        views, indexes = con.execute(
            "SELECT (SELECT count(*) FROM information_schema.views WHERE table_schema = 'public' "
            "AND table_name = ANY(%s)), (SELECT count(*) FROM pg_indexes WHERE schemaname = 'public' "
            "AND indexname = ANY(%s))", [list(PG_VIEWS), list(INDEXES)]).fetchone()
        return views == len(PG_VIEWS) and indexes == len(INDEXES)

    def init(self) -> "PostgresLedger":
        psycopg = psycopg_module()
        try:
            self._create_schema()
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.InvalidSchemaName) as err:
            raise LedgerMissing(f"{self.path}: no ledger in this database, and this login may not create one "
                                f"({str(err).splitlines()[0]}): make the first write as the schema's owner") from None
        return self

    def _create_schema(self) -> None:
        with self._connect() as con:
            con.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
            for table, columns in TABLES.items():
                cols = ", ".join(f"{n} {_PG_TYPES[t]}" for n, t in columns)
                con.execute(f"CREATE TABLE IF NOT EXISTS {table} (seq BIGINT PRIMARY KEY, prev_hash TEXT NOT NULL, "
                            f"row_hash TEXT NOT NULL, recorded_at TEXT NOT NULL, {cols})")
            for name, sql in PG_VIEWS.items():
                con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
            for name, on in INDEXES.items():  # a ledger made before them gains them here
                con.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {on}")
            for role, (login, grants) in ROLE_GRANTS.items():
                if not con.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone():
                    con.execute(f"CREATE ROLE {role} {login} NOSUPERUSER NOCREATEDB NOCREATEROLE")
                con.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
                con.execute(f"GRANT {', '.join(grants)} ON ALL TABLES IN SCHEMA public TO {role}")

    def require_exists(self) -> "PostgresLedger":
        with self._connect() as con:
            if not self._has_schema(con):
                raise LedgerMissing(f"{self.path}: no ledger in this database (run a writer or `init` first)")
        return self

    # -- appending -------------------------------------------------------------------
    def append(self, table: str, row: Mapping[str, Any]) -> int:
        return self.append_many([(table, row)])[0]

    def append_many(self, rows: Sequence[tuple[str, Mapping[str, Any]]]) -> list[int]:
        return self.check_and_append(lambda _: list(rows))[1]

    def check_and_append(self, decide: Callable[[Callable[..., list[dict[str, Any]]]], Sequence[tuple[str, Mapping[str, Any]]]]
                         ) -> tuple[Any, list[int]]:
        """As Ledger.check_and_append: `decide(rows)` reads and returns the rows to append, in one
        transaction under the head's lock."""
        psycopg = psycopg_module()
        with self._connect() as con:
            if not self._has_schema(con):
                con.commit()
                self.init()
            con.execute(f"SET LOCAL lock_timeout = '{int(self.lock_timeout_s * 1000)}ms'")
            try:
                con.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
            except psycopg.errors.LockNotAvailable:
                raise LedgerLockTimeout(f"{self.path}: another writer has held the ledger for more than "
                                        f"{self.lock_timeout_s:g} s; nothing was written") from None

            def rows(sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
                cur = con.execute(*portable(sql, params))
                cols = [d.name for d in cur.description] if cur.description else []
                return [dict(zip(cols, r)) for r in cur.fetchall()]

            wanted = decide(rows)
            with gc_paused(len(wanted)):
                prepared = [(table, checked_payload(table, row)) for table, row in wanted]
                if wanted and (hidden := _write_hazards(con)):
                    raise LedgerIntegrityError(f"{self.path}: {hidden[0]}: a write could be dropped or changed unseen; "
                                               "nothing was written")
                head = con.execute("SELECT seq, row_hash FROM ledger_chain ORDER BY seq DESC LIMIT 1").fetchone()
                chained = extend_chain((head[0], head[1]) if head else (0, GENESIS), prepared)
                _insert_rows(con, chained)
            if chained:  # the head this transaction wrote, read back before anything is acknowledged
                last = chained[-1][1]
                back = con.execute("SELECT seq, row_hash FROM ledger_chain ORDER BY seq DESC LIMIT 1").fetchone()
                if back is None or (back[0], back[1]) != (last["seq"], last["row_hash"]):
                    raise LedgerIntegrityError(f"{self.path}: wrote seq {last['seq']} but the store's head reads "
                                               f"{'nothing' if back is None else f'seq {back[0]}'}; nothing was written")
        return wanted, [chain["seq"] for _, chain, _ in chained]

    def insert_chain(self, rows: Iterable[tuple[str, Mapping[str, Any], Mapping[str, Any]]]) -> None:
        """As Ledger.insert_chain: a whole chain checked elsewhere, into a ledger with no rows."""
        self.init()
        with self._connect() as con:
            con.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
            held = con.execute("SELECT count(*) FROM ledger_chain").fetchone()[0]
            if held:
                raise InputError(self.path, "<ledger>", f"holds {held} rows: a chain is imported whole into an empty "
                                 "ledger, never merged into another")
            for table, chain, payload in rows:
                _insert(con, table, chain, payload)

    # -- reading ---------------------------------------------------------------------
    @contextmanager
    def reading(self) -> Iterator["PostgresLedger"]:
        """As Ledger.reading: one read-only REPEATABLE READ transaction (one snapshot) for a burst
        of reads."""
        if self._reading is not None:
            yield self
            return
        with self.reader() as con:
            con.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            self._reading = con
            try:
                yield self
            finally:
                self._reading = None

    def query(self, sql: str, params: Sequence[Any] | None = None, sandboxed: bool = False) -> tuple[list[str], list[tuple]]:
        if self._reading is not None and not sandboxed:
            cur = self._reading.execute(*portable(sql, params))
            return ([d.name for d in cur.description] if cur.description else []), cur.fetchall()
        with self.reader(sandboxed=sandboxed) as con:
            if sandboxed and params is None:
                # a prepared statement holds exactly one statement: "COMMIT; ..." is refused by the server
                cur = con.execute(sql.replace("%", "%%"), prepare=True)
                rows = cur.fetchmany(QUERY_MAX_ROWS + 1)
                if len(rows) > QUERY_MAX_ROWS:
                    raise QueryRefused(f"the query returns more than {QUERY_MAX_ROWS} rows: narrow it (WHERE, LIMIT)")
                return ([d.name for d in cur.description] if cur.description else []), rows
            cur = con.execute(*portable(sql, params))
            columns = [d.name for d in cur.description] if cur.description else []
            return columns, cur.fetchall()

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        columns, rows = self.query(sql, params)
        return [dict(zip(columns, r)) for r in rows]

    def track_verdicts(self, track: str) -> list[dict[str, Any]]:
        """As Ledger.track_verdicts: `SELECT * FROM track_verdicts WHERE track = ?`'s rows, track-first."""
        return self.rows(TRACK_VERDICTS_SQL, [track])

    @staticmethod
    def chain_entries(con) -> list[tuple[int, str, str, str, str, tuple]]:
        entries: list[tuple[int, str, str, str, str, tuple]] = []
        for table, columns in TABLES.items():
            names = [n for n, _ in columns]
            cur = con.execute(f"SELECT {', '.join((*CHAIN_COLUMNS, *names))} FROM {table}")
            entries += [(r[0], table, r[1], r[2], r[3], tuple(r[4:])) for r in cur.fetchall()]
        entries.sort(key=lambda e: e[0])
        return entries

    @staticmethod
    @contextmanager
    def streamed_chain_entries(con, chunk_rows: int = VERIFY_CHUNK_ROWS) -> Iterator[Iterator[tuple]]:
        """As Ledger.streamed_chain_entries: a server-side cursor per table (in the connection's
        transaction), each read in seq order `chunk_rows` rows at a time, merged by seq."""
        cursors = [con.cursor(name=f"tica_chain_{table}") for table in TABLES]
        try:
            yield merge_chain([table_stream(cur, table, chunk_rows) for cur, table in zip(cursors, TABLES)])
        finally:
            for cur in cursors:
                cur.close()

    def verify(self, expect: Head | None = None, in_db: bool | None = None) -> VerifyReport:
        """As Ledger.verify: the chain re-hashed by the server first when `in_db` (else
        TICA_VERIFY_IN_DB, else IN_DB_DEFAULT) says so, on a ledger with no problem in its views,
        functions or search path and every table's columns of the code's types; anything else, or
        any row out of place there, verified in Python."""
        with self._connect() as con:
            try:  # one snapshot for every table's cursor, whatever other writers append meanwhile
                con.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                present = {t for (t,) in con.execute(
                    "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = 'public'").fetchall()}
                if missing := dropped_tables(present):
                    return VerifyReport(rows=0, head_hash="", problems=missing)
                views = _view_problems(con)
                if not views and in_db_enabled(in_db, IN_DB_DEFAULT) and _tables_as_created(con):
                    con.execute("SET LOCAL jit = off")  # compiling the bodies' expressions costs more than it saves
                    report = in_db_report(lambda sql: con.execute(sql).fetchall(), PostgresSql(), expect)
                    if report is not None:
                        return report
                workers = parallel.verify_workers(con)
                if batches.batches_enabled():  # in batches of columns, ranges in processes (on this snapshot) when large
                    snapshot = con.execute("SELECT pg_export_snapshot()").fetchone()[0]
                    report = parallel.verify_batches("postgres", con, self.dsn, expect, views, workers, snapshot)
                    if report is not None:
                        return report
                if workers > 1:  # ranges re-hashed in processes of their own, all on this snapshot
                    return parallel.verify_postgres(self.dsn, con, expect, views, workers)
                with self.streamed_chain_entries(con) as entries:
                    return verify_entries(entries, expect, views)
            finally:
                con.rollback()

    def verify_or_raise(self, expect: Head | None = None) -> VerifyReport:
        report = self.verify(expect)
        if not report.ok:
            raise LedgerIntegrityError("; ".join(report.problems))
        return report

    @contextmanager
    def session(self) -> Iterator["PostgresLedger"]:
        """Each append is its own locked transaction here: a session needs no connection of its own."""
        yield self


def _insert_rows(con, chained: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]]) -> None:
    """Chained rows (extend_chain's) into their tables, each table's in seq order: a table's single
    row by INSERT, its several by one COPY (a statement per row was most of a batch's time: 0.21x a
    plain executemany at 10,000 rows), each statement's stored count checked. COPY fires triggers
    and ignores rules; neither may exist when this runs (_write_hazards), and one that did could only
    store fewer rows, which the count names."""
    for table, run in by_table(chained).items():
        if len(run) == 1:
            _insert(con, table, *run[0])
            continue
        names = [n for n, _ in TABLES[table]]
        payload_of, chain_of = itemgetter(*names), itemgetter(*CHAIN_COLUMNS)
        cur = con.cursor()
        with cur.copy(f"COPY {table} ({', '.join((*CHAIN_COLUMNS, *names))}) FROM STDIN") as copy:
            for chain, payload in run:
                if len(payload) != len(names):  # checked_payload's: every column, nothing else
                    raise LedgerIntegrityError(f"{table} seq {chain['seq']}: not a checked payload; nothing was written")
                values = payload_of(payload)
                copy.write_row((*chain_of(chain), *(values if len(names) > 1 else (values,))))
        if cur.rowcount != len(run):  # a BEFORE trigger returning NULL
            raise LedgerIntegrityError(f"{table} seqs {run[0][0]['seq']} to {run[-1][0]['seq']}: the store took "
                                       f"{len(run)} rows but stored {cur.rowcount}; nothing was written")


def _insert(con, table: str, chain: Mapping[str, Any], payload: Mapping[str, Any]) -> None:
    cur = con.execute(insert_sql(table, payload, "%s"), [*(chain[c] for c in CHAIN_COLUMNS), *payload.values()])
    if cur.rowcount != 1:  # a rule DO INSTEAD NOTHING, a BEFORE trigger returning NULL
        raise LedgerIntegrityError(f"{table} seq {chain['seq']}: the store took the insert but stored {cur.rowcount} "
                                   "rows; nothing was written")


def _write_hazards(con) -> list[str]:
    """What on the ledger's tables could drop, divert, hide or fill in a row: rules, triggers,
    row-level security and its policies, column defaults (read from pg_catalog, whatever the search
    path). The code creates none of them."""
    names = list(TABLES)
    out = [f"rule {rule} on {table}" for table, rule in con.execute(
        "SELECT c.relname, r.rulename FROM pg_catalog.pg_rewrite r JOIN pg_catalog.pg_class c ON c.oid = r.ev_class "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relname = ANY(%s) "
        "AND r.rulename <> '_RETURN' ORDER BY 1, 2", [names]).fetchall()]
    out += [f"trigger {trigger} on {table}" for table, trigger in con.execute(
        "SELECT c.relname, t.tgname FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relname = ANY(%s) "
        "AND NOT t.tgisinternal ORDER BY 1, 2", [names]).fetchall()]
    out += [f"row-level security on {table}" for (table,) in con.execute(
        "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relname = ANY(%s) AND (c.relrowsecurity OR c.relforcerowsecurity) "
        "ORDER BY 1", [names]).fetchall()]
    out += [f"policy {policy} on {table}" for table, policy in con.execute(
        "SELECT tablename, policyname FROM pg_catalog.pg_policies WHERE schemaname = 'public' "
        "AND tablename = ANY(%s) ORDER BY 1, 2", [names]).fetchall()]
    # init declares no default: one fills a column an append leaves out with a value no writer chose
    out += [f"default on {table}.{column}" for table, column in con.execute(
        "SELECT c.relname, a.attname FROM pg_catalog.pg_attrdef d JOIN pg_catalog.pg_class c ON c.oid = d.adrelid "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' "
        "AND c.relname = ANY(%s) ORDER BY 1, 2", [names]).fetchall()]
    return out


def _grant_problems(con) -> list[str]:
    """Each privilege on a ledger relation that init did not grant (to another role, to PUBLIC, or
    more than SELECT/INSERT to the ledger's roles), and each relation owned by another role than the
    one owning ledger_chain (the schema's owner): read from the relations' ACLs in pg_catalog."""
    names = [*TABLES, *PG_VIEWS]
    out: list[str] = []
    owners = dict(con.execute(
        "SELECT c.relname, pg_catalog.pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' "
        "AND c.relname = ANY(%s)", [names]).fetchall())
    owner = owners.get("ledger_chain")
    out += [f"{rel} is owned by {who}, not by {owner}, the ledger's owner" for rel, who in sorted(owners.items())
            if who != owner]
    for rel, grantee, privilege in con.execute(
            "SELECT c.relname, CASE WHEN a.grantee = 0 THEN 'PUBLIC' "
            "ELSE pg_catalog.pg_get_userbyid(a.grantee) END, a.privilege_type "
            "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) a "
            "WHERE n.nspname = 'public' AND c.relname = ANY(%s) ORDER BY 1, 2, 3", [names]).fetchall():
        if grantee != owners.get(rel) and privilege not in ROLE_GRANTS.get(grantee, ("", ()))[1]:
            out.append(f"{privilege} on {rel} was granted to {grantee} behind the ledger")
    return out


def _tables_as_created(con) -> bool:
    """Whether every table is a plain table in public whose chain and payload columns have the
    code's types (text, bigint; a domain or another type is not): what the in-database verify's
    SQL assumes of each column."""
    found: dict[str, dict[str, int]] = {}
    for table, column, type_oid in con.execute(
            "SELECT c.relname, a.attname, a.atttypid::pg_catalog.int8 FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace "
            "JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) c.oid "
            "WHERE n.nspname OPERATOR(pg_catalog.=) 'public' AND c.relkind OPERATOR(pg_catalog.=) 'r' "
            "AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped").fetchall():
        found.setdefault(table, {})[column] = type_oid
    for table, columns in TABLES.items():
        wanted = {"seq": "BIGINT", **{c: "VARCHAR" for c in CHAIN_COLUMNS[1:]}, **dict(columns)}
        have = found.get(table, {})
        if any(have.get(name) != _PG_TYPE_OIDS[kind] for name, kind in wanted.items()):
            return False
    return True


def _stored_definition(con, name: str, sql: str) -> str:
    """The definition Postgres stores for a view of `sql`: made as a temporary view (the caller's
    transaction is rolled back)."""
    con.execute(f"CREATE TEMP VIEW tica_expected_{name} AS {sql}")
    return con.execute("SELECT pg_catalog.pg_get_viewdef(%s::pg_catalog.regclass)",
                       [f"tica_expected_{name}"]).fetchone()[0]


def _view_problems(con) -> list[str]:
    """Each view must be defined as the code defines it: its stored definition against the one
    Postgres gives the code's SQL as a temporary view (rolled back by the caller). The catalog is
    read as pg_catalog's, whatever the search path puts before it."""
    found = dict(con.execute(
        "SELECT viewname, definition FROM pg_catalog.pg_views WHERE schemaname = 'public'").fetchall())
    out = [f"{hazard} was created behind the ledger (it can drop, change or hide rows)" for hazard in _write_hazards(con)]
    out += _grant_problems(con)
    for name, sql in PG_VIEWS.items():
        if name not in found:
            out.append(f"view {name} is missing")
            continue
        if found[name] != _stored_definition(con, name, sql) and not any(
                found[name] == _stored_definition(con, f"{name}_{k}", earlier)
                for k, earlier in enumerate(PG_PREVIOUS_VIEWS.get(name, ()))):
            out.append(f"view {name} is not defined as the code defines it (changed behind the ledger)")
    # Names the views and the verify's reads resolve: a function (or operator) added in a user schema
    # can shadow one they call, and a schema that shadows public on the search path its tables.
    for schema, name in con.execute(
            "SELECT n.nspname, p.proname FROM pg_catalog.pg_proc p "
            "JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%' "
            "ORDER BY 1, 2").fetchall():
        out.append(f"function {schema}.{name} was created behind the ledger (it can change what the views compute)")
    for (schema,) in con.execute(
            "SELECT s FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) AS s WHERE s <> 'public' "
            "ORDER BY 1").fetchall():
        out.append(f"schema {schema} is on the search path before or beside public: its tables would be read "
                   "in place of the ledger's")
    return out

