"""A candidate's identity (one fingerprint per component) and the diff between two candidates."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tica.evidence import Component, EvidenceItem, invalidated_by, reason
from tica.errors import ManifestError
from tica.fingerprint import CheckpointError, FingerprintCache, fingerprint_checkpoint
from tica.manifest import LoadedManifest, load_manifest, value_fingerprint


class CandidateIdentity(BaseModel):
    model_config = ConfigDict(frozen=True)

    track: str
    manifest_path: str
    components: dict[Component, str]

    @property
    def candidate_id(self) -> str:
        """Content address of the candidate on its track: a hash over the track and its component
        fingerprints. The track is part of it because a verdict is judged under the track's frozen
        questions and counts for that track alone: two tracks whose manifests resolve to the same
        components are two candidates, and the verdicts of one never land in the other's report
        (the ledger maps a candidate to one track). Components stay content hashes; which
        evidence a change voids is still read from them (`diff`), never from the id."""
        table = "\n".join([f"track={self.track}", *(f"{c.value}={self.components[c]}" for c in Component)])
        return "cand-" + hashlib.sha256(table.encode()).hexdigest()[:20]


class ComponentChange(BaseModel):
    model_config = ConfigDict(frozen=True)

    component: Component
    old: str
    new: str
    invalidates: tuple[EvidenceItem, ...]
    why: str


def identify(loaded: LoadedManifest, cache: FingerprintCache | None = None) -> CandidateIdentity:
    if loaded.checkpoint_path is not None:
        try:
            weights = fingerprint_checkpoint(loaded.checkpoint_path, cache, allowed_root=loaded.checkpoint_root)
        except CheckpointError as err:
            raise ManifestError(loaded.path, "checkpoint.path", str(err)) from None
    else:
        weights = loaded.manifest.checkpoint.digest or ""
    components = {Component.WEIGHTS: weights}
    for component, value in loaded.manifest.component_values().items():
        files = loaded.named_files.get(component)
        # a named file's content is part of the component (a manifest naming none hashes as before)
        components[component] = value_fingerprint({"value": value, "files": files} if files else value)
    return CandidateIdentity(
        track=loaded.manifest.track, manifest_path=str(loaded.path), components=components
    )


def identify_file(path: str | Path, cache: FingerprintCache | None = None) -> CandidateIdentity:
    return identify(load_manifest(path), cache)


def diff(old: CandidateIdentity, new: CandidateIdentity) -> list[ComponentChange]:
    """The components that changed, each with the evidence it voids and why (matrix order)."""
    return [
        ComponentChange(
            component=c,
            old=old.components[c],
            new=new.components[c],
            invalidates=invalidated_by(c),
            why=reason(c),
        )
        for c in Component
        if old.components[c] != new.components[c]
    ]


def voided_items(changes: list[ComponentChange]) -> dict[EvidenceItem, list[Component]]:
    """Each voided evidence item with the component changes that void it."""
    out: dict[EvidenceItem, list[Component]] = {}
    for change in changes:
        for item in change.invalidates:
            out.setdefault(item, []).append(change.component)
    return {item: out[item] for item in EvidenceItem if item in out}
