"""One spelling of a content digest, so that two spellings of one hash compare equal.

`SHA256:ABC…`, `sha256:abc…` and a bare `abc…` of 64 hex digits name one sha256; a digest of
another algorithm keeps its name (`blake3:…`). Anything that is not a digest is returned as it
was written (stripped), and compares only with itself. Standard library only.
"""

from __future__ import annotations

import re

_NAMED = re.compile(r"^(?P<algo>[a-z0-9_-]+):(?P<hex>[0-9a-f]+)$")
_BARE_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def canonical(value: str) -> str:
    """'algo:hexdigest' in lower case; a bare 64-hex digest is a sha256."""
    text = value.strip()
    low = text.lower()
    if _BARE_SHA256.match(low):
        return "sha256:" + low
    if _NAMED.match(low):
        return low
    return text
