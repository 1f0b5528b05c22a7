"""One asset per evidence item and track, built by one factory.

Each asset depends on exactly the candidate components the invalidation matrix says it is
sensitive to (`tica.evidence.sensitive_components`), so Dagster's own staleness names the
cause of a change. Clean exit and the final artifacts also cover the legs of the evidence
before them (every leg's processes, every sealed receipt), so they depend on those assets too.

A materialization: read the manifest, refuse a component version Dagster has not observed, then
`tica.acceptance.materialize` (record the candidate, freeze the question before any leg, run the
legs through the track's leg runner, record them, judge them for the candidate, check the
verdict, append verdict and checks), and show the verdict with its tables, receipt hashes, plot
and checks (as asset checks). Nothing here writes to the ledger itself.
"""

from __future__ import annotations

from pathlib import Path

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
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
from tica import checks
from tica.acceptance import TITLES, Judged, LegBatch, changes_voiding, materialize
from tica.candidate import CandidateIdentity
from tica.checks import FROZEN
from tica.errors import FrozenQuestionError, ManifestError, QuestionError
from tica.evidence import COVERS, LEG_ITEMS, EvidenceItem, sensitive_components  # noqa: F401 (re-exported)
from tica.items.registry import rooms
from tica.messages import sentence
from tica.seal import seal_digest
from tica.verdict import Verdict
from tica_assets import core, plots
from tica_assets.candidates import load_track, observed_version
from tica_assets.keys import GPU_POOL, LEDGER_POOL, component_key, evidence_key, leg_runner_key, safe_name
from tica_assets.settings import Settings
from tica_assets.tracks import Track

E = EvidenceItem
# Evidence whose legs another item covers (tica.evidence.COVERS, the core's, re-exported here):
# clean exit reads the processes of every leg that starts vLLM, the final artifacts name every
# sealed receipt. The report accepts a covering verdict only while it judged every leg of the
# current verdict of each item it covers.


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
                  current: CandidateIdentity) -> tuple[list[Path], list[str]]:
    """The legs the latest materialization of each covered item judged, when that evidence
    still holds for the current candidate (judged for it, or for one that differs only in
    components that do not void the covered item), and why the others are not covered. A
    covered item not materialized yet, or voided since, makes the covering verdict inconclusive
    (`tica.acceptance.materialize`'s `uncovered`): a pass over the legs that are left would say
    nothing of the legs that run later."""
    legs: list[Path] = []
    uncovered: list[str] = []
    for covered in COVERS.get(item, ()):
        event = context.instance.get_latest_materialization_event(evidence_key(track, covered))
        mat = event.asset_materialization if event else None
        if mat is None or "candidate_id" not in mat.metadata or "leg_dirs" not in mat.metadata:
            uncovered.append(f"{covered.value}: not materialized yet, so its legs cannot be judged")
            continue
        judged_for = mat.metadata["candidate_id"].value
        voiding = changes_voiding(ledger, judged_for, current, covered)
        if voiding is None or voiding:
            why = ("whose components the ledger does not hold" if voiding is None
                   else f"voided since by {', '.join(c.value for c in voiding)}")
            uncovered.append(f"{covered.value}: judged for {judged_for}, {why}; materialize it first")
            continue
        legs += [Path(p) for p in mat.metadata["leg_dirs"].value]
    for why in uncovered:
        context.log.warning(f"{item.value} will be inconclusive: not covered: {why}")
    return legs, uncovered


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


def cell_metadata(judged: Judged, question, candidate_id: str, runner_kind: str, plot: tuple[str, str] | None,
                  earlier: tuple[Judged, ...] = ()) -> dict:
    cell = judged.cell
    meta: dict = {
        "verdict": MetadataValue.text(cell.verdict.value),
        "summary": MetadataValue.text(cell.summary),
        "candidate_id": MetadataValue.text(candidate_id),
        "verdict_id": MetadataValue.text(judged.verdict_id),
        "question": MetadataValue.text(question.name),
        "question_hash": MetadataValue.text(question.hash),
        "judge_version": MetadataValue.text(cell.judge_version),
        "leg_runner": MetadataValue.text(runner_kind),
        "leg_dirs": MetadataValue.json([str(p) for p in judged.own_legs]),
        "legs_judged": MetadataValue.int(len(judged.legs)),
        "receipt_hashes": MetadataValue.md(receipt_table(list(judged.legs)) if judged.legs else "_no receipts_"),
        "judge_receipt_hashes": MetadataValue.json(dict(cell.receipt_hashes)),
        "reasons": MetadataValue.md("\n".join(f"- {r}" for r in cell.reasons) or "_none_"),
        "checks": MetadataValue.md("\n".join(
            f"- `{c.name}`: {'passed' if c.passed else 'FAILED' if c.applicable else 'not applicable'}"
            f"{' (blocking)' if c.blocking else ''}: {c.description}" for c in judged.checks)),
    }
    if earlier:
        meta["earlier_runs"] = MetadataValue.md("\n".join(
            f"- {j.label or j.verdict_id}: {j.cell.verdict.value} (`{j.verdict_id}`): {j.cell.summary}" for j in earlier))
    if question.formula_label:
        meta["formula"] = MetadataValue.text(question.formula_label)
    for name, table in cell.tables.items():
        meta[f"table: {name}"] = MetadataValue.md(table)
    if plot:
        meta["plot"] = MetadataValue.md(plot[0])
        meta["plot_path"] = MetadataValue.path(plot[1])
    return meta


# Checks whose failure is a finding about the evidence, not an integrity fault: drawn as a
# failure (ERROR) but not blocking in Dagster's sense, so the run goes on and the report shows
# the cell as not accepted (judged after the fact; legs that ran another workload than the
# candidate's). The report requires them all the same (tica.checks.REQUIRED).
VERDICT_CHECKS = (FROZEN, checks.WORKLOAD)
# The cell's verdict on the canvas: passed only for a pass. Any other verdict fails it as an
# error, which is what Dagster's asset graph draws red (a failed WARN check leaves the node green).
# Not blocking: a verdict is the answer, it stops nothing downstream.
VERDICT = "verdict"


def verdict_result(key: AssetKey, judged: Judged) -> AssetCheckResult:
    cell = judged.cell
    why = sentence(next((r for r in cell.reasons if r.startswith(f"{cell.verdict.value}:")), cell.summary))
    return AssetCheckResult(asset_key=key, check_name=VERDICT, passed=cell.verdict is Verdict.PASS,
                            severity=AssetCheckSeverity.ERROR, description=f"{cell.verdict.value}: {why}",
                            metadata={"verdict": cell.verdict.value, "verdict_id": judged.verdict_id})


def check_results(key: AssetKey, judged: Judged) -> list[AssetCheckResult]:
    """The verdict, and its checks as the ledger holds them, shown as Dagster asset checks. A
    required check that fails is an error: integrity checks stop the run, VERDICT_CHECKS do not.
    A check with nothing to check (the cell cannot pass anyway) and the advisory ones warn."""
    out = [verdict_result(key, judged)]
    for c in judged.checks:
        severity = AssetCheckSeverity.ERROR if c.blocking and c.applicable else AssetCheckSeverity.WARN
        out.append(AssetCheckResult(asset_key=key, check_name=c.name, passed=c.passed, severity=severity,
                                    description=sentence(c.description, 2000),
                                    metadata={"verdict_id": judged.verdict_id, "blocking": c.blocking,
                                              "detail": MetadataValue.json(c.detail)}))
    return out


def materialize_evidence(context: AssetExecutionContext, track: Track, item: EvidenceItem, settings: Settings,
                         runner_key: str) -> MaterializeResult:
    try:
        loaded, identity = load_track(track, settings)
    except ManifestError as err:
        raise Failure(description=f"{err.file}: {err.field}: {err.message}") from None
    require_observed(context, track.name, item, identity.components)
    ledger = context.resources.ledger.ledger()
    runner = getattr(context.resources, runner_key)
    upstream, uncovered = upstream_legs(context, ledger, track.name, item, identity)

    def run_legs(question, candidate_id: str) -> list[LegBatch]:
        out_dir = settings.legs_dir / track.name / candidate_id / item.value / context.run.run_id[:8]
        return runner.run_batches(context, LegRequest(track=track.name, item=item, question=question, manifest=loaded,
                                                      candidate_id=candidate_id, out_dir=out_dir))

    try:
        question_path = core.find_question(settings.questions_dir, track.name, item)
        done = materialize(ledger, loaded, identity, item, question_path, run_legs, upstream,
                           log=lambda m: context.log.info(f"{track.name}/{m}"),
                           track_questions=core.track_questions(settings.questions_dir, track.name),
                           uncovered=uncovered)
    except (QuestionError, FrozenQuestionError) as err:
        raise Failure(description=str(err)) from None
    current = done.current
    plot = None
    png = plots.plot_for(item, list(current.own_legs), getattr(done.question.criteria, "budget", None))
    if png:
        path = settings.plots_dir / track.name / f"{item.value}-{current.verdict_id}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        plot = (plots.markdown_image(png, f"{item.value} plot"), str(path))
    meta = cell_metadata(current, done.question, done.candidate_id, runner.kind, plot, done.judged[:-1])
    if item is EvidenceItem.THROUGHPUT:
        criteria = done.question.criteria
        basis = getattr(criteria, "statistical_basis", None)
        for name, png in plots.throughput_statistics(current.cell.numbers, criteria.budget,
                                                     basis.alpha if basis else None).items():
            meta[f"plot: {name}"] = MetadataValue.md(plots.markdown_image(png, name) + (
                "" if basis else "\n\n_no statistical basis frozen: band at alpha 0.05, for orientation only_"))
    return MaterializeResult(
        metadata=meta,
        check_results=check_results(evidence_key(track.name, item), current),
    )


def check_specs(track: Track, item: EvidenceItem) -> list[AssetCheckSpec]:
    key = evidence_key(track.name, item)
    # Every check an item's verdict needs before it can be accepted (tica.checks.REQUIRED) is
    # declared; the integrity ones block what runs after them (VERDICT_CHECKS, above, do not).
    return [AssetCheckSpec(VERDICT, asset=key, blocking=False, description=CHECK_DESCRIPTIONS[VERDICT])] + [
        AssetCheckSpec(name, asset=key, blocking=name not in VERDICT_CHECKS, description=CHECK_DESCRIPTIONS[name])
        for name in checks.REQUIRED[item]]


CHECK_DESCRIPTIONS = {
    VERDICT: "the verdict under the frozen question: passed only for pass; fail, inconclusive and not run draw the node red",
    checks.CANARIES: "every criterion of the frozen question returns fail on its planted error (those the question "
                     "switches off are listed one by one)",
    checks.RECEIPTS: "every judged receipt matches its seal and every hash the ledger recorded for it",
    checks.FROZEN: "the question was frozen before any judged leg started (otherwise: judged after the fact)",
    checks.QUALITY_SUMS: "both_correct + only_bi0 + only_bi1 + both_wrong = N, recounted from the receipts, as judged",
    checks.WORKLOAD: "each throughput leg ran the fixed-length workload the manifest names (required for acceptance)",
}


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
        check_specs=check_specs(track, item),
    )
    def _evidence(context) -> MaterializeResult:
        return materialize_evidence(context, track, item, settings, runner_key)

    return _evidence


def evidence_defs(track: Track, settings: Settings) -> Definitions:
    runner_key = leg_runner_key(track.name, settings.own_runner(track.name))
    return Definitions(assets=[evidence_asset(track, r.item, settings, runner_key) for r in rooms()])

