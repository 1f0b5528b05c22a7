"""The ledger: append-only by construction, hash-chained, safe under concurrent writers."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import duckdb
import pytest

from tests.long import size
from tica.cli import main
from tica.errors import TicaError
from tica.ledger import TABLES, Ledger


def _append_rows(path: str, writer: int, n: int, gate: str | None = None) -> None:
    import time

    ledger = Ledger(path)
    while gate is not None and not Path(gate).exists():  # all four start appending together
        time.sleep(0.01)
    for i in range(n):
        ledger.append("reruns", {"rerun_id": f"w{writer}-{i}", "original_kind": "leg", "original_id": "x",
                                 "new_id": "y", "reason": "concurrency test"})


def test_the_api_offers_no_update_or_delete():
    public = {name for name in dir(Ledger) if not name.startswith("_")}
    assert not {n for n in public if any(w in n.lower() for w in ("update", "delete", "remove", "edit", "set", "drop"))}


def test_query_runs_read_only(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append("reruns", {"rerun_id": "r1", "original_kind": "leg", "original_id": "a", "new_id": "b", "reason": "t"})
    for sql in ("DELETE FROM reruns", "UPDATE reruns SET reason = 'x'", "DROP TABLE reruns"):
        with pytest.raises(duckdb.Error, match="read-only"):
            ledger.query(sql)
    assert ledger.query("SELECT count(*) FROM reruns")[1] == [(1,)]


def test_unknown_columns_and_tables_are_refused(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    with pytest.raises(TicaError, match="no column"):
        ledger.append("reruns", {"rerun_id": "r", "verdict": "pass"})
    with pytest.raises(TicaError, match="no table"):
        ledger.append("scratch", {})
    assert ledger.verify().rows == 0


@pytest.mark.processes
def test_four_processes_appending_at_once_lose_no_row_and_leave_a_valid_chain(tmp_path):
    """4 x 500 rows under TICA_TESTS=full, 4 x 60 by default (tests/long.py): each append locks,
    connects and commits on its own, so the four processes interleave either way."""
    per = size(60, 500)
    path = str(tmp_path / "l.duckdb")
    Ledger(path).init()
    ctx = mp.get_context("spawn")
    gate = tmp_path / "go"
    procs = [ctx.Process(target=_append_rows, args=(path, w, per, str(gate))) for w in range(4)]
    for p in procs:
        p.start()
    gate.touch()
    for p in procs:
        p.join(timeout=600)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    ledger = Ledger(path)
    assert ledger.query("SELECT count(*), count(DISTINCT rerun_id), max(seq) FROM reruns")[1] == [(4 * per,) * 3]
    report = ledger.verify()
    assert report.ok and report.rows == 4 * per


def _three_rows(tmp_path: Path) -> Ledger:
    ledger = Ledger(tmp_path / "l.duckdb").init()
    for i in range(3):
        ledger.append("reruns", {"rerun_id": f"r{i}", "original_kind": "leg", "original_id": "a", "new_id": "b", "reason": "t"})
    return ledger


def test_a_row_altered_with_raw_sql_fails_verify_and_is_named(tmp_path):
    ledger = _three_rows(tmp_path)
    assert ledger.verify().ok
    con = duckdb.connect(str(ledger.path))
    con.execute("UPDATE reruns SET reason = 'rewritten' WHERE seq = 2")
    con.close()
    report = ledger.verify()
    assert not report.ok
    assert report.problems == ("reruns seq=2: content does not match its row_hash (edited behind the ledger)",)


def test_a_row_deleted_with_raw_sql_fails_verify(tmp_path):
    ledger = _three_rows(tmp_path)
    con = duckdb.connect(str(ledger.path))
    con.execute("DELETE FROM reruns WHERE seq = 2")
    con.close()
    report = ledger.verify()
    assert any("reruns seq=3" in p for p in report.problems)


def test_cli_verify_exits_nonzero_on_a_tampered_ledger(tmp_path, capsys):
    ledger = _three_rows(tmp_path)
    assert main(["--ledger", str(ledger.path), "ledger", "verify"]) == 0
    con = duckdb.connect(str(ledger.path))
    con.execute("UPDATE reruns SET row_hash = 'x' WHERE seq = 1")
    con.close()
    assert main(["--ledger", str(ledger.path), "ledger", "verify"]) == 1
    assert "reruns seq=1" in capsys.readouterr().err


def test_cli_query_prints_a_table(tmp_path, capsys):
    ledger = _three_rows(tmp_path)
    assert main(["--ledger", str(ledger.path), "ledger", "query", "SELECT rerun_id, seq FROM reruns ORDER BY seq"]) == 0
    out = capsys.readouterr().out
    assert "rerun_id" in out and "r2" in out and "(3 rows)" in out


def test_every_table_carries_the_chain_columns(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    for table in TABLES:
        cols = [r[0] for r in ledger.query(f"DESCRIBE {table}")[1]]
        assert cols[:4] == ["seq", "prev_hash", "row_hash", "recorded_at"]
