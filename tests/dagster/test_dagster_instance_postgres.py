"""Dagster's own instance on Postgres (issue 15): the profile in deploy/postgres/dagster.yaml,
selected the documented way (DAGSTER_HOME holding it, DAGSTER_PG_* naming a real Postgres 15
started by the tests, tests/postgres_server.py). The manifest sensor ticks through Dagster's own
sensor daemon code, TICA's evidence job runs in-process over the real definitions, and the
run, its materializations, the tick and the sensor's cursor are read back from Postgres's own
tables. The negative controls: a wrong password, or a variable left unset, is an error at
start, never a quiet SQLite instance under DAGSTER_HOME."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.definitions.data_version import DATA_VERSION_TAG
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.scheduler.instigation import InstigatorType, TickStatus
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.sensor import execute_sensor_iteration
from dagster_helpers import materialize_track
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage
from dagster_postgres.utils import DagsterPostgresException
from dagster_project import TRACK, fresh_defs

from sensors.manifests import SENSOR_NAME
from tica.evidence import Component, EvidenceItem
from tica.ledger import PostgresLedger
from tica_assets.keys import component_key, evidence_key, report_key
from tica_assets.settings import PROJECT_ROOT

pytestmark = pytest.mark.scale

PROFILE = PROJECT_ROOT / "deploy" / "postgres" / "dagster.yaml"
SECRET = "dagster-s3cret"
# where an instance without `storage:` keeps its SQLite files under DAGSTER_HOME
SQLITE = ("history", "schedules")


@pytest.fixture
def dagster_db(postgres_server):
    """A database for Dagster's instance, owned by a role that must give its password: the
    session's server trusts loopback logins, so this role alone gets a scram-sha-256 line at the
    top of pg_hba.conf (removed again afterwards); without it a wrong password would pass."""
    suffix = uuid.uuid4().hex[:10]
    role, db = f"dagster_{suffix}", f"dagster_{suffix}"
    with psycopg.connect(f"{postgres_server}/postgres", autocommit=True) as con:
        con.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{SECRET}'")
        con.execute(f"CREATE DATABASE {db} OWNER {role}")
        hba = Path(con.execute("SHOW hba_file").fetchone()[0])
        original = hba.read_text()
        hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n{original}")
        con.execute("SELECT pg_reload_conf()")
    url = urlsplit(postgres_server)
    env = {"DAGSTER_PG_USERNAME": role, "DAGSTER_PG_PASSWORD": SECRET, "DAGSTER_PG_HOST": url.hostname,
           "DAGSTER_PG_DB": db, "DAGSTER_PG_PORT": str(url.port)}
    try:
        deadline = time.monotonic() + 10  # the postmaster rereads pg_hba.conf on its own time
        while _logs_in_without_password(env) and time.monotonic() < deadline:
            time.sleep(0.1)
        yield env
    finally:
        hba.write_text(original)
        with psycopg.connect(f"{postgres_server}/postgres", autocommit=True) as con:
            con.execute("SELECT pg_reload_conf()")


def _logs_in_without_password(env: dict[str, str]) -> bool:
    try:
        psycopg.connect(dagster_dsn(env | {"DAGSTER_PG_PASSWORD": ""})).close()
    except psycopg.OperationalError:
        return False
    return True


def profile_home(home: Path, env: dict[str, str], monkeypatch) -> Path:
    """DAGSTER_HOME holding the Postgres profile, as docs/deployment.md says to select it."""
    home.mkdir(parents=True)
    shutil.copy(PROFILE, home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return home


def dagster_dsn(env: dict[str, str]) -> str:
    return (f"postgresql://{env['DAGSTER_PG_USERNAME']}:{env['DAGSTER_PG_PASSWORD']}@{env['DAGSTER_PG_HOST']}:"
            f"{env['DAGSTER_PG_PORT']}/{env['DAGSTER_PG_DB']}")


def sensor_daemon_tick(instance: DagsterInstance, project, tmp_path: Path) -> None:
    """One iteration of Dagster's sensor daemon over the code location (loaded in-process from
    build_defs with the project's settings: TICA's own sensor, not a copy)."""
    env = project.env()
    defs_file = tmp_path / "tica_location.py"
    defs_file.write_text(
        "from tica_assets.definitions import build_defs\n"
        "from tica_assets.settings import Settings\n"
        f"defs = build_defs(Settings.from_env({env!r}))\n"
    )
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(python_file=str(defs_file), attribute="defs", working_directory=str(PROJECT_ROOT)),
        location_name="tica",
    )
    with create_test_daemon_workspace_context(InProcessWorkspaceLoadTarget(origin), instance) as workspace:
        list(execute_sensor_iteration(workspace, logging.getLogger("tica.test.sensor_daemon"), None, None))


def test_a_tick_and_a_run_of_tica_land_in_dagsters_postgres(project, dagster_db, pg_dsn, tmp_path, monkeypatch):
    home = profile_home(tmp_path / "dagster_home", dagster_db, monkeypatch)
    settings = dataclasses.replace(project.settings, ledger_path=pg_dsn)  # the ledger on Postgres too
    project.settings = settings
    with DagsterInstance.get() as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
        assert instance.run_coordinator.__class__.__name__ == "QueuedRunCoordinator"
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1  # the profile kept the pools

        # (c) the manifest sensor, ticked by the daemon's own code: tick, cursor and observations
        sensor_daemon_tick(instance, project, tmp_path)
        (state,) = [s for s in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
                    if s.name == SENSOR_NAME]
        cursor = json.loads(state.instigator_data.cursor)
        assert set(cursor) == {TRACK} and cursor[TRACK]
        (tick,) = instance.get_ticks(state.instigator_origin_id, state.selector_id)
        # Dagster files a tick that requested no run as skipped, its observations and cursor kept
        assert tick.status == TickStatus.SKIPPED and tick.cursor == state.instigator_data.cursor

        # (a) TICA's evidence job, in-process, over the real definitions (fresh receipts runner)
        result = materialize_track(fresh_defs(project, settings), instance, TRACK)
        assert result.success
        materialized = {e.asset_key for e in result.get_asset_materialization_events()}
        assert materialized == {evidence_key(TRACK, i) for i in EvidenceItem} | {report_key(TRACK)}
        report = instance.get_latest_materialization_event(report_key(TRACK)).asset_materialization
        assert report.metadata["acceptance"].value == "accepted"  # read back through the Postgres event log

    # (b) read back from Postgres itself, not through Dagster
    with psycopg.connect(dagster_dsn(dagster_db)) as con:
        runs = con.execute("SELECT run_id, pipeline_name, status FROM runs").fetchall()
        assert runs == [(result.run_id, f"{TRACK}_evidence", DagsterRunStatus.SUCCESS.value)]
        stored = {r[0] for r in con.execute(
            "SELECT asset_key FROM event_logs WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
            (result.run_id,))}
        assert stored == {k.to_string() for k in materialized}
        versions = con.execute("SELECT count(*) FROM asset_event_tags WHERE key = %s", (DATA_VERSION_TAG,)).fetchone()[0]
        assert versions >= len(materialized)  # data versions (staleness) live in Postgres too
        observed = {r[0] for r in con.execute(
            "SELECT asset_key FROM event_logs WHERE dagster_event_type = 'ASSET_OBSERVATION'")}
        assert observed == {component_key(TRACK, c).to_string() for c in Component}
        (body,) = con.execute("SELECT instigator_body FROM instigators WHERE instigator_type = 'SENSOR'").fetchone()
        assert json.loads(body)["job_specific_data"]["cursor"] == state.instigator_data.cursor  # serdes' stored name
        ticks = con.execute("SELECT status, type FROM job_ticks").fetchall()
        assert ticks == [("SKIPPED", "SENSOR")]
    assert not [p for p in SQLITE if (home / p).exists()] and not list(home.rglob("*.db"))  # no SQLite beside
    verdicts = PostgresLedger(pg_dsn).rows("SELECT item, verdict FROM track_verdicts")
    assert {r["item"]: r["verdict"] for r in verdicts} == {i.value: "pass" for i in EvidenceItem}


def test_a_wrong_password_is_an_error_not_a_sqlite_instance(dagster_db, tmp_path, monkeypatch):
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):  # the server asks this role
        psycopg.connect(dagster_dsn(dagster_db | {"DAGSTER_PG_PASSWORD": ""})).close()

    home = profile_home(tmp_path / "wrong", dagster_db | {"DAGSTER_PG_PASSWORD": "not-the-password"}, monkeypatch)
    with pytest.raises(DagsterPostgresException) as failed:
        DagsterInstance.get()
    assert "password authentication failed" in str(failed.value.__cause__)
    assert not [p for p in SQLITE if (home / p).exists()] and not list(home.rglob("*.db"))

    # A variable left unset names itself; the profile never runs without its server.
    monkeypatch.delenv("DAGSTER_PG_PASSWORD")
    with pytest.raises(DagsterInvalidConfigError, match="DAGSTER_PG_PASSWORD"):
        DagsterInstance.get()
    assert not [p for p in SQLITE if (home / p).exists()] and not list(home.rglob("*.db"))
