"""Checkpoint fingerprints: stable for the same bytes, different after any one-byte change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tica.fingerprint import RACY_WINDOW_NS, FingerprintCache, fingerprint_checkpoint

files_strategy = st.dictionaries(
    st.from_regex(r"[a-z]{1,8}\.(safetensors|json)", fullmatch=True),
    st.binary(min_size=1, max_size=4096),
    min_size=1,
    max_size=4,
)


def _write(root: Path, files: dict[str, bytes]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)


@settings(max_examples=40, deadline=None)
@given(files=files_strategy)
def test_fingerprint_is_stable_across_runs_and_caches(tmp_path_factory, files):
    root = tmp_path_factory.mktemp("ckpt")
    _write(root, files)
    first = fingerprint_checkpoint(root, FingerprintCache(root.parent / "c1.json"))
    again = fingerprint_checkpoint(root, FingerprintCache(root.parent / "c1.json"))
    fresh = fingerprint_checkpoint(root, FingerprintCache(root.parent / "c2.json"))
    assert first == again == fresh


@settings(max_examples=40, deadline=None)
@given(files=files_strategy, data=st.data())
def test_any_one_byte_change_changes_the_fingerprint(tmp_path_factory, files, data):
    root = tmp_path_factory.mktemp("ckpt")
    _write(root, files)
    cache = FingerprintCache(root.parent / "cache.json")
    before = fingerprint_checkpoint(root, cache)
    name = data.draw(st.sampled_from(sorted(files)))
    blob = bytearray(files[name])
    pos = data.draw(st.integers(0, len(blob) - 1))
    blob[pos] ^= data.draw(st.integers(1, 255))
    (root / name).write_bytes(bytes(blob))  # same size, possibly the same coarse mtime
    assert fingerprint_checkpoint(root, cache) != before


def test_unchanged_old_files_come_from_the_cache(tmp_path):
    root = tmp_path / "ckpt"
    _write(root, {"a.safetensors": b"x" * 1000, "b.json": b"{}"})
    old = (os.stat(root / "a.safetensors").st_mtime_ns - 2 * RACY_WINDOW_NS) / 1e9
    for p in root.iterdir():
        os.utime(p, (old, old))
    warm = FingerprintCache(tmp_path / "cache.json")
    fingerprint_checkpoint(root, warm)
    warm.save()
    reread = FingerprintCache(tmp_path / "cache.json")
    fingerprint_checkpoint(root, reread)
    assert (reread.hits, reread.misses) == (2, 0)


def test_an_unchanged_tree_writes_no_cache_and_a_changed_one_does(tmp_path, monkeypatch):
    """A fingerprint of an unchanged tree only reads the shared cache (it runs before every
    materialization); the control: a changed file is hashed and the cache learns it."""
    root = tmp_path / "ckpt"
    _write(root, {"a.safetensors": b"x" * 1000})
    old = (os.stat(root / "a.safetensors").st_mtime_ns - 2 * RACY_WINDOW_NS) / 1e9
    os.utime(root / "a.safetensors", (old, old))
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "cache"))
    first = fingerprint_checkpoint(root)
    cache_file = next((tmp_path / "cache").rglob("*.json"))
    inode = cache_file.stat().st_ino  # a save replaces the file: a new inode
    assert fingerprint_checkpoint(root) == first
    assert cache_file.stat().st_ino == inode
    (root / "a.safetensors").write_bytes(b"y" * 1000)
    os.utime(root / "a.safetensors", (old, old))
    assert fingerprint_checkpoint(root) != first
    assert next((tmp_path / "cache").rglob("*.json")).stat().st_ino != inode


def test_a_file_rewritten_within_the_racy_window_is_hashed_again(tmp_path):
    """Negative control for the cache: same size and mtime, fresh entry -> must not be trusted."""
    root = tmp_path / "ckpt"
    _write(root, {"a.safetensors": b"x" * 1000})
    cache = FingerprintCache(tmp_path / "cache.json")
    before = fingerprint_checkpoint(root, cache)
    st_before = os.stat(root / "a.safetensors")
    (root / "a.safetensors").write_bytes(b"y" + b"x" * 999)
    os.utime(root / "a.safetensors", ns=(st_before.st_atime_ns, st_before.st_mtime_ns))
    assert fingerprint_checkpoint(root, cache) != before


def test_a_file_rewritten_in_place_with_its_size_and_mtime_put_back_is_hashed_again(tmp_path):
    """cp -p / rsync --inplace -t / touch -r onto an old, cached shard: size, mtime and inode all as
    cached, outside the racy window. Only the ctime (which no one can set) shows the write."""
    root = tmp_path / "ckpt"
    _write(root, {"a.safetensors": b"x" * 1000})
    shard = root / "a.safetensors"
    old = (os.stat(shard).st_mtime_ns - 2 * RACY_WINDOW_NS) / 1e9
    os.utime(shard, (old, old))
    cache = FingerprintCache(tmp_path / "cache.json")
    before = fingerprint_checkpoint(root, cache)
    assert fingerprint_checkpoint(root, cache) == before and cache.hits == 1  # control: unchanged -> cached
    st = os.stat(shard)
    with open(shard, "r+b") as f:  # in place: the same inode
        f.write(b"y")
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(shard)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert fingerprint_checkpoint(root, cache) != before


def test_renaming_a_file_changes_the_fingerprint(tmp_path):
    root = tmp_path / "ckpt"
    _write(root, {"a.safetensors": b"same"})
    before = fingerprint_checkpoint(root, FingerprintCache(tmp_path / "c.json"))
    (root / "a.safetensors").rename(root / "b.safetensors")
    assert fingerprint_checkpoint(root, FingerprintCache(tmp_path / "c.json")) != before


# ---- what the loader reads (issue 28, class 1 and 5)


def _ckpt(tmp_path, name="ckpt"):
    d = tmp_path / name
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"hidden_size": 64}')
    (d / "model.safetensors").write_bytes(b"w" * 1024)
    return d


def test_a_linked_folder_is_followed_and_its_content_counts(tmp_path):
    from tica.fingerprint import fingerprint_checkpoint

    d = _ckpt(tmp_path)
    shards = tmp_path / "ckpt" / "real_shards"
    shards.mkdir()
    (shards / "a.bin").write_bytes(b"a" * 10)
    (d / "linked").symlink_to(shards, target_is_directory=True)
    before = fingerprint_checkpoint(d, persist=False)
    (shards / "a.bin").write_bytes(b"b" * 10)  # the loader would read new bytes through the link
    assert fingerprint_checkpoint(d, persist=False) != before


def test_a_link_outside_the_checkpoint_is_refused_by_name_unless_the_root_admits_it(tmp_path):
    from tica.fingerprint import CheckpointError, fingerprint_checkpoint

    d = _ckpt(tmp_path / "models--org--m" / "snapshots", "rev1")
    blob = tmp_path / "models--org--m" / "blobs" / "abc"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"x" * 64)
    (d / "extra.safetensors").symlink_to(blob)
    with pytest.raises(CheckpointError, match="extra.safetensors: resolves outside the checkpoint"):
        fingerprint_checkpoint(d, persist=False)
    admitted = fingerprint_checkpoint(d, persist=False, allowed_root=tmp_path / "models--org--m")
    blob.write_bytes(b"y" * 64)
    assert fingerprint_checkpoint(d, persist=False, allowed_root=tmp_path / "models--org--m") != admitted


def test_a_shard_the_index_names_outside_the_folder_is_hashed_or_refused(tmp_path):
    from tica.fingerprint import CheckpointError, fingerprint_checkpoint

    d = _ckpt(tmp_path / "run")
    other = tmp_path / "run" / "shared"
    other.mkdir()
    (other / "model-00002.safetensors").write_bytes(b"s" * 32)
    (d / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model.safetensors", "b": "../shared/model-00002.safetensors"}}')
    with pytest.raises(CheckpointError, match="resolves outside the checkpoint"):
        fingerprint_checkpoint(d, persist=False)
    admitted = fingerprint_checkpoint(d, persist=False, allowed_root=tmp_path / "run")
    (other / "model-00002.safetensors").write_bytes(b"t" * 32)
    assert fingerprint_checkpoint(d, persist=False, allowed_root=tmp_path / "run") != admitted
    (d / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-00009.safetensors"}}')
    with pytest.raises(CheckpointError, match="names shard model-00009.safetensors, which does not exist"):
        fingerprint_checkpoint(d, persist=False)


def test_hidden_bookkeeping_files_no_loader_reads_do_not_change_the_fingerprint(tmp_path):
    from tica.fingerprint import fingerprint_checkpoint

    d = _ckpt(tmp_path)
    before = fingerprint_checkpoint(d, persist=False)
    (d / ".gitattributes").write_text("*.safetensors filter=lfs")
    (d / ".cache").mkdir()
    (d / ".cache" / "download.lock").write_text("1")
    assert fingerprint_checkpoint(d, persist=False) == before
    (d / "tokenizer.json").write_text("{}")  # control: a file the loader reads does
    assert fingerprint_checkpoint(d, persist=False) != before


def test_a_fifo_is_never_fingerprinted_as_empty_content(tmp_path):
    import os

    from tica.fingerprint import CheckpointError, fingerprint_checkpoint

    fifo = tmp_path / "weights.fifo"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="not a regular file"):
        fingerprint_checkpoint(fifo, persist=False)
    d = _ckpt(tmp_path)
    os.mkfifo(d / "pipe.safetensors")
    with pytest.raises(CheckpointError, match="pipe.safetensors: not a regular file"):
        fingerprint_checkpoint(d, persist=False)
