"""The test project of tests/dagster (a candidate, its frozen questions) with its legs run by a
RayLegRunner whose producer is tests/ray/fake_producer.py, and its ledger on Postgres."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from resources.ray_legs import RayLegRunner
from tests.dagster.dagster_project import TRACK, Project, build_project
from tica_assets.definitions import build_defs

PRODUCER = "tests.ray.fake_producer --item {item}"


def ray_project(root: Path, pg_dsn: str) -> tuple[Project, object]:
    """(project, settings): the project, its ledger at pg_dsn and no replayed receipts."""
    project = build_project(root)
    settings = dataclasses.replace(project.settings, ledger_path=pg_dsn, replay={})
    return project, settings


def ray_runner(project: Project, dashboard: str, shared: Path, **kw) -> RayLegRunner:
    env = {"TICA_FAKE_PROJECT": str(project.root), **kw.pop("env", {})}
    return RayLegRunner(address=dashboard, shared_dir=str(shared), producer_module=PRODUCER, env=env,
                        poll_interval_s=0.25, leg_timeout_s=300, **kw)


def ray_defs(settings, runner: RayLegRunner):
    return build_defs(settings, resources={"leg_runner": runner})


def leg_json(leg: str | Path) -> dict:
    return json.loads((Path(leg) / "leg.json").read_text())


__all__ = ["TRACK", "leg_json", "ray_defs", "ray_project", "ray_runner"]
