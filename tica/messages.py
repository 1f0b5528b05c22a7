"""One style for every message a person reads: one sentence, no repeated verdict prefix, no
absolute path, digests shortened, cut only at a word. Standard library only.

The judges write reasons as `<verdict>: <what>`; wrapping layers (a rule that forbids a pass,
a report that quotes a verdict) have prefixed them again. `sentence` is what a report shows.
"""

from __future__ import annotations

import re

VERDICT_WORDS = ("pass", "fail", "inconclusive", "not run", "note")
_PREFIX = re.compile(r"^\s*(?:(?:pass|fail|inconclusive|not run|note)\s*:\s*)+", re.IGNORECASE)
# An absolute path (POSIX), shown as its last two parts: where it lies on the producer's disk
# says nothing to the reader and differs per machine.
_ABS_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.@+-]+/)*?([\w.@+-]+/)?([\w.@+*-]+)(?![\w.@+*/-])")
_DIGEST = re.compile(r"\b(sha256|blake3|sha1|md5):([0-9a-f]{12})[0-9a-f]{8,}\b", re.IGNORECASE)
_BARE_HEX = re.compile(r"\b([0-9a-f]{12})[0-9a-f]{28,}\b")


def without_prefix(text: str) -> str:
    """`text` without its leading verdict words ("not run: not run: x" -> "x")."""
    return _PREFIX.sub("", text, count=1).strip()


def _short_path(m: re.Match[str]) -> str:
    return "".join(p for p in m.groups() if p) or m.group(0)


def plain(text: str) -> str:
    """Absolute paths shown by their last two parts, digests by their first 12 hex digits."""
    text = _ABS_PATH.sub(_short_path, text)
    text = _DIGEST.sub(lambda m: f"{m.group(1)}:{m.group(2)}…", text)
    return _BARE_HEX.sub(lambda m: f"{m.group(1)}…", text)


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters at a word boundary, an ellipsis marking the cut."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:(") + "…"


def sentence(text: str, limit: int = 160) -> str:
    """A message as a person reads it: no verdict prefix, plain, its first clause, clipped at a word."""
    text = plain(without_prefix(text))
    first = text.split("; ")[0]
    return clip(first, limit)
