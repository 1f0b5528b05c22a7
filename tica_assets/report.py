"""The acceptance report of a track, read from the ledger: one row per evidence item, each cell
a verdict, with the scope line. Stale evidence is shown as stale, never as a silent pass: an item
is stale when the ledger holds a later invalidation for it, or when its verdict belongs to an
earlier candidate than the manifest names now."""

from __future__ import annotations

from dataclasses import dataclass

from dagster import Definitions, MaterializeResult, MetadataValue, asset

from tica.candidate import CandidateIdentity
from tica.errors import ManifestError
from tica.evidence import EvidenceItem
from tica.ledger import Ledger
from tica.verdict import Verdict
from tica_assets.candidates import changes_voiding, load_track
from tica_assets.evidence import TITLES
from tica_assets.keys import evidence_key, report_key, safe_name
from tica_assets.settings import Settings
from tica_assets.tracks import Track


@dataclass(frozen=True)
class ReportCell:
    item: EvidenceItem
    verdict: str
    stale: bool
    stale_cause: str | None
    summary: str
    question_hash: str | None
    candidate_id: str | None

    @property
    def shown(self) -> str:
        return f"stale (was {self.verdict})" if self.stale else self.verdict

    @property
    def accepted(self) -> bool:
        return self.verdict == Verdict.PASS.value and not self.stale


def unrecorded_change(ledger: Ledger, candidate_id: str, item: EvidenceItem, current: CandidateIdentity) -> str | None:
    """A component the verdict's candidate differs in from the manifest now, voiding this item,
    that no invalidation row names yet (the sensor has not ticked since the manifest changed)."""
    causes = changes_voiding(ledger, candidate_id, current, item)
    if causes is None:
        return f"judged for {candidate_id}, whose components the ledger does not hold"
    if not causes:
        return None
    return "; ".join(f"{c.value}: changed in the manifest since judged, not yet recorded" for c in causes)


def report_cells(ledger: Ledger, track: str, current: CandidateIdentity | None) -> list[ReportCell]:
    rows = {r["item"]: r for r in ledger.rows("SELECT * FROM track_verdicts WHERE track = ?", [track])}
    cells = []
    for item in EvidenceItem:
        r = rows.get(item.value)
        if r is None:
            cells.append(ReportCell(item, Verdict.NOT_RUN.value, False, None, "no verdict recorded", None, None))
            continue
        cause = r["stale_cause"]
        if cause is None and current is not None:
            cause = unrecorded_change(ledger, r["candidate_id"], item, current)
        cells.append(ReportCell(item, r["verdict"], cause is not None, cause, r["summary"],
                                r["question_hash"], r["candidate_id"]))
    return cells


def scope_line(cells: list[ReportCell]) -> str:
    parts = []
    for c in cells:
        if c.stale:
            parts.append(f"{TITLES[c.item]} stale")
        elif c.verdict == Verdict.NOT_RUN.value and c.question_hash is None:
            parts.append(f"{TITLES[c.item]} not run")
        else:
            parts.append(c.summary)
    return "; ".join(parts)


def report_markdown(track: str, cells: list[ReportCell]) -> str:
    lines = [
        f"### Acceptance report: {track}",
        "",
        "| evidence | verdict | summary | stale cause | question |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in cells:
        verdict = f"**{c.shown}**" if c.stale else c.shown
        cause = (c.stale_cause or "").replace("|", "/")
        lines.append(f"| {TITLES[c.item]} | {verdict} | {c.summary.replace('|', '/')} | {cause} | "
                     f"`{(c.question_hash or '')[:19]}` |")
    lines += ["", f"**Scope:** {scope_line(cells)}"]
    return "\n".join(lines)


def report_defs(track: Track, settings: Settings) -> Definitions:
    @asset(
        key=report_key(track.name),
        deps=[evidence_key(track.name, item) for item in EvidenceItem],
        description=f"Acceptance report of the {track.name} track, from the ledger.",
        group_name=safe_name(track.name),
        required_resource_keys={"ledger"},
        kinds={"duckdb"},
    )
    def _report(context) -> MaterializeResult:
        try:
            _, current = load_track(track, settings)
        except ManifestError as err:
            context.log.warning(f"manifest unreadable, staleness from the ledger only: {err}")
            current = None
        cells = report_cells(context.resources.ledger.ledger(), track.name, current)
        accepted = all(c.accepted for c in cells)
        stale = [c.item.value for c in cells if c.stale]
        blocking = [f"{c.item.value}: {c.shown}" for c in cells if not c.accepted]
        meta = {
            "acceptance": MetadataValue.text("accepted" if accepted else "not accepted: " + ", ".join(blocking)),
            "scope": MetadataValue.text(scope_line(cells)),
            "report": MetadataValue.md(report_markdown(track.name, cells)),
            "stale_items": MetadataValue.text(", ".join(stale) or "none"),
            "candidate_id": MetadataValue.text(current.candidate_id if current else "unknown (manifest unreadable)"),
        }
        for c in cells:
            meta[f"cell: {c.item.value}"] = MetadataValue.text(
                c.shown + (f" ({c.stale_cause})" if c.stale else "")
            )
        return MaterializeResult(metadata=meta)

    return Definitions(assets=[_report])
