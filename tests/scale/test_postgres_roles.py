"""The ledger's three roles on a real Postgres server: whoever runs `init` owns the schema; a login
that is only a member of `tica_writer` appends and verifies but cannot change what the ledger is
(no rule, trigger, policy, ALTER, UPDATE, DELETE or DROP); a login in `tica_reader` only reads.
Each refusal is the server's own, and the owner doing the same is the negative control."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.scale.test_postgres_ledger import _HIDERS
from tica.ledger import PostgresLedger
from tica.ledger.postgres_store import READER_ROLE, WRITER_ROLE

pytestmark = pytest.mark.scale

ROW = {"verdict_id": "v1", "candidate_id": "c1", "item": "forward", "verdict": "pass", "summary": "ok"}
SCHEMA_CHANGES = [*_HIDERS.values(), "ALTER TABLE verdicts ADD COLUMN note TEXT", "DROP TABLE verdicts CASCADE",
                  "UPDATE verdicts SET verdict = 'fail'", "DELETE FROM verdicts"]


def login_in(dsn: str, role: str) -> str:
    """A new login that is a member of `role` alone; its address on the same database."""
    name = f"{role.split('_')[1]}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute(f"CREATE ROLE {name} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE IN ROLE {role}")
    rest = dsn.split("://", 1)[1].split("@", 1)[1]
    return f"postgresql://{name}@{rest}"


@pytest.fixture
def owned(pg_dsn) -> str:
    PostgresLedger(pg_dsn).init()
    return pg_dsn


def test_a_writer_login_appends_and_verifies(owned):
    writer = PostgresLedger(login_in(owned, WRITER_ROLE))
    writer.append("verdicts", ROW)
    report = writer.verify()
    assert report.ok and report.rows == 1, report.problems


@pytest.mark.parametrize("sql", SCHEMA_CHANGES, ids=lambda s: s.split()[0] + "_" + s.split()[1])
def test_a_writer_login_cannot_change_the_ledger(owned, sql):
    writer_dsn = login_in(owned, WRITER_ROLE)
    PostgresLedger(writer_dsn).append("verdicts", ROW)
    with psycopg.connect(writer_dsn) as con, pytest.raises(psycopg.errors.InsufficientPrivilege):
        con.execute(sql)
    assert PostgresLedger(owned).verify().ok  # nothing changed


@pytest.mark.parametrize("sql", SCHEMA_CHANGES[:3], ids=["rule", "trigger", "rls"])
def test_the_owner_can_change_the_ledger_and_verify_names_it(owned, sql):
    """Negative control: the same statements from the schema's owner go through, and verify sees them."""
    ledger = PostgresLedger(owned)
    ledger.append("verdicts", ROW)
    with psycopg.connect(owned) as con:
        con.execute(sql)
    assert not ledger.verify().ok


def test_a_reader_login_reads_and_cannot_write(owned):
    PostgresLedger(owned).append("verdicts", ROW)
    reader_dsn = login_in(owned, READER_ROLE)
    with psycopg.connect(reader_dsn) as con:
        assert con.execute("SELECT count(*) FROM verdicts").fetchone()[0] == 1
    with psycopg.connect(reader_dsn) as con, pytest.raises(psycopg.errors.InsufficientPrivilege):
        con.execute("INSERT INTO verdicts (seq, prev_hash, row_hash, recorded_at) VALUES (9, 'x', 'y', 'z')")


def test_a_writer_login_on_a_database_without_the_ledger_is_one_line_naming_the_owner(pg_dsn, capsys):
    from tica.cli import main

    PostgresLedger(pg_dsn).init()  # the roles exist; this database then loses the ledger's tables
    with psycopg.connect(pg_dsn, autocommit=True) as con:
        con.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    code = main(["--ledger", login_in(pg_dsn, WRITER_ROLE), "candidate", "record", "demo/candidates/h200-accept.yaml"])
    err = capsys.readouterr().err.strip()
    assert code in (4, 5) and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "owner" in err, err


@pytest.mark.parametrize("sql, named", [
    (f"GRANT UPDATE ON verdicts TO {WRITER_ROLE}", f"UPDATE on verdicts was granted to {WRITER_ROLE}"),
    (f"GRANT INSERT ON verdicts TO {READER_ROLE}", f"INSERT on verdicts was granted to {READER_ROLE}"),
    ("GRANT DELETE ON ledger_chain TO PUBLIC", "DELETE on ledger_chain was granted to PUBLIC"),
    ("CREATE ROLE {other}; ALTER TABLE verdicts OWNER TO {other}", "verdicts is owned by {other}"),
], ids=["writer-update", "reader-insert", "public-delete", "owner"])
def test_a_grant_or_owner_changed_behind_the_ledger_is_named_by_verify(owned, sql, named):
    ledger = PostgresLedger(owned)
    ledger.append("verdicts", ROW)
    assert ledger.verify().ok  # the grants init made are the expected ones
    other = f"owner_{uuid.uuid4().hex[:8]}"  # roles outlive a test's database
    sql, named = sql.format(other=other), named.format(other=other)
    with psycopg.connect(owned) as con:
        con.execute(sql)
    report = ledger.verify()
    assert not report.ok and any(named in p for p in report.problems), report.problems
