"""The TICA code location: gathers each track's domain modules and the shared resources.

    export DAGSTER_HOME=$PWD/data/dagster            # a kept folder: staleness lives here
    mkdir -p $DAGSTER_HOME && ln -sf $PWD/dagster.yaml $DAGSTER_HOME/dagster.yaml
    export TICA_REPLAY=h200=tests/fixtures/h200       # tracks replayed from committed receipts
    .venv/bin/dagster dev -w workspace.yaml

Per track (one manifest in TICA_CANDIDATES_DIR): `<track>/candidate/<component>` (observable,
data version = fingerprint), `<track>/evidence/<item>` (one per evidence item, deps from the
invalidation matrix), `<track>/report`; jobs `<track>_evidence` and `<track>_report`; the
`tica_manifest_sensor`. Beside the tracks, `h200-matrix/<set>` per committed matrix receipt set
and the job `h200_matrix` (tica_assets/matrix.py). Every variable: docs/settings.md.
"""

from __future__ import annotations

from typing import Any

from dagster import Definitions

from resources import CpuLegRunner, LedgerResource, LocalGpuLegRunner, ReplayLegRunner
from sensors import autorun_sensor, manifest_sensor
from tica_assets.candidates import candidate_defs
from tica_assets.evidence import evidence_defs
from tica_assets.jobs import job_defs
from tica_assets.keys import leg_runner_key
from tica_assets.matrix import matrix_defs
from tica_assets.report import report_defs
from tica_assets.settings import Settings
from tica_assets.tracks import discover_tracks


def shared_runner(settings: Settings) -> Any:
    """The runner of every track that neither replays nor runs on this machine's GPUs
    (TICA_LEG_RUNNER): the CPU runner, or legs as jobs on a Ray cluster."""
    if settings.leg_runner == "ray":
        from resources.ray_legs import RayLegRunner  # the scale extra: dagster-ray

        return RayLegRunner(address=str(settings.ray_address), shared_dir=str(settings.ray_shared_dir))
    return CpuLegRunner()


def build_defs(settings: Settings | None = None, resources: dict | None = None) -> Definitions:
    """The whole code location for the tracks in the candidates folder; `resources` replaces
    resources by key (tests, or a GPU leg runner in a deployment)."""
    settings = settings or Settings.from_env()
    overrides = resources or {}
    tracks = discover_tracks(settings.candidates_dir)
    resources = {"ledger": LedgerResource(path=str(settings.ledger_path)), "leg_runner": shared_runner(settings)}
    per_track: list[Definitions] = []
    for track in tracks:
        replay = settings.replay_folder(track.name)
        if replay is not None:
            resources[leg_runner_key(track.name, True)] = ReplayLegRunner(receipts_dir=str(replay))
        elif settings.on_local_gpus(track.name):
            resources[leg_runner_key(track.name, True)] = LocalGpuLegRunner()
        per_track += [
            candidate_defs(track, settings),
            evidence_defs(track, settings),
            report_defs(track, settings),
            job_defs(track),
        ]
    sensors = [manifest_sensor(tracks, settings)]
    autorun = autorun_sensor(tracks, settings)
    if autorun is not None:
        sensors.append(autorun)
    shared = Definitions(resources={**resources, **overrides}, sensors=sensors)
    return Definitions.merge(*per_track, matrix_defs(settings), shared)


defs = build_defs()
