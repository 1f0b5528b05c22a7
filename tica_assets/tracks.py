"""Candidate tracks: one manifest file each in the candidates folder.

The graph is built once per code-location load, so a track is known by a cheap read of its
file's `track:` field (falling back to the file name): a manifest that is malformed right now
keeps its assets in the graph, and only its observation and the sensor report the bad field.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

log = logging.getLogger(__name__)
TRACK_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
MANIFEST_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Track:
    name: str
    manifest_path: Path


def manifest_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in MANIFEST_SUFFIXES)


def track_name(path: Path) -> str:
    try:
        data = yaml.safe_load(path.read_text())
        name = data.get("track") if isinstance(data, dict) else None
    except (OSError, yaml.YAMLError):
        name = None
    if isinstance(name, str) and TRACK_RE.match(name):
        return name
    return path.stem.lower()


def discover_tracks(folder: Path) -> list[Track]:
    tracks: dict[str, Track] = {}
    for path in manifest_files(folder):
        name = track_name(path)
        if name in tracks:
            log.warning("%s: track: %r is already the track of %s; file skipped", path, name, tracks[name].manifest_path)
            continue
        tracks[name] = Track(name=name, manifest_path=path.resolve())
    return list(tracks.values())
