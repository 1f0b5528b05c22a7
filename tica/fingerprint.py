"""Content fingerprints of checkpoints: BLAKE3, streamed and multi-threaded, with a stat cache.

A checkpoint of hundreds of GB is re-fingerprinted in well under a second when unchanged: each
file's digest is cached under its absolute path and keyed by (size, mtime_ns, inode). A file
whose key changed is re-hashed at near disk speed (memory-mapped, BLAKE3's own threads).

File timestamps are coarse (a few ms on ext4), so a file rewritten right after it was hashed
can keep its (size, mtime). As git does with its "racily clean" entries, a cached digest is
trusted only if the file's mtime was at least RACY_WINDOW_NS older than the moment it was
hashed; otherwise the file is hashed again.

Leg producers record the same fingerprint of the folder their model was loaded from
(`fingerprint_checkpoint(model_dir, persist=False)`): in memory only, never reading or writing
the shared cache file (a GPU node's ~/.cache is not theirs, and a producer certifies the bytes it
loaded, not a cache entry). Standard library + blake3 only (vLLM depends on blake3). Progress goes
to stderr when it is a terminal (tica.progress).
"""

from __future__ import annotations

import json
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import blake3

from tica import leg_settings
from tica.progress import Progress

PREFIX = "blake3:"
HASH_SLICE = 64 << 20  # bytes per progress step: large enough for BLAKE3's threads to stay busy
RACY_WINDOW_NS = 2_000_000_000


def default_cache_path() -> Path:
    return leg_settings.cache_dir() / "fingerprints.json"


def hash_file(path: str | Path, progress: Progress | None = None) -> str:
    """BLAKE3 of one file's bytes (memory-mapped, multi-threaded); `progress` counts its bytes."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    size = os.path.getsize(path)
    if size == 0:
        return PREFIX + h.hexdigest()
    if progress is None:
        h.update_mmap(str(path))
        return PREFIX + h.hexdigest()
    # In slices, to report progress inside one large file; the digest is the same (BLAKE3 streams).
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        try:
            for at in range(0, size, HASH_SLICE):
                h.update(view[at:at + HASH_SLICE])
                progress.update(min(HASH_SLICE, size - at))
        finally:
            view.release()
    return PREFIX + h.hexdigest()


@dataclass(frozen=True)
class _StatKey:
    size: int
    mtime_ns: int
    inode: int
    # ctime: set by the kernel on every write, rename into place and utime, and settable by no one,
    # so a file rewritten in place with its size and mtime put back (cp -p, rsync --inplace -t,
    # touch -r) is still seen to have changed
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> "_StatKey":
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


class FingerprintCache:
    """Per-file digests keyed by (path, size, mtime_ns, inode, ctime_ns); saved atomically as JSON.

    persistent=False: a cache in memory only (path None), that never reads or writes a file."""

    def __init__(self, path: Path | None = None, *, persistent: bool = True) -> None:
        self.path: Path | None = (path or default_cache_path()) if persistent else None
        self._lock = threading.Lock()
        self._entries: dict[str, dict] = {}
        if self.path is not None:
            try:
                self._entries = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self._entries = {}
        self.hits = 0
        self.misses = 0

    def digest(self, path: Path, progress: Progress | None = None) -> str:
        """The file's digest (cached, or hashed now); `progress` counts its bytes either way."""
        path = path.resolve()
        st = path.stat()
        key = _StatKey.of(st)
        with self._lock:
            entry = self._entries.get(str(path))
        if (
            entry
            and _StatKey(entry["size"], entry["mtime_ns"], entry["inode"], entry.get("ctime_ns", -1)) == key
            and entry.get("hashed_at_ns", 0) - key.mtime_ns >= RACY_WINDOW_NS
        ):
            self.hits += 1
            if progress is not None:
                progress.update(key.size)
            return entry["digest"]
        self.misses += 1
        hashed_at_ns = time.time_ns()
        digest = hash_file(path, progress)
        with self._lock:
            self._entries[str(path)] = {**key.__dict__, "hashed_at_ns": hashed_at_ns, "digest": digest}
        return digest

    def save(self) -> None:
        import tempfile  # only a cache that learned something writes

        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            payload = json.dumps(self._entries, sort_keys=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".fingerprints.")
        with os.fdopen(fd, "w") as f:
            f.write(payload)
        os.replace(tmp, self.path)


class CheckpointError(ValueError):
    """A checkpoint that cannot be fingerprinted as the loader reads it (names the path and why)."""


# What a loader reads of a checkpoint folder: every file, through symlinked folders and files, and
# every shard a `*.index.json` names (`weight_map`), wherever the index points. Hidden entries (a
# name starting with ".": git, HF download and editor bookkeeping) no loader reads: left out.
INDEX_SUFFIX = ".index.json"


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _index_shards(index: Path) -> list[str]:
    try:
        data = json.loads(index.read_text())
        names = sorted(set((data.get("weight_map") or {}).values()))
    except (OSError, ValueError, AttributeError, TypeError) as err:
        raise CheckpointError(f"{index.name}: not a readable shard index ({err})") from None
    if not all(isinstance(n, str) and n for n in names):
        raise CheckpointError(f"{index.name}: weight_map names a shard that is not a file name")
    return names


def checkpoint_files(root: Path, allowed_root: Path | None = None) -> list[tuple[str, Path]]:
    """(name, file) for every file a loader reads from `root`, sorted by name: the name as seen
    from the checkpoint (a link's own path), the file what it resolves to. Links and index-named
    shards that resolve outside `allowed_root` (default: the checkpoint itself) are refused by
    name, and so is anything that is not a regular file (a FIFO or a device has no content to hash);
    a folder linked twice (a cycle) is walked once."""
    root = Path(root)
    real_root = root.resolve()
    fence = (allowed_root or root).resolve()
    if not (real_root.is_file() or real_root.is_dir()):
        raise CheckpointError(f"{root.name}: not a regular file or folder (a FIFO or device is never a checkpoint)")
    if real_root.is_file():
        return [(root.name, real_root)]
    found: dict[str, Path] = {}
    seen_dirs: set[Path] = set()

    def admit(name: str, path: Path) -> None:
        real = path.resolve()
        if not _inside(real, fence):
            raise CheckpointError(f"{name}: resolves outside the checkpoint ({real.name} in another folder); "
                                  "declare checkpoint.root to admit it")
        if not real.is_file():
            raise CheckpointError(f"{name}: not a regular file (a FIFO, device or missing target has no content)")
        found[name] = real

    for folder, dirs, files in os.walk(root, followlinks=True):
        real_folder = Path(folder).resolve()
        if real_folder in seen_dirs or not _inside(real_folder, fence):
            if not _inside(real_folder, fence):
                raise CheckpointError(f"{Path(folder).relative_to(root).as_posix()}: a linked folder outside the "
                                      "checkpoint; declare checkpoint.root to admit it")
            dirs[:] = []
            continue
        seen_dirs.add(real_folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            if f.startswith("."):
                continue
            path = Path(folder) / f
            admit(path.relative_to(root).as_posix(), path)
    for name in [n for n in found if n.endswith(INDEX_SUFFIX)]:
        here = (root / name).parent
        for shard in _index_shards(found[name]):
            shard_name = os.path.normpath((Path(name).parent / shard).as_posix())
            if shard_name not in found:
                if not (here / shard).exists():
                    raise CheckpointError(f"{name}: names shard {shard}, which does not exist")
                admit(shard_name, here / shard)
    return sorted(found.items(), key=lambda nf: Path(nf[0]))  # by path parts, as fingerprints always were


def fingerprint_checkpoint(root: str | Path, cache: FingerprintCache | None = None, workers: int = 4, *,
                           persist: bool = True, allowed_root: str | Path | None = None) -> str:
    """One digest over every file a loader reads (`checkpoint_files`): its name, size and BLAKE3
    content hash. CheckpointError where the checkpoint cannot be read as the loader reads it.

    Without a cache: the shared cache file, or with persist=False none at all (every file hashed,
    nothing read from or written to disk but the checkpoint's own bytes)."""
    root = Path(root)
    own_cache = cache is None
    cache = cache or FingerprintCache(persistent=persist)
    files = checkpoint_files(root, Path(allowed_root) if allowed_root is not None else None)
    total = sum(p.stat().st_size for _, p in files)
    with Progress(f"fingerprint {root}", total, unit="B") as bar, ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(lambda nf: cache.digest(nf[1], bar), files))
    if own_cache and cache.misses:
        cache.save()  # an unchanged tree reads the cache and writes nothing
    h = blake3.blake3()
    for (name, path), digest in zip(files, digests):
        h.update(f"{name}\0{path.stat().st_size}\0{digest}\n".encode())
    return PREFIX + h.hexdigest()
