"""Dagster resources over the core: the ledger and the leg runners.

Imported lazily, so that a GPU box with no DuckDB can use the leg runners (`resources.gpu`)
without the ledger's imports."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

_WHERE = {
    "CpuLegRunner": "resources.legs",
    "LedgerResource": "resources.ledger",
    "LegRequest": "resources.legs",
    "LegRunner": "resources.legs",
    "LegSpec": "resources.legs",
    "LocalGpuLegRunner": "resources.gpu",
    "RayLegRunner": "resources.ray_legs",
    "ReplayLegRunner": "resources.legs",
    "plan_legs": "resources.legs",
}
__all__ = [
    "CpuLegRunner",
    "LedgerResource",
    "LegRequest",
    "LegRunner",
    "LegSpec",
    "LocalGpuLegRunner",
    "RayLegRunner",
    "ReplayLegRunner",
    "plan_legs",
]

if TYPE_CHECKING:
    from resources.gpu import LocalGpuLegRunner
    from resources.ledger import LedgerResource
    from resources.ray_legs import RayLegRunner
    from resources.legs import CpuLegRunner, LegRequest, LegRunner, LegSpec, ReplayLegRunner, plan_legs


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'resources' has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
