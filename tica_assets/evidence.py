"""One asset per evidence item and track, built by one factory.

Each asset depends on exactly the candidate components the invalidation matrix says it is
sensitive to (`tica.evidence.sensitive_components`), so Dagster's own staleness names the
cause of a change. Clean exit and the final artifacts also cover the legs of the evidence
before them (every leg's processes, every sealed receipt), so they depend on those assets too.

A materialization: read the manifest, refuse a component version Dagster has not observed,
record the candidate, freeze the question (before any leg), run the legs through the track's
leg runner, record legs and receipts, judge the sealed receipts, append the verdict (linked to
the verdict it reruns) and return the verdict with its tables, receipt hashes and plot.
"""

from __future__ import annotations

from pathlib import Path

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AutomationCondition,
    Definitions,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)

from resources.legs import LegRequest
from tica.candidate import CandidateIdentity
from tica.errors import FrozenQuestionError, ManifestError, QuestionError
from tica.evidence import EvidenceItem, sensitive_components
from tica.records import freeze_question, record_candidate, record_leg, record_verdict
from tica.seal import check_seal, seal_digest
from tica.verdict import VerdictCell
from tica_assets import core, plots
from tica_assets.candidates import changes_voiding, load_track, observed_version
from tica_assets.keys import GPU_POOL, LEDGER_POOL, component_key, evidence_key, leg_runner_key, safe_name
from tica_assets.settings import Settings
from tica_assets.tracks import Track

E = EvidenceItem
LEG_ITEMS = (E.FORWARD, E.BACKWARD, E.UPDATE, E.QUALITY, E.THROUGHPUT)
# Evidence whose legs another item covers: clean exit reads every leg's processes, the final
# artifacts name every sealed receipt.
COVERS: dict[EvidenceItem, tuple[EvidenceItem, ...]] = {
    E.CLEAN_EXIT: LEG_ITEMS,
    E.ARTIFACTS: (*LEG_ITEMS, E.CLEAN_EXIT),
}
TITLES = {
    E.FORWARD: "train-inference forward",
    E.BACKWARD: "module backward",
    E.UPDATE: "real update",
    E.QUALITY: "quality pairing",
    E.THROUGHPUT: "throughput pairing",
    E.CLEAN_EXIT: "clean exit",
    E.ARTIFACTS: "final immutable artifacts",
}


def evidence_deps(track: str, item: EvidenceItem) -> list[AssetKey]:
    return [component_key(track, c) for c in sensitive_components(item)] + [
        evidence_key(track, covered) for covered in COVERS.get(item, ())
    ]


def require_observed(context: AssetExecutionContext, track: str, item: EvidenceItem, components: dict) -> None:
    """Evidence is recorded only against component versions Dagster has observed; otherwise
    the materialization would carry the old version and hide the change."""
    unseen = []
    for c in sensitive_components(item):
        seen = observed_version(context.instance, component_key(track, c))
        if seen != components[c]:
            unseen.append(f"{c.value} is {components[c][:23]} but Dagster observed {str(seen)[:23]}")
    if unseen:
        raise Failure(
            description=(
                f"{track}: the manifest changed since Dagster last observed it ({'; '.join(unseen)}). "
                "Observe the candidate components (the manifest sensor does it on its next tick), then materialize."
            ),
            metadata={"unobserved": "; ".join(unseen)},
        )


def upstream_legs(context: AssetExecutionContext, ledger, track: str, item: EvidenceItem,
                  current: CandidateIdentity) -> list[Path]:
    """The legs the latest materialization of each covered item judged, when that evidence
    still holds for the current candidate (judged for it, or for one that differs only in
    components that do not void the covered item)."""
    legs: list[Path] = []
    for covered in COVERS.get(item, ()):
        event = context.instance.get_latest_materialization_event(evidence_key(track, covered))
        mat = event.asset_materialization if event else None
        if mat is None or "candidate_id" not in mat.metadata or "leg_dirs" not in mat.metadata:
            context.log.warning(f"{covered.value}: not materialized yet; its legs are not covered")
            continue
        judged_for = mat.metadata["candidate_id"].value
        voiding = changes_voiding(ledger, judged_for, current, covered)
        if voiding:
            context.log.warning(f"{covered.value}: judged for {judged_for}, voided since by "
                                f"{', '.join(c.value for c in voiding)}; its legs are not covered")
            continue
        legs += [Path(p) for p in mat.metadata["leg_dirs"].value]
    return legs


def leg_status(leg: Path, meta: dict) -> str:
    if meta.get("not_run_reason"):
        return "not run"
    return "sealed" if not check_seal(leg) else "seal broken"


def receipt_table(legs: list[Path]) -> str:
    lines = ["| leg | arm | round | c | seal digest |", "| --- | --- | --- | --- | --- |"]
    for leg in legs:
        meta = core.leg_meta(leg)
        try:
            digest = seal_digest(leg)
        except (OSError, ValueError, KeyError):
            digest = "unsealed"
        lines.append(
            f"| {leg.parent.name}/{leg.name} | {meta.get('arm', '')} | {meta.get('round') or ''} "
            f"| {meta.get('concurrency') or ''} | `{digest}` |"
        )
    return "\n".join(lines)


def cell_metadata(cell: VerdictCell, question, candidate_id: str, verdict_id: str, legs: list[Path],
                  own_legs: list[Path], runner_kind: str, plot: tuple[str, str] | None) -> dict:
    meta: dict = {
        "verdict": MetadataValue.text(cell.verdict.value),
        "summary": MetadataValue.text(cell.summary),
        "candidate_id": MetadataValue.text(candidate_id),
        "verdict_id": MetadataValue.text(verdict_id),
        "question": MetadataValue.text(question.name),
        "question_hash": MetadataValue.text(question.hash),
        "judge_version": MetadataValue.text(cell.judge_version),
        "leg_runner": MetadataValue.text(runner_kind),
        "leg_dirs": MetadataValue.json([str(p) for p in own_legs]),
        "legs_judged": MetadataValue.int(len(legs)),
        "receipt_hashes": MetadataValue.md(receipt_table(legs) if legs else "_no receipts_"),
        "judge_receipt_hashes": MetadataValue.json(dict(cell.receipt_hashes)),
        "reasons": MetadataValue.md("\n".join(f"- {r}" for r in cell.reasons) or "_none_"),
    }
    if question.formula_label:
        meta["formula"] = MetadataValue.text(question.formula_label)
    for name, table in cell.tables.items():
        meta[f"table: {name}"] = MetadataValue.md(table)
    if plot:
        meta["plot"] = MetadataValue.md(plot[0])
        meta["plot_path"] = MetadataValue.path(plot[1])
    return meta


def materialize_evidence(context: AssetExecutionContext, track: Track, item: EvidenceItem, settings: Settings,
                         runner_key: str) -> MaterializeResult:
    try:
        loaded, identity = load_track(track, settings)
    except ManifestError as err:
        raise Failure(description=f"{err.file}: {err.field}: {err.message}") from None
    require_observed(context, track.name, item, identity.components)
    ledger = context.resources.ledger.ledger()
    runner = getattr(context.resources, runner_key)
    candidate_id = record_candidate(ledger, identity, loaded)
    try:
        question_path = core.find_question(settings.questions_dir, track.name, item)
        question = freeze_question(ledger, question_path)  # frozen before the first leg runs
    except (QuestionError, FrozenQuestionError) as err:
        raise Failure(description=str(err)) from None
    context.log.info(f"{track.name}/{item.value}: question {question.name} {question.hash}")

    out_dir = settings.legs_dir / track.name / candidate_id / item.value / context.run.run_id[:8]
    own_legs = runner.run_legs(
        context,
        LegRequest(track=track.name, item=item, question=question, manifest=loaded,
                   candidate_id=candidate_id, out_dir=out_dir),
    )
    for leg in own_legs:
        meta = core.leg_meta(leg)
        record_leg(ledger, candidate_id, question, leg, meta, leg_status(leg, meta))
    legs = own_legs + upstream_legs(context, ledger, track.name, item, identity)
    cell = core.judge(item, question, legs)

    previous = ledger.rows(
        "SELECT verdict_id FROM verdicts WHERE candidate_id = ? AND item = ? ORDER BY seq DESC LIMIT 1",
        [candidate_id, item.value],
    )
    verdict_id = record_verdict(ledger, candidate_id, cell, rerun_of=previous[0]["verdict_id"] if previous else None)
    context.log.info(f"{track.name}/{item.value}: {cell.verdict.value}: {cell.summary}")

    plot = None
    png = plots.plot_for(item, own_legs, getattr(question.criteria, "budget", None))
    if png:
        path = settings.plots_dir / track.name / f"{item.value}-{verdict_id}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        plot = (plots.markdown_image(png, f"{item.value} plot"), str(path))
    return MaterializeResult(
        metadata=cell_metadata(cell, question, candidate_id, verdict_id, legs, own_legs, runner.kind, plot)
    )


def evidence_asset(track: Track, item: EvidenceItem, settings: Settings, runner_key: str):
    components = ", ".join(c.value for c in sensitive_components(item))

    @asset(
        key=evidence_key(track.name, item),
        deps=evidence_deps(track.name, item),
        description=f"{TITLES[item]} of the {track.name} candidate. Sensitive to: {components}.",
        group_name=safe_name(track.name),
        required_resource_keys={"ledger", runner_key},
        # Leg-running items hold the GPU pool (one leg producer per device); the two that
        # only read receipts queue as ledger writers.
        pool=GPU_POOL if item not in COVERS else LEDGER_POOL,
        kinds={"duckdb"},
        metadata={"evidence_item": item.value, "sensitive_to": components},
        automation_condition=AutomationCondition.eager() if settings.autoruns(track.name) else None,
    )
    def _evidence(context) -> MaterializeResult:
        return materialize_evidence(context, track, item, settings, runner_key)

    return _evidence


def evidence_defs(track: Track, settings: Settings) -> Definitions:
    runner_key = leg_runner_key(track.name, settings.own_runner(track.name))
    return Definitions(assets=[evidence_asset(track, item, settings, runner_key) for item in EvidenceItem])

