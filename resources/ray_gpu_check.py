"""Did a throughput leg share its GPU? Read back from RayLegRunner's `<leg>.ray.json` records.

A leg held its devices from the moment tica.legs.gpu_identity started on the node (`gpu.started_at`)
to Ray's end of its job (`ended_at`, at or after the producer's exit): Ray's own start time is the
submission's, which a job waiting for a GPU would stretch into a false overlap. Two legs are on one
GPU where they ran on one host (node IP) with a `CUDA_VISIBLE_DEVICES` entry in common (Ray hands
out the host's device indices), or where both UUIDs are known and one is in common.

A leg that ran but whose record lacks its GPU or its times cannot be shown to have been alone: it
is named, and the check does not pass.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

THROUGHPUT = "throughput"
NEVER_RAN = ("NOT_STARTED", "NOT_SUBMITTED")


@dataclass(frozen=True)
class GpuSpan:
    leg: str  # <item>/<leg name>
    item: str
    host: str
    visible: frozenset[str]
    uuids: frozenset[str]  # known UUIDs only
    start: _dt.datetime
    end: _dt.datetime

    def shares_gpu(self, other: "GpuSpan") -> bool:
        return bool((self.host == other.host and self.visible & other.visible) or self.uuids & other.uuids)

    def overlaps(self, other: "GpuSpan") -> bool:
        return self.start < other.end and other.start < self.end


@dataclass
class GpuCheck:
    spans: list[GpuSpan] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # legs that ran on a GPU nobody can name, or at unknown times

    @property
    def ok(self) -> bool:
        return not self.overlaps and not self.unknown


def records(shared: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(Path(shared).rglob("*.ray.json"))]


def _time(value: str | None) -> _dt.datetime | None:
    return _dt.datetime.fromisoformat(value) if value else None


def span_of(record: dict[str, Any]) -> GpuSpan | str | None:
    """The leg's hold on its GPU; None where it used none or never ran; a sentence where unknown."""
    name = f"{record.get('item')}/{record.get('leg')}"
    if record.get("status") in NEVER_RAN:
        return None
    gpu = record.get("gpu")
    if not gpu:
        return f"{name}: no GPU record (tica.legs.gpu_identity wrote none), so its device is unknown"
    devices = gpu.get("devices") or []
    if not devices:
        return None if not record.get("num_gpus") else f"{name}: asked for {record['num_gpus']} GPU(s) but saw none"
    start, end = _time(gpu.get("started_at")), _time(record.get("ended_at"))
    if start is None or end is None:
        return f"{name}: ran on GPU {gpu.get('cuda_visible_devices')} but its start or end time is unknown"
    return GpuSpan(leg=name, item=str(record.get("item")), host=str(record.get("node_ip")),
                   visible=frozenset(d["visible"] for d in devices),
                   uuids=frozenset(d["uuid"] for d in devices if d.get("uuid") not in (None, "unknown")),
                   start=start, end=end)


def check(recs: list[dict[str, Any]]) -> GpuCheck:
    out = GpuCheck()
    for record in recs:
        span = span_of(record)
        if isinstance(span, str):
            out.unknown.append(span)
        elif span is not None:
            out.spans.append(span)
    tput = [s for s in out.spans if s.item == THROUGHPUT]
    for a in tput:
        for b in out.spans:
            if b is a or (b.item == THROUGHPUT and b.leg < a.leg):  # each throughput pair once
                continue
            if a.shares_gpu(b) and a.overlaps(b):
                out.overlaps.append(f"throughput leg {a.leg} shared GPU {','.join(sorted(a.visible))} on {a.host} "
                                    f"with {b.leg} ({max(a.start, b.start).isoformat()} to "
                                    f"{min(a.end, b.end).isoformat()})")
    return out
