"""Asset keys and names of the graph, one place: `<track>/candidate/<component>`,
`<track>/evidence/<item>`, `<track>/report`."""

from __future__ import annotations

import re

from dagster import AssetKey

from tica.evidence import Component, EvidenceItem

LEDGER_POOL = "ledger"
GPU_POOL = "gpu"


def component_key(track: str, component: Component) -> AssetKey:
    return AssetKey([track, "candidate", component.value])


def evidence_key(track: str, item: EvidenceItem) -> AssetKey:
    return AssetKey([track, "evidence", item.value])


def report_key(track: str) -> AssetKey:
    return AssetKey([track, "report"])


def safe_name(track: str) -> str:
    """Dagster names (groups, ops, jobs) allow only [A-Za-z0-9_]."""
    return re.sub(r"[^A-Za-z0-9_]", "_", track)


def leg_runner_key(track: str, own_runner: bool) -> str:
    return f"leg_runner_{safe_name(track)}" if own_runner else "leg_runner"
