"""On a real Postgres server: the `track_verdicts` view, rewritten winners-first for Postgres (issue 32:
2.1 s at 100,000 verdicts), returns exactly the rows of its previous text (PG_PREVIOUS_VIEWS) and of
DuckDB's view on the same ledger, on the hand-made story and on random ones (reruns, candidates
recorded twice or never, invalidations that void, revert, name no new candidate or carry NULLs,
checks of every kind). A ledger made with the previous text verifies, and its owner's next write
replaces the text and adds the new index; any other text is still named by verify."""

from __future__ import annotations

import psycopg
import pytest

from tests.core.test_ledger_report_query import build_story
from tests.core.test_ledger_track_verdicts_view import random_story
from tica.ledger import Ledger, PostgresLedger
from tica.ledger import INDEXES
from tica.ledger.postgres_store import PG_PREVIOUS_VIEWS, PG_VIEWS

pytestmark = pytest.mark.scale

ALL = "SELECT * FROM track_verdicts"
PREVIOUS = PG_PREVIOUS_VIEWS["track_verdicts"][0]


def _sorted(rows) -> list[str]:
    return sorted(map(repr, rows))


def _previous_rows(dsn: str) -> tuple[list[str], list[tuple]]:
    """The previous text's rows on this ledger, as a temporary view (rolled back)."""
    with psycopg.connect(dsn) as con:
        con.execute(f"CREATE TEMP VIEW previous_track_verdicts AS {PREVIOUS}")
        cur = con.execute("SELECT * FROM previous_track_verdicts")
        columns, rows = [d.name for d in cur.description], cur.fetchall()
        con.rollback()
    return columns, rows


def _assert_identical(pg: PostgresLedger, duck: Ledger | None) -> int:
    columns, rows = pg.query(ALL)
    old_columns, old_rows = _previous_rows(pg.dsn)
    assert columns == old_columns and _sorted(rows) == _sorted(old_rows)
    if duck is None:
        return len(rows)
    duck_columns, duck_rows = duck.query(ALL)
    assert columns == duck_columns and _sorted(rows) == _sorted(duck_rows)
    # and one track at a time, as a person queries it
    for track in {r[0] for r in rows} | {"no-such-track"}:
        assert _sorted(pg.query(f"{ALL} WHERE track = ?", [track])[1]) == \
            _sorted(duck.query(f"{ALL} WHERE track = ?", [track])[1])
    return len(rows)


def test_the_view_returns_the_previous_texts_rows_and_duckdbs_on_the_story(pg_dsn, tmp_path):
    pg, duck = PostgresLedger(pg_dsn), Ledger(tmp_path / "l.duckdb")
    build_story(pg)
    build_story(duck)
    assert _assert_identical(pg, duck) == 9  # every track and item the story judged
    assert pg.verify().ok


@pytest.mark.parametrize("seed", range(8))
def test_the_view_returns_the_previous_texts_rows_and_duckdbs_on_random_ledgers(pg_dsn, tmp_path, seed):
    pg, duck = PostgresLedger(pg_dsn), Ledger(tmp_path / "l.duckdb")
    for rows in random_story(seed, one_track_each=seed < 5):  # then candidates recorded on several tracks
        pg.append_many(rows)
        duck.append_many(rows)
    assert _assert_identical(pg, duck) > 0
    assert pg.verify().ok


def _view_text(dsn: str) -> str:
    with psycopg.connect(dsn) as con:
        return con.execute("SELECT definition FROM pg_views WHERE viewname = 'track_verdicts'").fetchone()[0]


def test_a_ledger_with_the_previous_text_verifies_and_its_owners_next_write_replaces_it(pg_dsn):
    pg = PostgresLedger(pg_dsn)
    build_story(pg)
    current = _view_text(pg_dsn)
    with psycopg.connect(pg_dsn) as con:  # the ledger as the code before issue 32 made it
        con.execute(f"CREATE OR REPLACE VIEW track_verdicts AS {PREVIOUS}")
        con.execute("DROP INDEX tica_verdicts_candidate_item_seq")
    assert _view_text(pg_dsn) != current
    before = PostgresLedger(pg_dsn).verify()
    assert before.ok, before.problems
    PostgresLedger(pg_dsn).append("reruns", {"rerun_id": "r1", "reason": "after the upgrade"})
    assert _view_text(pg_dsn) == current
    with psycopg.connect(pg_dsn) as con:
        held = {r[0] for r in con.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")}
    assert set(INDEXES) <= held
    after = PostgresLedger(pg_dsn).verify()
    assert after.ok and after.rows == before.rows + 1


@pytest.mark.parametrize("text", [
    PREVIOUS.replace("rn = 1", "rn = 2"),
    PG_VIEWS["track_verdicts"].replace("passed = 0 THEN name", "passed = 1 THEN name"),
    PG_VIEWS["track_verdicts"].replace("LEFT JOIN stale x", "LEFT JOIN (SELECT * FROM stale WHERE false) x"),
])
def test_any_other_text_is_still_named(pg_dsn, text):
    pg = PostgresLedger(pg_dsn)
    build_story(pg)
    with psycopg.connect(pg_dsn) as con:
        con.execute(f"CREATE OR REPLACE VIEW track_verdicts AS {text}")
    problems = PostgresLedger(pg_dsn).verify().problems
    assert "view track_verdicts is not defined as the code defines it (changed behind the ledger)" in problems
