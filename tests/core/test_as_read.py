"""How every receipt is read: its nesting bounded (tica.strict_io.depth), placeholders made absent
and whole floats read as whole numbers (tica.receipts.as_read). These walks are the judges' hottest
path, so they are written for speed; this pins each to its plain recursive definition on any JSON
value (hypothesis), under every key."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from tica.receipts import as_read
from tica.strict_io import StrictInputError, depth
from tica.unknowns import PLACEHOLDERS, WORD_VALUE_KEYS, is_placeholder, without_placeholders


def _plain_without(value: Any, key: str | None = None) -> Any:
    if isinstance(value, dict):
        inner = {k: (key if key in WORD_VALUE_KEYS else k) for k in value}
        return {k: _plain_without(v, inner[k]) for k, v in value.items() if not is_placeholder(v, inner[k])}
    if isinstance(value, list):
        return [_plain_without(v, key) for v in value]
    return None if is_placeholder(value, key) else value


def _plain_whole(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain_whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_whole(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return int(value)
    return value


WORDS = st.sampled_from(sorted(PLACEHOLDERS) + ["none", " ", "None", "\n", "value", "2", " Unknown "])
KEYS = st.sampled_from(sorted(WORD_VALUE_KEYS)[:6] + ["a", "b", "model", "num_prompts"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 60, 2 ** 60),
                    st.floats(allow_nan=False, allow_infinity=False), st.floats(min_value=-1e6, max_value=1e6).map(round).map(float),
                    WORDS, st.text(max_size=4))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                     st.dictionaries(KEYS, inner, max_size=5)), max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(JSON, st.one_of(st.none(), KEYS))
def test_the_fast_walk_reads_every_json_value_as_the_plain_definition_does(value, key):
    assert without_placeholders(value, key) == _plain_without(value, key)
    got, want = as_read(value), _plain_whole(_plain_without(value))
    assert got == want and repr(got) == repr(want)  # 1 and 1.0 compare equal: the spelling must match too


def _plain_depth(value: Any) -> int:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return 1 + max(map(_plain_depth, value), default=0)
    return 1


def _plain_count(value: Any) -> int:
    children = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []
    return 1 + sum(map(_plain_count, children))


@settings(max_examples=400, deadline=None)
@given(JSON)
def test_the_depth_bound_measures_and_counts_as_the_plain_definition_does(value):
    deep, count = _plain_depth(value), _plain_count(value)
    assert depth(value) == deep
    with pytest.raises(StrictInputError):
        depth(value, limit=deep - 1)
    assert depth(value, max_values=count) == deep
    with pytest.raises(StrictInputError):
        depth(value, max_values=count - 1)
