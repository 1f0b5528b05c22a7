"""Verify re-hashes the chain in the database first (tica.ledger.in_db.in_db_report; DuckDB's and Postgres's
SQL: DuckDBSql, PostgresSql) and Python stays the authority. The rules, each with the way it must fail:

- the SQL body is `_body` byte for byte for printable-ASCII rows, and NULL for any other row (never a
  guessed escape);
- the report is the Python path's, problem for problem, intact or tampered, with or without a head;
  on anything out of place the SQL declines (Python names the problem);
- a row re-hashed with a body that is not the spec's (an unescaped quote, a raw newline) is caught;
- nothing stored in the ledger can change what the SQL computes: a macro or function named like one
  it calls fails verify, and a table not defined as the code defines it is verified in Python."""

from __future__ import annotations

import hashlib

import duckdb
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.ledger_templates import copied
from tests.core.test_ledger_fast_verify import _every_kind, _reference, _tamper
from tests.postgres_server import pg_dsn, postgres_server  # noqa: F401  (fixtures)
from tica.ledger import (GENESIS, TABLES, DuckDBSql, Head, Ledger, PostgresLedger, PostgresSql, body_sql,
                         in_db_chain_sql, in_db_enabled, in_db_report, insert_sql, row_hash, verify_entries)
from tica.ledger.chain import _body, _now, _quote
from tica.ledger.postgres_store import _tables_as_created, _view_problems

# ----------------------------------------------------------------------------------- the SQL body
_printable = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
_escapes = st.text(alphabet='"\\/ a{}:,\'', max_size=12)  # quotes, backslashes and JSON's own characters
_clean = st.one_of(st.none(), st.just(""), _printable, _escapes)
_bigint = st.one_of(st.none(), st.sampled_from([0, -1, 1, 2**63 - 1, -(2**63)]), st.integers(-(2**63), 2**63 - 1))
# One character outside 0x20-0x7E: control characters, DEL, beyond ASCII (no NUL: Postgres text holds none,
# no lone surrogate: neither store holds one).
_odd_char = st.one_of(st.characters(min_codepoint=1, max_codepoint=0x1F), st.just("\x7f"),
                      st.characters(min_codepoint=0x80, blacklist_categories=("Cs",)))
_dirty = st.tuples(_printable, _odd_char, _printable).map("".join)
_at = st.one_of(st.just(_now()), _printable, _escapes)


def _values(data, table: str) -> list:
    return [data.draw(_bigint if kind == "BIGINT" else _clean) for _, kind in TABLES[table]]


def _sql_body(con, sql: DuckDBSql, placeholder: str, table: str, seq: int, at: str, values: list):
    """The body the store's SQL makes of one row of `table` holding these values."""
    payload = dict(zip((n for n, _ in TABLES[table]), values))
    con.execute(f"DELETE FROM {table}")
    con.execute(insert_sql(table, payload, placeholder), [seq, "p", "h", at, *values])
    (body,), = con.execute(f"SELECT body FROM ({body_sql(sql, table)}) b").fetchall()
    return body


@pytest.fixture(scope="module")
def duck_con():
    con = duckdb.connect(":memory:")
    Ledger._ensure_schema(con)
    yield con
    con.close()


@pytest.fixture(scope="module")
def pg_con(postgres_server):  # noqa: F811
    import uuid

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(f"{postgres_server}/postgres", autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    dsn = f"{postgres_server}/{name}"
    PostgresLedger(dsn).init()
    con = psycopg.connect(dsn, autocommit=True)
    yield con
    con.close()


_STORES = [("duckdb", DuckDBSql(), "?"), ("postgres", PostgresSql(), "%s")]
# the Postgres variant starts the session's Postgres server: marked as the postgres_server fixture's users are
# (tests/conftest.py), so `scripts/test.sh --fast` leaves it to the full run
_STORE_PARAMS = [pytest.param(*s, id=s[0], marks=[pytest.mark.postgres] if s[0] == "postgres" else []) for s in _STORES]


@pytest.mark.parametrize("store,sql,placeholder", _STORE_PARAMS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.sampled_from(sorted(TABLES)), seq=st.one_of(st.integers(0, 2**63 - 1), st.integers(-(2**63), -1)),
       at=_at, data=st.data())
def test_the_sql_body_is_body_byte_for_byte_for_printable_rows(request, store, sql, placeholder, table, seq, at, data):
    con = request.getfixturevalue("duck_con" if store == "duckdb" else "pg_con")
    values = _values(data, table)
    want = _body(table, seq, at, dict(zip((n for n, _ in TABLES[table]), values)))
    assert _sql_body(con, sql, placeholder, table, seq, at, values) == want


@pytest.mark.parametrize("store,sql,placeholder", _STORE_PARAMS)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.sampled_from(sorted(TABLES)), data=st.data())
def test_the_sql_body_is_null_for_a_row_with_any_other_text(request, store, sql, placeholder, table, data):
    con = request.getfixturevalue("duck_con" if store == "duckdb" else "pg_con")
    values = _values(data, table)
    texts = [k for k, (_, kind) in enumerate(TABLES[table]) if kind == "VARCHAR"]
    at = _now()
    where = data.draw(st.sampled_from([*texts, "recorded_at"]))
    dirty = data.draw(_dirty)
    if where == "recorded_at":
        at = dirty
    else:
        values[where] = dirty
    assert _sql_body(con, sql, placeholder, table, 7, at, values) is None
    # negative control: the same row with that value printable has a body
    if where == "recorded_at":
        at = _now()
    else:
        values[where] = "printable"
    assert _sql_body(con, sql, placeholder, table, 7, at, values) is not None


def test_the_sql_for_every_table_calls_builtins_by_their_qualified_names():
    """The names a macro or function stored in the ledger could take over are qualified."""
    for sql, qualifier in ((DuckDBSql(), "system.main."), (PostgresSql(), "pg_catalog.")):
        text = in_db_chain_sql(sql, 3)
        for name in ("sha256", "replace", "concat", "chr", "row_number", "lag", "lead", "count", "max"):
            assert f"{qualifier}{name}(" in text
            assert f" {name}(" not in text and f"({name}(" not in text, (qualifier, name)
        assert "||" not in text  # an operator a macro can take over: concatenation is concat()
        assert "\\" not in text  # a backslash is chr(92): no string-literal setting can change it
    assert " = " not in in_db_chain_sql(PostgresSql(), 3)  # Postgres: OPERATOR(pg_catalog.=)


# ----------------------------------------------------------------------------------- DuckDB
def _fill(ledger: Ledger) -> None:
    for _ in range(2):
        _every_kind(ledger)  # text beyond ASCII and control characters: rows Python hashes
    ledger.append_many([("reruns", {"rerun_id": f"r{i}", "original_kind": "leg", "original_id": "a",
                                    "new_id": 'b "quoted" \\ back', "reason": ""}) for i in range(5)])


def _filled(tmp_path) -> Ledger:
    """A copy of the filled ledger at tmp_path/l.duckdb (tests/core/ledger_templates.py: filled once)."""
    return copied(tmp_path / "l.duckdb", "in-db-filled", _fill)


def _duck_fast(ledger: Ledger, expect: Head | None = None):
    """The in-database report alone (None: the SQL declined), and how many rows Python hashed."""
    with ledger.reader() as con:
        in_python = sum(con.execute(in_db_chain_sql(DuckDBSql(), None)).fetchone()[5:])
        return in_db_report(lambda q: con.execute(q).fetchall(), DuckDBSql(), expect), in_python


_HEADS = (None, Head(seq=0, row_hash=GENESIS, recorded_at=""), Head(seq=3, row_hash="0" * 64, recorded_at=""),
          Head(seq=10_000, row_hash="0" * 64, recorded_at=""))


def test_an_intact_ledger_is_verified_in_the_database_with_the_python_report(tmp_path):
    ledger = _filled(tmp_path)
    head = ledger.verify(in_db=False).head
    for expect in (*_HEADS, head):
        fast, in_python = _duck_fast(ledger, expect)
        assert fast is not None and in_python > 0  # the SQL ran, and left the rows beyond ASCII to Python
        on, off = ledger.verify(expect, in_db=True), ledger.verify(expect, in_db=False)
        assert fast == on == off == _reference(ledger, expect)
    assert ledger.verify(head, in_db=True).ok and not ledger.verify(_HEADS[2], in_db=True).ok


def test_an_empty_ledger_verifies_the_same_both_ways(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    assert _duck_fast(ledger)[0] == ledger.verify(in_db=False) == _reference(ledger)
    assert ledger.verify(in_db=True).rows == 0


_EDITS = [
    ["UPDATE legs SET status = 'sealed!' WHERE leg_id = 'l1'"],
    ["UPDATE reruns SET new_id = 'b \"quoted\" / back' WHERE rerun_id = 'r2'"],  # a printable row: SQL's to see
    ["UPDATE reruns SET reason = 'ü' WHERE rerun_id = 'r3'"],  # now beyond ASCII: Python's to see
    ["DELETE FROM receipts"],
    ["DELETE FROM reruns WHERE rerun_id = 'r4'"],  # the tail: only a head sees it
    ["UPDATE checks SET prev_hash = 'x'"],
    ["UPDATE reruns SET row_hash = upper(row_hash) WHERE rerun_id = 'r1'"],
    ["UPDATE reruns SET seq = seq + 1000 WHERE rerun_id = 'r0'"],
    ["INSERT INTO reruns (seq, prev_hash, row_hash, recorded_at, rerun_id) VALUES (2, 'p', 'h', 't', 'r')",
     "INSERT INTO reruns (seq, prev_hash, row_hash, recorded_at, rerun_id) VALUES (0, 'p', 'h', 't', 'r0')"],
    ["INSERT INTO components (seq, prev_hash, row_hash, recorded_at) VALUES (1000, 'p', 'h', 't')"],
    ["CREATE OR REPLACE VIEW track_verdicts AS SELECT 'x' AS track"],
]


@pytest.mark.parametrize("edit", _EDITS)
def test_a_tampered_ledger_gets_the_python_report_with_the_in_db_path_on(tmp_path, edit):
    ledger = _filled(tmp_path)
    head = ledger.verify().head
    _tamper(ledger.path, *edit)
    for expect in (*_HEADS, head):
        on, off = ledger.verify(expect, in_db=True), ledger.verify(expect, in_db=False)
        assert on == off == _reference(ledger, expect)
        if expect is head:
            assert not on.ok
    if edit[0].startswith(("UPDATE", "INSERT")) and "VIEW" not in edit[0]:
        assert _duck_fast(ledger)[0] is None  # a row out of place: the SQL declines, Python names it


def _forge_last(con_execute, fetch_one, table: str, column: str, value: str, spec: bool) -> int:
    """Set `column` of `table`'s last row (the chain's last) to `value` and re-hash that row: with the
    spec's body, or with one that writes the value unescaped (what a forger's SQL might do)."""
    names = [n for n, _ in TABLES[table]]
    seq, prev, at, *values = fetch_one(f"SELECT seq, prev_hash, recorded_at, {', '.join(names)} FROM {table} "
                                       "ORDER BY seq DESC LIMIT 1")
    payload = dict(zip(names, values)) | {column: value}
    if spec:
        digest = row_hash(prev, table, seq, at, payload)
    else:
        body = _body(table, seq, at, payload).replace(_quote(value), f'"{value}"')
        assert body != _body(table, seq, at, payload)
        digest = hashlib.sha256(f"{prev}\n{body}".encode()).hexdigest()
    con_execute(f"UPDATE {table} SET {column} = ?, row_hash = ? WHERE seq = ?", [value, digest, seq])
    return seq


_FORGED = ['say "hi"', "a\\b", 'both \\" of them', "line\nbreak", "tab\there", "café", "del\x7f", "\u2028"]


@pytest.mark.parametrize("value", _FORGED)
def test_a_row_rehashed_with_a_body_that_is_not_the_specs_is_caught(tmp_path, value):
    for spec in (False, True):
        ledger = _filled(tmp_path / str(spec))
        con = duckdb.connect(str(ledger.path))
        seq = _forge_last(lambda q, p: con.execute(q, p), lambda q: con.execute(q).fetchone(), "reruns", "reason",
                          value, spec)
        con.close()
        on, off = ledger.verify(in_db=True), ledger.verify(in_db=False)
        assert on == off
        # the SQL itself passes the spec's hash (its body for that row is the spec's, or it leaves
        # the row to Python) and declines the forger's, whatever the other rows hold
        assert (_duck_fast(ledger)[0] is not None) == spec
        if spec:  # negative control: the same edit hashed as the spec says verifies (no head given)
            assert on.ok
        else:
            assert on.problems == (f"reruns seq={seq}: content does not match its row_hash (edited behind the ledger)",)


@pytest.mark.parametrize("macros", [
    ["CREATE MACRO sha256(x) AS 'fake'"],
    ["CREATE MACRO replace(a, b, c) AS a"],
    ['CREATE MACRO "||"(a, b) AS a'],
    ["CREATE MACRO regexp_full_match(a, b) AS true"],
    # a table macro under a catalog function's name, hiding the others from the check
    ["CREATE MACRO sha256(x) AS 'fake'",
     "CREATE MACRO duckdb_functions() AS TABLE SELECT 'x' AS function_name, 'macro' AS function_type, "
     "'main' AS schema_name, true AS internal WHERE false"],
])
def test_a_macro_stored_in_the_file_fails_verify_on_either_path(tmp_path, macros):
    ledger = _filled(tmp_path)
    assert ledger.verify(in_db=True).ok  # negative control
    _tamper(ledger.path, *macros)
    on, off = ledger.verify(in_db=True), ledger.verify(in_db=False)
    assert on == off and not on.ok
    first = macros[0].split()[2].split("(")[0].strip('"')
    assert any(f"macro main.{first} was created behind the ledger" in p for p in on.problems), on.problems


def test_a_table_not_defined_as_the_code_defines_it_is_verified_in_python(tmp_path):
    """A case-blind collation on row_hash would make the SQL's comparisons pass an upper-cased hash
    (the negative control below shows it would): verify must not use the SQL on such a table."""
    ledger = _filled(tmp_path)
    _tamper(ledger.path, "ALTER TABLE reruns ALTER COLUMN row_hash SET DATA TYPE VARCHAR COLLATE nocase",
            "ALTER TABLE reruns ALTER COLUMN prev_hash SET DATA TYPE VARCHAR COLLATE nocase",
            "UPDATE reruns SET row_hash = upper(row_hash) WHERE rerun_id = 'r1'")
    with ledger.reader() as con:
        assert not Ledger._tables_as_created(con)
    on, off = ledger.verify(in_db=True), ledger.verify(in_db=False)
    assert on == off and not on.ok and any("content does not match" in p for p in on.problems)
    fooled, _ = _duck_fast(ledger)  # the SQL alone, without the check of the tables
    assert fooled is not None and fooled.ok


@pytest.mark.processes
def test_a_chain_the_sql_declines_is_verified_by_the_parallel_path_when_that_is_on(tmp_path, monkeypatch):
    ledger = _filled(tmp_path)
    head = ledger.verify().head
    _tamper(ledger.path, "UPDATE legs SET status = 'sealed!' WHERE leg_id = 'l1'")
    want = _reference(ledger, head)
    monkeypatch.setenv("TICA_VERIFY_WORKERS", "3")
    assert ledger.verify(head, in_db=True) == want and not want.ok


def test_the_variable_turns_the_in_db_path_on_and_off(monkeypatch):
    monkeypatch.delenv("TICA_VERIFY_IN_DB", raising=False)
    assert not in_db_enabled() and in_db_enabled(default=True) and not in_db_enabled(default=False)
    monkeypatch.setenv("TICA_VERIFY_IN_DB", "0")
    assert not in_db_enabled() and in_db_enabled(True)
    monkeypatch.setenv("TICA_VERIFY_IN_DB", "1")
    assert in_db_enabled(default=False) and not in_db_enabled(False)
    monkeypatch.setenv("TICA_VERIFY_IN_DB", "yes")
    with pytest.raises(Exception, match="TICA_VERIFY_IN_DB"):
        in_db_enabled()


# ----------------------------------------------------------------------------------- Postgres
def _pg_reference(ledger: PostgresLedger, expect: Head | None = None):
    with ledger._connect() as con:
        try:
            return verify_entries(PostgresLedger.chain_entries(con), expect, _view_problems(con))
        finally:
            con.rollback()


def _pg_fast(ledger: PostgresLedger, expect: Head | None = None):
    with ledger._connect() as con:
        try:
            assert _tables_as_created(con)
            return in_db_report(lambda q: con.execute(q).fetchall(), PostgresSql(), expect)
        finally:
            con.rollback()


def _pg_filled(dsn: str) -> PostgresLedger:
    ledger = PostgresLedger(dsn)
    for _ in range(2):
        _every_kind(ledger)
    ledger.append_many([("reruns", {"rerun_id": f"r{i}", "original_kind": "leg", "original_id": "a",
                                    "new_id": 'b "quoted" \\ back', "reason": ""}) for i in range(5)])
    return ledger


def _pg_sql(dsn: str, *sql: str) -> None:
    with psycopg.connect(dsn) as con:
        for s in sql:
            con.execute(s)


def test_postgres_an_intact_ledger_is_verified_on_the_server_with_the_python_report(pg_dsn):  # noqa: F811
    ledger = _pg_filled(pg_dsn)
    head = ledger.verify(in_db=False).head
    for expect in (*_HEADS, head):
        fast = _pg_fast(ledger, expect)
        assert fast is not None
        on, off = ledger.verify(expect, in_db=True), ledger.verify(expect, in_db=False)
        assert fast == on == off == _pg_reference(ledger, expect)
    assert ledger.verify(head, in_db=True).ok


_LITERALS_OFF = ("DO $$ BEGIN EXECUTE pg_catalog.format('ALTER DATABASE %I SET standard_conforming_strings = off', "
                 "pg_catalog.current_database()); END $$")
_RETYPED = "ALTER TABLE reruns ALTER COLUMN reason TYPE varchar"


@pytest.mark.parametrize("edit", [e for e in _EDITS if "VIEW" not in e[0]] + [
    ["CREATE FUNCTION public.sha256(bytea) RETURNS bytea AS 'SELECT $1' LANGUAGE sql"],
    ["CREATE OR REPLACE VIEW stale_evidence AS SELECT track, candidate_id, item, verdict, verdict_id, stale_cause "
     "FROM current_verdicts WHERE false"],
    [_LITERALS_OFF],  # string literals read otherwise: a backslash is chr(92), never in a literal
    [_RETYPED],  # not the code's table: verified in Python
])
def test_postgres_a_tampered_ledger_gets_the_python_report_with_the_in_db_path_on(pg_dsn, edit):  # noqa: F811
    ledger = _pg_filled(pg_dsn)
    head = ledger.verify().head
    _pg_sql(pg_dsn, *edit)
    for expect in (*_HEADS, head):
        on, off = ledger.verify(expect, in_db=True), ledger.verify(expect, in_db=False)
        assert on == off == _pg_reference(ledger, expect)
        if expect is head:
            assert on.ok == (edit[0] in (_LITERALS_OFF, _RETYPED)), on.problems
    if edit[0] == _LITERALS_OFF:  # the SQL still runs there, and still makes the spec's bodies
        assert _pg_fast(ledger, head) == ledger.verify(head, in_db=False)
    if edit[0] == _RETYPED:
        with ledger._connect() as con:
            assert not _tables_as_created(con)


@pytest.mark.parametrize("value", _FORGED)
def test_postgres_a_row_rehashed_with_a_body_that_is_not_the_specs_is_caught(postgres_server, value):  # noqa: F811
    for spec in (False, True):
        dsn = pg_dsn.__wrapped__(postgres_server)
        ledger = _pg_filled(dsn)
        with psycopg.connect(dsn) as con:
            seq = _forge_last(lambda q, p: con.execute(q.replace("?", "%s"), p), lambda q: con.execute(q).fetchone(),
                              "reruns", "reason", value, spec)
        on, off = ledger.verify(in_db=True), ledger.verify(in_db=False)
        assert on == off
        assert (_pg_fast(ledger) is not None) == spec
        if spec:
            assert on.ok
        else:
            assert on.problems == (f"reruns seq={seq}: content does not match its row_hash (edited behind the ledger)",)


def test_postgres_rows_beyond_ascii_are_hashed_in_python_and_still_checked(pg_dsn):  # noqa: F811
    ledger = _pg_filled(pg_dsn)
    with psycopg.connect(pg_dsn) as con:
        in_python = sum(con.execute(in_db_chain_sql(PostgresSql(), None)).fetchone()[5:])
    assert in_python > 0 and _pg_fast(ledger) is not None
    _pg_sql(pg_dsn, "UPDATE components SET component = component || 'x' WHERE component LIKE '%中'")  # still Python's
    assert _pg_fast(ledger) is None
    assert ledger.verify(in_db=True) == ledger.verify(in_db=False) and not ledger.verify(in_db=True).ok

