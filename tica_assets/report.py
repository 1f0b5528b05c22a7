"""The acceptance report asset of a track: `tica.acceptance.report` over the ledger (verdicts and
the checks of those verdicts), one row per evidence item. Stale evidence, evidence judged after
the fact, a verdict under another question than the track asks now, and a pass whose blocking
check failed or is missing are shown as such, never as a silent pass."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    Definitions,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
)

from tica.acceptance import TITLES, Report, report, report_markdown, scope_line
from tica.errors import ManifestError, QuestionError
from tica.ledger import Head
from tica.evidence import EvidenceItem
from tica.judges import JUDGE_VERSION
from tica.question import load_question
from tica_assets import core
from tica_assets.candidates import load_track
from tica_assets.keys import evidence_key, report_key, safe_name
from tica_assets.settings import Settings
from tica_assets.tracks import Track


def questions_in_force(context, track: Track, settings: Settings) -> dict[EvidenceItem, str | None]:
    """Per item, the hash of the question the track asks now: the file the evidence asset would
    freeze and judge under (`core.find_question`), hashed as it reads now. None where there is
    none, or it cannot be read (the cell is then not accepted)."""
    out: dict[EvidenceItem, str | None] = {}
    for item in EvidenceItem:
        try:
            out[item] = load_question(core.find_question(settings.questions_dir, track.name, item)).hash
        except QuestionError as err:
            context.log.warning(f"{track.name}/{item.value}: no question in force: {err}")
            out[item] = None
    return out


def report_defs(track: Track, settings: Settings) -> Definitions:
    @asset(
        key=report_key(track.name),
        deps=[evidence_key(track.name, item) for item in EvidenceItem],
        description=f"Acceptance report of the {track.name} track, from the ledger's verdicts and their checks.",
        group_name=safe_name(track.name),
        required_resource_keys={"ledger"},
        kinds={"duckdb"},
        check_specs=[AssetCheckSpec(ACCEPTED, asset=report_key(track.name), description=ACCEPTED_DESCRIPTION)],
    )
    def _report(context) -> MaterializeResult:
        try:
            loaded, current = load_track(track, settings)
            conditions = loaded.manifest.description
        except ManifestError as err:
            context.log.warning(f"manifest unreadable: no verdict can be shown as current: {err}")
            current, conditions = None, ""
        ledger = context.resources.ledger.ledger()
        key = ledger_key(ledger)
        questions = questions_in_force(context, track, settings)
        rep = report(ledger, track.name, current, conditions, _last_verified(context, key), questions=questions)
        numbers = rep.numbers
        context.log.info(rep.headline)
        meta = {
            "answer": MetadataValue.text(rep.headline),
            "verdicts": verdict_table(rep),
            "acceptance": MetadataValue.text("accepted" if rep.accepted else "not accepted: " + "; ".join(rep.why_not)),
            "scope": MetadataValue.text(scope_line(rep.cells)),
            "report": MetadataValue.md(report_markdown(rep)),
            "stale_items": MetadataValue.text(", ".join(c.item.value for c in rep.cells if c.stale) or "none"),
            "after_the_fact": MetadataValue.text(", ".join(c.item.value for c in rep.cells if c.after_the_fact) or "none"),
            "candidate_id": MetadataValue.text(rep.candidate_id or "unknown (manifest unreadable)"),
            "judge_version": MetadataValue.text(JUDGE_VERSION),
            "shown_under": MetadataValue.text(rep.conditions or "the manifest says nothing"),
            "questions_in_force": MetadataValue.json({i.value: h for i, h in questions.items()}),
            "earlier_non_pass": MetadataValue.json(numbers["earlier_non_pass"]),
            "earlier_non_pass_count": MetadataValue.int(numbers["earlier_non_pass_count"]),
            "uncovered_legs": MetadataValue.json(numbers["uncovered_legs"]),
            "verified_head": MetadataValue.json({"ledger": key, **json.loads(rep.verified_head.to_json())}),
        }
        for c in rep.cells:
            meta[f"cell: {c.item.value}"] = MetadataValue.text(c.shown + (f" ({c.why})" if c.why else ""))
        return MaterializeResult(metadata=meta, check_results=[accepted_check(track.name, rep)])

    return Definitions(assets=[_report])


ACCEPTED = "accepted"
ACCEPTED_DESCRIPTION = "every evidence item of the track is accepted for the candidate the manifest names now"


def accepted_check(track: str, rep: Report) -> AssetCheckResult:
    """The report's answer on the canvas: passed only when the candidate is accepted, else an error,
    which Dagster's asset graph draws red (a failed WARN check leaves the node green). Not
    blocking: the answer is shown, it stops nothing."""
    return AssetCheckResult(asset_key=report_key(track), check_name=ACCEPTED, passed=rep.accepted,
                            severity=AssetCheckSeverity.ERROR,
                            description=rep.headline, metadata={"answer": MetadataValue.text(rep.headline)})


def verdict_table(rep: Report) -> MetadataValue:
    """One row per evidence item, shown inline in the UI: verdict, why in one sentence, next step."""
    schema = TableSchema(columns=[TableColumn("evidence", "string"), TableColumn("verdict", "string"),
                                  TableColumn("why", "string"), TableColumn("next step", "string")])
    return MetadataValue.table(records=[
        TableRecord({"evidence": TITLES[c.item], "verdict": c.state, "why": c.deciding or "—",
                     "next step": c.next_step or "—"}) for c in rep.cells], schema=schema)


def ledger_key(ledger) -> str:
    """What names one ledger however it is spelled: a Postgres ledger by its address without the
    password (`PostgresLedger.path`), a DuckDB file by its resolved path (symlinks followed)."""
    if hasattr(ledger, "dsn"):
        return str(ledger.path)
    return str(Path(os.path.abspath(ledger.path)).resolve())


def same_ledger(recorded: str, key: str) -> bool:
    """Whether a previous report's `ledger` names the ledger `key` names: the same redacted
    address, or a path that resolves to the same file (an older report recorded the path as
    configured: relative, through a symlink, or another spelling of it)."""
    if recorded == key:
        return True
    from tica.ledger import is_postgres

    if is_postgres(recorded) or is_postgres(key):
        return False
    old, new = Path(os.path.abspath(recorded)), Path(key)
    try:
        if old.exists() and new.exists():
            return os.path.samefile(old, new)
    except OSError:
        pass
    return str(old.resolve()) == str(new.resolve())


def _last_verified(context: AssetExecutionContext, ledger_key_: str) -> Head | None:
    """The head the previous report of this track verified in this ledger, from Dagster's event
    log: the next report refuses a ledger that no longer holds it (truncated or rewritten since).
    The same ledger named another way (a relative path, a symlink, another spelling of the same
    file, the same Postgres address) keeps its anchor. A report of another ledger than the
    previous one is anchored anew, with a warning; a ledger replaced on purpose at the same
    place is re-anchored only by wiping this asset's materializations."""
    event = context.instance.get_latest_materialization_event(context.asset_key)
    mat = event.asset_materialization if event else None
    value = mat.metadata.get("verified_head") if mat else None
    data = getattr(value, "data", None)
    if not isinstance(data, dict):
        return None
    recorded = data.get("ledger")
    if not isinstance(recorded, str) or not same_ledger(recorded, ledger_key_):
        context.log.warning(f"the previous report verified another ledger ({recorded!r}); {ledger_key_} is anchored "
                            "anew from this report")
        return None
    return Head.from_json(json.dumps({k: v for k, v in data.items() if k != "ledger"}), "previous report's verified_head")
