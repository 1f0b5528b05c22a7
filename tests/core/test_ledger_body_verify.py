"""Verify on DuckDB with each row's body built by DuckDB and hashed in Python (issue 32:
tica.ledger.batches.duckdb_body_batches) gives the report the row-wise Python path gives, the oracle
(`verify_entries` over `Ledger.chain_entries`, the path every store has always had):

- for random ledgers (text with quotes, backslashes, controls, non-ASCII; NULLs; extreme integers)
  and random tamperings of one byte, one value, one link, one hash, one row (deleted, duplicated,
  renumbered), a value re-hashed as the spec hashes it and one re-hashed over the SQL's body of a
  value the SQL cannot write (a raw newline, a non-ASCII character), with and without the published
  head: the same verdict, the same problems in the same words, the same head;
- the negative control: the same comparison with the body check switched off (every body taken as
  printable) finds the row re-hashed over the SQL's body passing, where the oracle names it;
- every row of an intact ledger, odd text included, is hashed by this path (rows whose SQL body is
  not printable ASCII re-read as values), and the path never declines an intact ledger."""

from __future__ import annotations

import hashlib

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.long import size
from tica.ledger import TABLES, Ledger, batches, parallel, verify_entries
from tica.ledger.chain import Head

_TEXT_TABLES = [t for t in TABLES if any(kind == "VARCHAR" for _, kind in TABLES[t])]
_alphabet = st.sampled_from(list('ab "\\{}:,/') + ["\n", "\t", "\x01", "\x7f", "é", "中", "\u2028", "😀"])
_plain = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)
_text = st.one_of(st.none(), _plain, st.text(alphabet=_alphabet, max_size=12), st.just(""))
_bigint = st.one_of(st.none(), st.sampled_from([0, -1, 2**63 - 1, -(2**63)]), st.integers(-(2**63), 2**63 - 1))


def _row(data, table: str) -> dict:
    return {n: data.draw(_bigint if kind == "BIGINT" else _text) for n, kind in TABLES[table]}


def _build(path, data, rows: int) -> Ledger:
    ledger = Ledger(path)
    tables = data.draw(st.lists(st.sampled_from(sorted(TABLES)), min_size=rows, max_size=rows))
    ledger.append_many([(t, _row(data, t)) for t in tables])
    return ledger


def _oracle(path, expect: Head | None):
    """The row-wise Python verify, as every store has always verified."""
    with duckdb.connect(str(path), read_only=True) as con:
        return verify_entries(Ledger.chain_entries(con), expect)


def _fast(path, expect: Head | None, workers: int = 1, bodies: bool = True):
    """The body path alone (`bodies`; else the batches of columns it replaces on such a ledger): a
    report, or None where it declines (the row-wise path then answers)."""
    with duckdb.connect(str(path), read_only=True) as con:
        return parallel.verify_batches("duckdb", con, str(path), expect, [], workers, bodies=bodies)


def _key(report) -> tuple:
    return report.ok, report.problems, report.rows, report.head_hash, report.head_seq, report.head_recorded_at


def _disagreement(path, expect: Head | None, workers: int = 1) -> str | None:
    """Where the body path's verdict, or Ledger.verify's, differs from the oracle's (None: nowhere)."""
    want = _key(_oracle(path, expect))
    fast = _fast(path, expect, workers)
    if fast is not None and _key(fast) != want:
        return f"body path {_key(fast)} vs oracle {want}"
    if fast is None and want[0]:
        return "the body path declined an intact ledger"
    columns = _fast(path, expect, workers, bodies=False)
    if columns is not None and _key(columns) != want:
        return f"columns path {_key(columns)} vs oracle {want}"
    got = _key(Ledger(path).verify(expect))
    return None if got == want else f"Ledger.verify {got} vs oracle {want}"


def _sql_body_hash(con, table: str, seq: int) -> str:
    """sha256(prev_hash + newline + the body DuckDB's SQL builds) of one row: what a writer who
    trusted the SQL's body for any text would store."""
    sql, params = batches.body_range_sql(table, seq, seq + 1)
    (*_, hashed), = con.execute(sql, params).fetchall()
    return hashlib.sha256(hashed.encode()).hexdigest()


def _tamper(path, data) -> None:
    con = duckdb.connect(str(path))
    try:
        rows = con.execute("SELECT seq, prev_hash, row_hash FROM ledger_chain ORDER BY seq").fetchall()
        if not rows:
            return
        seq, _, digest = data.draw(st.sampled_from(rows))
        (table,), = con.execute(
            " UNION ALL ".join(f"SELECT '{t}' FROM {t} WHERE seq = {int(seq)}" for t in TABLES)).fetchall()
        texts = [n for n, kind in TABLES[table] if kind == "VARCHAR"]
        kind = data.draw(st.sampled_from(["byte", "value", "odd_rehashed_sql", "rehashed_spec", "link", "hash",
                                          "delete", "duplicate", "renumber", "nothing"]))
        if kind in ("byte", "value", "odd_rehashed_sql", "rehashed_spec") and not texts:
            kind = "hash"
        where = f"WHERE seq = {int(seq)}"
        if kind == "byte":  # one character of one value changed (a NULL becomes one character)
            col = data.draw(st.sampled_from(texts))
            (old,), = con.execute(f"SELECT {col} FROM {table} {where}").fetchall()
            old = old or ""
            at = data.draw(st.integers(0, len(old)))
            new = old[:at] + data.draw(_alphabet.filter(lambda c: old[at:at + 1] != c)) + old[at + 1:]
            con.execute(f"UPDATE {table} SET {col} = ? {where}", [new])
        elif kind == "value":
            col = data.draw(st.sampled_from(texts))
            con.execute(f"UPDATE {table} SET {col} = ? {where}", [data.draw(_text)])
        elif kind in ("odd_rehashed_sql", "rehashed_spec"):
            col = data.draw(st.sampled_from(texts))
            odd = data.draw(st.sampled_from(["\n", "\x01", "\x7f", "é", "中", "\u2028", '"', "\\"]))
            con.execute(f"UPDATE {table} SET {col} = concat(coalesce({col}, ''), ?) {where}", [odd])
            if kind == "odd_rehashed_sql":
                new_hash = _sql_body_hash(con, table, seq)
            else:
                names = [n for n, _ in TABLES[table]]
                (prev, at_, *values), = con.execute(
                    f"SELECT prev_hash, recorded_at, {', '.join(names)} FROM {table} {where}").fetchall()
                from tica.ledger import row_hash
                new_hash = row_hash(prev, table, seq, at_, dict(zip(names, values)))
            con.execute(f"UPDATE {table} SET row_hash = ? {where}", [new_hash])
        elif kind == "link":
            con.execute(f"UPDATE {table} SET prev_hash = ? {where}", [hashlib.sha256(b"x").hexdigest()])
        elif kind == "hash":
            flipped = digest[:-1] + ("0" if digest[-1] != "0" else "1")
            con.execute(f"UPDATE {table} SET row_hash = ? {where}", [flipped])
        elif kind == "delete":
            con.execute(f"DELETE FROM {table} {where}")
        elif kind == "duplicate":  # the same row again under the next free seq, in another place of the chain
            top = max(r[0] for r in rows)
            con.execute(f"INSERT INTO {table} SELECT * REPLACE ({top + 1} AS seq) FROM {table} {where}")
        elif kind == "renumber":
            top = max(r[0] for r in rows)
            con.execute(f"UPDATE {table} SET seq = {top + 5} {where}")
    finally:
        con.close()


@pytest.fixture
def fresh(tmp_path_factory):
    counter = iter(range(10**6))
    return lambda: tmp_path_factory.mktemp("body") / f"l{next(counter)}.duckdb"


@settings(max_examples=size(20, 60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(rows=st.integers(0, 14), data=st.data(), anchored=st.booleans())
def test_the_body_path_reports_what_the_python_path_reports_for_random_tamperings(fresh, rows, data, anchored):
    path = fresh()
    ledger = _build(path, data, rows)
    head = ledger.verify(in_db=False).head if anchored else None
    assert _disagreement(path, head) is None  # intact
    _tamper(path, data)
    assert _disagreement(path, head) is None


def _last_row_rehashed_over_the_sql_body(path) -> None:
    """The last row's summary given a raw newline, its row_hash re-computed over DuckDB's body of it
    (json.dumps writes the newline as \\n: not the spec's hash)."""
    con = duckdb.connect(str(path))
    try:
        (seq,), = con.execute("SELECT max(seq) FROM verdicts").fetchall()
        con.execute("UPDATE verdicts SET summary = 'two\nlines' WHERE seq = ?", [seq])
        con.execute("UPDATE verdicts SET row_hash = ? WHERE seq = ?", [_sql_body_hash(con, "verdicts", seq), seq])
    finally:
        con.close()


def _verdicts(ledger: Ledger, n: int) -> None:
    ledger.append_many([("verdicts", {"verdict_id": f"v{i}", "summary": 'say "hi" \\ ok', "numbers_json": {"a": i}})
                        for i in range(n)])


def test_negative_control_a_body_check_switched_off_is_caught(tmp_path, monkeypatch):
    path = tmp_path / "l.duckdb"
    _verdicts(Ledger(path), 5)
    assert _disagreement(path, None) is None
    _last_row_rehashed_over_the_sql_body(path)
    assert not _oracle(path, None).ok  # the spec's hash of that row is not the stored one
    assert _disagreement(path, None) is None  # the body path declines it: the row-wise path names it
    monkeypatch.setattr(batches, "_printable_bodies", lambda data, starts, ends: starts >= 0)  # every body "printable"
    found = _disagreement(path, None)
    assert found is not None and "body path (True" in found


def test_every_row_of_an_intact_ledger_with_odd_text_is_hashed_by_the_body_path(tmp_path):
    path = tmp_path / "l.duckdb"
    ledger = Ledger(path)
    ledger.append_many([("verdicts", {"verdict_id": f"v{i}", "summary": ["plain", "é", "tab\t", "中\n", None][i % 5],
                                      "numbers_json": '{"q": "\\\\"}'}) for i in range(9000)]
                       + [("legs", {"leg_id": "l", "round": -(2**63), "slot": 2**63 - 1, "detail_json": "\x7f"})])
    with duckdb.connect(str(path), read_only=True) as con:
        seen = 0
        for table, (seq, _, digest, _), hashes in batches.duckdb_body_batches(con, rows=1000):
            assert hashes == digest, table
            seen += len(seq)
    assert seen == 9001
    assert _disagreement(path, None) is None


@pytest.mark.parametrize("edit", ["UPDATE verdicts SET summary = 'x' WHERE seq = 4000",
                                  "UPDATE verdicts SET prev_hash = 'p' WHERE seq = 5001",
                                  "DELETE FROM verdicts WHERE seq = 2", None])
def test_the_ranges_in_processes_report_what_the_python_path_reports(tmp_path, edit):
    path = tmp_path / "l.duckdb"
    _verdicts(Ledger(path), 6000)
    if edit:
        with duckdb.connect(str(path)) as con:
            con.execute(edit)
    assert _disagreement(path, None, workers=2) is None


def test_the_read_ahead_hands_over_every_item_raises_what_the_reader_raises_and_stops_when_closed():
    import threading

    assert list(batches._read_ahead(lambda: iter(range(50)))) == list(range(50))

    def failing():
        yield 1
        raise ValueError("the reader failed")

    stream = batches._read_ahead(failing)
    assert next(stream) == 1
    with pytest.raises(ValueError, match="the reader failed"):
        next(stream)
    endless = batches._read_ahead(lambda: iter(int, 1))  # never ends by itself
    assert next(endless) == 0
    endless.close()  # the consumer stops: the reading thread stops too
    assert not [t for t in threading.enumerate() if t.name == "tica-verify-read-ahead"]


def test_a_range_runs_duckdb_on_the_threads_it_asks_for_and_restores_the_setting(tmp_path):
    path = tmp_path / "l.duckdb"
    _verdicts(Ledger(path), 3)
    with duckdb.connect(str(path), read_only=True) as con:
        (before,), = con.execute("SELECT current_setting('threads')").fetchall()
        seen = []
        for _ in batches.duckdb_body_batches(con, threads=1):
            seen += con.execute("SELECT current_setting('threads')").fetchall()
        assert seen == [(1,)]
        assert con.execute("SELECT current_setting('threads')").fetchall() == [(before,)]
