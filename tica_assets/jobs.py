"""Jobs a person launches per track: all of its evidence and the report, or the report alone."""

from __future__ import annotations

from dagster import AssetSelection, Definitions, define_asset_job

from tica.evidence import EvidenceItem
from tica_assets.keys import evidence_key, report_key, safe_name
from tica_assets.tracks import Track


def job_defs(track: Track) -> Definitions:
    evidence = AssetSelection.assets(*(evidence_key(track.name, i) for i in EvidenceItem))
    report = AssetSelection.assets(report_key(track.name))
    return Definitions(
        jobs=[
            define_asset_job(
                f"{safe_name(track.name)}_evidence",
                selection=evidence | report,
                description=f"Every evidence item of {track.name}, its checks, then the acceptance report.",
            ),
            define_asset_job(
                f"{safe_name(track.name)}_report",
                selection=report,
                description=f"Re-read the ledger into the acceptance report of {track.name}.",
            ),
        ]
    )
