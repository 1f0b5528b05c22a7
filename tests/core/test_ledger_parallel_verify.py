"""Verify in parallel (tica.ledger.parallel): the chain cut into seq ranges, each re-hashed in a
process of its own, the pieces joined. The report must be the serial verify's, problem for problem,
on intact and tampered ledgers, with and without a published head; and a range that cannot check
its own first link must still have it checked."""

from __future__ import annotations

import pytest

from tests.core.ledger_templates import copied
from tests.core.test_ledger_fast_verify import _every_kind, _reference, _tamper
from tica.ledger import GENESIS, Head, Ledger, check_segment, join_segments
from tica.ledger.parallel import cut_points, ranges_of, workers_for


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    """Every kind of row three times, on a copy for this test (tests/core/ledger_templates.py)."""
    def fill(led: Ledger) -> None:
        for _ in range(3):
            _every_kind(led)
    return copied(tmp_path / "l.duckdb", "every-kind-x3", fill)


@pytest.fixture
def parallel(monkeypatch):
    monkeypatch.setenv("TICA_VERIFY_WORKERS", "3")
    monkeypatch.setenv("TICA_VERIFY_IN_DB", "0")  # the ranges re-hashed in Python, intact ledgers included
    monkeypatch.setenv("TICA_VERIFY_BATCHES", "0")  # row by row (tests/core/test_ledger_batch_verify.py: in batches)


def test_cut_points_split_the_rows_and_cover_every_seq():
    seqs = list(range(1, 31))
    cuts = cut_points(seqs, 3)
    assert cuts == [11, 21]
    ranges = ranges_of(cuts)
    assert ranges == [(None, 11), (11, 21), (21, None)]
    covered = [s for s in seqs for lo, hi in ranges if (lo is None or s >= lo) and (hi is None or s < hi)]
    assert covered == seqs  # every row in exactly one range
    assert cut_points(seqs, 1) == [] and cut_points([], 4) == []
    assert cut_points([5, 5, 5, 5], 3) == []  # one seq value (a tampered ledger): one range


def test_the_number_of_processes_follows_the_chain_and_the_variable(monkeypatch):
    monkeypatch.delenv("TICA_VERIFY_WORKERS", raising=False)
    assert workers_for(10) == 1
    monkeypatch.setenv("TICA_VERIFY_WORKERS", "4")
    assert workers_for(10) == 4
    monkeypatch.setenv("TICA_VERIFY_WORKERS", "many")
    with pytest.raises(Exception, match="TICA_VERIFY_WORKERS"):
        workers_for(10)


@pytest.mark.processes
def test_an_intact_ledger_verifies_in_parallel_as_it_does_serially(ledger, parallel):
    got, want = ledger.verify(), _reference(ledger)
    assert got.ok and got == want
    head = got.head
    assert ledger.verify(head) == _reference(ledger, head)


@pytest.mark.parametrize("edit", [
    ["UPDATE legs SET status = 'sealed!' WHERE leg_id = 'l1'"],
    ["DELETE FROM receipts"],
    ["UPDATE checks SET prev_hash = 'x'"],
    ["DELETE FROM questions WHERE seq = (SELECT max(seq) FROM questions)"],
    ["INSERT INTO reruns (seq, prev_hash, row_hash, recorded_at, rerun_id) VALUES (2, 'p', 'h', 't', 'r')",
     "INSERT INTO reruns (seq, prev_hash, row_hash, recorded_at, rerun_id) VALUES (0, 'p', 'h', 't', 'r0')"],
    ["INSERT INTO components (seq, prev_hash, row_hash, recorded_at) VALUES (1000, 'p', 'h', 't')"],
])
@pytest.mark.processes
def test_a_tampered_ledger_is_named_in_parallel_exactly_as_serially(ledger, parallel, edit):
    head = ledger.verify().head
    _tamper(ledger.path, *edit)
    for expect in (None, Head(seq=3, row_hash="0" * 64, recorded_at="")) if edit[0].startswith("INSERT") else (head,):
        got, want = ledger.verify(expect), _reference(ledger, expect)
        assert not got.ok
        assert got == want


def test_a_link_broken_exactly_where_two_ranges_meet_is_named(ledger):
    """The row a range starts with cannot check its own link: the join must."""
    with ledger.reader() as con:
        entries = Ledger.chain_entries(con)
    k = len(entries) // 2
    seq, table, _, digest, at, values = entries[k]
    broken = [*entries[:k], (seq, table, "not the row before", digest, at, values), *entries[k + 1:]]
    whole = join_segments([check_segment(broken, 1, None, GENESIS)])
    pieces = join_segments([check_segment(broken[:k], 1, None, GENESIS), check_segment(broken[k:], k + 1, None, None)])
    assert not whole.ok and pieces == whole
    assert any(f"seq={seq}: prev_hash does not match" in p for p in pieces.problems)
    intact = join_segments([check_segment(entries[:k], 1, None, GENESIS), check_segment(entries[k:], k + 1, None, None)])
    assert intact.ok  # negative control: the same cut of an intact chain


def test_a_macro_stored_in_the_file_fails_verify(ledger):
    """A view's text is verified, and so is what its names resolve to: a stored macro can shadow
    row_number() and turn every verdict into the newest."""
    assert ledger.verify().ok
    _tamper(ledger.path, "CREATE MACRO row_number() AS min(1)")
    report = ledger.verify()
    assert not report.ok and any("macro main.row_number" in p for p in report.problems)
