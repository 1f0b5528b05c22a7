"""Batch appends on a real Postgres server (issue 32, scale): each run of consecutive rows of one table
goes in by one COPY (tests/core/test_ledger_batch_append.py holds the same on DuckDB). What it
stores is exactly what was sent and hashed, COPY's own escapes and NULL marker included, in the
same seqs as row by row; a tamper inside a batch is still named; a batch the store did not keep
whole (a trigger the catalog check missed) is never acknowledged and writes nothing."""

from __future__ import annotations

import psycopg
import pytest

from tests.core.test_ledger_batch_append import assert_stores_what_was_sent, batch, stored
from tica.errors import LedgerIntegrityError
from tica.ledger import PostgresLedger

pytestmark = pytest.mark.scale


def _second(pg_dsn: str) -> str:
    server, _ = pg_dsn.rsplit("/", 1)
    with psycopg.connect(f"{server}/postgres", autocommit=True) as con:
        con.execute("CREATE DATABASE " + _ + "_rows")
    return f"{pg_dsn}_rows"


def test_a_batch_stores_exactly_what_was_sent_in_the_same_seqs_as_row_by_row(pg_dsn):
    assert_stores_what_was_sent(PostgresLedger(pg_dsn), batch(), PostgresLedger(_second(pg_dsn)))


@pytest.mark.parametrize("edit,named", [
    ("UPDATE reruns SET reason = 'edited' WHERE rerun_id = 'r2'", "reruns seq=4: content does not match"),
    ("UPDATE reruns SET original_kind = NULL WHERE rerun_id = 'r0'", "reruns seq=2: content does not match"),
    ("UPDATE checks SET passed = 1 WHERE check_id = 'k1'", "checks seq=9: content does not match"),
    ("DELETE FROM legs WHERE leg_id = 'l2'", "expected seq"),
])
def test_a_row_tampered_inside_a_batch_is_named(pg_dsn, edit, named):
    ledger = PostgresLedger(pg_dsn)
    ledger.append("reruns", {"rerun_id": "first"})
    ledger.append_many(batch())
    head = ledger.verify().head
    with psycopg.connect(pg_dsn) as con:
        con.execute(edit)
    for expect in (None, head):
        report = ledger.verify(expect)
        assert not report.ok and any(named in p for p in report.problems), report.problems


def test_a_batch_a_trigger_thinned_is_never_acknowledged(pg_dsn, monkeypatch):
    """COPY fires triggers: one returning NULL for some rows (as if the catalog check missed it)
    leaves the count short, and the whole append rolls back."""
    from tica.ledger import postgres_store

    ledger = PostgresLedger(pg_dsn)
    ledger.append("reruns", {"rerun_id": "first"})
    with psycopg.connect(pg_dsn) as con:
        con.execute("CREATE FUNCTION public.tica_thin() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    "IF NEW.rerun_id = 'r3' THEN RETURN NULL; END IF; RETURN NEW; END $$; "
                    "CREATE TRIGGER thin BEFORE INSERT ON reruns FOR EACH ROW EXECUTE FUNCTION public.tica_thin()")
    monkeypatch.setattr(postgres_store, "_write_hazards", lambda con: [])
    with pytest.raises(LedgerIntegrityError, match="reruns seqs 2 to 19: the store took 6 rows but stored 5; nothing was written"):
        ledger.append_many(batch())
    assert [r[1] for r in stored(ledger, "reruns")] == ["first"]
    assert ledger.rows("SELECT count(*) AS n FROM verdicts") == [{"n": 0}]
    with psycopg.connect(pg_dsn) as con:
        con.execute("DROP TRIGGER thin ON reruns; DROP FUNCTION public.tica_thin()")
    monkeypatch.undo()
    assert ledger.append_many(batch())[0] == 2  # the chain goes on from the same head
    report = ledger.verify()
    assert report.ok and report.rows == 1 + len(batch()), report.problems


def test_a_nul_in_a_batch_is_refused_whole(pg_dsn):
    ledger = PostgresLedger(pg_dsn)
    ledger.append("reruns", {"rerun_id": "first"})
    with pytest.raises(psycopg.DataError, match="NUL"):
        ledger.append_many([("reruns", {"rerun_id": "ok"}), ("reruns", {"rerun_id": "a\x00b"})])
    assert ledger.verify().rows == 1
