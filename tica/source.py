"""Which source a process runs from: the git commit of a checkout, and whether it is dirty.

Standard library only: leg producers record it in every leg (`leg.json` `source`), and a
manifest whose `source.commit` is `working-tree` resolves to the same value, so a receipt can be
bound to the code that produced it. A value git cannot give is `None` (unknown), never invented.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

WORKING_TREE = "working-tree"
DIRTY_SUFFIX = "+dirty"
# Paths of a checkout that are not its source (candidate manifests, questions): each a git
# pathspec pattern per line, '#' comments. They are bound by their own components (a manifest
# field, a named file, a question hash); counting them as source too would void every item on
# an edit that touches one. The file itself is always source.
IGNORE_FILE = ".tica-source-ignore"


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def checkout_commit(root: str | Path) -> str | None:
    """`<sha>` of HEAD; `<sha>+dirty.<digest>` when the checkout differs from it, the digest naming
    those differences (two different edits are two different sources); None outside a checkout.

    What counts is what an import can read: tracked changes, every submodule's own changes (a
    second patch to an already dirty submodule is another source), and untracked files git does
    not ignore (a new module that tracked code imports). Ignored outputs (data/, .venv) do not."""
    root = Path(root)
    head = _git(root, "rev-parse", "HEAD")
    top_out = _git(root, "rev-parse", "--show-toplevel")
    if not head or not top_out:
        return None
    top = Path(top_out.strip())
    scope = ["--", ":/", *(f":(top,exclude,glob){p}" for p in ignored_patterns(top))]
    status = _git(top, "status", "--porcelain", "--untracked-files=all", "--ignore-submodules=none", *scope)
    if status is None:
        return None
    if not status.strip():
        return head.strip()
    changes = _git(top, "diff", "HEAD", "--binary", "--submodule=diff", *scope)
    untracked = _git(top, "ls-files", "--others", "--exclude-standard", "--full-name", "-z", *scope)
    if changes is None or untracked is None:
        return None
    h = hashlib.sha256(changes.encode())
    for name in sorted(n for n in untracked.split("\0") if n):
        try:
            content = hashlib.sha256((top / name).read_bytes()).hexdigest()
        except OSError:
            content = "unreadable"
        h.update(f"\0untracked {name}\0{content}".encode())
    return f"{head.strip()}{DIRTY_SUFFIX}.{h.hexdigest()[:12]}"


def ignored_patterns(top: Path) -> list[str]:
    """The patterns of `IGNORE_FILE` at the checkout's top (none when it is absent or unreadable)."""
    try:
        lines = (top / IGNORE_FILE).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    patterns = [line.strip().rstrip("/") + ("/**" if line.strip().endswith("/") else "") for line in lines
                if line.strip() and not line.lstrip().startswith("#")]
    return [p for p in patterns if p.strip("/*") != IGNORE_FILE]


def same_commit(pinned: str, recorded: str) -> bool:
    """A pinned commit (at least 7 hex digits, a prefix of the recorded one) names it; a dirty
    checkout matches only the same changes (its `+dirty.<digest>`), never a clean one, and a bare
    `+dirty`, which names no changes, matches nothing."""
    p, p_sep, p_dirty = pinned.lower().partition(DIRTY_SUFFIX)
    r, r_sep, r_dirty = recorded.lower().partition(DIRTY_SUFFIX)
    if p_sep and not p_dirty:  # a bare +dirty names no changes: two different dirty trees would match
        return False
    return (p_sep, p_dirty) == (r_sep, r_dirty) and len(p) >= 7 and r.startswith(p)
