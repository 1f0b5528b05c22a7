"""Matrix cells share one GPU: a neighbour's engine start or exit must not fail a cell."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import time

from tica.legs.vllm_kernels.matrix import engine_start_lock, retry_cell


def test_a_cell_that_sealed_nothing_runs_again_once():
    assert retry_cell(rc=1, sealed=0, attempts=1)
    assert not retry_cell(rc=1, sealed=0, attempts=2)  # failed twice: it stands
    assert not retry_cell(rc=1, sealed=3, attempts=1)  # its legs are the evidence, failed or not
    assert not retry_cell(rc=0, sealed=0, attempts=1)


def test_an_exiting_cell_holds_the_start_lock_until_its_process_is_gone(tmp_path):
    lock, freed = tmp_path / "engine_start.lock", tmp_path / "engine_freed"
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import atexit, sys, time; from pathlib import Path;"
         "from tica.legs.vllm_kernels.matrix import hold_start_lock_until_exit as h;"
         # vLLM's exit handlers, registered first, run last: here, one that frees "memory" late
         f"atexit.register(lambda: (time.sleep(0.5), Path({str(freed)!r}).touch()));"
         f"atexit.register(h, Path({str(lock)!r})); print('ok', flush=True)"],
        stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ok"
    while True:  # until the child holds it (its exit handlers run after the line above)
        with open(lock, "w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                break
            fcntl.flock(f, fcntl.LOCK_UN)
        if child.poll() is not None:
            raise AssertionError("the child exited without holding the lock")
        time.sleep(0.01)
    with engine_start_lock(lock):  # a neighbour's start waits for the engine's whole exit
        assert freed.exists()
    child.wait()
