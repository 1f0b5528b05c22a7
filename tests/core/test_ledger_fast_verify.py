"""Verify hashes every row with a body function generated per table (tica.ledger.chain.FAST_BODIES) and
reads the chain as a stream: the bodies must be byte-identical to `_body` (the hash's definition)
for every column type and kind of value, and the streamed verify must name exactly what
`verify_entries` over the whole chain names, tampered rows included."""

from __future__ import annotations

import datetime as dt
import math

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.ledger_templates import copied
from tica.ledger import FAST_BODIES, TABLES, Head, Ledger, verify_entries
from tica.ledger.chain import _body, _now

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=8)
# What a column may hold once Ledger._payload has made it storable: text (any, non-ASCII and
# control characters included), integers, NULL; and what DuckDB or Postgres could hand back if a
# column's type were changed behind the ledger (floats, booleans, nested values).
_stored = st.one_of(st.none(), st.text(), st.integers(min_value=-(2**63), max_value=2**63 - 1))
_odd = st.one_of(st.floats(allow_nan=False), st.booleans(), st.integers(min_value=-(2**90), max_value=2**90),
                 st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3))
_at = st.one_of(st.just(_now()), st.datetimes(timezones=st.just(dt.timezone.utc)).map(lambda d: d.isoformat()), st.text())


def _payload_of(table: str, values) -> dict:
    return dict(zip((n for n, _ in TABLES[table]), values))


@settings(max_examples=200, deadline=None)
@given(table=st.sampled_from(sorted(TABLES)), seq=st.integers(0, 2**62), at=_at, data=st.data())
def test_the_fast_body_is_byte_identical_to_body_for_stored_values(table, seq, at, data):
    values = tuple(data.draw(_stored) for _ in TABLES[table])
    assert FAST_BODIES[table](seq, at, values) == _body(table, seq, at, _payload_of(table, values))


@settings(max_examples=200, deadline=None)
@given(table=st.sampled_from(sorted(TABLES)), seq=st.one_of(st.integers(0, 2**62), st.booleans()), at=_at, data=st.data())
def test_the_fast_body_is_byte_identical_to_body_for_any_value(table, seq, at, data):
    values = tuple(data.draw(st.one_of(_stored, _odd)) for _ in TABLES[table])
    assert FAST_BODIES[table](seq, at, values) == _body(table, seq, at, _payload_of(table, values))


@settings(max_examples=100, deadline=None)
@given(table=st.sampled_from(sorted(TABLES)), data=st.data())
def test_the_fast_body_equals_body_for_rows_as_the_ledger_makes_them(table, data):
    """Floats, nested JSON, timestamps, booleans, non-ASCII text: through Ledger._payload."""
    row = {}
    for name, kind in TABLES[table]:
        if kind == "BIGINT":
            row[name] = data.draw(st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1)))
        else:
            row[name] = data.draw(st.one_of(_json, st.datetimes().map(lambda d: {"at": d}), st.just("ünï 中文 🙂"),
                                            st.just({"f": math.pi, "neg": -0.0, "big": 1e300})))
    payload = Ledger._payload(table, row)
    values = tuple(payload.values())
    at = _now()
    assert FAST_BODIES[table](7, at, values) == _body(table, 7, at, payload)


def test_the_fast_body_fails_where_body_fails():
    values = tuple(None for _ in TABLES["reruns"])
    with pytest.raises(TypeError):
        _body("reruns", 1, None, _payload_of("reruns", values))  # recorded_at must be text
    with pytest.raises(TypeError):
        FAST_BODIES["reruns"](1, None, values)
    odd = (dt.datetime(2026, 1, 1),) + values[1:]
    with pytest.raises(TypeError):
        _body("reruns", 1, "t", _payload_of("reruns", odd))
    with pytest.raises(TypeError):
        FAST_BODIES["reruns"](1, "t", odd)


def _every_kind(ledger: Ledger) -> None:
    ledger.append("questions", {"question_hash": "q1", "name": "fwd", "item": "forward",
                                "body_json": {"x": "é", "f": 0.1, "n": [1, [2, {"z": None}]], "at": dt.datetime(2026, 1, 2)}})
    ledger.append_many([
        ("legs", {"leg_id": "l1", "candidate_id": "c1", "item": "forward", "arm": "a", "round": 0, "slot": -1,
                  "concurrency": 2**62, "status": "sealed", "detail_json": {"tab\t": "\x00\x1f\u2028"}}),
        ("receipts", {"leg_id": "l1", "path": "p/ü", "sha256": "0" * 64, "size_bytes": None}),
        ("checks", {"check_id": "k1", "verdict_id": "v1", "name": "n", "blocking": True, "passed": False}),
    ])
    for table in TABLES:
        if table not in ("questions", "legs", "receipts", "checks"):
            ledger.append(table, {n: f"{table}-{n}-中" for n, kind in TABLES[table] if kind == "VARCHAR"})


def test_every_row_of_a_real_ledger_hashes_the_same_way(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb")
    _every_kind(ledger)
    with ledger.reader() as con:
        entries = Ledger.chain_entries(con)
    assert {e[1] for e in entries} == set(TABLES)
    for seq, table, _, _, at, values in entries:
        assert FAST_BODIES[table](seq, at, values) == _body(table, seq, at, _payload_of(table, values))
    assert ledger.verify().ok


def _reference(ledger: Ledger, expect: Head | None = None):
    """verify_entries over the whole chain read at once and sorted (what verify did before streaming)."""
    with ledger.reader() as con:
        return verify_entries(Ledger.chain_entries(con), expect, Ledger._view_problems(con))


@pytest.mark.parametrize("chunk", [1, 2, 20_000])
def test_the_streamed_chain_is_the_sorted_chain(tmp_path, chunk):
    ledger = Ledger(tmp_path / "l.duckdb")
    _every_kind(ledger)
    _every_kind(ledger)
    with ledger.reader() as con:
        whole = Ledger.chain_entries(con)
        for ordered in (True, False):
            with Ledger.streamed_chain_entries(con, chunk, ordered=ordered) as stream:
                assert [tuple(e) for e in stream] == [tuple(e) for e in whole]


def _tamper(path, *sql: str) -> None:
    con = duckdb.connect(str(path))
    for s in sql:
        con.execute(s)
    con.close()


@pytest.mark.parametrize("edit", [
    ["UPDATE legs SET status = 'sealed!' WHERE leg_id = 'l1'"],
    ["DELETE FROM receipts"],
    ["UPDATE checks SET prev_hash = 'x'"],
    # rows inserted behind the API, out of seq order in their table, one at a seq another table holds
    ["INSERT INTO reruns (seq, prev_hash, row_hash, recorded_at, rerun_id) VALUES (2, 'p', 'h', 't', 'r')",
     "INSERT INTO reruns (seq, prev_hash, row_hash, recorded_at, rerun_id) VALUES (0, 'p', 'h', 't', 'r0')"],
    ["INSERT INTO components (seq, prev_hash, row_hash, recorded_at) VALUES (1000, 'p', 'h', 't')"],
])
@pytest.mark.parametrize("in_db", [True, False], ids=["in-db", "python"])
def test_a_tampered_ledger_is_named_exactly_as_before(tmp_path, edit, in_db):
    ledger = copied(tmp_path / "l.duckdb", "every-kind", _every_kind)  # tests/core/ledger_templates.py
    head = ledger.verify().head
    _tamper(ledger.path, *edit)
    for expect in (None, head, Head(seq=0, row_hash="genesis", recorded_at=""), Head(seq=3, row_hash="0" * 64, recorded_at="")):
        got, want = ledger.verify(expect, in_db=in_db), _reference(ledger, expect)
        assert not got.ok
        assert got == want
