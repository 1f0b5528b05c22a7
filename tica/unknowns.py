"""What a receipt did not record, spelled as a value: one explicit list, read in one place.

A producer that writes "unknown", "n/a" or "" where a value belongs recorded nothing. Such a
placeholder never satisfies "recorded", and two equal placeholders never count as aligned: the
receipt reader (`tica.receipts.read_receipt`) turns every placeholder into an absent value
before any model or rule sees it — a mapping's key is dropped (absent is unknown), a list item
becomes null. Standard library only.

"none" is not on the list: it is a value some settings take (vLLM's CUDA graph mode NONE, a
prompt template without a thinking switch).
"""

from __future__ import annotations

from typing import Any

PLACEHOLDERS: frozenset[str] = frozenset({
    "", "unknown", "<unknown>", "(unknown)", "n/a", "na", "n.a.", "?", "??", "-", "--", "tbd", "todo", "null",
    "nil", "undefined", "unspecified", "unset", "not set", "not recorded", "none recorded", "not available",
    "unavailable", "missing",
})


def is_placeholder(value: Any) -> bool:
    """A string that stands for 'not recorded' (case and surrounding space ignored). White space
    alone is a value ("\n" is a stop sequence); only the empty string is empty."""
    if not isinstance(value, str):
        return False
    word = value.strip().lower()
    return value == "" or (word != "" and word in PLACEHOLDERS)


def without_placeholders(value: Any) -> Any:
    """`value` with every placeholder made absent: dropped from mappings, null in lists, None alone."""
    if isinstance(value, dict):
        return {k: without_placeholders(v) for k, v in value.items() if not is_placeholder(v)}
    if isinstance(value, list):
        return [None if is_placeholder(v) else without_placeholders(v) for v in value]
    return None if is_placeholder(value) else value


def is_unknown(value: Any) -> bool:
    """What a producer did not record: absent (None), empty, or a placeholder."""
    return value is None or is_placeholder(value) or (isinstance(value, (dict, list, tuple)) and not value)
