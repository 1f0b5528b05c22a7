"""Dagster resources over the core: the ledger and the leg runners."""

from resources.ledger import LedgerResource
from resources.legs import CpuLegRunner, LegRequest, LegRunner, LegSpec, ReplayLegRunner, plan_legs

__all__ = [
    "CpuLegRunner",
    "LedgerResource",
    "LegRequest",
    "LegRunner",
    "LegSpec",
    "ReplayLegRunner",
    "plan_legs",
]
