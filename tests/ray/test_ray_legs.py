"""TICA's legs as Ray jobs on a multi-node Ray cluster (resources/ray_legs.py, issue 15): one
Dagster run of the real TICA definitions whose legs run on different nodes, the verdicts in a
Postgres ledger; every throughput round on one node; the node recorded in each sealed leg."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.dagster.dagster_helpers import kept_instance, materialize_track, tick
from tests.ray.ray_project import TRACK, leg_json, ray_defs, ray_project, ray_runner
from tica.evidence import EvidenceItem
from tica.ledger import PostgresLedger

pytestmark = pytest.mark.scale


def test_a_run_on_ray_nodes_lands_its_verdicts_in_the_postgres_ledger(ray_cluster, pg_dsn, tmp_path):
    project, settings = ray_project(tmp_path / "project", pg_dsn)
    shared = tmp_path / "shared"
    defs = ray_defs(settings, ray_runner(project, ray_cluster.dashboard, shared))
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    t0 = time.monotonic()
    assert materialize_track(defs, instance, TRACK).success
    print(f"the track on Ray: {time.monotonic() - t0:.1f} s")

    ledger = PostgresLedger(pg_dsn)
    rows = ledger.rows("SELECT item, verdict, summary FROM track_verdicts")
    assert {r["item"]: r["verdict"] for r in rows} == {i.value: "pass" for i in EvidenceItem}, rows
    assert ledger.verify().ok
    legs = ledger.rows("SELECT item, arm, status, leg_dir FROM legs")
    own = [r for r in legs if r["item"] != "artifacts"]
    assert own and all(r["status"] == "sealed" for r in own)
    assert all(Path(r["leg_dir"]).is_relative_to(shared) for r in own)  # receipts on the shared folder

    # Each leg recorded its node; a pairing's legs share one node, the items spread over both.
    nodes_by_item: dict[str, set[str]] = {}
    for r in own:
        env = leg_json(r["leg_dir"])["env"]
        assert env["TICA_NODE"] in ray_cluster.nodes and env["TICA_NODE_ID"] and env["TICA_NODE_IP"]
        nodes_by_item.setdefault(r["item"], set()).add(env["TICA_NODE"])
    assert all(len(n) == 1 for n in nodes_by_item.values()), nodes_by_item
    assert set().union(*nodes_by_item.values()) == set(ray_cluster.nodes) - {"victim"}
    tput = [r for r in own if r["item"] == "throughput"]
    assert len(tput) == 20 and len({leg_json(r["leg_dir"])["env"]["TICA_NODE"] for r in tput}) == 1

    # Ray ran each job on the node the leg names (the runner's record beside each leg).
    records = [json.loads(p.read_text()) for p in shared.rglob("*.ray.json")]
    import datetime as dt
    spans = [(dt.datetime.fromisoformat(r["ended_at"]) - dt.datetime.fromisoformat(r["started_at"])).total_seconds()
             for r in records]
    t = lambda r, k: dt.datetime.fromisoformat(r[k]).timestamp()  # noqa: E731
    print(f"{len(records)} Ray jobs, {sum(spans):.1f} s in their entrypoints; submit->start "
          f"{sum(t(r, 'started_at') - t(r, 'submitted_at') for r in records):.1f} s, end->returned "
          f"{sum(t(r, 'returned_at') - t(r, 'ended_at') for r in records):.1f} s")
    assert len(records) == 20 and Counter(r["status"] for r in records) == {"SUCCEEDED": 20}
    assert all(r["ran_on_node_id"] == r["node_id"] for r in records)
