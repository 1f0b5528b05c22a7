"""Running the graph in-process against a kept test instance, and asking Dagster's GraphQL."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from dagster import DagsterInstance, build_sensor_context
from dagster._core.workspace.context import WorkspaceProcessContext, WorkspaceRequestContext
from dagster._core.workspace.load_target import ModuleTarget
from dagster_graphql.test.utils import execute_dagster_graphql

from sensors.manifests import SENSOR_NAME
from tica_assets.definitions import build_defs
from tica_assets.keys import safe_name
from tica_assets.settings import PROJECT_ROOT

STALE_QUERY = """
query Stale($keys: [AssetKeyInput!]) {
  assetNodes(assetKeys: $keys) {
    assetKey { path }
    staleStatus
    staleCauses { key { path } category reason dependency { path } }
  }
}
"""


def kept_instance(home: Path) -> DagsterInstance:
    """An instance in a kept folder configured by the project's own dagster.yaml (pools of 1)."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    return DagsterInstance.from_config(str(home))


def tick(defs, instance: DagsterInstance):
    """Evaluate one manifest-sensor tick and apply its events, as the daemon would."""
    sensor = defs.resolve_sensor_def(SENSOR_NAME)
    context = build_sensor_context(instance=instance, resources={"ledger": defs.resources["ledger"]},
                                   sensor_name=SENSOR_NAME)
    data = sensor.evaluate_tick(context)
    for event in data.asset_events:
        instance.report_runless_asset_event(event)
    return data


def materialize_track(defs, instance: DagsterInstance, track: str, job: str = "evidence", keys=None):
    """Run a track's job in-process (its asset checks included); `keys` narrows the selection."""
    return defs.resolve_job_def(f"{safe_name(track)}_{job}").execute_in_process(
        instance=instance, raise_on_error=False, asset_selection=keys
    )


@contextlib.contextmanager
def graphql_context(instance: DagsterInstance, env: dict[str, str]):
    """The code location loaded the way `dagster dev` loads it (a gRPC code server started from
    workspace.yaml's module), over the test's instance."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        target = ModuleTarget(module_name="tica_assets.definitions", attribute="defs",
                              working_directory=str(PROJECT_ROOT), location_name="tica")
        with WorkspaceProcessContext(instance, target, version="", read_only=False) as process:
            yield process
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def stale_nodes(process: WorkspaceProcessContext, keys: list[list[str]]) -> dict[tuple, dict]:
    request: WorkspaceRequestContext = process.create_request_context()
    result = execute_dagster_graphql(request, STALE_QUERY, {"keys": [{"path": k} for k in keys]})
    assert not result.errors, result.errors
    return {tuple(n["assetKey"]["path"]): n for n in result.data["assetNodes"]}


__all__ = ["build_defs", "graphql_context", "kept_instance", "materialize_track", "stale_nodes", "tick"]
