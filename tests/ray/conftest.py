"""A local Ray cluster for the tests of RayLegRunner (resources/ray_legs.py): a head running the
dashboard (the job API dagster-ray's Pipes client submits to) and two worker nodes, each
advertising one fake GPU (`num_gpus=1`: Ray's bookkeeping, no device; a CUDA_VISIBLE_DEVICES index of
its own) and its own node resource (`tica_node_w1`, `tica_node_w2`). All on this host: one set of processes per node, started once
per session. The Postgres fixtures are tests/postgres_server.py's."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.postgres_server import pg_dsn, postgres_server  # noqa: F401  (fixtures)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
WORKERS = ("w1", "w2")
PREFIX = "tica_node_"


@dataclass
class RayTestCluster:
    cluster: object  # ray.cluster_utils.Cluster
    dashboard: str
    nodes: dict  # name -> the Cluster's node handle

    def add_worker(self, name: str):
        # a fake device index of its own, as scripts/h200/ray_track.py gives each node its GPU: Ray
        # hands a job the index its node started with (CUDA_VISIBLE_DEVICES)
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = str(len(self.nodes))
        try:
            node = self.cluster.add_node(num_cpus=4, num_gpus=1, resources={PREFIX + name: 1})
        finally:
            if saved is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved
        self.cluster.wait_for_nodes()
        self.nodes[name] = node
        return node


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory) -> Iterator[RayTestCluster]:
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_ADDRESS")}
    # Every node (and the jobs and workers it starts) imports TICA and the tests from this checkout.
    os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (str(PROJECT_ROOT), saved["PYTHONPATH"]) if x)
    os.environ.pop("RAY_ADDRESS", None)
    port = _free_port()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0, "include_dashboard": True, "dashboard_host": "127.0.0.1",
        "dashboard_port": port})
    test_cluster = RayTestCluster(cluster=cluster, dashboard=f"http://127.0.0.1:{port}", nodes={})
    try:
        for name in WORKERS:
            test_cluster.add_worker(name)
        yield test_cluster
    finally:
        cluster.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
