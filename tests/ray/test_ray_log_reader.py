"""The Ray runner's Pipes log reader (resources/ray_legs._LegLogReader) without a cluster: a job that
ended is drained from its whole log at once instead of waiting for Ray to close the log tail
(about 5 s per leg), and every Pipes message reaches Dagster exactly once, whole, even when the
tail cut it between two chunks. Control: where the whole log cannot be read, the reader waits for
the tail as dagster-ray does, and the messages still arrive once."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from resources.ray_legs import _LegLogReader

PIPES = "__dagster_pipes_version"


def _message(n: int) -> str:
    return json.dumps({PIPES: "0.1", "method": "report_custom_message", "params": {"payload": n}})


class _Handler:
    def __init__(self) -> None:
        self.got: list[int] = []

    def handle_message(self, message: dict) -> None:
        self.got.append(message["params"]["payload"])


class _Client:
    """Ray's job client as the reader uses it: a tail that hands on `early` at once and `late` only
    when Ray closes it (`closed`), and the whole log."""

    def __init__(self, early: list[str], late: list[str], *, whole_log_fails: bool = False) -> None:
        self.early, self.late, self.whole_log_fails = early, late, whole_log_fails
        self.closed = threading.Event()

    async def _tail(self):
        for chunk in self.early:
            yield chunk
        while not self.closed.is_set():
            await asyncio.sleep(0.01)
        for chunk in self.late:
            yield chunk

    def tail_job_logs(self, job_id: str):
        return self._tail()

    def get_job_logs(self, job_id: str) -> str:
        if self.whole_log_fails:
            raise ConnectionError("dashboard gone")
        return "".join(self.early + self.late)


# message 1 cut between the first two chunks, a plain line, message 2, then message 3 only in the
# part of the log the tail hands on when Ray closes it
EARLY = [_message(1)[:20], _message(1)[20:] + "\nplain output\n" + _message(2)[:7], _message(2)[7:] + "\n"]
LATE = [_message(3) + "\n"]


def _read(client: _Client) -> tuple[_Handler, _LegLogReader, float]:
    handler, reader = _Handler(), _LegLogReader()
    reader._client, reader._job_id = client, "job-1"
    with reader.read_messages(handler):
        deadline = time.monotonic() + 10
        while reader._consumed < sum(map(len, EARLY)) and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
    return handler, reader, time.monotonic() - t0


def test_an_ended_jobs_log_is_drained_without_waiting_for_the_tail_and_each_message_arrives_once():
    client = _Client(EARLY, LATE)
    handler, reader, _ = _read(client)
    assert handler.got == [1, 2, 3]
    assert reader._thread.is_alive()  # the tail was not waited for: Ray has not closed it
    client.closed.set()  # Ray closes the tail and hands on message 3 again: not a second time
    reader._thread.join(timeout=10)
    assert not reader._thread.is_alive() and handler.got == [1, 2, 3]


def test_without_the_whole_log_the_reader_waits_for_the_tail_and_still_hands_on_each_message_once():
    client = _Client(EARLY, LATE, whole_log_fails=True)
    threading.Timer(0.3, client.closed.set).start()
    handler, reader, waited = _read(client)
    assert handler.got == [1, 2, 3] and not reader._thread.is_alive()
    assert waited >= 0.2  # it waited for Ray to close the tail
