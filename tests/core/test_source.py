"""Which source a leg ran from: git's commit, and a dirty checkout named by its changes."""

from __future__ import annotations

import subprocess

from tica.source import checkout_commit, same_commit


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_a_dirty_checkout_is_named_by_its_changes_not_only_as_dirty(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    clean = checkout_commit(tmp_path)
    assert clean and "+dirty" not in clean
    (tmp_path / "a.py").write_text("x = 2\n")
    first = checkout_commit(tmp_path)
    (tmp_path / "a.py").write_text("x = 3\n")
    second = checkout_commit(tmp_path)
    assert first.startswith(clean + "+dirty.") and second.startswith(clean + "+dirty.")
    assert first != second  # two different edits are two different sources
    assert same_commit(first, first) and not same_commit(first, second)
    assert not same_commit(clean, first) and not same_commit(first, clean)
    (tmp_path / ".git" / "info" / "exclude").write_text("outputs/\n")
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "run.log").write_text("ignored outputs do not count")
    assert checkout_commit(tmp_path) == second


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    assert checkout_commit(tmp_path) is None


def test_a_pinned_prefix_names_the_full_commit_and_nothing_shorter_than_seven():
    full = "0123456789abcdef0123456789abcdef01234567"
    assert same_commit("0123456", full) and same_commit(full.upper(), full)
    assert not same_commit("012345", full) and not same_commit("0123457", full)


# ---- what an import reads (issue 28, class 1)


def _repo(tmp_path):
    import subprocess

    def git(*a):
        subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)
    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "main.py").write_text("import helper\n")
    (tmp_path / ".gitignore").write_text("data/\n")
    git("add", ".")
    git("commit", "-qm", "one")
    return git


def test_an_untracked_module_tracked_code_imports_changes_the_source(tmp_path):
    from tica.source import checkout_commit

    _repo(tmp_path)
    clean = checkout_commit(tmp_path / "pkg")
    assert "+dirty" not in clean
    (tmp_path / "pkg" / "helper.py").write_text("X = 1\n")
    first = checkout_commit(tmp_path / "pkg")
    assert first.startswith(clean + "+dirty.")
    (tmp_path / "pkg" / "helper.py").write_text("X = 2\n")  # another edit of the untracked module
    assert checkout_commit(tmp_path / "pkg") not in (clean, first)
    # control: an ignored output changes nothing
    (tmp_path / "pkg" / "helper.py").unlink()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "out.bin").write_bytes(b"x")
    assert checkout_commit(tmp_path / "pkg") == clean


# ---- what is not source: candidate manifests and questions (issue 29, exact staleness)


def test_paths_the_repository_declares_not_source_are_left_out_and_only_those(tmp_path):
    from tica.source import IGNORE_FILE

    git = _repo(tmp_path)
    (tmp_path / "candidates").mkdir()
    (tmp_path / "candidates" / "c.yaml").write_text("track: t\n")
    (tmp_path / IGNORE_FILE).write_text("# manifests are bound by their own components\ncandidates/\n")
    git("add", ".")
    git("commit", "-qm", "two")
    clean = checkout_commit(tmp_path / "pkg")
    assert "+dirty" not in clean
    (tmp_path / "candidates" / "c.yaml").write_text("track: t\nedited: yes\n")  # tracked, edited
    (tmp_path / "candidates" / "new.yaml").write_text("track: u\n")  # untracked
    assert checkout_commit(tmp_path / "pkg") == clean
    (tmp_path / "pkg" / "main.py").write_text("import helper  # edited\n")  # control: code still counts
    assert checkout_commit(tmp_path / "pkg").startswith(clean + "+dirty.")
    git("checkout", "pkg/main.py")
    # the declaration itself is source, even where it names itself
    (tmp_path / IGNORE_FILE).write_text(f"candidates/\n{IGNORE_FILE}\npkg/\n")
    assert checkout_commit(tmp_path / "pkg").startswith(clean + "+dirty.")
