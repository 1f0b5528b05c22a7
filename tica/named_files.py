"""The files a manifest's command fields name, and their content (standard library only: the
manifest model and the fingerprint fast path, tica.identity_cache, read them through this one function)."""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterable
from pathlib import Path


def _tokens(text: str) -> list[str]:
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    return [part for w in words for part in (w, w.split("=", 1)[-1]) if part]


def named_file_digests(texts: Iterable[tuple[str, str]], folder: Path) -> dict[str, dict[str, str]]:
    """{component: {path as named: sha256 of the file}} for every regular file inside `folder` that a
    token of a (component, field text) pair names."""
    folder = folder.resolve()
    out: dict[str, dict[str, str]] = {}
    for component, text in texts:
        for token in _tokens(text):
            if token.startswith("-") or len(token) > 4096:
                continue
            try:
                path = (folder / token).resolve()
                regular = path.is_file() and (path == folder or folder in path.parents)
            except (OSError, ValueError):
                continue
            if regular:
                out.setdefault(component, {})[token] = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    return out
