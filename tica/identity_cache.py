"""`tica candidate fingerprint` on an unchanged candidate without loading the manifest model: the
answer a full identification gave, kept with what it was read from, and given again only when
every input reads the same now. Standard library and tica.fingerprint only, so a hit imports no
pydantic and no YAML (benchmarks/fingerprint_startup.py).

What an answer was read from, and how each is checked on a hit (any difference: the full path):
- the manifest: the same file (resolved path) with the same bytes (sha256);
- the code that identifies: every module of the `tica` package by path, size, mtime and inode,
  and the versions of the libraries that parse and hash (pydantic, PyYAML, blake3);
- the checkpoint: the loader's own walk (tica.fingerprint.checkpoint_files) run again must list
  the same names resolving to the same files, each with the stat key (size, mtime, inode, ctime)
  it had when it was hashed;
- the files the recipe and evaluation fields name: hashed again (tica.named_files, the function
  the manifest model uses), small files by nature.
- a source pinned as the working tree: resolved by git again (tica.source.checkout_commit, the
  function the manifest model uses) to the commit the answer was computed under.
An answer whose inputs changed while it was computed, or within the racy window before it, is
never kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from tica import leg_settings, strict_io
from tica.fingerprint import RACY_WINDOW_NS, CheckpointError, checkpoint_files
from tica.named_files import named_file_digests
from tica.source import checkout_commit

SCHEMA = "tica.identity_cache/1"
LIBRARIES = ("pydantic", "pydantic-core", "PyYAML", "blake3")


def cache_path() -> Path:
    return leg_settings.cache_dir() / "identities.json"


def code_version() -> str:
    """The identifying code as installed: each module of the package and the parsing libraries."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        st = p.stat()
        h.update(f"{p.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    for lib in LIBRARIES:
        try:
            h.update(f"{lib}={metadata.version(lib)}\n".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{lib}=absent\n".encode())
    return h.hexdigest()


def _stat_key(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def _checkpoint_stats(path: str | None, root: str | None) -> list[list[Any]] | None:
    """[name, file, stat key] of every file the loader reads, in its order; None when unreadable."""
    if path is None:
        return []
    try:
        files = checkpoint_files(Path(path), Path(root) if root is not None else None)
        return [[name, str(real), _stat_key(real)] for name, real in files]
    except (CheckpointError, OSError):
        return None


class Inputs:
    """What one identification read, captured before it ran (and compared after)."""

    def __init__(self, manifest: Path, checkpoint: str | None, root: str | None,
                 texts: list[tuple[str, str]], working_tree: bool = False) -> None:
        self.manifest = manifest.resolve()
        self.raw = self.manifest.read_bytes()
        self.manifest_stat = _stat_key(self.manifest)
        self.checkpoint, self.root, self.texts, self.working_tree = checkpoint, root, texts, working_tree
        self.files = _checkpoint_stats(checkpoint, root)
        self.code = code_version()

    def entry(self, named: dict[str, dict[str, str]], commit: str | None, answer: dict[str, Any]) -> dict[str, Any]:
        return {"schema": SCHEMA, "sha256": hashlib.sha256(self.raw).hexdigest(), "code": self.code,
                "working_tree": self.working_tree, "commit": commit,
                "checkpoint": self.checkpoint, "root": self.root, "files": self.files,
                "texts": [list(t) for t in self.texts], "named": named, "answer": answer}


def _load() -> dict[str, Any]:
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached_answer(manifest: str | Path) -> dict[str, Any] | None:
    """The kept answer for this manifest when every input it was read from reads the same now."""
    try:
        path = Path(manifest).resolve()
        raw = strict_io.regular_file_bytes(path)
    except (OSError, ValueError):  # not a regular file: the full path names what is wrong
        return None
    entry = _load().get(str(path))
    if not isinstance(entry, dict) or entry.get("schema") != SCHEMA:
        return None
    if entry.get("sha256") != hashlib.sha256(raw).hexdigest() or entry.get("code") != code_version():
        return None
    files = _checkpoint_stats(entry.get("checkpoint"), entry.get("root"))
    if files is None or files != entry.get("files"):
        return None
    if entry.get("working_tree") is not False and checkout_commit(path.parent) != entry.get("commit"):
        return None
    texts = [tuple(t) for t in entry.get("texts") or []]
    if named_file_digests(texts, path.parent) != entry.get("named"):
        return None
    answer = entry.get("answer")
    return answer if isinstance(answer, dict) else None


def keep(before: Inputs, loaded_sha256: str, named: dict[str, dict[str, str]], commit: str | None,
         answer: dict[str, Any]) -> bool:
    """Keep `answer` for next time if it was computed from the bytes `before` read (`loaded_sha256`:
    the manifest as loaded; `named`: the named files' digests and `commit` the working tree's
    commit, as the answer used them), its inputs did not
    move while it was computed, and they are older than the racy window (a file written in the same
    instant may change again unseen)."""
    after = Inputs(before.manifest, before.checkpoint, before.root, before.texts, before.working_tree)
    if (after.raw, after.manifest_stat, after.files, after.code) != (before.raw, before.manifest_stat, before.files,
                                                                     before.code) or before.files is None:
        return False
    if loaded_sha256 != hashlib.sha256(before.raw).hexdigest():
        return False
    settled = time.time_ns() - RACY_WINDOW_NS
    keys = [before.manifest_stat, *(f[2] for f in before.files)]
    if any(k[1] > settled or k[3] > settled for k in keys):
        return False
    data = _load()
    data[str(before.manifest)] = before.entry(named, commit, answer)
    target = cache_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".identities.")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, sort_keys=True)
        os.replace(tmp, target)
    except OSError:
        return False
    return True
