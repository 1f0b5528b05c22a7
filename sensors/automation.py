"""Declarative automation for the tracks that ask for re-runs (TICA_AUTORUN_TRACKS): their
evidence carries `AutomationCondition.eager()`, and this sensor evaluates it, so a new
component version observed by the manifest sensor re-materializes exactly the evidence it voids."""

from __future__ import annotations

from dagster import AssetSelection, AutomationConditionSensorDefinition, DefaultSensorStatus

from tica.evidence import EvidenceItem
from tica_assets.keys import evidence_key
from tica_assets.settings import Settings
from tica_assets.tracks import Track


def autorun_sensor(tracks: list[Track], settings: Settings) -> AutomationConditionSensorDefinition | None:
    keys = [evidence_key(t.name, item) for t in tracks if settings.autoruns(t.name) for item in EvidenceItem]
    if not keys:
        return None
    return AutomationConditionSensorDefinition(
        name="tica_autorun",
        target=AssetSelection.assets(*keys),
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=max(30, settings.sensor_interval_s),
        description="Re-materializes the evidence of auto-run tracks when a component it depends on changes.",
    )
