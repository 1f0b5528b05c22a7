"""One Dagster run whose verdicts land in a Postgres ledger (issue 15): the same project as the
DuckDB tests, TICA_LEDGER set to a postgresql:// address, the real judges, checks and report;
the ledger server is a real Postgres 15 started by the tests (tests/postgres_server.py)."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest
from dagster_helpers import kept_instance, materialize_track, tick
from dagster_project import TRACK, fresh_defs

from tica.evidence import EvidenceItem
from tica.ledger import PostgresLedger, redacted
from tica_assets.keys import report_key

pytestmark = pytest.mark.scale


def test_a_run_lands_its_verdicts_and_checks_in_the_postgres_ledger(project, pg_dsn, tmp_path):
    settings = dataclasses.replace(project.settings, ledger_path=pg_dsn)
    defs = fresh_defs(project, settings)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    assert materialize_track(defs, instance, TRACK).success
    ledger = PostgresLedger(pg_dsn)
    rows = ledger.rows("SELECT item, verdict, failed_checks, after_the_fact FROM track_verdicts")
    assert {r["item"]: r["verdict"] for r in rows} == {i.value: "pass" for i in EvidenceItem}
    assert ledger.verify().ok
    meta = instance.get_latest_materialization_event(report_key(TRACK)).asset_materialization.metadata
    assert meta["acceptance"].value == "accepted"
    assert meta["verified_head"].data["ledger"] == redacted(pg_dsn)


def test_the_report_refuses_a_postgres_ledger_edited_behind_it(project, pg_dsn, tmp_path):
    """The negative control: a verdict rewritten in the database itself; the next report run
    verifies the chain first and fails rather than show the edited verdict."""
    settings = dataclasses.replace(project.settings, ledger_path=pg_dsn)
    defs = fresh_defs(project, settings)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    assert materialize_track(defs, instance, TRACK).success
    with psycopg.connect(pg_dsn) as con:
        con.execute("UPDATE verdicts SET summary = 'edited' WHERE item = 'forward'")
    result = materialize_track(defs, instance, TRACK, job="report")
    assert not result.success


def test_a_password_never_reaches_messages_or_metadata():
    assert redacted("postgresql://tica:s3cret@db:5432/ledger") == "postgresql://tica:***@db:5432/ledger"
    assert redacted("postgresql://tica@db/ledger") == "postgresql://tica@db/ledger"
