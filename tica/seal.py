"""Sealing a leg directory: `seal.json` names every file of the leg with its sha256.

Standard library only: leg producers on GPU nodes call `seal_leg` as their last step, and
judges call `check_seal` before reading anything. Sealing a large leg shows its progress on
stderr when that is a terminal (tica.progress, standard library too).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from pathlib import Path

from tica.progress import Progress

SEAL_FILE = "seal.json"
SEAL_SCHEMA = "tica.seal/1"


def sha256_file(path: Path, progress: Progress | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            if progress is not None:
                progress.update(len(chunk))
    return h.hexdigest()


def _leg_files(leg_dir: Path) -> list[Path]:
    """Every plain file of the leg but its own top-level seal.json: a file named seal.json deeper
    in the leg (a collected folder's, an earlier leg's) is the leg's content and sealed like any other."""
    return sorted(p for p in leg_dir.rglob("*")
                  if p.is_file() and not p.is_symlink() and p.relative_to(leg_dir).as_posix() != SEAL_FILE)


def _foreign(leg_dir: Path) -> list[str]:
    """Entries a leg may not hold: symlinks (what they point at is not the leg's content) and
    anything that is not a plain file or folder (a FIFO, a socket, a device): never sealed."""
    out = []
    for root, dirs, files in os.walk(leg_dir):
        for name in (*dirs, *files):
            p = Path(root) / name
            if p.is_symlink():
                out.append(f"{p}: a symlink inside the leg: what it points at is not sealed by content")
            elif not (p.is_dir() or p.is_file()):
                out.append(f"{p}: not a regular file inside the leg (a FIFO, socket or device is never sealed)")
    return sorted(out)


def _read_seal(seal_path: Path) -> dict:
    from tica import strict_io  # standard library only, like this module

    seal = strict_io.read_json(seal_path)
    if not isinstance(seal, dict) or not isinstance(seal.get("files"), dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in seal["files"].items()):
        raise ValueError("a seal is {files: {relative path: sha256}}")
    return seal


def seal_leg(leg_dir: str | Path) -> dict:
    """Write seal.json over every file under leg_dir; return the seal."""
    leg_dir = Path(leg_dir)
    paths = _leg_files(leg_dir)
    with Progress(f"seal {leg_dir}", sum(p.stat().st_size for p in paths), unit="B") as bar:
        files = {p.relative_to(leg_dir).as_posix(): sha256_file(p, bar) for p in paths}
    seal = {
        "schema": SEAL_SCHEMA,
        "algorithm": "sha256",
        "sealed_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "files": files,
    }
    (leg_dir / SEAL_FILE).write_text(json.dumps(seal, indent=1, sort_keys=True))
    return seal


def seal_digest(leg_dir: str | Path) -> str:
    """One hash naming the whole sealed leg (sha256 of its seal's file table)."""
    seal = _read_seal(Path(leg_dir) / SEAL_FILE)
    table = json.dumps(seal["files"], sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(table.encode()).hexdigest()


def verified_files(leg_dir: str | Path) -> tuple[dict[str, str], list[str]]:
    """(the sealed files, by path inside the leg, with their sha256; the seal's problems): the
    files only when the seal verifies whole, never a name a seal made up (`../x`) or a file changed
    since. No seal: nothing sealed, no problem."""
    leg_dir = Path(leg_dir)
    if not (leg_dir / SEAL_FILE).exists():
        return {}, []
    problems = check_seal(leg_dir)
    return ({} if problems else _read_seal(leg_dir / SEAL_FILE)["files"]), problems


def check_seal(leg_dir: str | Path) -> list[str]:
    """Problems with a leg's seal, empty when every file matches and none was added or removed."""
    leg_dir = Path(leg_dir)
    seal_path = leg_dir / SEAL_FILE
    if not seal_path.is_file():
        return [f"{seal_path}: missing seal"]
    try:
        files: dict[str, str] = _read_seal(seal_path)["files"]
    except (OSError, ValueError) as err:
        return [f"{seal_path}: unreadable seal ({err})"]
    problems = _foreign(leg_dir)
    present = {p.relative_to(leg_dir).as_posix() for p in _leg_files(leg_dir)}
    for rel, digest in sorted(files.items()):
        if rel not in present:
            problems.append(f"{leg_dir / rel}: sealed file is missing")
        elif sha256_file(leg_dir / rel) != digest:
            problems.append(f"{leg_dir / rel}: changed after sealing (sha256 differs)")
    for rel in sorted(present - set(files)):
        problems.append(f"{leg_dir / rel}: added after sealing")
    return problems
