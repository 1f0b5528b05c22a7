"""The acceptance report asset of a track: `tica.acceptance.report` over the ledger (verdicts and
the checks of those verdicts), one row per evidence item. Stale evidence, evidence judged after
the fact and a pass whose blocking check failed are shown as such, never as a silent pass."""

from __future__ import annotations

import json

from dagster import AssetExecutionContext, Definitions, MaterializeResult, MetadataValue, asset

from tica.acceptance import report, report_markdown, scope_line
from tica.errors import ManifestError
from tica.ledger import Head
from tica.evidence import EvidenceItem
from tica.judges import JUDGE_VERSION
from tica_assets.candidates import load_track
from tica_assets.keys import evidence_key, report_key, safe_name
from tica_assets.settings import Settings
from tica_assets.tracks import Track


def report_defs(track: Track, settings: Settings) -> Definitions:
    @asset(
        key=report_key(track.name),
        deps=[evidence_key(track.name, item) for item in EvidenceItem],
        description=f"Acceptance report of the {track.name} track, from the ledger's verdicts and their checks.",
        group_name=safe_name(track.name),
        required_resource_keys={"ledger"},
        kinds={"duckdb"},
    )
    def _report(context) -> MaterializeResult:
        try:
            loaded, current = load_track(track, settings)
            conditions = loaded.manifest.description
        except ManifestError as err:
            context.log.warning(f"manifest unreadable: no verdict can be shown as current: {err}")
            current, conditions = None, ""
        ledger = context.resources.ledger.ledger()
        rep = report(ledger, track.name, current, conditions, _last_verified(context, str(ledger.path)))
        meta = {
            "acceptance": MetadataValue.text("accepted" if rep.accepted else "not accepted: " + "; ".join(rep.why_not)),
            "scope": MetadataValue.text(scope_line(rep.cells)),
            "report": MetadataValue.md(report_markdown(rep)),
            "stale_items": MetadataValue.text(", ".join(c.item.value for c in rep.cells if c.stale) or "none"),
            "after_the_fact": MetadataValue.text(", ".join(c.item.value for c in rep.cells if c.after_the_fact) or "none"),
            "candidate_id": MetadataValue.text(rep.candidate_id or "unknown (manifest unreadable)"),
            "judge_version": MetadataValue.text(JUDGE_VERSION),
            "shown_under": MetadataValue.text(rep.conditions or "the manifest says nothing"),
            "verified_head": MetadataValue.json({"ledger": str(ledger.path), **json.loads(rep.verified_head.to_json())}),
        }
        for c in rep.cells:
            why = "" if c.accepted else (c.stale_cause or "; ".join(c.blocking))
            meta[f"cell: {c.item.value}"] = MetadataValue.text(c.shown + (f" ({why})" if why else ""))
        return MaterializeResult(metadata=meta)

    return Definitions(assets=[_report])


def _last_verified(context: AssetExecutionContext, ledger_path: str) -> Head | None:
    """The head the previous report of this track verified in this ledger, from Dagster's event
    log: the next report refuses a ledger that no longer holds it (truncated or rewritten since).
    A ledger replaced on purpose is re-anchored by wiping this asset's materializations."""
    event = context.instance.get_latest_materialization_event(context.asset_key)
    mat = event.asset_materialization if event else None
    value = mat.metadata.get("verified_head") if mat else None
    data = getattr(value, "data", None)
    if not isinstance(data, dict) or data.get("ledger") != ledger_path:
        return None
    return Head.from_json(json.dumps({k: v for k, v in data.items() if k != "ledger"}), "previous report's verified_head")
