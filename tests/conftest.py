"""Suite-wide: tests marked `long` run only under TICA_TESTS=full (tests/long.py); under
pytest-xdist (`scripts/test.sh` runs two workers, `--dist loadgroup`) each file stays on one
worker, so its module and session fixtures are made once, and every test that starts the Ray
test cluster runs on the same worker (one cluster at a time on the machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.long import FULL, SKIP_REASON

ONE_WORKER = {"ray": "ray"}  # tests/<folder> -> the xdist group all of its files share


def pytest_collection_modifyitems(config, items):
    skip = None if FULL else pytest.mark.skip(reason=SKIP_REASON)
    grouped = bool(getattr(config.option, "numprocesses", None))
    for item in items:
        if skip is not None and "long" in item.keywords:
            item.add_marker(skip)
        if grouped:
            path = Path(str(item.fspath))
            group = ONE_WORKER.get(path.parent.name, str(path))
            item.add_marker(pytest.mark.xdist_group(group))
