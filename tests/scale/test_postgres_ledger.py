"""The ledger on a real Postgres server (tica/ledger/postgres_store.py): the same chain, hashes and views as
the DuckDB ledger, chains moved between the two with every hash kept, and no pass for a ledger
edited behind its back. One invariant per test, each with the way it must fail."""

from __future__ import annotations

import multiprocessing as mp

import psycopg
import pytest

pytestmark = pytest.mark.scale

from tests.long import size
from tica.cli import main
from tica.ledger import Ledger, PostgresLedger

VERDICT_VIEWS = ("track_verdicts", "current_verdicts", "stale_evidence", "after_the_fact_verdicts", "verdict_history")


def _story(ledger) -> None:
    """Candidates, a verdict with its checks, a later invalidation: enough for every view to say something."""
    ledger.append("candidates", {"candidate_id": "c1", "track": "t", "manifest_hash": "h1"})
    ledger.append("questions", {"question_hash": "q1", "name": "fwd", "item": "forward", "body_json": {"x": "é"}})
    ledger.append_many([
        ("verdicts", {"verdict_id": "v1", "candidate_id": "c1", "item": "forward", "verdict": "pass", "summary": "s"}),
        ("checks", {"check_id": "k1", "verdict_id": "v1", "name": "canaries_caught", "blocking": 1, "passed": 1}),
        ("checks", {"check_id": "k2", "verdict_id": "v1", "name": "frozen_before_run", "blocking": 1, "passed": 0,
                    "description": "after the fact"}),
        ("verdicts", {"verdict_id": "v2", "candidate_id": "c1", "item": "quality", "verdict": "fail", "summary": "q"}),
    ])
    ledger.append("invalidations", {"invalidation_id": "i1", "track": "t", "old_candidate_id": "c1",
                                    "new_candidate_id": "c2", "component": "weights", "item": "quality", "cause": "changed"})


def _view_rows(ledger, view: str) -> list[tuple]:
    """A view's rows without recorded_at (the two ledgers appended at different moments)."""
    columns, rows = ledger.query(f"SELECT * FROM {view}")
    keep = [i for i, c in enumerate(columns) if c != "recorded_at"]
    return sorted((tuple(r[i] for i in keep) for r in rows), key=repr)


def test_the_same_appends_give_the_same_chain_and_views_as_duckdb(pg_dsn, tmp_path):
    pg, duck = PostgresLedger(pg_dsn), Ledger(tmp_path / "l.duckdb")
    for ledger in (pg, duck):
        _story(ledger)
    assert pg.verify().ok and duck.verify().ok
    assert [e[:2] + e[5:] for e in _entries(pg)] == [e[:2] + e[5:] for e in _entries(duck)]
    for view in VERDICT_VIEWS:
        assert _view_rows(pg, view) == _view_rows(duck, view), view
    stale = pg.rows("SELECT item, stale, stale_cause FROM track_verdicts ORDER BY item")
    assert stale == [{"item": "forward", "stale": False, "stale_cause": None},
                     {"item": "quality", "stale": True, "stale_cause": "weights: changed"}]


def _entries(ledger):
    with ledger.reader() as con:
        return ledger.chain_entries(con)


def test_a_chain_moves_duckdb_to_postgres_and_back_with_every_hash(pg_dsn, tmp_path):
    duck = Ledger(tmp_path / "a.duckdb")
    _story(duck)
    out, back = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(["--ledger", str(duck.path), "ledger", "export", "--out", str(out)]) == 0
    assert main(["--ledger", pg_dsn, "ledger", "import", str(out)]) == 0
    assert PostgresLedger(pg_dsn).verify().head == duck.verify().head
    assert main(["--ledger", pg_dsn, "ledger", "export", "--out", str(back)]) == 0
    assert back.read_text() == out.read_text()


def test_a_row_edited_behind_the_ledger_is_named_by_verify(pg_dsn, capsys):
    ledger = PostgresLedger(pg_dsn)
    _story(ledger)
    assert main(["--ledger", pg_dsn, "ledger", "verify"]) == 0
    with psycopg.connect(pg_dsn) as con:
        con.execute("UPDATE verdicts SET verdict = 'pass' WHERE verdict_id = 'v2'")
    assert main(["--ledger", pg_dsn, "ledger", "verify"]) == 1
    assert "verdicts seq=6: content does not match its row_hash" in capsys.readouterr().err


def test_a_view_replaced_behind_the_ledger_is_named_by_verify(pg_dsn):
    ledger = PostgresLedger(pg_dsn)
    _story(ledger)
    with psycopg.connect(pg_dsn) as con:
        con.execute("CREATE OR REPLACE VIEW stale_evidence AS SELECT track, candidate_id, item, verdict, verdict_id, "
                    "stale_cause FROM current_verdicts WHERE false")
    assert any("view stale_evidence is not defined as the code defines it" in p for p in ledger.verify().problems)


def test_sql_a_person_types_can_read_the_views_but_not_write_or_read_server_files(pg_dsn, capsys):
    _story(PostgresLedger(pg_dsn))
    assert main(["--ledger", pg_dsn, "ledger", "query", "SELECT item, verdict FROM track_verdicts"]) == 0
    for sql in ("DELETE FROM verdicts", "SELECT pg_read_file('/etc/hostname')", "CREATE TABLE x (a int)"):
        with pytest.raises(psycopg.Error):
            PostgresLedger(pg_dsn).query(sql, sandboxed=True)
    assert PostgresLedger(pg_dsn).verify().rows == 7


def test_a_missing_ledger_is_an_error_not_an_empty_ledger(pg_dsn, capsys):
    assert main(["--ledger", pg_dsn, "ledger", "verify"]) == 4
    assert "no ledger in this database" in capsys.readouterr().err


def _writer(dsn: str, n: int, w: int) -> None:
    ledger = PostgresLedger(dsn, lock_timeout_s=120)
    for i in range(n):
        ledger.append("reruns", {"rerun_id": f"w{w}-{i}", "reason": "concurrent"})


def test_concurrent_writers_lose_nothing_and_the_chain_verifies(pg_dsn):
    """The CI slice, 8 x 40; the issue's 8 x 500 under TICA_TESTS=full (or TICA_SCALE_APPENDS=500)."""
    import os

    writers, appends = 8, int(os.environ.get("TICA_SCALE_APPENDS", size(40, 500)))
    PostgresLedger(pg_dsn).init()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(pg_dsn, appends, w)) for w in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    assert [p.exitcode for p in procs] == [0] * writers
    report = PostgresLedger(pg_dsn).verify()
    assert report.ok and report.rows == writers * appends
    ids = {r[0] for r in PostgresLedger(pg_dsn).query("SELECT rerun_id FROM reruns")[1]}
    assert ids == {f"w{w}-{i}" for w in range(writers) for i in range(appends)}


def test_duckdb_placeholders_become_psycopgs_outside_quotes_only():
    from tica.ledger.postgres_store import portable

    sql, params = portable("SELECT '?%' AS q FROM t WHERE a = ? AND b LIKE 'x%' AND c IN (?, ?)", [1, 2, 3])
    assert sql == "SELECT '?%%' AS q FROM t WHERE a = %s AND b LIKE 'x%%' AND c IN (%s, %s)" and params == [1, 2, 3]
    assert portable("SELECT '?' FROM t", None) == ("SELECT '?' FROM t", None)  # no parameters: untouched


# ------------------------------------------------------------ the database as the adversary (issue 32)
_HIDERS = {
    "rule": "CREATE RULE drop_fail AS ON INSERT TO verdicts WHERE NEW.verdict = 'fail' DO INSTEAD NOTHING",
    "trigger": ("CREATE FUNCTION public.tica_drop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.verdict = 'fail' THEN RETURN NULL; END IF; RETURN NEW; END $$; "
                "CREATE TRIGGER drop_fail BEFORE INSERT ON verdicts FOR EACH ROW EXECUTE FUNCTION public.tica_drop()"),
    "row-level security": ("ALTER TABLE verdicts ENABLE ROW LEVEL SECURITY; "
                           "CREATE POLICY no_fail ON verdicts FOR SELECT TO PUBLIC USING (verdict <> 'fail')"),
    "default": "ALTER TABLE verdicts ALTER COLUMN summary SET DEFAULT 'ok'",
}


@pytest.mark.parametrize("kind", list(_HIDERS))
def test_what_could_drop_or_hide_rows_is_named_by_verify_and_refuses_every_write(pg_dsn, kind):
    """A rule, a trigger or a row-level-security policy needs only table ownership, which the
    writer's login has: verify names it, and no append is acknowledged while it is there."""
    ledger = PostgresLedger(pg_dsn)
    _story(ledger)
    before = ledger.verify()
    with psycopg.connect(pg_dsn) as con:
        con.execute(_HIDERS[kind])
    report = ledger.verify()
    assert not report.ok and any("created behind the ledger" in p and kind.split()[0] in p for p in report.problems)
    with pytest.raises(Exception, match="nothing was written"):
        ledger.append("verdicts", {"verdict_id": "v3", "candidate_id": "c1", "item": "update", "verdict": "fail",
                                   "summary": "dropped?"})
    assert ledger.verify().rows == before.rows  # nothing acknowledged, nothing stored


def test_a_dropped_insert_is_never_acknowledged(pg_dsn, monkeypatch):
    """The write's own proof, whatever the catalog check says: an insert the store did not keep
    (rowcount 0) ends the append with nothing written."""
    from tica.ledger import postgres_store

    ledger = PostgresLedger(pg_dsn)
    _story(ledger)
    with psycopg.connect(pg_dsn) as con:
        con.execute(_HIDERS["rule"])
    monkeypatch.setattr(postgres_store, "_write_hazards", lambda con: [])  # as if the catalog check missed it
    rows = ledger.verify().rows
    with pytest.raises(Exception, match="stored 0 rows; nothing was written"):
        ledger.append_many([("reruns", {"rerun_id": "r0", "reason": "kept?"}),
                            ("verdicts", {"verdict_id": "v3", "candidate_id": "c1", "item": "update",
                                          "verdict": "fail", "summary": "dropped?"})])
    assert ledger.rows("SELECT count(*) AS n FROM reruns") == [{"n": 0}]  # the whole append rolled back
    # control: a row the rule lets through is acknowledged, and the chain stays whole
    ledger.append("reruns", {"rerun_id": "r1", "reason": "control"})
    assert ledger.rows("SELECT rerun_id FROM reruns") == [{"rerun_id": "r1"}]
    assert ledger.verify().rows == rows + 1


@pytest.mark.parametrize("sql,why", [
    ("DELETE FROM verdicts", "read-only transaction"),
    ("SELECT pg_read_file('/etc/hostname')", "permission denied"),
    ("COMMIT; SELECT 1", "multiple commands"),
    ("SELECT 1; SELECT 2", "multiple commands"),
    ("SELECT pg_sleep(5)", "statement timeout"),
    ("SELEC 1", "syntax error"),
])
def test_a_refused_typed_query_is_one_line_and_exit_4(pg_dsn, capsys, monkeypatch, sql, why):
    """On Postgres as on DuckDB: never a traceback; one statement only; bounded in time."""
    from tica.ledger import postgres_store

    monkeypatch.setattr(postgres_store, "QUERY_TIMEOUT_S", 1.0)
    _story(PostgresLedger(pg_dsn))
    capsys.readouterr()
    assert main(["--ledger", pg_dsn, "ledger", "query", sql]) == 4
    err = capsys.readouterr().err
    assert err.startswith("tica: query refused: ") and why in err and len(err.strip().splitlines()) == 1, err


def test_a_typed_query_with_a_percent_sign_runs(pg_dsn, capsys):
    """Control: one statement, a literal % (the driver's placeholder sign) kept as text."""
    _story(PostgresLedger(pg_dsn))
    capsys.readouterr()
    assert main(["--ledger", pg_dsn, "ledger", "query", "SELECT item FROM verdicts WHERE item LIKE 'f%'"]) == 0
    assert "forward" in capsys.readouterr().out


def test_a_chain_holding_a_nul_is_refused_by_postgres_import_before_anything_is_created(pg_dsn, tmp_path, capsys):
    """DuckDB stores a NUL in text, Postgres cannot: the import named nothing, raised a traceback
    and left empty tables. Now one line naming the row, exit 4, and no ledger there."""
    duck = Ledger(tmp_path / "a.duckdb")
    _story(duck)
    duck.append("reruns", {"rerun_id": "r\x00", "reason": "a NUL in an id"})
    out = tmp_path / "a.jsonl"
    assert main(["--ledger", str(duck.path), "ledger", "export", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["--ledger", pg_dsn, "ledger", "import", str(out)]) == 4
    err = capsys.readouterr().err
    assert "payload.rerun_id" in err and "NUL" in err and len(err.strip().splitlines()) == 1, err
    assert main(["--ledger", pg_dsn, "ledger", "verify"]) == 4  # no ledger was created there


def test_a_table_dropped_behind_the_ledger_is_named_by_verify(pg_dsn):
    ledger = PostgresLedger(pg_dsn)
    _story(ledger)
    with psycopg.connect(pg_dsn) as con:
        con.execute("DROP TABLE reruns CASCADE")
    report = ledger.verify()
    assert not report.ok and report.problems[0].startswith("table reruns is missing")
