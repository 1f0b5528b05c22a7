"""A leg's times, read one way for every item and every format.

`started_at` / `ended_at` are ISO 8601; "Z" and any offset are the same instant spelled another
way. A time without a zone is local time in a zone nobody recorded, so it is placed only within
the widest zone offset (14 h) of UTC: never silently skipped, never read as UTC. The seal's
`sealed_at` is TICA's own, always with a zone. A leg that ends before it starts, that names one
time with a zone and one without, or that ended after it was sealed, contradicts itself: it
is no measurement, whatever item it belongs to.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

# The widest offset any time zone has from UTC: a zone-less local time lies within it.
MAX_ZONE_OFFSET = _dt.timedelta(hours=14)
UTC = _dt.timezone.utc


class TimeValue:
    """A parsed leg time: `at` (aware) or `local` (zone-less), never both."""

    def __init__(self, at: _dt.datetime) -> None:
        self.aware = at.tzinfo is not None
        self.at = at.astimezone(UTC) if self.aware else at

    def earliest_utc(self) -> _dt.datetime:
        return self.at if self.aware else (self.at - MAX_ZONE_OFFSET).replace(tzinfo=UTC)

    def latest_utc(self) -> _dt.datetime:
        return self.at if self.aware else (self.at + MAX_ZONE_OFFSET).replace(tzinfo=UTC)


def parse(value: Any) -> TimeValue | None:
    """None for an unrecorded time; ValueError for one that is not an ISO 8601 time."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not an ISO 8601 time")
    try:
        return TimeValue(_dt.datetime.fromisoformat(value.strip()))
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO 8601 time") from None


def ordered(a: TimeValue, b: TimeValue) -> bool | None:
    """Whether a <= b for certain (True), certainly not (False), or undecidable (None): two times
    with a zone, or two without (one producer's clock), compare directly; one of each only where
    the 14 h window decides."""
    if a.aware == b.aware:
        return a.at <= b.at
    if a.latest_utc() <= b.earliest_utc():
        return True
    if a.earliest_utc() > b.latest_utc():
        return False
    return None


def contradictions(meta: dict[str, Any], sealed_at: Any = None) -> list[str]:
    """Why a leg's recorded times contradict themselves (empty: they do not, or are unknown)."""
    out: list[str] = []
    times: dict[str, TimeValue | None] = {}
    for key in ("started_at", "ended_at"):
        try:
            times[key] = parse(meta.get(key))
        except ValueError as err:
            out.append(f"{key} {err}")
            times[key] = None
    start, end = times["started_at"], times["ended_at"]
    if start is not None and end is not None:
        if start.aware != end.aware:
            out.append(f"started_at {meta['started_at']} and ended_at {meta['ended_at']}: one names a time zone and "
                       "the other does not, so they cannot be ordered")
        elif end.at < start.at:
            out.append(f"ended_at {meta['ended_at']} is before started_at {meta['started_at']}")
    try:
        sealed = parse(sealed_at)
    except ValueError:
        sealed = None
    last = end or start
    if sealed is not None and last is not None and ordered(last, sealed) is False:
        key = "ended_at" if end is not None else "started_at"
        out.append(f"{key} {meta[key]} is after the leg was sealed ({sealed_at})")
    return out
