"""Suite-wide: tests marked `long` run only under TICA_TESTS=full (tests/long.py); tests using the
postgres_server fixture are marked `postgres`.

The full run (`bash scripts/test.sh`) has two phases: every test not marked `serial` on two
pytest-xdist workers (`--dist loadfile`: each file on one worker, so its module fixtures are made
once; a session fixture, once per worker that runs a test of it), then the `serial` tests in one
process. `serial` marks a test that times a signal, a deadline or a short wait against the clock:
with both cores busy such tests failed. The tests of the demo leg set (tests/legs/conftest.py, the
costliest fixture) live in one file, tests/legs/test_legs_cpu.py, so the set is made once. The Ray
cluster (tests/ray/conftest.py, about 11 s) is made twice: for tests/ray/test_ray_legs.py on a
worker, and for the serial Ray tests. (xdist's `loadgroup` groups nothing under pytest 9: it tags a
group onto `item._nodeid`, which pytest 9 no longer reads.)

Under xdist the files are handed out slowest first (SLOWEST_FIRST, from the full run's
`--durations`; scripts/test.sh passes `--no-loadscope-reorder`, since xdist's own order is by number
of tests, which puts a one-test file of two minutes last): a long file started last would leave
one worker idle while the other finishes it."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.long import FULL, SKIP_REASON

# vLLM's CPU platform pins each engine's worker process (its imports included) to the first core
# when VLLM_CPU_OMP_THREADS_BIND is "auto", its default: with two xdist workers each starting an
# engine, both land on core 0 while core 1 waits. Measured here, two tiny-model engines started at
# once: 44 s with the default, 34 s with one core each (one engine alone: 33 s). So each worker's
# engines get a core of their own; a caller's own setting is kept. The legs record it (VLLM_*).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit() and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
    _cores = sorted(os.sched_getaffinity(0))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(_cores[int(_WORKER[2:]) % len(_cores)])

# The files of the longest wall time in the full run (tests/<path>, slowest first); the rest keep
# their collection order after these. Only the order changes: every test runs.
SLOWEST_FIRST = (
    "legs/test_legs_cpu.py",  # the demo leg set (430-590 s), the faulted throughput legs (65 s), the clean-exit canary
    "legs/test_walkthrough_report.py",  # 145-205 s
    "dagster/test_pipes_gpu_proof.py",  # 20 s + 15 s + 15 s (the real producers' 145 s: TICA_TESTS=full)
    "ray/test_ray_legs.py",  # 155-185 s, and a Ray cluster of its own (the node-loss tests' is in the serial phase)
    "core/test_ledger_batch_verify.py",  # 130 s of tamperings, DuckDB and Postgres
    "legs/test_demo_cpu_track.py",  # 62 s + 51 s
    "metamorphic/test_unknowns_spelling.py",  # 96 s
    "dagster/test_demo_browser_in_clone.py",  # 80-90 s
    "metamorphic/test_relations.py",  # 84 s
    "core/test_ledger_in_db_verify.py",  # 79 s
    "legs/test_matrix_fp8_block.py",  # 72 s + 14 s of CPU dry runs
    "dagster/test_dagster_acceptance.py",  # five of 10-15 s
    "dagster/test_dagster_browser.py",  # 55-120 s
    "scale/test_postgres_track_verdicts_view.py",  # 54 s
    "false_pass/test_acceptance_trust.py",  # 50 s
    "dagster/test_dagster_staleness.py",  # 36-48 s
    "legs/test_leg_run_trust.py",  # 46 s
    "core/test_ledger_body_verify.py",
    "dagster/test_dagster_instance_postgres.py",
    "legs/test_pipes_child.py",
    "legs/test_leg_identity.py",
)


@pytest.fixture(scope="session")
def baseline(tmp_path_factory):
    """The false-pass suite's accepted track (tests/false_pass/test_acceptance.py), materialized once
    per session for every file that starts from it; each test works on a copy of its ledger."""
    from tests.false_pass.test_acceptance import accepted_track

    return accepted_track(tmp_path_factory)


def pytest_configure(config):
    config.addinivalue_line("markers", "postgres: starts a real Postgres server (set on every test using "
                                       "the postgres_server fixture); `scripts/test.sh --fast` leaves these out")
    config.addinivalue_line("markers", "serial: times a signal, a deadline or a short wait against the clock (a "
                                       "contender's hold, a 1 s timeout, a race with a process started a moment "
                                       "before); the full run runs it after its two-worker phase, in one process "
                                       "(scripts/test.sh finds those tests' files by the marker's text in them)")


def _slowest_first(item) -> int:
    path = item.nodeid.split("::", 1)[0].removeprefix("tests/")
    return SLOWEST_FIRST.index(path) if path in SLOWEST_FIRST else len(SLOWEST_FIRST)


# TICA_TEST_TIMELINE=FILE: one JSON line per test (worker, start, wall and CPU seconds of the process
# and of its waited-for children) to see where a run's time goes and whether a worker sat idle
_TIMELINE = os.environ.get("TICA_TEST_TIMELINE")
if _TIMELINE:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        t0, c0 = time.time(), os.times()
        yield
        c1 = os.times()
        line = {"worker": _WORKER or "main", "test": item.nodeid, "start": round(t0, 3),
                "wall": round(time.time() - t0, 3), "cpu": round(c1.user + c1.system - c0.user - c0.system, 3),
                "children_cpu": round(c1.children_user + c1.children_system - c0.children_user - c0.children_system, 3)}
        with open(_TIMELINE, "a") as f:
            f.write(json.dumps(line) + "\n")


def pytest_collection_modifyitems(config, items):
    skip = None if FULL else pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if skip is not None and "long" in item.keywords:
            item.add_marker(skip)
        if "postgres_server" in item.fixturenames:
            item.add_marker(pytest.mark.postgres)
    if hasattr(config, "workerinput"):  # an xdist worker: its order is the order the files are handed out
        items.sort(key=_slowest_first)  # stable: each file's tests keep their order
