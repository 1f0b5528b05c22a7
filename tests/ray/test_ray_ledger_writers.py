"""Eight ledger writers as Ray tasks pinned to different nodes, appending to one Postgres ledger:
nothing lost, the chain verifies: 8 x 40 by default, the issue's full 8 x 500 under TICA_TESTS=full
(or TICA_SCALE_APPENDS=500)."""

from __future__ import annotations

import os

import pytest

from tests.long import size
from tests.ray.conftest import PREFIX
from tests.ray.writers import append_reruns
from tica.ledger import PostgresLedger

# serial beside the node-loss tests, whose cluster (tests/ray/conftest.py) it shares: a few seconds of
# writes, not worth a cluster of its own in the two-worker phase
pytestmark = [pytest.mark.scale, pytest.mark.serial]


def test_eight_writers_on_different_nodes_lose_nothing_and_the_chain_verifies(ray_cluster, pg_dsn):
    import ray

    writers, appends = 8, int(os.environ.get("TICA_SCALE_APPENDS", size(40, 500)))
    names = sorted(n for n in ray_cluster.nodes if n != "victim")
    PostgresLedger(pg_dsn).init()
    ray.init(address=ray_cluster.cluster.address, log_to_driver=False)
    try:
        task = ray.remote(append_reruns)
        refs = [task.options(num_cpus=1, max_retries=0, resources={PREFIX + names[w % len(names)]: 0.001})
                .remote(pg_dsn, w, appends) for w in range(writers)]
        done = ray.get(refs, timeout=600)
    finally:
        ray.shutdown()
    # Each writer ran where it was pinned, and the writers ran on more than one node.
    assert [d["labels"] for d in done] == [[PREFIX + names[w % len(names)]] for w in range(writers)]
    assert len({d["node_id"] for d in done}) == len(names) >= 2
    print(f"writers overlapped: {max(d['started'] for d in done) < min(d['ended'] for d in done)}; "
          f"{writers} x {appends} in {max(d['ended'] for d in done) - min(d['started'] for d in done):.1f} s")
    report = PostgresLedger(pg_dsn).verify()
    assert report.ok and report.rows == writers * appends, report.problems
    ids = {r[0] for r in PostgresLedger(pg_dsn).query("SELECT rerun_id FROM reruns")[1]}
    assert ids == {f"w{w}-{i}" for w in range(writers) for i in range(appends)}
