"""The quality scorer: answer-region extraction (last \\boxed{...}, else the last number in the
response) and numeric comparison. Standard library only. Its identity is its name plus the
sha256 of this file, so any change of the scorer is a new evaluation contract."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

SCORER_NAME = "tica.scorer.boxed/1"
# a number standing on its own: not the tail of a word such as "t441"
_NUMBER = re.compile(r"(?<![A-Za-z0-9_.])-?\d+(?:,\d{3})*(?:\.\d+)?(?![A-Za-z0-9_])")


def scorer_id() -> str:
    return f"{SCORER_NAME} sha256:{hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}"


def last_boxed(text: str) -> str | None:
    i = text.rfind("\\boxed{")
    if i < 0:
        return None
    j, depth = i + len("\\boxed{"), 1
    k = j
    while k < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        k += 1
    return text[j : k - 1].strip() if depth == 0 else None


def extract(text: str) -> tuple[str | None, str]:
    """(extracted answer, how): 'boxed', 'last_number' or 'none'."""
    boxed = last_boxed(text)
    if boxed is not None:
        nums = _NUMBER.findall(boxed)
        return (nums[-1] if nums else boxed), "boxed"
    nums = _NUMBER.findall(text)
    if nums:
        return nums[-1], "last_number"
    return None, "none"


def _num(s: str) -> float | None:
    try:
        return float(s.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def is_correct(extracted: str | None, answer: str) -> bool:
    if extracted is None:
        return False
    a, b = _num(extracted), _num(answer)
    if a is not None and b is not None:
        return abs(a - b) < 1e-9
    return extracted.strip() == answer.strip()
