"""Suite-wide: tests marked `long` run only under TICA_TESTS=full (tests/long.py); tests using the
postgres_server fixture are marked `postgres`. Under pytest-xdist (`TICA_TEST_WORKERS=2 bash
scripts/test.sh`, and `--fast`) `--dist loadfile` keeps each file on one worker, so its module
fixtures are made once; a session fixture (the demo leg set, the accepted track) is made once per
worker that runs a test of its. (xdist's `loadgroup` groups nothing under pytest 9: it tags a
group onto `item._nodeid`, which pytest 9 no longer reads.)"""

from __future__ import annotations

import pytest

from tests.long import FULL, SKIP_REASON

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
