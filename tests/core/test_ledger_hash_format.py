"""The row hash's body is written by hand for speed (verify hashes every row); it must stay
byte-equal to the json.dumps it replaced, or every existing ledger would stop verifying."""

from __future__ import annotations

import hashlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tica.ledger import row_hash

_values = st.one_of(st.none(), st.text(), st.integers(min_value=-(2**80), max_value=2**80))


def _reference(prev: str, table: str, seq: int, at: str, payload: dict) -> str:
    body = json.dumps({"table": table, "seq": seq, "recorded_at": at, "payload": payload},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{prev}\n{body}".encode()).hexdigest()


@settings(max_examples=300, deadline=None)
@given(prev=st.text(max_size=70), table=st.text(max_size=12), seq=st.integers(0, 2**62), at=st.text(max_size=40),
       payload=st.dictionaries(st.text(max_size=12), _values, max_size=12))
def test_row_hash_equals_the_json_dumps_reference(prev, table, seq, at, payload):
    assert row_hash(prev, table, seq, at, payload) == _reference(prev, table, seq, at, payload)


def test_the_reference_sees_a_one_character_change():  # negative control
    p = {"reason": "a"}
    assert row_hash("g", "reruns", 1, "t", p) != _reference("g", "reruns", 1, "t", {"reason": "b"})
