"""On a real Postgres server: the report's track-first query returns exactly the rows of
`SELECT * FROM track_verdicts WHERE track = ?` (the same story as the DuckDB test); the indexes are
made, are no tampering, and a ledger made before them verifies and gains them on its next write;
the streamed verify names a tampered row exactly as verify_entries over the whole chain does."""

from __future__ import annotations

import psycopg
import pytest

pytestmark = pytest.mark.scale

from tests.core.test_ledger_report_query import TRACKS, VIEW_SQL, assert_same_as_the_view, build_story
from tica.ledger import INDEXES, TRACK_VERDICTS_SQL, Head, Ledger, PostgresLedger, verify_entries
from tica.ledger.postgres_store import _view_problems


def _indexes(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as con:
        return {r[0] for r in con.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'").fetchall()}


def test_the_track_first_query_returns_exactly_the_views_rows_on_postgres(pg_dsn, tmp_path):
    pg = PostgresLedger(pg_dsn)
    build_story(pg)
    assert pg.verify().ok
    assert_same_as_the_view(pg)
    duck = Ledger(tmp_path / "l.duckdb")
    build_story(duck)
    for track in TRACKS:  # and the same rows as DuckDB's
        assert sorted(map(repr, pg.query(TRACK_VERDICTS_SQL, [track])[1])) == \
            sorted(map(repr, duck.query(TRACK_VERDICTS_SQL, [track])[1]))


def test_the_indexes_are_made_and_an_older_ledger_verifies_and_gains_them(pg_dsn):
    pg = PostgresLedger(pg_dsn)
    build_story(pg)
    assert set(INDEXES) <= _indexes(pg_dsn) and pg.verify().ok
    with psycopg.connect(pg_dsn) as con:
        for name in INDEXES:
            con.execute(f"DROP INDEX {name}")
    assert not set(INDEXES) & _indexes(pg_dsn)
    before = PostgresLedger(pg_dsn).verify()
    assert before.ok, before.problems
    assert_same_as_the_view(PostgresLedger(pg_dsn))
    PostgresLedger(pg_dsn).append("reruns", {"rerun_id": "r1", "reason": "after the upgrade"})
    assert set(INDEXES) <= _indexes(pg_dsn)
    after = PostgresLedger(pg_dsn).verify()
    assert after.ok and after.rows == before.rows + 1


@pytest.mark.parametrize("edit", [
    "UPDATE verdicts SET verdict = 'pass' WHERE verdict_id = 'v1'",
    "DELETE FROM candidates WHERE candidate_id = 'b1'",
    "INSERT INTO reruns (seq, prev_hash, row_hash, recorded_at, rerun_id) VALUES (3, 'p', 'h', 't', 'r')",
])
def test_a_tampered_postgres_ledger_is_named_exactly_as_before(pg_dsn, edit):
    pg = PostgresLedger(pg_dsn)
    build_story(pg)
    head = pg.verify().head
    with psycopg.connect(pg_dsn) as con:
        con.execute(edit)
    for expect in (None, head, Head(seq=4, row_hash="0" * 64, recorded_at="")):
        with psycopg.connect(pg_dsn) as con:
            want = verify_entries(PostgresLedger.chain_entries(con), expect, _view_problems(con))
            con.rollback()
        got = pg.verify(expect)
        assert not got.ok and got == want
