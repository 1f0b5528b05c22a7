"""Suite-wide: tests marked `long` run only under TICA_TESTS=full (tests/long.py); under
pytest-xdist (`TICA_TEST_WORKERS=2 bash scripts/test.sh`: two workers, `--dist loadgroup`) each file stays on one
worker, so its module fixtures are made once, and the files that share an expensive session
fixture share a worker too: the demo leg set (about ten minutes of real vLLM legs) is produced
once, and one Ray test cluster runs at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.long import FULL, SKIP_REASON

SHARED = {"demo_legs": "demo-legs", "ray_cluster": "ray"}  # session fixture -> the group of every file using it


def pytest_configure(config):
    config.addinivalue_line("markers", "postgres: starts a real Postgres server (set on every test using "
                                       "the postgres_server fixture); `scripts/test.sh --fast` leaves these out")


def pytest_collection_modifyitems(config, items):
    skip = None if FULL else pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if skip is not None and "long" in item.keywords:
            item.add_marker(skip)
        if "postgres_server" in item.fixturenames:
            item.add_marker(pytest.mark.postgres)
    if not getattr(config.option, "numprocesses", None):
        return
    group_of: dict[str, str] = {}
    for item in items:
        path = str(Path(str(item.fspath)))
        shared = [g for f, g in SHARED.items() if f in item.fixturenames]
        if shared or path not in group_of:
            group_of[path] = shared[0] if shared else group_of.get(path, path)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of[str(Path(str(item.fspath)))]))
