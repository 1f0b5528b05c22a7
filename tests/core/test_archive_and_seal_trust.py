"""A receipts archive is refused whole when its compressed stream is damaged, and a leg's seal
covers every file but its own top-level seal.json.

- F11 (tica.receipt_archive): a corrupt .tgz / .tar.xz / .tar.bz2 is bad input naming the archive
  (InputError, exit 4), never zlib.error / lzma.LZMAError escaping; the archive is read to its
  end, so damage only the gzip CRC sees (tarfile alone unpacks it) is refused too; nothing is left
  half-unpacked in the cache.
- F13 (tica.seal): a file named seal.json below the leg's top level is sealed like any other: an
  edit or an addition after sealing is caught.

Each test has its negative control: the intact archive unpacks, the untouched leg checks clean."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import random
import tarfile
import zlib
from pathlib import Path

import pytest

from tica.errors import InputError, ReceiptError
from tica.receipt_archive import unpacked
from tica.receipts import load_leg
from tica.seal import SEAL_FILE, check_seal, seal_leg

MEMBER = "track/leg/metrics.jsonl"
# deterministic, compressible and not trivial: many compressed blocks, the same bytes every run
_rng = random.Random(11)
PAYLOAD = "".join(json.dumps({"step": i, "x": _rng.random()}) + "\n" for i in range(3000)).encode()


def _tar_bytes(mode: str, **kw) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode, **kw) as tar:
        info = tarfile.TarInfo(MEMBER)
        info.size = len(PAYLOAD)
        tar.addfile(info, io.BytesIO(PAYLOAD))
    return buf.getvalue()


def _flip_where(raw: bytes, fails) -> bytes:
    """`raw` with the first byte past its first quarter flipped for which `fails(damaged)` holds."""
    for pos in range(len(raw) // 4, len(raw)):
        damaged = bytearray(raw)
        damaged[pos] ^= 0x55
        if fails(bytes(damaged)):
            return bytes(damaged)
    raise AssertionError("no such byte")


def _raises(exc, decompress):
    def fails(data: bytes) -> bool:
        try:
            decompress(data)
        except exc:
            return True
        except Exception:  # noqa: BLE001 - another error: not the case this test is about
            return False
        return False
    return fails


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _assert_refused_leaving_nothing(archive: Path, cache: Path) -> InputError:
    with pytest.raises(InputError) as err:
        unpacked(archive, cache)
    assert err.value.field == "<archive>" and str(archive) in str(err.value)
    assert not cache.exists() or not any(cache.iterdir())  # no target, no half-unpacked temporary folder
    return err.value


# Each case: how the archive is written, and a flipped byte the decompressor itself refuses with
# the error that used to escape.
CORRUPT = {
    "tgz": ("w:gz", ".tgz", _raises(zlib.error, lambda d: zlib.decompress(d, 31))),
    "tar.xz": ("w:xz", ".tar.xz", _raises(lzma.LZMAError, lzma.decompress)),
    "tar.bz2": ("w:bz2", ".tar.bz2", _raises(OSError, bz2.decompress)),
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_a_corrupt_compressed_stream_is_refused_naming_the_archive(tmp_path, kind):
    mode, suffix, fails = CORRUPT[kind]
    raw = _tar_bytes(mode)
    # control: the intact archive unpacks to the very bytes archived
    good = unpacked(_write(tmp_path / f"good{suffix}", raw), tmp_path / "good-cache")
    assert (good / MEMBER).read_bytes() == PAYLOAD
    archive = _write(tmp_path / f"bad{suffix}", _flip_where(raw, fails))
    _assert_refused_leaving_nothing(archive, tmp_path / "cache")  # InputError: exit 4 at every entry point


def _plain_tarfile_reads(data: bytes) -> bytes:
    """What tarfile alone (no read to the end) unpacks of the member."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.extractfile(MEMBER).read()


def _data_byte_flipped() -> tuple[bytes, bytes, bytes, str]:
    """A stored (level 0) gzip stream with one byte of the member's data flipped: deflate has no
    check of its own there, only gzip's CRC-32 at the end of the stream sees it. (intact, damaged,
    what tarfile alone unpacks of the damaged one, what the refusal says)"""
    raw = gzip.compress(_tar_bytes("w"), compresslevel=0, mtime=0)
    damaged = bytearray(raw)
    damaged[raw.index(PAYLOAD[1000:1040]) + 10] ^= 0x01
    expected = bytearray(PAYLOAD)
    expected[1010] ^= 0x01
    return raw, bytes(damaged), bytes(expected), "CRC check failed"


def _trailer_cut() -> tuple[bytes, bytes, bytes, str]:
    """A .tgz missing its last 8 bytes (gzip's CRC-32 and size): every member still reads whole."""
    raw = _tar_bytes("w:gz")
    return raw, raw[:-8], PAYLOAD, "end-of-stream marker"


@pytest.mark.parametrize("case", [_data_byte_flipped, _trailer_cut], ids=["data byte flipped", "trailer cut"])
def test_damage_only_the_end_of_the_stream_shows_is_refused(tmp_path, case):
    raw, bad, plain, says = case()
    assert _plain_tarfile_reads(bad) == plain  # the case: tarfile alone reads the member, no error raised
    # control: the intact archive unpacks
    good = unpacked(_write(tmp_path / "good.tgz", raw), tmp_path / "good-cache")
    assert (good / MEMBER).read_bytes() == PAYLOAD
    err = _assert_refused_leaving_nothing(_write(tmp_path / "bad.tgz", bad), tmp_path / "cache")
    assert says in err.message, err.message


# ---------------------------------------------------------------- F13: nested seal.json


def _leg(tmp: Path) -> Path:
    leg = tmp / "leg"
    (leg / "lm_eval").mkdir(parents=True)
    (leg / "leg.json").write_text(json.dumps({"schema": "tica.leg/1", "item": "quality", "arm": "bi1"}))
    (leg / "lm_eval" / SEAL_FILE).write_text('{"a collected folder": "its own seal"}')
    return leg


def test_a_nested_seal_json_is_sealed_and_an_edit_to_it_is_caught(tmp_path):
    leg = _leg(tmp_path)
    seal = seal_leg(leg)
    assert sorted(seal["files"]) == ["leg.json", "lm_eval/seal.json"]  # the leg's own seal.json is not in it
    # control: untouched, the leg checks clean and loads
    assert check_seal(leg) == [] and load_leg(leg).meta.item == "quality"
    (leg / "lm_eval" / SEAL_FILE).write_text('{"edited": "after sealing"}')
    assert check_seal(leg) == [f"{leg / 'lm_eval' / SEAL_FILE}: changed after sealing (sha256 differs)"]
    with pytest.raises(ReceiptError, match="lm_eval/seal.json: changed after sealing"):
        load_leg(leg)


def test_a_nested_seal_json_added_after_sealing_is_caught(tmp_path):
    leg = _leg(tmp_path)
    seal_leg(leg)
    # control: resealing the leg leaves its top-level seal.json out of its own table, and checks clean
    assert SEAL_FILE not in seal_leg(leg)["files"] and check_seal(leg) == []
    (leg / "post_forward").mkdir()
    (leg / "post_forward" / SEAL_FILE).write_text("added later")
    assert check_seal(leg) == [f"{leg / 'post_forward' / SEAL_FILE}: added after sealing"]
