"""Archived receipts (tica.receipt_archive): unpacked whole, once per archive digest, and strictly
(a member that is not a plain file or folder, or that points outside, is refused by name)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from tica.errors import InputError
from tica.receipt_archive import is_archive, unpacked


def _archive(path: Path, members: dict[str, bytes], *, links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:xz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return path


def test_an_archive_unpacks_into_a_folder_named_by_its_digest_once(tmp_path):
    archive = _archive(tmp_path / "r.tar.xz", {"track/run1/leg/leg.json": b"{}", "README.md": b"hi"})
    first = unpacked(archive, tmp_path / "cache")
    assert (first / "track" / "run1" / "leg" / "leg.json").read_bytes() == b"{}"
    assert unpacked(archive, tmp_path / "cache") == first  # reused, not unpacked again
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.name]  # no temporary folder left


def test_another_archive_content_gets_another_folder(tmp_path):
    a = unpacked(_archive(tmp_path / "a.tar.xz", {"x": b"1"}), tmp_path / "cache")
    b = unpacked(_archive(tmp_path / "b.tar.xz", {"x": b"2"}), tmp_path / "cache")
    assert a != b and (a / "x").read_bytes() == b"1" and (b / "x").read_bytes() == b"2"


@pytest.mark.parametrize("members,links,field", [
    ({"../escape": b"x"}, None, "../escape"),
    ({"/etc/passwd": b"x"}, None, "/etc/passwd"),
    ({"ok": b"x"}, {"leg/seal.json": "/etc/passwd"}, "leg/seal.json"),
])
def test_a_member_outside_the_folder_or_not_a_plain_file_is_refused_by_name(tmp_path, members, links, field):
    archive = _archive(tmp_path / "bad.tar.xz", members, links=links)
    with pytest.raises(InputError) as err:
        unpacked(archive, tmp_path / "cache")
    assert err.value.field == field and str(archive) in str(err.value)
    assert not any((tmp_path / "cache").iterdir())  # nothing left behind


def test_a_file_that_is_not_an_archive_is_bad_input(tmp_path):
    fake = tmp_path / "r.tar.xz"
    fake.write_bytes(b"not a tar")
    with pytest.raises(InputError, match="not a readable tar archive"):
        unpacked(fake, tmp_path / "cache")
    with pytest.raises(InputError, match="no such archive"):
        unpacked(tmp_path / "missing.tgz", tmp_path / "cache")


def test_archives_are_told_from_folders_by_name():
    assert is_archive(Path("basis.tar.xz")) and is_archive(Path("receipts.tgz"))
    assert not is_archive(Path("tests/fixtures/h200")) and not is_archive(Path("run.xz"))
