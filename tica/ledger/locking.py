"""The DuckDB ledger's writer lock: an exclusive flock on a file beside the database, waited for at
most a bounded time, the holder's pid and start written into it so that a timeout names who held it."""

from __future__ import annotations

import fcntl
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from tica.ledger.chain import _now
from tica.ledger.interface import LedgerLockTimeout


@contextmanager
def writer_lock(lock_path: Path, timeout_s: float, ledger: Path) -> Iterator[None]:
    """The writers' lock at `lock_path`, held for the block (waited for at most `timeout_s`;
    the timeout names `ledger`)."""
    with open(lock_path, "a+") as lock:
        _take_lock(lock, timeout_s, ledger)
        try:
            yield
        finally:
            lock.seek(0)
            lock.truncate()
            lock.flush()
            fcntl.flock(lock, fcntl.LOCK_UN)


def _take_lock(lock: IO[str], timeout_s: float, ledger: Path) -> None:
    """The writer lock, waited for at most timeout_s; the error names who holds it.

    In the main thread the wait is the kernel's own blocking flock (waiters are woken in
    turn, so four busy writers do not starve one), bounded by a timer; elsewhere it polls."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if threading.current_thread() is threading.main_thread():
            _wait_blocking(lock, timeout_s, ledger)
        else:
            _wait_polling(lock, timeout_s, ledger)
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()} since {_now()}")
    lock.flush()


def _timeout(lock: IO[str], timeout_s: float, ledger: Path) -> LedgerLockTimeout:
    lock.seek(0)
    holder = lock.read().strip() or "a process that recorded nothing"
    return LedgerLockTimeout(f"{ledger}: another writer has held the ledger for more than "
                             f"{timeout_s:g} s ({holder}); nothing was written")


def _wait_blocking(lock: IO[str], timeout_s: float, ledger: Path) -> None:
    class _Expired(Exception):
        pass

    def expire(signum, frame):  # noqa: ARG001
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
    except _Expired:
        raise _timeout(lock, timeout_s, ledger) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _wait_polling(lock: IO[str], timeout_s: float, ledger: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        time.sleep(0.002 + 0.003 * random.random())
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise _timeout(lock, timeout_s, ledger) from None
