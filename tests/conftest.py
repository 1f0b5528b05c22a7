"""Suite-wide: tests marked `long` run only under TICA_TESTS=full (tests/long.py); under
pytest-xdist (`TICA_TEST_WORKERS=2 bash scripts/test.sh`: two workers, `--dist loadgroup`) each file stays on one
worker, so its module fixtures are made once, and the files that share an expensive session
fixture share a worker too: the demo leg set (about ten minutes of real vLLM legs) is produced
once, the accepted track (`baseline`) is materialized once, and one Ray test cluster runs at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.long import FULL, SKIP_REASON

# session fixture -> the group of every file using it
SHARED = {"demo_legs": "demo-legs", "ray_cluster": "ray", "baseline": "accepted-track"}


@pytest.fixture(scope="session")
def baseline(tmp_path_factory):
    """The false-pass suite's accepted track (tests/false_pass/test_acceptance.py), materialized once
    per session for every file that starts from it; each test works on a copy of its ledger."""
    from tests.false_pass.test_acceptance import accepted_track

    return accepted_track(tmp_path_factory)


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
    # NOTE (issue 30): under pytest 9.2 these groups reach no scheduler. pytest-xdist 3.8 reads a
    # group from a suffix its worker appends to `item._nodeid`, which pytest 9 no longer reads
    # (nodeid comes from `item._id`), and this hook returns early in the workers (numprocesses=None
    # there): --dist loadgroup spreads every file's tests over the workers. Module and session
    # fixtures are then built once per worker that runs a test of theirs.
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
