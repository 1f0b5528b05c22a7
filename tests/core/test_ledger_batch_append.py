"""Batch appends (issue 32, scale): `append_many` writes each run of consecutive rows of one table as
one statement (DuckDB: an Arrow batch; Postgres: COPY, tests/scale/test_postgres_batch_append.py)
instead of a statement per row. What they store must be exactly what was sent and hashed, in the
same seqs as row by row, the chain must verify, a tamper inside a batch must still be named, and a
batch the store did not keep whole must write nothing."""

from __future__ import annotations

import duckdb
import pytest

from tica.errors import LedgerIntegrityError, TicaError
from tica.ledger import TABLES, Ledger
from tica.ledger.rows import checked_payload

# Text every store must give back byte for byte: COPY's escapes and NULL marker, JSON's, SQL's quotes,
# control characters, non-ASCII, the empty string.
NASTY = ["\\N", "\\.", "a\tb", "a\nb", "a\r\nb", "back\\slash", "quote'd", 'double"d', "", " ", "ü ñ 漢字 🙂",
         "\x01\x7f", "%s %% ?", "NULL", "null", "{\"json\": [1, 2]}", "\u2028\u2029", "é" * 300]


def batch() -> list[tuple[str, dict]]:
    """Runs of one table long and short, interleaved, every column kind, NULLs, the nasty text."""
    rows: list[tuple[str, dict]] = []
    for k, text in enumerate(NASTY[:5]):
        rows.append(("reruns", {"rerun_id": f"r{k}", "original_kind": text, "original_id": None, "new_id": f"n{k}",
                                "reason": NASTY[-1 - k]}))
    rows.append(("verdicts", {"verdict_id": "v1", "candidate_id": "c1", "item": "forward", "verdict": "pass",
                              "summary": NASTY[5], "numbers_json": {"x": 1.5, "t": NASTY[6]}, "rerun_of": None}))
    for k, text in enumerate(NASTY[7:10]):
        rows.append(("checks", {"check_id": f"k{k}", "verdict_id": "v1", "name": text, "blocking": k % 2,
                                "passed": -(2 ** 63) if k == 0 else 2 ** 63 - 1, "description": text}))
    rows.append(("candidates", {"candidate_id": "c1", "track": NASTY[10], "manifest_json": {"n": NASTY[11]}}))
    for k, text in enumerate(NASTY[11:]):
        rows.append(("legs", {"leg_id": f"l{k}", "item": text, "round": k, "slot": None, "concurrency": True,
                              "detail_json": [text]}))
    rows.append(("reruns", {"rerun_id": "last", "reason": "a run of one at the end"}))
    return rows


def stored(ledger, table: str) -> list[tuple]:
    names = [n for n, _ in TABLES[table]]
    return [tuple(r) for r in ledger.query(f"SELECT {', '.join(('seq', *names))} FROM {table} ORDER BY seq")[1]]


def sent(rows: list[tuple[str, dict]], first_seq: int, table: str) -> list[tuple]:
    return [(seq, *checked_payload(t, r).values()) for seq, (t, r) in enumerate(rows, start=first_seq) if t == table]


def assert_stores_what_was_sent(ledger, rows: list[tuple[str, dict]], row_by_row) -> None:
    """`ledger` took `rows` by one append_many after one row; `row_by_row` took the same rows one
    append each: the same seqs, the same stored values, both chains verified."""
    ledger.append("reruns", {"rerun_id": "first"})
    seqs = ledger.append_many(rows)
    assert seqs == list(range(2, 2 + len(rows)))
    row_by_row.append("reruns", {"rerun_id": "first"})
    assert [row_by_row.append(t, r) for t, r in rows] == seqs
    for table in {t for t, _ in rows}:
        want = sent(rows, 2, table)
        got = [r for r in stored(ledger, table) if r[0] != 1]
        assert got == want, table
        assert [r for r in stored(row_by_row, table) if r[0] != 1] == want, table
    for each in (ledger, row_by_row):
        report = each.verify()
        assert report.ok and report.rows == 1 + len(rows), report.problems


def test_a_batch_stores_exactly_what_was_sent_in_the_same_seqs_as_row_by_row(tmp_path):
    assert_stores_what_was_sent(Ledger(tmp_path / "batch.duckdb"), batch(), Ledger(tmp_path / "rows.duckdb"))


def test_a_nul_in_a_batch_is_stored_and_hashed_as_sent_on_duckdb(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb")
    ledger.append_many([("reruns", {"rerun_id": "a\x00b"}), ("reruns", {"rerun_id": "c\x00"})])
    assert [r[1] for r in stored(ledger, "reruns")] == ["a\x00b", "c\x00"]
    assert ledger.verify().ok


@pytest.mark.parametrize("edit,named", [
    ("UPDATE reruns SET reason = 'edited' WHERE rerun_id = 'r2'", "reruns seq=4: content does not match"),
    ("UPDATE checks SET passed = 1 WHERE check_id = 'k1'", "checks seq=9: content does not match"),
    ("DELETE FROM legs WHERE leg_id = 'l2'", "expected seq"),
    ("UPDATE reruns SET prev_hash = 'x' WHERE rerun_id = 'r0'", "reruns seq=2: prev_hash does not match"),
])
def test_a_row_tampered_inside_a_batch_is_named(tmp_path, edit, named):
    ledger = Ledger(tmp_path / "l.duckdb")
    ledger.append("reruns", {"rerun_id": "first"})
    ledger.append_many(batch())
    head = ledger.verify().head
    con = duckdb.connect(str(ledger.path))
    con.execute(edit)
    con.close()
    for expect in (None, head):
        report = ledger.verify(expect)
        assert not report.ok and any(named in p for p in report.problems), report.problems


def test_a_batch_the_store_did_not_keep_whole_writes_nothing(tmp_path, monkeypatch):
    from tica.ledger import duckdb_store

    ledger = Ledger(tmp_path / "l.duckdb")
    ledger.append("reruns", {"rerun_id": "first"})
    real = duckdb_store._insert_batch
    monkeypatch.setattr(duckdb_store, "_insert_batch", lambda con, table, rows: real(con, table, rows[:-1]))
    with pytest.raises(LedgerIntegrityError, match="nothing was written"):
        ledger.append_many(batch())
    monkeypatch.undo()
    report = ledger.verify()
    assert report.ok and report.rows == 1
    assert ledger.append_many(batch())[0] == 2  # and the next append goes on from the same head
    assert ledger.verify().ok


def test_a_bad_row_in_a_batch_writes_nothing(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb")
    with pytest.raises(TicaError, match="must be an integer"):
        ledger.append_many([*batch(), ("checks", {"check_id": "bad", "passed": "yes"})])
    assert ledger.verify().rows == 0


def _checked_payload_before(table: str, row: dict) -> dict:
    """checked_payload as it was before its common case skipped the loop (issue 32): the reference."""
    import json

    columns = TABLES[table]
    unknown = set(row) - {n for n, _ in columns}
    if unknown:
        raise TicaError(f"ledger table {table} has no column(s) {sorted(unknown)}")
    payload = {}
    for name, kind in columns:
        value = row.get(name)
        if isinstance(value, bool):
            value = int(value)
        if value is not None and kind == "BIGINT" and not isinstance(value, int):
            raise TicaError(f"ledger {table}.{name} must be an integer, got {value!r}")
        if value is not None and kind == "VARCHAR" and not isinstance(value, str):
            value = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
        payload[name] = value
    return payload


class _Str(str):
    pass


class _Int(int):
    pass


def _values():
    return [None, "", "text", _Str("sub"), 0, -5, 2 ** 70, _Int(3), True, False, 1.5, float("nan"), [1, "a"],
            {"b": 1, "a": None}, b"bytes", ("t",)]


@pytest.mark.parametrize("table", list(TABLES))
def test_checked_payload_is_what_it_was_for_every_value_kind_in_every_column(table):
    import random

    rng = random.Random(table)
    names = [n for n, _ in TABLES[table]]
    cases = [{name: value} for name in names for value in _values()]
    cases += [{n: rng.choice(_values()) for n in rng.sample(names, rng.randint(0, len(names)))} for _ in range(300)]
    cases += [{"no_such_column": 1}, {names[0]: "x", "zz": None}]
    for row in cases:
        try:
            want = _checked_payload_before(table, row)
        except TicaError as err:
            with pytest.raises(TicaError) as got:
                checked_payload(table, row)
            assert str(got.value) == str(err)
            continue
        got = checked_payload(table, row)
        assert list(got.items()) == list(want.items()) and [type(v) for v in got.values()] == \
            [type(v) for v in want.values()], row


def test_extend_chain_hashes_as_row_hash_whatever_the_payloads_shape():
    from tica.ledger import GENESIS, extend_chain, row_hash

    prepared = [(t, checked_payload(t, r)) for t, r in batch()]
    prepared += [("reruns", {"reason": "a subset of the columns"}),  # not checked_payload's: row_hash's path
                 ("reruns", dict(reversed(list(checked_payload("reruns", {"rerun_id": "r"}).items())))),
                 ("no_such_table", {"a": 1}), ("checks", {**checked_payload("checks", {}), "passed": True})]
    prev = GENESIS
    for table, chain, payload in extend_chain((0, GENESIS), prepared):
        assert chain["prev_hash"] == prev
        assert chain["row_hash"] == row_hash(prev, table, chain["seq"], chain["recorded_at"], payload), table
        prev = chain["row_hash"]
