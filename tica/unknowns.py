"""What a receipt did not record, spelled as a value: one explicit list, read in one place.

A producer that writes "unknown", "n/a" or "" where a value belongs recorded nothing. Such a
placeholder never satisfies "recorded", and two equal placeholders never count as aligned: the
receipt reader (`tica.receipts.read_receipt`) turns every placeholder into an absent value
before any model or rule sees it — a mapping's key is dropped (absent is unknown), a list item
becomes null. Standard library only.

"none" and white space alone are placeholders too, except under the keys in `WORD_VALUE_KEYS`:
there they are what a setting or a model wrote (vLLM's CUDA graph mode NONE, a thinking mode
"none", a stop sequence "\n", a delimiter " ", a response "None"). Where the key is not known,
an empty-looking word is read as unknown: a setting read as unrecorded costs a pass, never gives one.
"""

from __future__ import annotations

from typing import Any

PLACEHOLDERS: frozenset[str] = frozenset({
    "", "unknown", "<unknown>", "(unknown)", "n/a", "na", "n.a.", "?", "??", "-", "--", "tbd", "todo", "null",
    "nil", "undefined", "unspecified", "unset", "not set", "not recorded", "none recorded", "not available",
    "unavailable", "missing",
})


# Keys whose string values are model text or a setting's own word: there, "none" and white space
# are values. A value nested under such a key (a list of stop sequences) is read the same way.
WORD_VALUE_KEYS: frozenset[str] = frozenset({
    "cudagraph_mode", "thinking_mode", "enable_thinking",
    "stop", "stop_sequences", "until", "fewshot_delimiter", "target_delimiter",
    "text", "token_str", "tokens", "prompt", "completion", "response", "resps", "filtered_resps", "output",
    "answer", "target", "extracted", "doc_to_text", "doc_to_target", "regex_pattern", "pattern", "replacement",
    "tokenizer_bos_token", "tokenizer_eos_token", "tokenizer_pad_token",
})
_EMPTY_WORDS = frozenset({"", "none"})


def is_placeholder(value: Any, key: str | None = None) -> bool:
    """A string that stands for 'not recorded' (case and surrounding space ignored). Under a key in
    `WORD_VALUE_KEYS`, or with no key, "none" and white space alone are values; under any other
    key they are placeholders."""
    if not isinstance(value, str):
        return False
    word = value.strip().lower()
    if value == "" or (word != "" and word in PLACEHOLDERS):
        return True
    return key is not None and key not in WORD_VALUE_KEYS and word in _EMPTY_WORDS


def without_placeholders(value: Any, key: str | None = None) -> Any:
    """`value` with every placeholder made absent: dropped from mappings, null in lists, None alone.
    `key` is the mapping key the value sits under (a list's items sit under the list's key)."""
    kind = type(value)
    if kind is str:
        return None if is_placeholder(value, key) else value
    if kind is dict or isinstance(value, dict):
        word = key in WORD_VALUE_KEYS
        out = {}
        for k, v in value.items():
            under = key if word else k
            if type(v) is str:
                if not is_placeholder(v, under):
                    out[k] = v
            elif type(v) in _SCALARS:
                out[k] = v
            else:
                out[k] = without_placeholders(v, under)
        return out
    if kind is list or isinstance(value, list):  # a placeholder item becomes None, keeping the others' places
        return [v if type(v) in _SCALARS else without_placeholders(v, key) for v in value]
    return None if is_placeholder(value, key) else value


# what no placeholder can be (is_placeholder reads strings only): kept as they are without a call
_SCALARS = frozenset({int, float, bool, type(None)})


def is_unknown(value: Any) -> bool:
    """What a producer did not record: absent (None), empty, or a placeholder."""
    return value is None or is_placeholder(value) or (isinstance(value, (dict, list, tuple)) and not value)
