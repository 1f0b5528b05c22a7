"""The ledger under races, a stuck writer, tampering and typed SQL (issue 11, the ledger part):
one invariant per test, each with the tamper or race that would break it."""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import time
from pathlib import Path

import duckdb
import pytest
import yaml

from tica.cli import main
from tica.errors import FrozenQuestionError
from tica.ledger import Head, Ledger, LedgerLockTimeout, row_hash
from tica.records import freeze_question

QUESTION = {"name": "race/1", "item": "clean_exit", "compared": "exits", "computation": "leg receipts",
            "pass_line": "every process exited 0", "noise_floor": 0.0, "invalid_leg_rule": "rerun",
            "criteria": {"item": "clean_exit"}}


def _rerun(i: int) -> tuple[str, dict]:
    return "reruns", {"rerun_id": f"r{i}", "original_kind": "leg", "original_id": "a", "new_id": "b", "reason": "t"}


def _freeze(path: str, question_file: str, out: str) -> None:
    try:
        q = freeze_question(Ledger(path), question_file)
        Path(out).write_text(q.hash)
    except FrozenQuestionError as err:
        Path(out).write_text(f"refused: {err}")


@pytest.mark.processes
def test_one_question_name_is_frozen_to_exactly_one_hash_under_four_racing_processes(tmp_path):
    path = str(tmp_path / "l.duckdb")
    Ledger(path).init()
    files = []
    for i in range(4):  # four different bodies under one name, frozen at once
        body = {**QUESTION, "pass_line": f"every process exited 0 (variant {i})"}
        f = tmp_path / f"q{i}.yaml"
        f.write_text(yaml.safe_dump(body))
        files.append(str(f))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_freeze, args=(path, files[i], str(tmp_path / f"out{i}"))) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    rows = Ledger(path).rows("SELECT question_hash FROM questions WHERE name = 'race/1'")
    assert len(rows) == 1
    outcomes = [(tmp_path / f"out{i}").read_text() for i in range(4)]
    assert sum(not o.startswith("refused") for o in outcomes) == 1, outcomes
    assert Ledger(path).verify().ok


def test_a_stuck_writer_makes_others_fail_clearly_naming_it_and_writes_nothing(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb", lock_timeout_s=0.5).init()
    lock_path = tmp_path / "l.duckdb.lock"
    with open(lock_path, "a+") as stuck:
        fcntl.flock(stuck, fcntl.LOCK_EX)
        stuck.write("pid 4242 since 2026-11-30T00:00:00+00:00")
        stuck.flush()
        with pytest.raises(LedgerLockTimeout, match="pid 4242"):
            ledger.append(*_rerun(1))
        # readers are not writers: they do not wait for the writer lock
        assert ledger.rows("SELECT count(*) AS n FROM reruns")[0]["n"] == 0
    ledger.append(*_rerun(2))
    assert ledger.verify().ok and ledger.verify().rows == 1


@pytest.fixture(params=["1", "0"], ids=["in-db", "python"])
def either_verify(request, monkeypatch):
    """Verify's two paths (TICA_VERIFY_IN_DB): each tamper below must fail verify on both."""
    monkeypatch.setenv("TICA_VERIFY_IN_DB", request.param)
    return request.param


def _published(tmp_path: Path, ledger: Ledger) -> Path:
    head = tmp_path / "head.json"
    assert main(["--ledger", str(ledger.path), "ledger", "head", "--out", str(head)]) == 0
    return head


def test_a_truncated_tail_fails_against_the_published_head(tmp_path, either_verify):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append_many([_rerun(i) for i in range(5)])
    head = _published(tmp_path, ledger)
    con = duckdb.connect(str(ledger.path))
    con.execute("DELETE FROM reruns WHERE seq = 5")
    con.close()
    assert ledger.verify().ok  # without the anchor, a clean truncation verifies...
    assert main(["--ledger", str(ledger.path), "ledger", "verify", "--expect-head", str(head)]) == 1  # ...not with it


def test_a_rehashed_rewrite_fails_against_the_published_head(tmp_path, either_verify):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append_many([_rerun(i) for i in range(3)])
    head = Head.from_json(_published(tmp_path, ledger).read_text())
    # Rewrite row 2's reason and re-hash the chain from there: every link is consistent again.
    con = duckdb.connect(str(ledger.path))
    rows = con.execute("SELECT seq, prev_hash, recorded_at, rerun_id, original_kind, original_id, new_id, reason "
                       "FROM reruns ORDER BY seq").fetchall()
    prev = rows[0][1]
    for seq, _, at, rid, kind, oid, nid, reason in rows:
        reason = "forged" if seq == 2 else reason
        payload = {"rerun_id": rid, "original_kind": kind, "original_id": oid, "new_id": nid, "reason": reason}
        digest = row_hash(prev, "reruns", seq, at, payload)
        con.execute("UPDATE reruns SET prev_hash = ?, row_hash = ?, reason = ? WHERE seq = ?", [prev, digest, reason, seq])
        prev = digest
    con.close()
    assert ledger.verify().ok
    report = ledger.verify(expect=head)
    assert not report.ok and "rewritten" in report.problems[0]


def test_a_view_replaced_behind_the_ledger_fails_verify(tmp_path, either_verify):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    con = duckdb.connect(str(ledger.path))
    con.execute("CREATE OR REPLACE VIEW track_verdicts AS SELECT 'x' AS track, 'forward' AS item, 'pass' AS verdict")
    con.close()
    report = ledger.verify()
    assert not report.ok and any("track_verdicts" in p for p in report.problems)


def test_typed_sql_cannot_reach_files_and_errors_are_one_line(tmp_path, capsys):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    for sql in (f"COPY reruns TO '{tmp_path / 'out.csv'}'", f"SELECT * FROM read_text('{secret}')",
                f"EXPORT DATABASE '{tmp_path / 'exp'}'", "INSTALL httpfs", "DELETE FROM reruns"):
        assert main(["--ledger", str(ledger.path), "ledger", "query", sql]) == 4, sql
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "exp").exists()


def test_control_bytes_in_the_ledger_are_printed_escaped(tmp_path, capsys):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append("reruns", {"rerun_id": "r", "original_kind": "leg", "original_id": "a", "new_id": "b",
                             "reason": "clear screen \x1b[2J here"})
    assert main(["--ledger", str(ledger.path), "ledger", "query", "SELECT reason FROM reruns"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b" in out


def test_a_mistyped_ledger_path_is_an_error_not_an_empty_ledger(tmp_path, capsys):
    missing = tmp_path / "typo.duckdb"
    for verb in (["ledger", "verify"], ["ledger", "query", "SELECT 1"], ["ledger", "head"]):
        assert main(["--ledger", str(missing), *verb]) == 4
        assert "no ledger here" in capsys.readouterr().err
    assert not missing.exists()


def test_usage_errors_exit_4_not_the_inconclusive_code(capsys):
    for argv in (["ledger", "bogus"], ["judge"], ["judge", "forward", "leg"], ["candidate"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 4, argv


def test_a_published_head_that_is_not_a_head_is_bad_input(tmp_path, capsys):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    bad = tmp_path / "head.json"
    bad.write_text(json.dumps({"seq": "3", "row_hash": "abc"}))
    assert main(["--ledger", str(ledger.path), "ledger", "verify", "--expect-head", str(bad)]) == 4
    assert "head.json: seq" in capsys.readouterr().err


def _good_head(tmp_path: Path, ledger: Ledger) -> dict:
    out = tmp_path / "good.json"
    assert main(["--ledger", str(ledger.path), "ledger", "head", "--out", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", ["fifo", "duplicate_seq", "deep", "huge", "directory"])
def test_a_head_file_that_cannot_be_one_head_is_refused_by_name_at_once(tmp_path, capsys, case):
    """Issue 32: a FIFO hung verify, a deep JSON was a RecursionError, a second `seq` key was
    taken. Each is one line naming the file, exit 4, without waiting on the file."""
    import os

    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append_many([_rerun(0)])
    good = _good_head(tmp_path, ledger)
    bad = tmp_path / "head.json"
    if case == "fifo":
        os.mkfifo(bad)
    elif case == "duplicate_seq":
        body = json.dumps(good)
        bad.write_text(body[:-1] + ', "seq": 0}')
    elif case == "deep":
        bad.write_text("[" * 10_000 + "]" * 10_000)  # under the size bound: the depth bound refuses it
    elif case == "huge":
        bad.write_text(json.dumps({**good, "signed_by": "x" * 100_000}))
    else:
        bad.mkdir()
    for flag in ("--expect-head",):
        assert main(["--ledger", str(ledger.path), "ledger", "verify", flag, str(bad)]) == 4
        err = capsys.readouterr().err
        assert "head.json" in err and len(err.strip().splitlines()) == 1, err
    good_path = tmp_path / "ok.json"
    good_path.write_text(json.dumps(good))  # control: the same head, well formed, verifies
    assert main(["--ledger", str(ledger.path), "ledger", "verify", "--expect-head", str(good_path)]) == 0


def test_a_fifo_as_a_key_file_is_refused_not_waited_on(tmp_path, capsys):
    import os

    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append_many([_rerun(0)])
    fifo = tmp_path / "key.pem"
    os.mkfifo(fifo)
    assert main(["--ledger", str(ledger.path), "ledger", "head", "--out", str(tmp_path / "h.json"),
                 "--sign-key", str(fifo)]) == 4
    assert "key.pem" in capsys.readouterr().err


def test_a_session_appends_many_rows_on_one_connection_and_the_chain_verifies(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append(*_rerun(0))
    with ledger.session():
        for i in range(1, 50):
            ledger.append(*_rerun(i))
        with pytest.raises(FrozenQuestionError):  # a refused check-and-append inside the session...
            ledger.check_and_append(lambda rows: (_ for _ in ()).throw(FrozenQuestionError("refused")))
        ledger.append(*_rerun(50))  # ...leaves the head where it was
    ledger.append(*_rerun(51))
    report = ledger.verify()
    assert report.ok and report.rows == 52


def _keys(tmp_path: Path, name: str = "key") -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private, public = tmp_path / f"{name}.pem", tmp_path / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _signed_head(tmp_path: Path, ledger: Ledger, private: Path) -> Path:
    head = tmp_path / "head.json"
    assert main(["--ledger", str(ledger.path), "ledger", "head", "--out", str(head), "--sign-key", str(private)]) == 0
    return head


def _verify(ledger: Ledger, head: Path, public: Path) -> int:
    return main(["--ledger", str(ledger.path), "ledger", "verify", "--expect-head", str(head), "--public-key", str(public)])


def test_a_signed_head_verifies_under_its_public_key(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append_many([_rerun(i) for i in range(3)])
    private, public = _keys(tmp_path)
    assert _verify(ledger, _signed_head(tmp_path, ledger, private), public) == 0


def test_a_head_edited_to_match_a_rewritten_chain_fails_its_signature(tmp_path, either_verify):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append_many([_rerun(i) for i in range(3)])
    private, public = _keys(tmp_path)
    head = _signed_head(tmp_path, ledger, private)
    con = duckdb.connect(str(ledger.path))
    con.execute("DELETE FROM reruns WHERE seq = 3")
    con.close()
    # The forger publishes the truncated chain's head in the old file, keeping the signature.
    data = json.loads(head.read_text())
    truncated = ledger.verify().head
    data |= {"seq": truncated.seq, "row_hash": truncated.row_hash, "recorded_at": truncated.recorded_at}
    head.write_text(json.dumps(data))
    assert ledger.verify(Head.from_json(head.read_text())).ok  # the chain holds the edited head...
    assert _verify(ledger, head, public) == 1  # ...whose signature does not verify


def test_a_head_signed_by_another_key_fails(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append(*_rerun(1))
    private, _ = _keys(tmp_path, "forger")
    _, public = _keys(tmp_path, "owner")
    assert _verify(ledger, _signed_head(tmp_path, ledger, private), public) == 1


def test_a_signed_head_naming_another_signer_fails(tmp_path, capsys):
    """`signed_by` is not under the signature, so verify compares it with the key it was given
    (the fuzz found a head whose signer's name was altered verify, and print that name)."""
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append(*_rerun(1))
    private, public = _keys(tmp_path)
    head = _signed_head(tmp_path, ledger, private)
    assert _verify(ledger, head, public) == 0  # control
    data = json.loads(head.read_text())
    head.write_text(json.dumps(data | {"signed_by": "ed25519:0000000000000000"}))
    assert _verify(ledger, head, public) == 1
    assert "names its signer ed25519:0000000000000000, but the key given is" in capsys.readouterr().err


@pytest.mark.parametrize("drop", ["signature", "signed_by"])
def test_a_signed_head_missing_its_signature_or_its_signers_name_is_bad_input(tmp_path, drop):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append(*_rerun(1))
    private, public = _keys(tmp_path)
    head = _signed_head(tmp_path, ledger, private)
    data = json.loads(head.read_text())
    del data[drop]
    head.write_text(json.dumps(data))
    assert _verify(ledger, head, public) == 4


def test_an_unsigned_head_fails_when_a_public_key_is_given(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append(*_rerun(1))
    _, public = _keys(tmp_path)
    assert _verify(ledger, _published(tmp_path, ledger), public) == 1
    assert main(["--ledger", str(ledger.path), "ledger", "verify", "--expect-head",
                 str(tmp_path / "head.json")]) == 0  # negative control: without the key it holds


def test_a_key_that_is_not_ed25519_pem_is_bad_input(tmp_path, capsys):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append(*_rerun(1))
    bad = tmp_path / "key.pem"
    bad.write_text("not a key")
    assert main(["--ledger", str(ledger.path), "ledger", "head", "--sign-key", str(bad)]) == 4
    assert "key.pem" in capsys.readouterr().err


def test_a_table_dropped_behind_the_ledger_is_named_by_verify_not_a_traceback(tmp_path, capsys):
    """Issue 32: a dropped `reruns` table was a CatalogException traceback."""
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append_many([_rerun(0)])
    assert main(["--ledger", str(ledger.path), "ledger", "verify"]) == 0  # control
    con = duckdb.connect(str(ledger.path))
    con.execute("DROP TABLE reruns CASCADE")
    con.close()
    capsys.readouterr()
    assert main(["--ledger", str(ledger.path), "ledger", "verify"]) == 1
    assert "table reruns is missing" in capsys.readouterr().err


def _append_during(path: str, n: int, out) -> None:
    ledger = Ledger(path, lock_timeout_s=5)
    try:
        for i in range(n):
            ledger.append("reruns", {"rerun_id": f"during-{i}", "reason": "a verdict while someone reads"})
        out.put("ok")
    except Exception as err:  # noqa: BLE001 - reported to the test
        out.put(f"{type(err).__name__}: {err}")


@pytest.mark.serial  # a 4 s query bound, a 1 s head start
@pytest.mark.processes
def test_a_typed_query_never_holds_a_writer_out_and_is_interrupted(tmp_path, capsys, monkeypatch):
    """Issue 32: a long typed scan held the DuckDB file and a verdict produced meanwhile was not
    recorded. Typed SQL runs on a copy: every write lands, and the scan is interrupted at its bound."""
    import threading

    import tica.ledger.duckdb_store as L

    monkeypatch.setattr(L, "QUERY_TIMEOUT_S", 4.0)
    ledger = Ledger(tmp_path / "l.duckdb").init()
    ledger.append_many([_rerun(0)])
    results: list[int] = []
    reader = threading.Thread(target=lambda: results.append(main(
        ["--ledger", str(ledger.path), "ledger", "query", "SELECT count(*) FROM range(100000000000) a"])))
    reader.start()
    time.sleep(1.0)  # the scan is running
    out = mp.get_context("spawn").Queue()
    writer = mp.get_context("spawn").Process(target=_append_during, args=(str(ledger.path), 5, out))
    writer.start()
    writer.join(60)
    reader.join(60)
    assert out.get(timeout=5) == "ok"
    assert results == [4] and "query refused" in capsys.readouterr().err
    assert Ledger(ledger.path).verify().rows == 6  # the one before and the five written during the scan


def test_a_typed_query_returning_too_many_rows_is_refused(tmp_path, capsys, monkeypatch):
    import tica.ledger.duckdb_store as L

    monkeypatch.setattr(L, "QUERY_MAX_ROWS", 10)
    ledger = Ledger(tmp_path / "l.duckdb").init()
    assert main(["--ledger", str(ledger.path), "ledger", "query", "SELECT * FROM range(11)"]) == 4
    assert "more than 10 rows" in capsys.readouterr().err
    assert main(["--ledger", str(ledger.path), "ledger", "query", "SELECT * FROM range(10)"]) == 0  # control
