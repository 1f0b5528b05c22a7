"""Sensors of the TICA code location."""

from sensors.manifests import manifest_sensor, evaluate_track
from sensors.automation import autorun_sensor

__all__ = ["autorun_sensor", "evaluate_track", "manifest_sensor"]
