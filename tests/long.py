"""Long runs and their short slices. The default test command (`bash scripts/test.sh`, which CI
runs on two cores) runs each long test's short slice; `TICA_TESTS=full bash scripts/test.sh`
runs the full sizes and the tests marked `long` (skipped by default, named in pytest's summary)."""

from __future__ import annotations

import os

FULL = os.environ.get("TICA_TESTS") == "full"
SKIP_REASON = "long run: TICA_TESTS=full runs it; the default runs its short slice (tests/long.py)"


def size(short: int, full: int) -> int:
    """A test's size: `full` under TICA_TESTS=full, else `short`."""
    return full if FULL else short
