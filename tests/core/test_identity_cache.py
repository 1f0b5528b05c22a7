"""`tica candidate fingerprint`'s kept answer (tica.identity_cache) is given again only when every
input it was read from reads the same. The metamorphic relation, over each class of input (the
manifest's bytes, the checkpoint's files and listing, the files the recipe names, the identifying
code, a working-tree source): after any change, the command's answer is the answer a fresh
identification gives, never the kept one. The unchanged case is a hit that loads no pydantic."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tica import identity_cache
from tica.candidate import identify_file
from tica.cli import main
from tica.fingerprint import FingerprintCache

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fresh(manifest: Path) -> dict:
    """The answer with nothing kept: a full identification, no cache read or written."""
    ident = identify_file(manifest, FingerprintCache(persistent=False))
    return {"track": ident.track, "candidate_id": ident.candidate_id,
            "components": {c.value: fp for c, fp in ident.components.items()}}


def fingerprint(manifest: Path, capsys) -> dict:
    assert main(["candidate", "fingerprint", str(manifest), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(identity_cache, "RACY_WINDOW_NS", 0)  # files written by the test count as settled
    ck = tmp_path / "ckpt"
    ck.mkdir()
    (ck / "model.safetensors").write_bytes(b"weights-one")
    (ck / "config.json").write_text('{"hidden": 8}')
    (tmp_path / "train.py").write_text("print('bi1')\n")
    text = (ROOT / "demo" / "candidates" / "cpu-tiny.yaml").read_text()
    text = text.replace("../../data/models/tiny-llama", "ckpt").replace("commit: working-tree", f"commit: {COMMIT}")
    text = text.replace('bi1: "VLLM_BATCH_INVARIANT=1 python -m', 'bi1: "VLLM_BATCH_INVARIANT=1 python train.py -m')
    manifest = tmp_path / "candidate.yaml"
    manifest.write_text(text)
    return manifest


def kept(manifest: Path) -> bool:
    return identity_cache.cached_answer(manifest) is not None


def test_an_unchanged_candidate_is_answered_from_what_was_kept(project, capsys):
    first = fingerprint(project, capsys)
    assert first == fresh(project) and kept(project)
    assert "train.py" in json.dumps(identity_cache._load())  # the named file is one of its inputs
    assert fingerprint(project, capsys) == first


def test_a_hit_loads_neither_pydantic_nor_yaml(project, capsys):
    fingerprint(project, capsys)
    probe = ("import sys; from tica.cli import main; main(['candidate', 'fingerprint', sys.argv[1], '--json']); "
             "print(sorted(m for m in ('pydantic', 'yaml') if m in sys.modules))")
    env = {**os.environ, "TICA_CACHE_DIR": os.environ["TICA_CACHE_DIR"], "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", probe, str(project)], env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert json.loads("\n".join(out[:-1])) == fresh(project) and out[-1] == "[]"


def _rewrite_same_size_and_mtime(path: Path, data: bytes) -> None:
    st = path.stat()
    assert len(data) == st.st_size
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # only the ctime shows it


CHANGES = {
    "checkpoint content, size and mtime put back": lambda m: _rewrite_same_size_and_mtime(
        m.parent / "ckpt" / "model.safetensors", b"weights-two"),
    "a checkpoint file added": lambda m: (m.parent / "ckpt" / "extra.bin").write_bytes(b"x"),
    "a checkpoint file removed": lambda m: (m.parent / "ckpt" / "config.json").unlink(),
    "a checkpoint file renamed": lambda m: (m.parent / "ckpt" / "config.json").rename(m.parent / "ckpt" / "conf.json"),
    "a checkpoint file swapped for a link to other bytes": lambda m: (
        (m.parent / "ckpt" / "config.json").write_text('{"hidden": 9}'), (m.parent / "ckpt" / "model.safetensors").unlink(),
        (m.parent / "ckpt" / "model.safetensors").symlink_to("config.json")),
    "the manifest's bytes": lambda m: m.write_text(m.read_text().replace("bf16", "fp16", 1)),
    "a named file's content": lambda m: (m.parent / "train.py").write_text("print('changed')\n"),
    "a named file removed": lambda m: (m.parent / "train.py").unlink(),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_after_any_change_the_answer_is_a_fresh_identification(project, capsys, change):
    before = fingerprint(project, capsys)
    assert kept(project)
    time.sleep(0.01)
    CHANGES[change](project)
    after = fingerprint(project, capsys)
    assert after == fresh(project)
    assert after != before, "the change moves the identity: a kept answer would have been stale"


def test_a_file_that_appears_where_the_recipe_names_one_is_a_fresh_identification(project, capsys):
    project.write_text(project.read_text().replace("python train.py", "python prep.py"))
    before = fingerprint(project, capsys)
    assert kept(project)
    (project.parent / "prep.py").write_text("print('new')\n")
    after = fingerprint(project, capsys)
    assert after == fresh(project) != before


def test_other_identifying_code_is_a_fresh_identification(project, capsys, monkeypatch):
    fingerprint(project, capsys)
    assert kept(project)
    monkeypatch.setattr(identity_cache, "code_version", lambda: "another build of tica")
    assert not kept(project)


def test_an_answer_over_files_inside_the_racy_window_is_not_kept(project, capsys, monkeypatch):
    """The control of the window: with the real window, files written a moment ago are not settled."""
    monkeypatch.setattr(identity_cache, "RACY_WINDOW_NS", 10**12)
    assert fingerprint(project, capsys) == fresh(project)
    assert not kept(project)


def test_a_working_tree_source_is_resolved_by_git_again(project, capsys, tmp_path):
    project.write_text(project.read_text().replace(f"commit: {COMMIT}", "commit: working-tree"))
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    (tmp_path / ".gitignore").write_text("cache/\n")  # the caches are not source
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    first = fingerprint(project, capsys)
    assert kept(project)
    (tmp_path / "module.py").write_text("x = 1\n")  # an untracked file an import can read: another source
    assert not kept(project)
    assert fingerprint(project, capsys) == fresh(project) != first


def test_a_kept_answer_that_cannot_be_read_is_a_fresh_identification(project, capsys):
    fingerprint(project, capsys)
    identity_cache.cache_path().write_text("{not json")
    assert fingerprint(project, capsys) == fresh(project)
    shutil.rmtree(identity_cache.cache_path().parent)
    assert fingerprint(project, capsys) == fresh(project)
