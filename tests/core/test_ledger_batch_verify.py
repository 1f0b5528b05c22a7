"""Verify in batches of columns (tica.ledger.batches) and the row-by-row path stays the authority.
The rules, each with the way it must fail:

- a text column is written as it is only where json.dumps writes it so ('"' + the text + '"'),
  and with only its quotes escaped only where json.dumps writes it so, checked on every character
  there is;
- every generated hasher, whichever columns it takes as plain, hashes as the spec does;
- the report is the row-by-row report, intact or tampered, with or without a head, in one range or
  in several processes, on DuckDB and Postgres; on anything out of place the batch path declines;
- ranges cut at seq values must meet: a chain re-linked over a row deleted right below a cut,
  each range whole on its own, is verified row by row;
- a row re-hashed with a body that is not the spec's (an unescaped quote, a raw newline) is caught,
  and a column retyped behind the ledger is verified row by row."""

from __future__ import annotations

import sys

import duckdb
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_ledger_fast_verify import _reference, _tamper
from tests.core.test_ledger_in_db_verify import (_EDITS, _FORGED, _HEADS, _filled, _forge_last, _pg_filled,
                                                 _pg_reference, _pg_sql)
from tests.postgres_server import pg_dsn, postgres_server  # noqa: F401  (fixtures)
from tica.ledger import CHAIN_COLUMNS, GENESIS, TABLES, ChainSegment, Ledger, PostgresLedger, check_segment, row_hash
from tica.ledger.batches import (batch_hashes, batches_enabled, duckdb_batches, hasher, is_plain, join_or_none,
                                 postgres_batches, psycopg_batches, range_segment, text_class)
from tica.ledger.chain import _now, _quote
from tica.ledger.parallel import even_cuts


def in_processes(*values):
    """A parameter set that verifies in range processes of their own (TICA_VERIFY_WORKERS > 1):
    marked `processes`, which `scripts/test.sh --fast` leaves to the full run."""
    return pytest.param(*values, marks=pytest.mark.processes)


# ----------------------------------------------------------------------------------- plain text
def test_plain_is_exactly_where_json_dumps_writes_the_text_as_it_is():
    for code in range(sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF:  # lone surrogates: no store holds one
            continue
        c = chr(code)
        assert is_plain([c]) == (_quote(c) == f'"{c}"'), hex(code)
    assert is_plain([]) and is_plain(["", "a b"]) and not is_plain(["a", None]) and not is_plain(["a", 1])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=8),
                          st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=8)),
                max_size=6))
def test_plain_values_are_each_written_as_they_are(values):
    assert is_plain(values) == all(isinstance(v, str) and _quote(v) == f'"{v}"' for v in values)


def _quotes_escaped(text: str) -> str:
    return '"' + text.replace('"', '\\"') + '"'


def test_quoted_is_exactly_where_json_dumps_escapes_the_quotes_and_nothing_else():
    for code in range(sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF:
            continue
        c = chr(code)
        kind = text_class([c])
        assert (kind is not None) == (_quote(c) == _quotes_escaped(c)), hex(code)
        assert (kind == "quoted") == (_quote(c) == _quotes_escaped(c) != f'"{c}"'), hex(code)
    assert text_class(['say "hi"', "plain"]) == "quoted"
    assert text_class(['say "hi"', "back\\slash"]) is None  # negative control: replace would miss the backslash
    assert text_class(['say "hi"', None]) is None and text_class(['"', 1]) is None and text_class([]) == "plain"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=8),
                          st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=8)),
                max_size=6))
def test_quoted_values_are_each_written_with_only_their_quotes_escaped(values):
    escaped = all(isinstance(v, str) and _quote(v) == _quotes_escaped(v) for v in values)
    assert (text_class(values) in ("plain", "quoted")) == escaped


# ----------------------------------------------------------------------------------- the hashers
_printable = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)


@settings(max_examples=300, deadline=None)
@given(table=st.sampled_from(sorted(TABLES)), data=st.data())
def test_every_hasher_hashes_as_the_spec_whichever_columns_are_plain_or_quoted(table, data):
    names = [n for n, _ in TABLES[table]]
    rows = data.draw(st.integers(1, 4))
    texts = [n for n, kind in TABLES[table] if kind == "VARCHAR"] + ["recorded_at"]
    plain = frozenset(data.draw(st.sets(st.sampled_from(texts))) if texts else ())
    quoted = frozenset(data.draw(st.sets(st.sampled_from(sorted(set(texts) - plain)))) if set(texts) - plain else ())
    columns: dict[str, list] = {}
    for name, kind in [*TABLES[table], ("recorded_at", "VARCHAR")]:
        if name in plain:  # what the caller passes as plain: set, printable, no quote or backslash
            columns[name] = [data.draw(_printable.map(lambda t: t.replace('"', "").replace("\\", "")))
                             for _ in range(rows)]
        elif name in quoted:  # as quoted: set, printable, no backslash
            columns[name] = [data.draw(_printable.map(lambda t: t.replace("\\", ""))) for _ in range(rows)]
        elif kind == "BIGINT":
            columns[name] = [data.draw(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))) for _ in range(rows)]
        elif name == "recorded_at":
            columns[name] = [data.draw(st.one_of(st.just(_now()), st.text(max_size=10))) for _ in range(rows)]
        else:
            columns[name] = [data.draw(st.one_of(st.none(), st.text(max_size=10), _printable)) for _ in range(rows)]
    seqs = list(range(1, rows + 1))
    prevs = [data.draw(st.text(max_size=4)) for _ in range(rows)]
    got = hasher(table, plain, quoted)(seqs, prevs, columns["recorded_at"], *(columns[n] for n in names))
    want = [row_hash(prevs[i], table, seqs[i], columns["recorded_at"][i], {n: columns[n][i] for n in names})
            for i in range(rows)]
    assert got == want


def test_a_batch_hashes_plain_and_escaped_columns_as_the_spec():
    table = "reruns"
    names = [n for n, _ in TABLES[table]]
    values = {n: [f"{n}-1", f"{n}-2"] for n in names} | {"reason": ['say "hi"', "back\\slash"]}
    at = [_now(), _now()]
    columns = [[1, 2], ["genesis", "x"], [None, None], at, *(values[n] for n in names)]
    want = [row_hash(p, table, s, a, {n: values[n][i] for n in names})
            for i, (s, p, a) in enumerate(zip([1, 2], ["genesis", "x"], at))]
    assert batch_hashes(table, columns) == want


# ----------------------------------------------------------------------------------- DuckDB
def _segment(ledger: Ledger, want=None):
    with ledger.reader() as con:
        return range_segment(duckdb_batches(con, rows=3), 1, want)


def _row_by_row(ledger: Ledger, want=None):
    with ledger.reader() as con:
        return check_segment(Ledger.chain_entries(con), 1, want, None)


@pytest.fixture
def python_paths(monkeypatch):
    monkeypatch.setenv("TICA_VERIFY_IN_DB", "0")


def _both(ledger, expect, monkeypatch):
    monkeypatch.setenv("TICA_VERIFY_BATCHES", "1")
    on = ledger.verify(expect)
    monkeypatch.setenv("TICA_VERIFY_BATCHES", "0")
    off = ledger.verify(expect)
    monkeypatch.setenv("TICA_VERIFY_BATCHES", "1")
    return on, off


@pytest.mark.parametrize("workers", ["1", in_processes("3")])
def test_an_intact_ledger_in_batches_gets_the_row_by_row_report(tmp_path, monkeypatch, python_paths, workers):
    monkeypatch.setenv("TICA_VERIFY_WORKERS", workers)
    ledger = _filled(tmp_path)
    head = ledger.verify().head
    seg, want = _segment(ledger, 3), _row_by_row(ledger, 3)
    assert seg is not None and seg.count == want.count > 0
    assert (seg.last_hash, seg.last_at, seg.held) == (want.last_hash, want.last_at, want.held)
    assert seg.first == want.first and seg.problems == []
    for expect in (*_HEADS, head):
        on, off = _both(ledger, expect, monkeypatch)
        assert on == off == _reference(ledger, expect)
    assert ledger.verify(head).ok and not ledger.verify(_HEADS[2]).ok


def test_an_empty_ledger_verifies_the_same_in_batches(tmp_path, monkeypatch, python_paths):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    assert _segment(ledger).count == 0
    on, off = _both(ledger, None, monkeypatch)
    assert on == off == _reference(ledger) and on.rows == 0


# in processes: an edited row by default; a broken link and a row inserted at a seq another table
# holds too under TICA_TESTS=full (each starts three range processes: about 14 s on two cores)
_IN_PROCESSES = [(e, "1") for e in _EDITS] + [in_processes(_EDITS[0], "3")] + [
    pytest.param(_EDITS[k], "3", marks=[pytest.mark.processes, pytest.mark.long]) for k in (5, 8)]


@pytest.mark.parametrize("edit,workers", _IN_PROCESSES)
def test_a_tampered_ledger_gets_the_row_by_row_report_with_batches_on(tmp_path, monkeypatch, python_paths, edit,
                                                                      workers):
    monkeypatch.setenv("TICA_VERIFY_WORKERS", workers)
    ledger = _filled(tmp_path)
    head = ledger.verify().head
    _tamper(ledger.path, *edit)
    for expect in (*_HEADS, head):
        on, off = _both(ledger, expect, monkeypatch)
        assert on == off == _reference(ledger, expect)
        if expect is head:
            assert not on.ok
    if edit[0].startswith(("UPDATE", "INSERT")) and "VIEW" not in edit[0]:
        assert _segment(ledger) is None  # a row out of place: the batches decline, row by row names it


@pytest.mark.parametrize("value", _FORGED)
def test_a_row_rehashed_with_a_body_that_is_not_the_specs_is_caught_in_batches(tmp_path, monkeypatch, python_paths,
                                                                              value):
    for spec in (False, True):
        ledger = _filled(tmp_path / str(spec))
        con = duckdb.connect(str(ledger.path))
        seq = _forge_last(lambda q, p: con.execute(q, p), lambda q: con.execute(q).fetchone(), "reruns", "reason",
                          value, spec)
        con.close()
        on, off = _both(ledger, None, monkeypatch)
        assert on == off
        assert (_segment(ledger) is not None) == spec
        if spec:  # negative control: the same edit hashed as the spec says verifies (no head given)
            assert on.ok
        else:
            assert on.problems == (f"reruns seq={seq}: content does not match its row_hash (edited behind the ledger)",)


def test_a_column_retyped_behind_the_ledger_is_verified_row_by_row(tmp_path, monkeypatch, python_paths):
    ledger = _filled(tmp_path)
    assert _segment(ledger) is not None  # negative control
    _tamper(ledger.path, "ALTER TABLE legs ALTER COLUMN round SET DATA TYPE DOUBLE")
    assert _segment(ledger) is None
    on, off = _both(ledger, None, monkeypatch)
    assert on == off == _reference(ledger) and not on.ok


def _relink_over(rows, gone: int):
    """The chain's rows (chain_entries) without the row at seq `gone`, every later row re-linked and
    re-hashed as the spec says, each keeping its seq: (table, seq, prev_hash, row_hash) to write."""
    prev, out = GENESIS, []
    for seq, table, _prev, digest, at, values in rows:
        if seq == gone:
            continue
        if seq > gone:
            digest = row_hash(prev, table, seq, at, dict(zip([n for n, _ in TABLES[table]], values)))
            out.append((table, seq, prev, digest))
        prev = digest
    return out


def _gap_at_a_cut(read, write, workers: int) -> int:
    """Delete the row right below the first cut `workers` ranges make and re-link the chain over it:
    each range then holds contiguous seqs and links, and only where the ranges meet is a seq missing."""
    rows = read()
    gone = even_cuts(rows[-1][0], workers)[0] - 1
    table = next(t for s, t, *_ in rows if s == gone)
    write(f"DELETE FROM {table} WHERE seq = ?", [gone])
    for t, seq, prev, digest in _relink_over(rows, gone):
        write(f"UPDATE {t} SET prev_hash = ?, row_hash = ? WHERE seq = ?", [prev, digest, seq])
    return gone


def test_ranges_that_do_not_meet_are_not_joined():
    a = ChainSegment(start=1, linked=False, count=3, first=(1, "legs", GENESIS), last_hash="h3", problems=[])
    b = ChainSegment(start=5, linked=False, count=2, first=(5, "legs", "h3"), last_hash="h6", problems=[])
    assert join_or_none([a, b], None, []) is None
    b.start = 4  # negative control: ranges that meet
    assert join_or_none([a, b], None, []).ok


@pytest.mark.parametrize("workers", [in_processes("2"), in_processes("3")])
def test_a_chain_relinked_over_a_row_deleted_below_a_cut_is_verified_row_by_row(tmp_path, monkeypatch, python_paths,
                                                                                 workers):
    monkeypatch.setenv("TICA_VERIFY_WORKERS", workers)
    for gap in (False, True):
        ledger = _filled(tmp_path / str(gap))
        con = duckdb.connect(str(ledger.path))
        rows = Ledger.chain_entries(con)
        if gap:
            gone = _gap_at_a_cut(lambda: rows, lambda q, p: con.execute(q, p), int(workers))
        else:  # negative control: the same re-hashing over no deleted row leaves a chain that verifies
            for t, seq, prev, digest in _relink_over(rows, rows[-1][0] + 1):
                con.execute(f"UPDATE {t} SET prev_hash = ?, row_hash = ? WHERE seq = ?", [prev, digest, seq])
        con.close()
        on, off = _both(ledger, None, monkeypatch)
        assert on == off == _reference(ledger)
        assert on.ok != gap
        if gap:
            assert any(f"seq={gone + 1}" in p for p in on.problems), on.problems


def test_the_variable_turns_the_batches_on_and_off(monkeypatch):
    monkeypatch.delenv("TICA_VERIFY_BATCHES", raising=False)
    assert batches_enabled()
    monkeypatch.setenv("TICA_VERIFY_BATCHES", "0")
    assert not batches_enabled()
    monkeypatch.setenv("TICA_VERIFY_BATCHES", "yes")
    with pytest.raises(Exception, match="TICA_VERIFY_BATCHES"):
        batches_enabled()


# ----------------------------------------------------------------------------------- Postgres
def _pg_segment(ledger: PostgresLedger, batches=postgres_batches):
    with ledger._connect() as con:
        try:
            con.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            snapshot = con.execute("SELECT pg_export_snapshot()").fetchone()[0]
            return range_segment(batches(ledger.dsn, snapshot, rows=3), 1, None)
        finally:
            con.rollback()


def _pg_columns(ledger: PostgresLedger, batches) -> dict:
    with ledger._connect() as con:
        try:
            con.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            snapshot = con.execute("SELECT pg_export_snapshot()").fetchone()[0]
            out: dict = {}
            for table, columns in batches(ledger.dsn, snapshot):
                for k, col in enumerate(columns):
                    out.setdefault((table, k), []).extend(col)
            return out
        finally:
            con.rollback()


def test_postgres_batches_through_adbc_hold_the_values_psycopg_reads(pg_dsn, monkeypatch):  # noqa: F811
    ledger = _pg_filled(pg_dsn)
    through_adbc, through_psycopg = _pg_columns(ledger, postgres_batches), _pg_columns(ledger, psycopg_batches)
    assert through_adbc == through_psycopg and any("中" in str(v) for c in through_adbc.values() for v in c)
    monkeypatch.setitem(sys.modules, "adbc_driver_postgresql", None)  # not installed: psycopg's
    used = []
    monkeypatch.setattr("tica.ledger.batches.psycopg_batches",
                        lambda *a, **k: used.append(a) or psycopg_batches(*a, **k))
    assert _pg_columns(ledger, postgres_batches) == through_psycopg and used
    assert _pg_segment(ledger) is not None


@pytest.mark.parametrize("workers", ["1", "3"])
def test_postgres_an_intact_ledger_in_batches_gets_the_row_by_row_report(pg_dsn, monkeypatch, python_paths,  # noqa: F811
                                                                         workers):
    monkeypatch.setenv("TICA_VERIFY_WORKERS", workers)
    ledger = _pg_filled(pg_dsn)
    assert _pg_segment(ledger) is not None
    head = ledger.verify().head
    for expect in (*_HEADS, head):
        on, off = _both(ledger, expect, monkeypatch)
        assert on == off == _pg_reference(ledger, expect)
    assert ledger.verify(head).ok


@pytest.mark.parametrize("edit", [e for e in _EDITS if "VIEW" not in e[0]])
def test_postgres_a_tampered_ledger_gets_the_row_by_row_report_with_batches_on(pg_dsn, monkeypatch,  # noqa: F811
                                                                               python_paths, edit):
    monkeypatch.setenv("TICA_VERIFY_WORKERS", "3")
    ledger = _pg_filled(pg_dsn)
    head = ledger.verify().head
    _pg_sql(pg_dsn, *edit)
    for expect in (None, head):
        on, off = _both(ledger, expect, monkeypatch)
        assert on == off == _pg_reference(ledger, expect) and not (expect is head and on.ok)
    if edit[0].startswith(("UPDATE", "INSERT")):
        assert _pg_segment(ledger) is None


def test_postgres_a_chain_relinked_over_a_row_deleted_below_a_cut_is_verified_row_by_row(pg_dsn, monkeypatch,  # noqa: F811
                                                                                          python_paths):
    monkeypatch.setenv("TICA_VERIFY_WORKERS", "2")
    ledger = _pg_filled(pg_dsn)
    with psycopg.connect(pg_dsn) as con:
        gone = _gap_at_a_cut(lambda: PostgresLedger.chain_entries(con),
                             lambda q, p: con.execute(q.replace("?", "%s"), p), 2)
    on, off = _both(ledger, None, monkeypatch)
    assert on == off == _pg_reference(ledger) and not on.ok
    assert any(f"seq={gone + 1}" in p for p in on.problems), on.problems


@pytest.mark.parametrize("workers", ["1", "2"])
def test_postgres_every_range_reads_the_snapshot_verify_began_with(pg_dsn, monkeypatch, python_paths,  # noqa: F811
                                                                   workers):
    """Rows appended after verify exported its snapshot, before any range is read, are not seen by
    any range (the range in this process and the one in a process of its own)."""
    import tica.ledger.batches
    import tica.ledger.parallel

    monkeypatch.setenv("TICA_VERIFY_WORKERS", workers)
    ledger = _pg_filled(pg_dsn)
    before = ledger.verify()

    def append_first(original):
        def wrapped(*args, **kwargs):
            ledger.append_many([("reruns", {"rerun_id": f"late-{k}", "reason": "after the snapshot"}) for k in range(3)])
            return original(*args, **kwargs)
        return wrapped

    if workers == "1":
        monkeypatch.setattr(tica.ledger.batches, "postgres_hashed_batches",
                            append_first(tica.ledger.batches.postgres_hashed_batches))
    else:
        monkeypatch.setattr(tica.ledger.parallel, "_run", append_first(tica.ledger.parallel._run))
    answered = []
    join = tica.ledger.batches.join_or_none
    monkeypatch.setattr(tica.ledger.batches, "join_or_none", lambda *a: answered.append(join(*a)) or answered[-1])
    during = ledger.verify()
    assert during.ok and (during.rows, during.head) == (before.rows, before.head)
    assert answered and answered[-1] == during  # the batches answered, not the row-by-row path
    monkeypatch.undo()
    after = ledger.verify()  # negative control: the rows were there to be seen
    assert after.ok and after.rows == before.rows + 3


def test_postgres_a_forged_row_is_caught_in_batches(postgres_server, monkeypatch, python_paths):  # noqa: F811
    for spec in (False, True):
        dsn = pg_dsn.__wrapped__(postgres_server)
        ledger = _pg_filled(dsn)
        with psycopg.connect(dsn) as con:
            _forge_last(lambda q, p: con.execute(q.replace("?", "%s"), p), lambda q: con.execute(q).fetchone(),
                        "reruns", "reason", 'say "hi"', spec)
        on, off = _both(ledger, None, monkeypatch)
        assert on == off and on.ok == spec and (_pg_segment(ledger) is not None) == spec


# ----------------------------------------------------------------------------------- Arrow batches as bytes
def test_the_arrow_class_of_a_column_is_text_class_on_every_character():
    import pyarrow as pa

    from tica.ledger.batches import arrow_text_class

    for code in [*range(0x800), *range(0x800, sys.maxunicode + 1, 997)]:
        if 0xD800 <= code <= 0xDFFF:
            continue
        c = chr(code)
        for values in ([c], ["ab", f"x{c}y"], ['say "hi"', c]):
            for kind in (pa.string(), pa.large_string()):
                assert arrow_text_class(pa.array(values, kind)) == text_class(values), (hex(code), values)
    assert arrow_text_class(pa.array(["a", None])) is None and arrow_text_class(pa.array([], pa.string())) == "plain"
    assert arrow_text_class(pa.array(["", ""])) == "plain"
    sliced = pa.array(["back\\slash", 'say "hi"', "plain"]).slice(1)  # the class of its own values only
    assert arrow_text_class(sliced) == "quoted" and arrow_text_class(sliced.slice(1)) == "plain"


@settings(max_examples=300, deadline=None)
@given(table=st.sampled_from(sorted(TABLES)), data=st.data())
def test_an_arrow_batch_hashes_as_the_spec_whatever_its_values(table, data):
    import pyarrow as pa

    from tica.ledger.batches import arrow_batch_hashes

    names = [n for n, _ in TABLES[table]]
    rows = data.draw(st.integers(1, 4))
    # per column all printable, quoted, with a backslash, unicode or null: each class the batch takes
    text = st.one_of(_printable, _printable.map(lambda t: t.replace("\\", "")),
                     _printable.map(lambda t: t.replace('"', "").replace("\\", "")), st.text(max_size=8))
    columns: dict[str, list] = {}
    for name, kind in [*TABLES[table], ("recorded_at", "VARCHAR")]:
        if kind == "BIGINT":
            columns[name] = [data.draw(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))) for _ in range(rows)]
        else:
            nullable = name != "recorded_at" and data.draw(st.booleans())
            columns[name] = [data.draw(st.one_of(st.none(), text) if nullable else text) for _ in range(rows)]
    seqs = list(range(1, rows + 1))
    prevs = [data.draw(st.text(max_size=4)) for _ in range(rows)]
    digests = [f"d{k}" for k in range(rows)]
    arrays = [pa.array(seqs, pa.int64()), pa.array(prevs, pa.string()), pa.array(digests, pa.string()),
              pa.array(columns["recorded_at"], pa.string()),
              *(pa.array(columns[n], pa.int64() if kind == "BIGINT" else pa.string()) for n, kind in TABLES[table])]
    batch = pa.RecordBatch.from_arrays(arrays, names=[*CHAIN_COLUMNS, *names])
    chain, got = arrow_batch_hashes(table, batch)
    want = [row_hash(prevs[i], table, seqs[i], columns["recorded_at"][i], {n: columns[n][i] for n in names})
            for i in range(rows)]
    assert got == want and chain == [seqs, prevs, digests, columns["recorded_at"]]


def test_an_arrow_batch_of_another_type_than_the_codes_is_out_of_place():
    import pyarrow as pa

    from tica.ledger.batches import _OutOfPlace, arrow_batch_hashes

    names = [n for n, _ in TABLES["reruns"]]
    batch = pa.RecordBatch.from_arrays([pa.array([1]), *(pa.array(["x"]) for _ in range(3)),
                                        *(pa.array([b"x"], pa.binary()) for _ in names)], names=[*CHAIN_COLUMNS, *names])
    with pytest.raises(_OutOfPlace):
        arrow_batch_hashes("reruns", batch)


def test_postgres_hashed_batches_give_the_segment_of_the_columns(postgres_server, monkeypatch):  # noqa: F811
    from tica.ledger.batches import postgres_hashed_batches

    ledger = _pg_filled(pg_dsn.__wrapped__(postgres_server))
    hashed = _pg_segment(ledger, postgres_hashed_batches)
    assert hashed is not None and hashed == _pg_segment(ledger, postgres_batches)
    monkeypatch.setitem(sys.modules, "adbc_driver_postgresql", None)  # not installed: psycopg's columns
    assert _pg_segment(ledger, postgres_hashed_batches) == hashed
    monkeypatch.undo()
    for spec in (False, True):  # a forged row: out of place, unless re-hashed by the spec
        dsn = pg_dsn.__wrapped__(postgres_server)
        ledger = _pg_filled(dsn)
        with psycopg.connect(dsn) as con:
            _forge_last(lambda q, p: con.execute(q.replace("?", "%s"), p), lambda q: con.execute(q).fetchone(),
                        "reruns", "reason", 'say "hi"', spec)
        assert (_pg_segment(ledger, postgres_hashed_batches) is not None) == spec
