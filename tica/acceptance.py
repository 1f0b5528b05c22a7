"""The materialize sequence and the acceptance report, in one place, with no Dagster.

`materialize` does, in order: record the candidate, freeze the question (before any leg runs),
run the legs, record them, judge them for the candidate, run the checks of that verdict, and
append the verdict with its checks (a rerun linked to the verdict it reruns, with why). The
Dagster assets and the sensor call these functions and write nothing to the ledger themselves.

`report` reads the ledger: a track is accepted only when every evidence item's current verdict
passes for the candidate the manifest names now, is not stale, was not judged after the fact,
and carries every required check, each passed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tica import strict_io
from tica import checks
from tica.binding import Candidate
from tica.candidate import CandidateIdentity, ComponentChange, diff, voided_items
from tica.errors import FrozenQuestionError, InputError
from tica.evidence import Component, EvidenceItem
from tica.judges import JUDGE_VERSION, judge
from tica.ledger import Head, Ledger
from tica.manifest import LoadedManifest
from tica.question import Question
from tica.receipts import LEG_FILE
from tica.records import freeze_question, record_candidate, record_invalidations, record_leg, record_verdict
from tica.seal import check_seal
from tica.verdict import Verdict, VerdictCell

E = EvidenceItem
TITLES = {
    E.FORWARD: "train-inference forward",
    E.BACKWARD: "module backward",
    E.UPDATE: "real update",
    E.QUALITY: "quality pairing",
    E.THROUGHPUT: "throughput pairing",
    E.CLEAN_EXIT: "clean exit",
    E.ARTIFACTS: "final immutable artifacts",
}


# ---------------------------------------------------------------------------- materializing


@dataclass(frozen=True)
class LegBatch:
    """Legs judged together into one verdict. A replay of committed runs gives one batch per
    run, oldest first: each later batch is a rerun of the one before it, for `rerun_reason`."""

    legs: Sequence[Path]
    label: str = ""
    rerun_reason: str | None = None


@dataclass(frozen=True)
class Judged:
    cell: VerdictCell
    verdict_id: str
    checks: tuple[checks.CheckOutcome, ...]
    legs: tuple[Path, ...]
    own_legs: tuple[Path, ...]
    label: str = ""


@dataclass(frozen=True)
class Materialized:
    question: Question
    candidate_id: str
    judged: tuple[Judged, ...]

    @property
    def current(self) -> Judged:
        return self.judged[-1]


def leg_status(leg: Path, meta: dict) -> str:
    if meta.get("not_run_reason"):
        return "not run"
    return "sealed" if not check_seal(leg) else "seal broken"


def _leg_meta(leg: Path) -> dict:
    try:
        meta = strict_io.read_json(leg / LEG_FILE)
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def question_frozen_at(ledger: Ledger, question_hash: str) -> str | None:
    rows = ledger.rows("SELECT recorded_at FROM questions WHERE question_hash = ? ORDER BY seq LIMIT 1", [question_hash])
    return rows[0]["recorded_at"] if rows else None


def recorded_receipts(ledger: Ledger, legs: Sequence[Path]) -> dict[str, list[dict[str, str]]]:
    """Per leg folder, the file hashes of every time the ledger recorded it."""
    if not legs:
        return {}
    rows = ledger.rows(
        "SELECT l.leg_id, l.leg_dir, r.path, r.sha256 FROM legs l JOIN receipts r USING (leg_id) "
        f"WHERE l.leg_dir IN ({', '.join('?' * len(legs))})", [str(p) for p in legs])
    by_leg: dict[str, dict[str, dict[str, str]]] = {}
    for r in rows:
        by_leg.setdefault(r["leg_dir"], {}).setdefault(r["leg_id"], {})[r["path"]] = r["sha256"]
    return {leg: list(records.values()) for leg, records in by_leg.items()}


def check_verdict(ledger: Ledger, item: EvidenceItem, question: Question, cell: VerdictCell, legs: Sequence[Path],
                  loaded: LoadedManifest, frozen_at: str | None,
                  canary_outcome: checks.CheckOutcome) -> tuple[checks.CheckOutcome, ...]:
    out = [canary_outcome, checks.receipts(legs, recorded_receipts(ledger, legs)), checks.frozen_before_run(frozen_at, legs)]
    if item is E.QUALITY:
        out.append(checks.quality_sums(cell, question, legs))
    if item is E.THROUGHPUT:
        out.append(checks.workload(legs, loaded.manifest.workload, question))
    return tuple(out)


def materialize(
    ledger: Ledger,
    loaded: LoadedManifest,
    identity: CandidateIdentity,
    item: EvidenceItem,
    question_path: str | Path,
    run_legs: Callable[[Question, str], Sequence[LegBatch]],
    upstream_legs: Sequence[Path] = (),
    log: Callable[[str], None] = lambda _: None,
    track_questions: Sequence[str | Path] = (),
) -> Materialized:
    """One evidence item for one candidate, start to end (see the module's docstring).

    `track_questions`: the track's other questions, frozen here too before any leg runs, so an
    item that judges other items' legs (clean exit, artifacts) has its criteria frozen before
    those legs ran. One that cannot be frozen now is left to its own materialization."""
    candidate_id = record_candidate(ledger, identity, loaded)
    question = freeze_question(ledger, question_path)  # frozen before the first leg runs
    for other in track_questions:
        try:
            freeze_question(ledger, other)
        except (InputError, FrozenQuestionError) as err:
            log(f"{other}: not frozen with this item ({err}); its own materialization will say why")
    frozen_at = question_frozen_at(ledger, question.hash)
    log(f"{item.value}: question {question.name} {question.hash}, frozen at {frozen_at}")
    batches = run_legs(question, candidate_id)
    candidate = Candidate.of(loaded, identity)
    canary_outcome = checks.canaries(item, question)
    previous = ledger.rows("SELECT verdict_id FROM verdicts WHERE candidate_id = ? AND item = ? ORDER BY seq DESC LIMIT 1",
                           [candidate_id, item.value])
    rerun_of = previous[0]["verdict_id"] if previous else None
    judged: list[Judged] = []
    for batch in batches or [LegBatch(legs=())]:
        for leg in batch.legs:
            meta = _leg_meta(leg)
            record_leg(ledger, candidate_id, question, leg, meta, leg_status(leg, meta))
        legs = [*batch.legs, *upstream_legs]
        cell = judge(item, question, legs, candidate)
        outcomes = check_verdict(ledger, item, question, cell, legs, loaded, frozen_at, canary_outcome)
        reason = batch.rerun_reason if rerun_of else None
        verdict_id = record_verdict(ledger, candidate_id, cell, rerun_of=rerun_of, checks=outcomes, rerun_reason=reason)
        log(f"{item.value}{' ' + batch.label if batch.label else ''}: {cell.verdict.value}: {cell.summary}")
        judged.append(Judged(cell, verdict_id, outcomes, tuple(legs), tuple(batch.legs), batch.label))
        rerun_of = verdict_id
    return Materialized(question=question, candidate_id=candidate_id, judged=tuple(judged))


# ---------------------------------------------------------------------------- candidate changes


def changes_voiding(ledger: Ledger, candidate_id: str, current: CandidateIdentity,
                    item: EvidenceItem) -> list[Component] | None:
    """The components changed between a recorded candidate and the current one that void
    `item` (empty: evidence judged for that candidate still holds for this one); None when the
    ledger does not hold that candidate's components."""
    if candidate_id == current.candidate_id:
        return []
    rows = ledger.rows("SELECT component, fingerprint FROM components WHERE candidate_id = ?", [candidate_id])
    judged = {Component(r["component"]): r["fingerprint"] for r in rows}
    if set(judged) != set(Component):
        return None
    old = CandidateIdentity(track=current.track, manifest_path=current.manifest_path, components=judged)
    return voided_items(diff(old, current)).get(item, [])


def record_candidate_change(ledger: Ledger, loaded: LoadedManifest, identity: CandidateIdentity,
                            observed: dict[Component, str | None]) -> list[ComponentChange]:
    """A candidate seen with component versions other than the last observed ones: record it,
    and one invalidation row per (changed component, voided item) with its cause. The first
    sight of a track (nothing observed yet) records the candidate and invalidates nothing."""
    if all(observed.get(c) == identity.components[c] for c in Component):
        return []
    record_candidate(ledger, identity, loaded)
    if any(observed.get(c) is None for c in Component):
        return []
    old = CandidateIdentity(track=identity.track, manifest_path=str(loaded.path),
                            components={c: str(observed[c]) for c in Component})
    changes = diff(old, identity)
    record_invalidations(ledger, old, identity, changes)
    return changes


# ---------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class ReportCell:
    item: EvidenceItem
    verdict: str
    summary: str
    question_hash: str | None = None
    candidate_id: str | None = None
    verdict_id: str | None = None
    judge_version: str | None = None
    stale_cause: str | None = None
    blocking: tuple[str, ...] = ()  # why a passing verdict is still not accepted (failed or missing checks)
    after_the_fact: bool = False
    switched_off: dict[str, str] = field(default_factory=dict)

    @property
    def stale(self) -> bool:
        return self.stale_cause is not None

    @property
    def shown(self) -> str:
        if self.stale:
            return f"stale (was {self.verdict})"
        if self.after_the_fact:
            return f"judged after the fact (was {self.verdict})"
        if self.blocking and self.verdict == Verdict.PASS.value:
            return "pass, not accepted"
        return self.verdict

    @property
    def accepted(self) -> bool:
        return self.verdict == Verdict.PASS.value and not self.stale and not self.after_the_fact and not self.blocking


@dataclass(frozen=True)
class Report:
    track: str
    candidate_id: str | None
    cells: tuple[ReportCell, ...]
    conditions: str = ""  # what the candidate is and what its evidence was shown under (the manifest's description)
    verified_head: Head | None = None  # the chain's head this report verified before reading

    @property
    def accepted(self) -> bool:
        return all(c.accepted for c in self.cells)

    @property
    def why_not(self) -> list[str]:
        out = []
        for c in self.cells:
            if c.accepted:
                continue
            why = c.stale_cause or "; ".join(c.blocking) or c.summary
            out.append(f"{c.item.value}: {c.shown}" + (f" ({why})" if why else ""))
        return out


def _check_rows(ledger: Ledger, verdict_ids: Sequence[str]) -> dict[str, list[dict]]:
    if not verdict_ids:
        return {}
    rows = ledger.rows(f"SELECT verdict_id, name, blocking, passed, description, detail_json FROM checks "
                       f"WHERE verdict_id IN ({', '.join('?' * len(verdict_ids))}) ORDER BY seq", list(verdict_ids))
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["verdict_id"], []).append(r)
    return out


def _blocking(rows: list[dict]) -> tuple[tuple[str, ...], dict[str, str]]:
    import json

    names = {r["name"] for r in rows}
    # A required check blocks whatever its row says: a row cannot make itself advisory.
    why = [f"check {r['name']} failed: {r['description']}" for r in rows
           if (r["blocking"] or r["name"] in checks.REQUIRED) and not r["passed"]]
    why += [f"check {name} was never run on this verdict" for name in checks.REQUIRED if name not in names]
    off: dict[str, str] = {}
    for r in rows:
        if r["name"] == checks.CANARIES:
            try:
                off.update(json.loads(r["detail_json"] or "{}").get("switched_off") or {})
            except ValueError:
                why.append("check canaries_caught: its detail is unreadable")
    return tuple(why), off


def report(ledger: Ledger, track: str, current: CandidateIdentity | None, conditions: str = "",
           last_verified: Head | None = None) -> Report:
    """The acceptance report of a track from the ledger (verdicts and their checks). A ledger
    whose chain or views do not verify, or that no longer holds `last_verified` (the head an
    earlier report verified: a truncation or a self-consistent rewrite since), is not reported
    from: LedgerIntegrityError."""
    verified = ledger.verify_or_raise(last_verified).head
    # `SELECT * FROM track_verdicts WHERE track = ?`, read track-first (the same rows: Ledger.track_verdicts)
    rows = {r["item"]: r for r in ledger.track_verdicts(track)}
    by_verdict = _check_rows(ledger, [r["verdict_id"] for r in rows.values()])
    cells = []
    for item in EvidenceItem:
        r = rows.get(item.value)
        if r is None:
            cells.append(ReportCell(item, Verdict.NOT_RUN.value, "no verdict recorded"))
            continue
        cause = r["stale_cause"]
        if cause is None and current is not None:
            cause = unrecorded_change(ledger, r["candidate_id"], item, current)
        elif cause is None:
            cause = "the manifest could not be read: the candidate it names now is unknown"
        blocking, off = _blocking(by_verdict.get(r["verdict_id"], []))
        cells.append(ReportCell(item, r["verdict"], r["summary"], r["question_hash"], r["candidate_id"], r["verdict_id"],
                                r["judge_version"], cause, blocking, bool(r["after_the_fact"]), off))
    return Report(track=track, candidate_id=current.candidate_id if current else None, cells=tuple(cells),
                  conditions=conditions, verified_head=verified)


def unrecorded_change(ledger: Ledger, candidate_id: str, item: EvidenceItem, current: CandidateIdentity) -> str | None:
    """A component the verdict's candidate differs in from the manifest now, voiding this item,
    that no invalidation row names yet (the sensor has not ticked since the manifest changed)."""
    causes = changes_voiding(ledger, candidate_id, current, item)
    if causes is None:
        return f"judged for {candidate_id}, whose components the ledger does not hold"
    if not causes:
        return None
    return "; ".join(f"{c.value}: changed in the manifest since judged, not yet recorded" for c in causes)


def scope_line(cells: Sequence[ReportCell]) -> str:
    parts = []
    for c in cells:
        if c.stale:
            parts.append(f"{TITLES[c.item]} stale")
        elif c.after_the_fact:
            parts.append(f"{TITLES[c.item]} judged after the fact ({c.verdict})")
        elif c.verdict == Verdict.NOT_RUN.value and c.question_hash is None:
            parts.append(f"{TITLES[c.item]} not run")
        else:
            parts.append(c.summary)
    return "; ".join(parts)


def report_markdown(rep: Report) -> str:
    lines = [f"### Acceptance report: {rep.track}", "",
             f"**{'accepted' if rep.accepted else 'not accepted'}** for candidate `{rep.candidate_id}`", "",
             *([f"Shown under: {rep.conditions}", ""] if rep.conditions else []),
             "| evidence | verdict | summary | why not accepted | question | judge |",
             "| --- | --- | --- | --- | --- | --- |"]
    for c in rep.cells:
        verdict = c.shown if c.accepted or c.verdict != Verdict.PASS.value else f"**{c.shown}**"
        why = "" if c.accepted else (c.stale_cause or "; ".join(c.blocking))
        lines.append(f"| {TITLES[c.item]} | {verdict} | {c.summary.replace('|', '/')} | {why.replace('|', '/')} | "
                     f"`{(c.question_hash or '')[:19]}` | `{c.judge_version or ''}` |")
    off = [(c.item.value, name, why) for c in rep.cells for name, why in c.switched_off.items()]
    if off:
        lines += ["", "**Canaries switched off by the frozen questions:**", ""]
        lines += [f"- {item}: `{name}`: {why}" for item, name, why in off]
    lines += ["", f"**Scope:** {scope_line(rep.cells)}", "", f"Judged by `{JUDGE_VERSION}` (this code's version)."]
    return "\n".join(lines)
