"""A track's candidate components as observable source assets: data version = fingerprint.

One observation reads the manifest once and fingerprints every component (the checkpoint
through the stat-keyed cache), so downstream evidence goes unsynced exactly when a component it
is sensitive to gets a new fingerprint. A manifest that cannot be read fails the observation,
naming the file and field, and records no new version: never a false invalidation.
"""

from __future__ import annotations

from dagster import (
    AssetKey,
    AssetSpec,
    DagsterInstance,
    DataVersion,
    Definitions,
    Failure,
    MetadataValue,
    ObserveResult,
    multi_observable_source_asset,
)


from tica.acceptance import record_candidate_change
from tica.candidate import CandidateIdentity, identify
from tica.errors import ManifestError
from tica.evidence import Component, invalidated_by, reason
from tica.ledger import Ledger
from tica.fingerprint import FingerprintCache
from tica.manifest import LoadedManifest, load_manifest
from tica_assets.keys import component_key, safe_name
from tica_assets.settings import Settings
from tica_assets.tracks import Track


def component_spec(track: Track, component: Component) -> AssetSpec:
    voids = ", ".join(i.value for i in invalidated_by(component))
    return AssetSpec(
        key=component_key(track.name, component),
        description=f"{component.value} of the {track.name} candidate. A change voids: {voids} ({reason(component)}).",
        group_name=safe_name(track.name),
        kinds={"yaml"},
        metadata={"manifest": MetadataValue.path(str(track.manifest_path)), "voids": voids},
    )


def load_track(track: Track, settings: Settings) -> tuple[LoadedManifest, CandidateIdentity]:
    """The track's manifest and identity now; ManifestError names the file and field."""
    loaded = load_manifest(track.manifest_path)
    if loaded.manifest.track != track.name:
        raise ManifestError(
            track.manifest_path, "track",
            f"says {loaded.manifest.track!r} but this file is the {track.name!r} track; "
            "a renamed track is a new track: reload the code location",
        )
    cache = FingerprintCache(settings.fingerprint_cache)
    identity = identify(loaded, cache)
    cache.save()
    return loaded, identity


def observed_version(instance: DagsterInstance, key: AssetKey) -> str | None:
    """The data version Dagster last observed for a component, None if never observed."""
    record = instance.get_latest_data_version_record(key, is_source=True)
    if record is None:
        return None
    observation = record.event_log_entry.asset_observation
    return observation.data_version if observation else None


def record_change(track: Track, loaded: LoadedManifest, identity: CandidateIdentity, instance: DagsterInstance,
                  ledger: Ledger, log) -> tuple[list[Component], dict[Component, str | None]]:
    """Compare the candidate now with what Dagster last observed; the core records a change
    (the new candidate, one invalidation row per changed component and voided item). Both the
    manifest sensor and a manual observation go through here, so the ledger never misses a
    change Dagster has seen. Returns the changed components and the old versions."""
    observed = {c: observed_version(instance, component_key(track.name, c)) for c in Component}
    changed = [c for c in Component if observed[c] != identity.components[c]]
    if not changed:
        return [], observed
    changes = record_candidate_change(ledger, loaded, identity, observed)
    if not changes:
        log.info(f"{track.name}: first observation of {len(changed)} component(s) of {identity.candidate_id}")
    for change in changes:
        log.info(f"{track.name}: {change.component.value} changed ({change.old[:19]} -> {change.new[:19]}); "
                 f"voids {', '.join(i.value for i in change.invalidates)}; recorded in {ledger.path}")
    return changed, observed


def observe_results(track: Track, identity: CandidateIdentity, loaded: LoadedManifest):
    for component in Component:
        yield ObserveResult(
            asset_key=component_key(track.name, component),
            data_version=DataVersion(identity.components[component]),
            metadata={
                "fingerprint": identity.components[component],
                "candidate_id": identity.candidate_id,
                "manifest_hash": loaded.text_hash,
            },
        )


def candidate_defs(track: Track, settings: Settings) -> Definitions:
    @multi_observable_source_asset(
        name=f"{safe_name(track.name)}_candidate",
        specs=[component_spec(track, c) for c in Component],
        description=f"Fingerprints every component of {track.manifest_path.name}; a change is recorded "
        "in the ledger with the evidence it voids, as the manifest sensor does.",
        group_name=safe_name(track.name),
        required_resource_keys={"ledger"},
    )
    def _observe(context):
        try:
            loaded, identity = load_track(track, settings)
        except ManifestError as err:
            context.log.error(f"manifest skipped: {err.file}: {err.field}: {err.message}")
            raise Failure(
                description=f"{err.file}: {err.field}: {err.message}",
                metadata={"file": err.file, "field": err.field},
            ) from None
        context.log.info(f"{track.name}: candidate {identity.candidate_id}")
        record_change(track, loaded, identity, context.instance, context.resources.ledger.ledger(), context.log)
        yield from observe_results(track, identity, loaded)

    return Definitions(assets=[_observe])
