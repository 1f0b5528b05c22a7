"""Suite-wide: tests marked `long` run only under TICA_TESTS=full (tests/long.py)."""

from __future__ import annotations

import pytest

from tests.long import FULL, SKIP_REASON


def pytest_collection_modifyitems(config, items):
    if FULL:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)
