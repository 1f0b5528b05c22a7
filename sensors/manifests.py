"""The manifest sensor: watches the candidates folder, one manifest per track.

On each tick, per track: read and fingerprint the manifest; compare every component's
fingerprint with the data version Dagster last observed; for the changed ones, record the new
candidate and one invalidation row per (changed component, voided evidence item) with its cause
(`tica.records.record_invalidations`, from the one invalidation matrix), and emit observations
of the changed components, so exactly the sensitive evidence turns unsynced in the UI.

A missing or malformed manifest is a logged skip naming the file and field, never an
invalidation: nothing is observed and nothing is written. The first sight of a track observes
its components without invalidating anything. Re-runs are requested by declarative automation
(`sensors.automation`) for the tracks that ask for it, not by this sensor.
"""

from __future__ import annotations

import json
import logging

from dagster import (
    AssetObservation,
    DagsterInstance,
    DefaultSensorStatus,
    SensorResult,
    SkipReason,
    sensor,
)

from resources.dagster_compat import DATA_VERSION_TAG
from tica.errors import ManifestError
from tica.evidence import Component, EvidenceItem, invalidated_by
from tica.ledger import Ledger
from tica_assets.candidates import load_track, record_change
from tica_assets.keys import component_key
from tica_assets.settings import Settings
from tica_assets.tracks import Track

SENSOR_NAME = "tica_manifest_sensor"


def evaluate_track(
    track: Track, settings: Settings, instance: DagsterInstance, ledger: Ledger, log: logging.Logger
) -> tuple[list[AssetObservation], str | None]:
    """Observations of the track's changed components (and the ledger rows written), plus the
    candidate id now, or ([], None) for a skipped manifest."""
    if not track.manifest_path.exists():
        log.warning(f"skipped {track.manifest_path}: <file>: the manifest is missing; nothing invalidated")
        return [], None
    try:
        loaded, identity = load_track(track, settings)
    except ManifestError as err:
        log.warning(f"skipped {err.file}: {err.field}: {err.message}; nothing invalidated")
        return [], None

    changed, observed = record_change(track, loaded, identity, instance, ledger, log)
    if not changed:
        return [], identity.candidate_id
    events = [
        AssetObservation(
            asset_key=component_key(track.name, c),
            tags={DATA_VERSION_TAG: identity.components[c]},
            metadata={
                "fingerprint": identity.components[c],
                "previous": observed[c] or "never observed",
                "candidate_id": identity.candidate_id,
                "manifest_hash": loaded.text_hash,
            },
        )
        for c in changed
    ]
    return events, identity.candidate_id


def tick_text(events: list[AssetObservation]) -> str:
    """What a tick recorded, per track: the components that changed and the evidence they void."""
    by_track: dict[str, list[str]] = {}
    for e in events:
        by_track.setdefault(e.asset_key.path[0], []).append(e.asset_key.path[-1])
    parts = []
    for track, names in by_track.items():
        voided = [i.value for i in EvidenceItem if any(i in invalidated_by(Component(c)) for c in names)]
        parts.append(f"{track}: {', '.join(names)} changed, voiding {', '.join(voided) or 'no evidence'}")
    return "; ".join(parts) + " (recorded in the ledger)"


def manifest_sensor(tracks: list[Track], settings: Settings):
    @sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=settings.sensor_interval_s,
        default_status=DefaultSensorStatus.RUNNING,
        required_resource_keys={"ledger"},
        description=f"Watches {settings.candidates_dir}: observes changed candidate components and "
        "records what they invalidate in the ledger.",
    )
    def _sensor(context):
        ledger = context.resources.ledger.ledger()
        events: list[AssetObservation] = []
        seen: dict[str, str | None] = {}
        for track in tracks:
            track_events, candidate_id = evaluate_track(track, settings, context.instance, ledger, context.log)
            events += track_events
            seen[track.name] = candidate_id
        cursor = json.dumps(seen, sort_keys=True)
        if not events:
            return SkipReason(f"no component changed in {len(tracks)} track(s)")
        # No run is requested (reruns are automation's), so the tick reads as skipped: its
        # reason says what it recorded and voided instead of Dagster's "empty result".
        return SensorResult(asset_events=events, cursor=cursor, skip_reason=tick_text(events))

    return _sensor
