"""Sealed receipts that travel as one archive (`receipts.tgz` as a GPU run returns it, or a
committed `.tar.xz`), unpacked once into a cache folder named by the archive's sha256.

The archive is transport only: every leg inside still carries its seal, and a judge checks it.
Unpacking is strict: regular files and folders only (no links, devices or FIFOs), no absolute
path and no `..`; anything else is refused naming the archive and the member (exit 4), and
nothing is left behind. The archive is read to its end, so a damaged compressed stream (a flipped
byte, a cut download) is refused naming the archive (exit 4), even where tarfile alone would
unpack damaged bytes: the gzip CRC-32 and the xz and bz2 checks are verified. A cache folder is
written whole (a temporary folder renamed into place), so a reader never sees half an archive.
"""

from __future__ import annotations

import hashlib
import lzma
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath

from tica.errors import InputError

SUFFIXES = (".tar.xz", ".txz", ".tar.gz", ".tgz", ".tar")
CACHE_ENV = "TICA_RECEIPTS_CACHE"


def is_archive(path: Path) -> bool:
    return path.name.endswith(SUFFIXES)


def default_cache() -> Path:
    """$TICA_RECEIPTS_CACHE, else ~/.cache/tica/receipts."""
    from tica.settings import setting

    cache: Path = setting("receipts_cache")
    return cache


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _checked_members(archive: Path, tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    members = []
    for m in tar.getmembers():
        name = PurePosixPath(m.name)
        if name.is_absolute() or ".." in name.parts:
            raise InputError(archive, m.name, "a member outside the archive's folder (absolute or '..')")
        if not (m.isfile() or m.isdir()):
            raise InputError(archive, m.name, "not a regular file or folder (links, devices and FIFOs are refused)")
        members.append(m)
    return members


# What a damaged archive raises while it is read: tarfile's own errors; a truncated stream
# (EOFError); gzip's bad header or CRC (gzip.BadGzipFile, an OSError); zlib's corrupt deflate data
# (zlib.error); xz's corrupt data or failed check (lzma.LZMAError); bz2's invalid stream (OSError);
# and a read or write that fails (OSError).
_UNREADABLE = (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError)


def _read_to_end(tar: tarfile.TarFile) -> None:
    """Read the (decompressed) stream past the last member to its very end. tarfile stops at the
    end-of-archive marker, before the compressed stream's trailer, so a damaged byte inside a
    member's data would otherwise unpack unnoticed: gzip checks its CRC-32 and length, xz its
    block checks, bz2 its block CRCs only when the stream is read through."""
    stream = tar.fileobj
    if stream is None:
        return
    while stream.read(1 << 20):
        pass


def unpacked(archive: str | Path, cache: str | Path | None = None) -> Path:
    """The folder holding `archive`'s contents, unpacking it on first use."""
    archive = Path(archive)
    if not archive.is_file():
        raise InputError(archive, "<file>", "no such archive")
    root = Path(cache) if cache is not None else default_cache()
    target = root / _sha256(archive)[:24]
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=root))
    try:
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, members=_checked_members(archive, tar), filter="data")
                _read_to_end(tar)
        except _UNREADABLE as err:
            raise InputError(archive, "<archive>", f"not a readable tar archive: {err}") from None
        try:
            tmp.rename(target)
        except OSError:
            if not target.is_dir():  # another process did not win the race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
