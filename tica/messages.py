"""One style for every message a person reads: one sentence, no repeated verdict prefix, no
absolute path, digests shortened, cut only at a word. Standard library only.

The judges write reasons as `<verdict>: <what>`; wrapping layers (a rule that forbids a pass,
a report that quotes a verdict) have prefixed them again. `sentence` is what a report shows.
`faults` names what makes a message unreadable (tests/core/test_messages.py holds every message
the judges, checks and canaries produce to it).
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

VERDICT_WORDS = ("pass", "fail", "inconclusive", "not run", "note")
_WORDS = r"(?:pass|fail|inconclusive|not run|note)"
_PREFIX = re.compile(rf"^\s*(?:{_WORDS}\s*:\s*)+", re.IGNORECASE)
# An absolute path (POSIX), shown as its last two parts: where it lies on the producer's disk
# says nothing to the reader and differs per machine.
_ABS_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.@+-]+/)*?([\w.@+-]+/)?([\w.@+*-]+)(?![\w.@+*/-])")
_DIGEST = re.compile(r"\b(sha256|blake3|sha1|md5):([0-9a-f]{12})[0-9a-f]{8,}\b", re.IGNORECASE)
_BARE_HEX = re.compile(r"\b([0-9a-f]{12})[0-9a-f]{28,}\b")
# The repository's root: a receipt under it is shown relative to it, as the committed verdicts show them.
_ROOT = Path(__file__).resolve().parent.parent


def without_prefix(text: str) -> str:
    """`text` without its leading verdict words ("not run: not run: x" -> "x")."""
    return _PREFIX.sub("", text, count=1).strip()


def _short_path(m: re.Match[str]) -> str:
    return "".join(p for p in m.groups() if p) or m.group(0)


# A value quoted verbatim ('...' or "..." after a space, '=', '(' or ':'): a recorded command or
# setting, data shown as recorded, never rewritten.
_QUOTED = re.compile(r"""(?<![\w])('[^'\n]*'|"[^"\n]*")(?![\w])""")


def _outside_quotes(text: str, fn) -> str:
    parts = _QUOTED.split(text)
    return "".join(p if i % 2 else fn(p) for i, p in enumerate(parts))


def relative(text: str) -> str:
    """Paths as a reader finds them: relative to the repository (or the working folder) where they
    lie under it, else by their last two parts (a leg folder and its file). Digests stay whole, and
    so does a quoted value (a recorded command's tokens are shown as recorded)."""
    def rewrite(part: str) -> str:
        for base in {str(_ROOT), os.getcwd()}:
            if base != "/":
                part = part.replace(base.rstrip("/") + "/", "")
        return _ABS_PATH.sub(_short_path, part)
    return _outside_quotes(text, rewrite)


def in_leg(text: str, leg: str | os.PathLike[str]) -> str:
    """`text` with the files of `leg` shown under the leg's folder name ("forward_bi1/arrays/s1.npz"),
    any other path `relative`."""
    leg = Path(leg)
    return relative(text.replace(f"{leg}/", f"{leg.name}/"))


def digest(value: object) -> str:
    """A digest by its first 12 hex digits and an ellipsis ("sha256:0123456789ab…")."""
    text = str(value)
    algo, sep, hexpart = text.rpartition(":")
    if len(hexpart) <= 12:
        return text
    return f"{algo}{sep}{hexpart[:12]}…"


def plain(text: str) -> str:
    """Paths relative (`relative`), digests by their first 12 hex digits."""
    text = relative(text)
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
    unclosed = _unclosed(cut)
    if unclosed and unclosed[-1] > limit // 2:  # cut before a parenthesis it would leave open
        cut, unclosed = cut[: unclosed[-1]], unclosed[:-1]
    return cut.rstrip(" ,;:(") + "…" + ")" * len(unclosed)


def _unclosed(text: str) -> list[int]:
    """Where the parentheses that `text` opens and does not close begin."""
    opened: list[int] = []
    for i, ch in enumerate(text):
        if ch == "(":
            opened.append(i)
        elif ch == ")" and opened:
            opened.pop()
    return opened


def sentence(text: str, limit: int = 160) -> str:
    """A message as a person reads it: no verdict prefix, plain, its first clause, clipped at a word."""
    text = plain(without_prefix(text))
    first = text.split("; ")[0]
    return clip(first, limit)


def unparenthesized(text: str) -> str:
    """`text` with its parentheses turned into commas: for a text quoted inside parentheses of its
    own, so that nothing nests deeper than one level."""
    text = re.sub(r"(?<=\w)\((s|es|ies)\)", r"[\1]", text)
    text = re.sub(r"\s*\(\s*", ", ", text)
    text = re.sub(r"\s*\)", "", text)
    return re.sub(r"\[(s|es|ies)\]", r"(\1)", text)


# ------------------------------------------------------------------ what makes a message unreadable

_STUTTER = re.compile(rf"\b{_WORDS}\s*:\s*{_WORDS}\s*:", re.IGNORECASE)
_NOT_RUN_TWICE = re.compile(r"^\s*not run\s*:[^;:]*\bnot run\b", re.IGNORECASE)
_JUDGED = re.compile(r"\b[1-9]\d*\b[^;]*\bjudged\b")
_ALL_GOOD = re.compile(r"^\s*fail\s*:\s*(\d+)\s*(?:of|/)\s*(\d+)\b")
_SLICED = re.compile(r"\w\.\.\.(?![.\w])")
_PLURAL = re.compile(r"(?<=\w)\((?:s|es|ies)\)")
_VERDICT_COLON = re.compile(rf"(?:^|(?<=[\s(;,]))(?<!did )({_WORDS}): ", re.IGNORECASE)  # "did not run:" is none
_ABSOLUTE = re.compile(r"(?<![\w.:/~-])/(?:[\w.@+-]+/)+[\w.@+*-]*")


def faults(text: str, headline: bool = False) -> list[str]:
    """What makes `text` unreadable, one phrase each; [] for a readable message. `headline`: a
    cell's summary (its verdict prefix is the headline that its body must not contradict)."""
    out = []
    if _STUTTER.search(text) or (headline and _NOT_RUN_TWICE.search(text)):
        out.append("a repeated verdict prefix")
    lowered = text.lstrip().lower()
    if headline and lowered.startswith("not run:") and _JUDGED.search(text):
        out.append("a 'not run' headline whose body says legs were judged")
    if headline and (m := _ALL_GOOD.match(lowered)) and m.group(1) == m.group(2) and m.group(1) != "0":
        out.append("a 'fail' headline over an all-good count")
    if _SLICED.search(text):
        out.append("a text cut by slicing ('...' after a word, not '…' at a word boundary)")
    depth = deepest = 0
    for ch in _PLURAL.sub("", text):
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
            if depth < 0:
                break
    if depth != 0:
        out.append("unbalanced parentheses (a text cut short, or one quoted whole)")
    if deepest > 1:
        out.append("parentheses inside parentheses")
    if len(_VERDICT_COLON.findall(text)) > 1:
        out.append("more than one verdict prefix")
    if _ABSOLUTE.search(_QUOTED.sub("''", text)):
        out.append("an absolute path")
    return out


def sliced_text(source: str, filename: str = "<source>") -> list[int]:
    """Lines of Python `source` that cut a text by slicing inside a message: `{x[:n]}` in an
    f-string, or `x[:n] + "..."`. Use `clip` (word boundary, ellipsis) or `digest`."""
    lines = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.FormattedValue):
            value = node.value
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.right, ast.Constant) \
                and isinstance(node.right.value, str) and node.right.value.startswith(("...", "…")):
            value = node.left
        else:
            continue
        if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Slice) and value.slice.upper is not None:
            lines.append(node.lineno)
    return sorted(set(lines))
