"""The materialize sequence and the acceptance report, in one place, with no Dagster.

`materialize` does, in order: record the candidate, freeze the question (before any leg runs),
run the legs, record them, judge them for the candidate, run the checks of that verdict, and
append the verdict with its checks (a rerun linked to the verdict it reruns, with why). The
Dagster assets and the sensor call these functions and write nothing to the ledger themselves.

`report` reads the ledger: a track is accepted only when every evidence item's current verdict
(the newest of the candidate the manifest names now, else the track's newest) passes for that
candidate, is not stale, answers the question the track asks now, was not judged after the fact,
carries every required check of its item, each passed, follows no non-pass result under other
criteria, and, for clean exit and the final artifacts, judged every leg of the evidence they cover.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tica import checks, order_proof
from tica.binding import Candidate
from tica.candidate import CandidateIdentity, ComponentChange, diff, voided_items
from tica.errors import FrozenQuestionError, InputError
from tica.evidence import COVERS, Component, EvidenceItem
from tica.judges import JUDGE_VERSION, judge
from tica.judging import without_pass
from tica.ledger import Head, Ledger
from tica.manifest import LoadedManifest
from tica.messages import clip, sentence, without_prefix
from tica.question import Question
from tica.receipts import LEG_FILE, read_receipt
from tica.records import freeze_question, record_candidate, record_invalidations, record_leg, record_verdict
from tica.seal import check_seal, seal_digest
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
        meta = read_receipt(leg / LEG_FILE)
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
    proven, proof_problems = order_proof.proven_freezes(legs, question.hash, order_proof.trusted_keys())
    out = [canary_outcome, checks.receipts(legs, recorded_receipts(ledger, legs)),
           checks.frozen_before_run(frozen_at, legs, proven, proof_problems)]
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
    uncovered: Sequence[str] = (),
) -> Materialized:
    """One evidence item for one candidate, start to end (see the module's docstring).

    `track_questions`: the track's other questions, frozen here too before any leg runs, so an
    item that judges other items' legs (clean exit, artifacts) has its criteria frozen before
    those legs ran. One that cannot be frozen now is left to its own materialization.

    `uncovered`: for an item that covers other items' legs (`tica.evidence.COVERS`), why some of
    them could not be given to it (a covered item not materialized yet, or voided since): its
    verdict is then at best inconclusive, never a pass over the legs that were left.

    A rerun is linked only to the newest verdict of the same candidate and item *under the same
    question*: a verdict under another question is recorded plainly (changing criteria is a new
    question, never a rerun), and one that follows a non-pass under another question is logged as
    criteria changed after a result (the report names it and does not accept it)."""
    with ledger.session():  # one burst of appends (each its own transaction) on one connection
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
    previous = ledger.rows("SELECT verdict_id, question_hash, verdict FROM verdicts WHERE candidate_id = ? AND item = ? "
                           "ORDER BY seq", [candidate_id, item.value])
    same_question = [r for r in previous if r["question_hash"] == question.hash]
    rerun_of = same_question[-1]["verdict_id"] if same_question else None
    changed_after = [r for r in previous if r["question_hash"] != question.hash and r["verdict"] in RESULTS]
    if changed_after:
        log(f"{item.value}: criteria changed after a result: {len(changed_after)} {changed_after[-1]['verdict']} "
            f"verdict(s) of this candidate under another question (newest {changed_after[-1]['verdict_id']}); "
            f"this verdict under {question.name} is recorded plainly, not as a rerun of them")
    judged: list[Judged] = []
    for batch in batches or [LegBatch(legs=())]:
        foreign = recorded_for_another(ledger, identity, item, [*batch.legs, *upstream_legs])
        with ledger.session():
            for leg in batch.legs:
                meta = _leg_meta(leg)
                record_leg(ledger, candidate_id, question, leg, meta, leg_status(leg, meta))
        legs = [*batch.legs, *upstream_legs]
        cell = judge(item, question, legs, candidate)
        if uncovered:
            cell = not_covering(cell, uncovered)
        if foreign:
            cell = not_this_candidates(cell, foreign)
        outcomes = check_verdict(ledger, item, question, cell, legs, loaded, frozen_at, canary_outcome)
        reason = batch.rerun_reason if rerun_of else None
        verdict_id = record_verdict(ledger, candidate_id, cell, rerun_of=rerun_of, checks=outcomes, rerun_reason=reason)
        log(f"{item.value}{' ' + batch.label if batch.label else ''}: {cell.verdict.value}: {cell.summary}")
        judged.append(Judged(cell, verdict_id, outcomes, tuple(legs), tuple(batch.legs), batch.label))
        rerun_of = verdict_id
    return Materialized(question=question, candidate_id=candidate_id, judged=tuple(judged))


def not_covering(cell: VerdictCell, uncovered: Sequence[str]) -> VerdictCell:
    """A covering item's cell judged without the legs of some item it covers: at best
    inconclusive (a fail stays a fail), its reasons naming what was not covered."""
    verdict = Verdict.FAIL if cell.verdict is Verdict.FAIL else Verdict.INCONCLUSIVE
    why = tuple(f"inconclusive: not covered: {u}" for u in uncovered)
    more = f" and {len(uncovered) - 1} more" if len(uncovered) > 1 else ""
    return cell.model_copy(update={
        "verdict": verdict, "reasons": (*why, *cell.reasons),
        "summary": f"{verdict.value}: not covered: {sentence(uncovered[0])}{more}; judged over the rest, "
                   f"{sentence(cell.summary, 200)}"})


def recorded_for_another(ledger: Ledger, identity: CandidateIdentity, item: EvidenceItem,
                         legs: Sequence[Path]) -> list[str]:
    """Legs the ledger first recorded for another candidate that differs from this one in a
    component the leg's own item reads (or whose components the ledger does not hold): such a receipt was
    made by another candidate, and re-judging it under an edited manifest never revives it. A leg
    recorded first for a candidate that differs only where the item does not look still counts."""
    out = []
    for leg in legs:
        try:
            digest = seal_digest(leg)
        except (OSError, ValueError):
            continue  # no readable seal: the judge says so
        rows = ledger.rows("SELECT candidate_id FROM legs WHERE detail_json LIKE ? ORDER BY seq LIMIT 1",
                           [f"%{digest}%"])
        if not rows or rows[0]["candidate_id"] == identity.candidate_id:
            continue
        first = rows[0]["candidate_id"]
        # the leg's own item decides what it measured (a forward leg's exits do not read the scorer,
        # even where clean exit, which covers it, is voided by one)
        try:
            own = EvidenceItem(_leg_meta(leg).get("item"))
        except ValueError:
            own = item
        voiding = changes_voiding(ledger, first, identity, own)
        if voiding is None:
            out.append(f"{leg.name} was first recorded for {first}, whose components the ledger does not hold")
        elif voiding:
            out.append(f"{leg.name} was first recorded for {first}, which differs from this candidate in "
                       f"{', '.join(c.value for c in voiding)}: another candidate's receipt")
    return out


def not_this_candidates(cell: VerdictCell, foreign: Sequence[str]) -> VerdictCell:
    """A cell judged over legs another candidate made: never a pass (a fail or not run stays)."""
    return without_pass(cell, [f"not evidence for this candidate: {f}" for f in foreign])


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

# Verdicts that are results a question can be said to have been changed after (a verdict "not
# run" judged nothing), and every verdict that is not a pass.
RESULTS = (Verdict.FAIL.value, Verdict.INCONCLUSIVE.value)
NON_PASS = (*RESULTS, Verdict.NOT_RUN.value)

# How a non-pass verdict that still holds for the candidate relates to the cell's own verdict.
RERUN_SINCE = "rerun since"
CRITERIA_CHANGED = "criteria changed after this result"
NEWER_OTHER = "newer, for another candidate"
OTHER_QUESTION = "under another question"
BLOCKS = (CRITERIA_CHANGED, NEWER_OTHER)


@dataclass(frozen=True)
class EarlierVerdict:
    """A non-pass verdict of a cell's item, other than the cell's own, that still holds for the
    candidate the manifest names now (judged for it, or for one it differs from only in
    components that do not void the item). Shown always; `relation` says how it stands to the
    cell's verdict, and the relations in BLOCKS take acceptance away."""

    verdict_id: str
    candidate_id: str
    verdict: str
    question_hash: str | None
    question: str
    seq: int
    summary: str
    relation: str

    def as_dict(self) -> dict:
        return {"verdict_id": self.verdict_id, "candidate_id": self.candidate_id, "verdict": self.verdict,
                "question": self.question, "question_hash": self.question_hash, "seq": self.seq,
                "summary": self.summary, "relation": self.relation}


# One recorded invalidation as a stale cause names it (tica.records.record_invalidations' cause).
_CHANGE = re.compile(r"(?:^|; )(\w+): \1 \S+ -> \S+:")


# A leg's label before the reason it did not run ("bi1 bi1-s1: did not run: BI=1 needs a GPU ...").
_LEG_NOT_RUN = re.compile(r"^[\w.\- ]+: did not run: ")


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
    blocking: tuple[str, ...] = ()  # why a passing verdict is still not accepted (failed or missing checks, ...)
    after_the_fact: bool = False
    switched_off: dict[str, str] = field(default_factory=dict)
    question_in_force: str | None = None  # the hash of the question the track asks now for this item
    earlier: tuple[EarlierVerdict, ...] = ()  # non-pass verdicts of this item that still hold for the candidate
    missing_checks: tuple[str, ...] = ()  # required checks this verdict does not carry
    uncovered: dict[str, list[str]] = field(default_factory=dict)  # covered item -> legs this verdict did not judge
    reasons: tuple[str, ...] = ()  # the verdict's reasons, as the judge gave them

    @property
    def stale(self) -> bool:
        return self.stale_cause is not None

    @property
    def shown(self) -> str:
        if self.stale:
            return f"stale (was {self.verdict})"
        if self.after_the_fact:
            return f"judged after the fact (was {self.verdict})"
        if self.missing_checks and self.verdict == Verdict.PASS.value:
            return "pass, checks missing"
        if self.blocking and self.verdict == Verdict.PASS.value:
            return "pass, not accepted"
        return self.verdict

    @property
    def why(self) -> str:
        """Why the cell is not accepted ('' when it is): the stale cause, then what blocks it."""
        if self.accepted:
            return ""
        return "; ".join([*([self.stale_cause] if self.stale_cause else []), *self.blocking])

    @property
    def accepted(self) -> bool:
        return self.verdict == Verdict.PASS.value and not self.stale and not self.after_the_fact and not self.blocking

    @property
    def state(self) -> str:
        """What the report groups the cell under: accepted, fail, inconclusive, not run, stale,
        judged after the fact, 'pass, checks missing' or 'pass, not accepted'."""
        if self.accepted:
            return "accepted"
        if self.stale:
            return "stale"
        if self.after_the_fact:
            return "judged after the fact"
        if self.verdict == Verdict.PASS.value:
            return "pass, checks missing" if self.missing_checks else "pass, not accepted"
        return self.verdict

    @property
    def deciding(self) -> str:
        """In one sentence, what keeps the cell from being accepted ('' when it is accepted)."""
        if self.accepted:
            return ""
        if self.stale:
            changed = _CHANGE.findall(self.stale_cause or "")
            if changed:  # invalidation causes: "<component>: <component> <old> -> <new>: <why>"
                names = list(dict.fromkeys(changed))
                return f"{', '.join(names)} changed since it was judged"
            return sentence(self.stale_cause or "")
        if self.after_the_fact:
            return "its question is not shown frozen before its legs ran"
        if self.verdict == Verdict.PASS.value:
            if self.missing_checks:
                return f"checks missing: {', '.join(self.missing_checks)}"
            return sentence(self.blocking[0]) if self.blocking else "not accepted"
        if self.question_hash is None:
            return "no verdict recorded"
        own = [r for r in self.reasons if r.lower().startswith(f"{self.verdict}:")]
        return sentence(_LEG_NOT_RUN.sub("", sentence((own or [without_prefix(self.summary)])[0]), count=1))

    @property
    def next_step(self) -> str:
        """What would decide the cell, as a person would do it next ('' when it is accepted)."""
        name = self.item.value
        if self.accepted:
            return ""
        if self.question_hash is None:
            return f"materialize {name}"
        if self.stale:
            return f"materialize {name} again for the current candidate"
        if self.after_the_fact:
            return f"rerun {name} under a question frozen before its legs run"
        if self.verdict == Verdict.PASS.value:
            return "resolve what blocks it, then materialize it again"
        if self.verdict == Verdict.FAIL.value:
            return "the candidate fails this item: change the candidate, then materialize it again"
        if self.verdict == Verdict.INCONCLUSIVE.value:
            return "record what is missing, then materialize it again"
        return f"run {name}'s legs where they can run"


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
    def headline(self) -> str:
        """The report's first line: accepted or not, how many cells pass, and per kind of non-pass
        how many and what decides the first of them."""
        n, ok = len(self.cells), sum(c.accepted for c in self.cells)
        if self.accepted:
            return f"{self.track}: accepted — {n} of {n} pass"
        groups: dict[str, list[ReportCell]] = {}
        for c in self.cells:
            if not c.accepted:
                groups.setdefault(c.state, []).append(c)
        order = ("fail", "inconclusive", "not run", "stale", "judged after the fact", "pass, checks missing",
                 "pass, not accepted")
        parts = [f"{len(cs)} {state} ({', '.join(c.item.value for c in cs)}): {clip(cs[0].deciding, 90)}"
                 for state in sorted(groups, key=lambda s: order.index(s) if s in order else len(order))
                 for cs in [groups[state]]]
        return f"{self.track}: not accepted — {ok} of {n} pass; " + "; ".join(parts)

    @property
    def why_not(self) -> list[str]:
        out = []
        for c in self.cells:
            if c.accepted:
                continue
            why = c.why or c.summary
            out.append(f"{c.item.value}: {c.shown}" + (f" ({why})" if why else ""))
        return out

    @property
    def numbers(self) -> dict:
        """What the report found besides the cells: every earlier non-pass verdict that still holds
        for the candidate, per item, and the legs a covering verdict did not judge."""
        earlier = {c.item.value: [e.as_dict() for e in c.earlier] for c in self.cells if c.earlier}
        return {"earlier_non_pass": earlier, "earlier_non_pass_count": sum(map(len, earlier.values())),
                "uncovered_legs": {c.item.value: c.uncovered for c in self.cells if c.uncovered}}


# The narrow columns of every verdict of a track's candidates, and the track's invalidations: the
# report picks and orders them here, by seq, rather than through a window function.
TRACK_HISTORY_SQL = """
SELECT v.seq, v.verdict_id, v.candidate_id, v.item, v.verdict, v.question_hash
FROM verdicts v JOIN (SELECT candidate_id FROM candidate_tracks WHERE track = ?) c USING (candidate_id)
ORDER BY v.seq"""
TRACK_INVALIDATIONS_SQL = "SELECT seq, item, new_candidate_id, component, cause FROM invalidations WHERE track = ? ORDER BY seq"
TRACK_COMPONENTS_SQL = """
SELECT p.candidate_id, p.component, p.fingerprint
FROM components p JOIN (SELECT candidate_id FROM candidate_tracks WHERE track = ?) c USING (candidate_id)"""


def _rows_in(ledger: Ledger, sql: str, values: Sequence) -> list[dict]:
    values = list(dict.fromkeys(v for v in values if v is not None))
    if not values:
        return []
    return ledger.rows(sql.format(marks=", ".join("?" * len(values))), values)


def _check_rows(ledger: Ledger, verdict_ids: Sequence[str]) -> dict[str, list[dict]]:
    rows = _rows_in(ledger, "SELECT verdict_id, name, blocking, passed, description, detail_json FROM checks "
                    "WHERE verdict_id IN ({marks}) ORDER BY seq", verdict_ids)
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["verdict_id"], []).append(r)
    return out


def _blocking(rows: list[dict], item: EvidenceItem) -> tuple[tuple[str, ...], dict[str, str], tuple[str, ...]]:
    """What the check rows of a verdict block: failed required or blocking checks, and required
    checks it does not carry (`checks.REQUIRED[item]`); the canaries switched off; the missing."""
    names = {r["name"] for r in rows}
    required = checks.REQUIRED[item]
    # A required check blocks whatever its row says: a row cannot make itself advisory.
    why = [f"check {r['name']} failed: {r['description']}" for r in rows
           if (r["blocking"] or r["name"] in required) and not r["passed"]]
    missing = tuple(name for name in required if name not in names)
    why += [f"check {name} was never run on this verdict" for name in missing]
    off: dict[str, str] = {}
    for r in rows:
        if r["name"] == checks.CANARIES:
            try:
                off.update(json.loads(r["detail_json"] or "{}").get("switched_off") or {})
            except ValueError:
                why.append("check canaries_caught: its detail is unreadable")
    return tuple(why), off, missing


def _receipt_hashes(value) -> dict[str, str] | None:
    """A verdict's receipt_hashes_json as {leg: digest}; None when unreadable."""
    if value is None or value == "":
        return {}
    try:
        data = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        return None
    return data


def _leg_name(leg: str) -> str:
    parts = Path(leg).parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else leg


def uncovered_legs(covering: dict, covered: dict[EvidenceItem, dict]) -> tuple[dict[str, list[str]], list[str]]:
    """The legs of each covered item's current verdict that the covering verdict did not judge
    with the same digest (by the receipt hashes both recorded), and why, one line per item. An
    item with no verdict has nothing to cover (its own cell says not run)."""
    have = _receipt_hashes(covering.get("receipt_hashes_json"))
    if have is None:
        return {}, ["its receipt hashes are unreadable: what it judged cannot be shown"]
    legs: dict[str, list[str]] = {}
    why: list[str] = []
    for item, r in covered.items():
        want = _receipt_hashes(r.get("receipt_hashes_json"))
        if want is None:
            legs[item.value] = []
            why.append(f"{item.value} verdict {r['verdict_id']}: its receipt hashes are unreadable")
            continue
        if not want and r["verdict"] == Verdict.PASS.value:
            legs[item.value] = []
            why.append(f"{item.value} verdict {r['verdict_id']} passes with no receipt hashes: nothing shows its legs "
                       "were covered")
            continue
        missing = sorted(leg for leg, digest in want.items()
                         if leg not in have or (digest and have[leg] != digest))
        if missing:
            legs[item.value] = missing
            names = ", ".join(_leg_name(m) for m in missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
            why.append(f"{item.value} verdict {r['verdict_id']}: {len(missing)} of {len(want)} leg(s) not judged by it "
                       f"with the same digest ({names})")
    return legs, why


class _Holding:
    """Whether a verdict of the track still holds for the candidate the manifest names now. It
    holds when (1) the last change the ledger recorded for its item since it was judged (an
    invalidation row) leads back to a candidate that agrees with the verdict's on every component
    that voids the item, or there is none, and (2) the candidate the manifest names now agrees
    with it the same way. A change reverted (recorded back by the sensor) makes the verdict hold
    again, the rows of what was voided meanwhile staying in the ledger; a reader holding an
    outdated manifest still sees what the sensor recorded since. None: it holds; else the cause."""

    def __init__(self, ledger: Ledger, track: str, current: CandidateIdentity | None) -> None:
        self.current = current
        self.by_item: dict[str, list[dict]] = {}
        for i in sorted(ledger.rows(TRACK_INVALIDATIONS_SQL, [track]), key=lambda i: i["seq"]):
            self.by_item.setdefault(i["item"], []).append(i)
        self.seqs = {item: [i["seq"] for i in rows] for item, rows in self.by_item.items()}
        self.ledger, self.track = ledger, track
        self._components: dict[str, dict[Component, str]] | None = None  # read once, when first needed
        self._causes: dict[tuple[str, EvidenceItem], str | None] = {}

    def components(self, candidate_id: str) -> dict[Component, str] | None:
        if self._components is None:
            self._components = {}
            for row in self.ledger.rows(TRACK_COMPONENTS_SQL, [self.track]):
                try:
                    self._components.setdefault(row["candidate_id"], {})[Component(row["component"])] = row["fingerprint"]
                except ValueError:
                    continue
        found = self._components.get(candidate_id, {})
        return found if set(found) == set(Component) else None

    def voiding(self, judged_for: str, other: CandidateIdentity | str, item: EvidenceItem) -> list[Component] | None:
        """The components voiding `item` in which `other` differs from the verdict's candidate
        (None: the ledger does not hold the components of one of them)."""
        other_id = other if isinstance(other, str) else other.candidate_id
        if judged_for == other_id:
            return []
        old = self.components(judged_for)
        new = self.components(other) if isinstance(other, str) else dict(other.components)
        if old is None or new is None:
            return None
        a = CandidateIdentity(track=self.track, manifest_path="", components=old)
        b = CandidateIdentity(track=self.track, manifest_path="", components=new)
        return voided_items(diff(a, b)).get(item, [])

    def recorded(self, r: dict, item: EvidenceItem) -> str | None:
        """Why the changes recorded since the verdict leave it void, None when they lead back."""
        rows = self.by_item.get(r["item"], [])[bisect.bisect_right(self.seqs.get(r["item"], []), r["seq"]):]
        if not rows or self.voiding(r["candidate_id"], rows[-1]["new_candidate_id"], item) == []:
            return None
        last = rows[-1]["new_candidate_id"]
        return "; ".join(f"{i['component']}: {i['cause']}" for i in rows if i["new_candidate_id"] == last)

    def changed(self, r: dict, item: EvidenceItem) -> str | None:
        assert self.current is not None
        causes = self.voiding(r["candidate_id"], self.current, item)
        if causes is None:
            return f"judged for {r['candidate_id']}, whose components the ledger does not hold"
        return "; ".join(f"{c.value} changed in the manifest since it was judged (not yet recorded by the sensor)" for c in causes) or None

    def cause(self, r: dict, item: EvidenceItem) -> str | None:
        key = (r["verdict_id"], item)
        if key not in self._causes:
            self._causes[key] = (self.recorded(r, item) or (
                "the manifest could not be read: the candidate it names now is unknown" if self.current is None
                else self.changed(r, item)))
        return self._causes[key]


def _relation(r: dict, pick: dict) -> str:
    same_question = r["question_hash"] == pick["question_hash"]
    if r["seq"] > pick["seq"]:  # only past the candidate's own newest: another candidate's, recorded later
        return NEWER_OTHER if same_question else OTHER_QUESTION
    if same_question:
        return RERUN_SINCE
    return CRITERIA_CHANGED if r["verdict"] in RESULTS else OTHER_QUESTION


def report(ledger: Ledger, track: str, current: CandidateIdentity | None, conditions: str = "",
           last_verified: Head | None = None, questions: Mapping[EvidenceItem, str | None] | None = None) -> Report:
    """The acceptance report of a track from the ledger (verdicts and their checks). A ledger
    whose chain or views do not verify, or that no longer holds `last_verified` (the head an
    earlier report verified: a truncation or a self-consistent rewrite since), is not reported
    from: LedgerIntegrityError.

    Per item the cell is the newest verdict of the candidate the manifest names now, else the
    track's newest (stale unless it still holds for this candidate). `questions`: per item, the
    hash of the question the track asks now (None: the track has none for it); a cell whose
    verdict answers another question is stale, and without `questions` no cell is accepted.
    Every other non-pass verdict of the item that still holds for the candidate is listed on the
    cell; one that precedes the cell's verdict under another question (criteria changed after a
    result), or a newer one of another candidate under the same question, blocks it. A clean-exit
    or artifacts verdict stands only if it judged every leg, with the same digest, of the current
    verdict of each item it covers (`tica.evidence.COVERS`)."""
    verified = ledger.verify_or_raise(last_verified).head
    with ledger.reading():  # every read below on one connection: one state of the ledger, no reconnects
        return _report(ledger, track, current, conditions, verified, questions)


def _report(ledger: Ledger, track: str, current: CandidateIdentity | None, conditions: str, verified: Head,
            questions: Mapping[EvidenceItem, str | None] | None) -> Report:
    by_item: dict[str, list[dict]] = {}
    for r in sorted(ledger.rows(TRACK_HISTORY_SQL, [track]), key=lambda r: r["seq"]):
        by_item.setdefault(r["item"], []).append(r)
    holding = _Holding(ledger, track, current)

    picked: dict[EvidenceItem, dict] = {}
    earlier: dict[EvidenceItem, list[tuple[dict, str]]] = {}
    current_id = current.candidate_id if current is not None else None
    for item in EvidenceItem:
        rows = by_item.get(item.value, [])
        if not rows:
            continue
        mine = [r for r in rows if current_id is not None and r["candidate_id"] == current_id]
        pick = picked[item] = (mine or rows)[-1]
        earlier[item] = [(r, _relation(r, pick)) for r in rows
                         if r["verdict_id"] != pick["verdict_id"] and r["verdict"] in NON_PASS
                         and holding.cause(r, item) is None]

    seqs = [r["seq"] for r in picked.values()] + [r["seq"] for e in earlier.values() for r, _ in e]
    wide = {r["verdict_id"]: r for r in _rows_in(  # by seq, the key: the wide columns of these verdicts only
        ledger, "SELECT verdict_id, summary, judge_version, receipt_hashes_json FROM verdicts WHERE seq IN ({marks})",
        seqs)}
    for r in picked.values():
        r.update(wide.get(r["verdict_id"], {}))
    reasons = {r["verdict_id"]: _reasons(r.get("numbers_json")) for r in _rows_in(
        ledger, "SELECT verdict_id, numbers_json FROM verdicts WHERE seq IN ({marks})", [r["seq"] for r in picked.values()])}
    hashes = [r["question_hash"] for r in picked.values()] + [r["question_hash"] for e in earlier.values() for r, _ in e]
    hashes += list((questions or {}).values())
    names: dict[str, str] = {}
    if any(e for e in earlier.values()) or any(
            questions is not None and questions.get(item) not in (None, r["question_hash"]) for item, r in picked.items()):
        names = {r["question_hash"]: r["name"] for r in _rows_in(  # only to name questions in what is shown
            ledger, "SELECT question_hash, name FROM questions WHERE question_hash IN ({marks}) ORDER BY seq", hashes)}

    def q(h: str | None) -> str:
        return f"question {names[h]} ({str(h)[:19]})" if h in names else f"a question not frozen in this ledger ({str(h)[:19]})"

    by_verdict = _check_rows(ledger, [r["verdict_id"] for r in picked.values()])
    cells = []
    for item in EvidenceItem:
        pick = picked.get(item)
        if pick is None:
            cells.append(ReportCell(item, Verdict.NOT_RUN.value, "no verdict recorded",
                                    question_in_force=(questions or {}).get(item)))
            continue
        causes = [holding.cause(pick, item)]
        blocking_, off, missing = _blocking(by_verdict.get(pick["verdict_id"], []), item)
        blocking = list(blocking_)
        in_force = None
        if questions is None:
            blocking.append("the question the track asks now is not known to this report: which question the "
                            "verdict must answer cannot be shown")
        else:
            in_force = questions.get(item)
            if in_force is None:
                blocking.append(f"the track asks no question for {item.value} now")
            elif pick["question_hash"] != in_force:
                causes.append(f"judged under {q(pick['question_hash'])}, the track asks {q(in_force)}")
        uncovered: dict[str, list[str]] = {}
        if item in COVERS:
            covered = {c: {**picked[c], **wide.get(picked[c]["verdict_id"], {})} for c in COVERS[item] if c in picked}
            uncovered, why = uncovered_legs(pick, covered)
            if why:
                causes.append(f"does not cover the current evidence it covers: {'; '.join(why)}")
        shown_earlier = []
        for r, relation in earlier.get(item, []):
            summary = wide.get(r["verdict_id"], {}).get("summary") or ""
            shown_earlier.append(EarlierVerdict(r["verdict_id"], r["candidate_id"], r["verdict"], r["question_hash"],
                                                q(r["question_hash"]), r["seq"], summary, relation))
            if relation == CRITERIA_CHANGED:
                blocking.append(f"criteria changed after a result: {r['verdict']} verdict {r['verdict_id']} (for "
                                f"{r['candidate_id']}) under {q(r['question_hash'])}, then judged under "
                                f"{q(pick['question_hash'])}; a question is never swapped after its results")
            elif relation == NEWER_OTHER:
                blocking.append(f"a newer {r['verdict']} verdict {r['verdict_id']} for {r['candidate_id']}, under "
                                "the same question, still holds for this candidate: rerun the item for it")
        after = any(c["name"] == checks.FROZEN and not c["passed"] for c in by_verdict.get(pick["verdict_id"], []))
        stale_cause = "; ".join(c for c in causes if c) or None
        cells.append(ReportCell(
            item, pick["verdict"], pick.get("summary") or "", pick["question_hash"], pick["candidate_id"],
            pick["verdict_id"], pick.get("judge_version"), stale_cause, tuple(blocking), after, off,
            question_in_force=in_force, earlier=tuple(shown_earlier), missing_checks=missing, uncovered=uncovered,
            reasons=reasons.get(pick["verdict_id"], ())))
    return Report(track=track, candidate_id=current.candidate_id if current else None, cells=tuple(cells),
                  conditions=conditions, verified_head=verified)


def _reasons(numbers_json) -> tuple[str, ...]:
    """A verdict row's reasons (`record_verdict` keeps them beside its numbers); () when unreadable."""
    try:
        data = json.loads(numbers_json) if isinstance(numbers_json, str) else numbers_json
    except ValueError:
        return ()
    found = data.get("reasons") if isinstance(data, dict) else None
    return tuple(r for r in found if isinstance(r, str)) if isinstance(found, list) else ()


def unrecorded_change(ledger: Ledger, candidate_id: str, item: EvidenceItem, current: CandidateIdentity) -> str | None:
    """A component the verdict's candidate differs in from the manifest now, voiding this item,
    that no invalidation row names yet (the sensor has not ticked since the manifest changed)."""
    causes = changes_voiding(ledger, candidate_id, current, item)
    if causes is None:
        return f"judged for {candidate_id}, whose components the ledger does not hold"
    if not causes:
        return None
    return "; ".join(f"{c.value} changed in the manifest since it was judged (not yet recorded by the sensor)" for c in causes)


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
            parts.append(c.summary + (f" (after {len(c.earlier)} earlier non-pass)" if c.earlier else ""))
    return "; ".join(parts)


def report_markdown(rep: Report) -> str:
    """The report as a person reads it: the answer, one row per item (verdict, why in one
    sentence, the next step), then the details one level down."""
    lines = [f"**{rep.headline}**", "",
             "| evidence | verdict | why | next step |", "| --- | --- | --- | --- |"]
    for c in rep.cells:
        lines.append(f"| {TITLES[c.item]} | {'accepted' if c.accepted else c.state} | "
                     f"{(c.deciding or sentence(c.summary)).replace('|', '/')} | {c.next_step or '—'} |")
    lines += ["", f"Candidate `{rep.candidate_id}`" + (f", shown under: {rep.conditions}" if rep.conditions else ""), "",
              "| evidence | summary | question | judge |", "| --- | --- | --- | --- |"]
    lines += [f"| {TITLES[c.item]} | {clip(c.summary, 200).replace('|', '/')} | `{(c.question_hash or '')[:19]}` | "
              f"`{c.judge_version or ''}` |" for c in rep.cells]
    earlier = [(c.item, e) for c in rep.cells for e in c.earlier]
    if earlier:
        lines += ["", "**Earlier non-pass verdicts that still hold for this candidate:**", ""]
        lines += [f"- {TITLES[item]}: {e.verdict} `{e.verdict_id}` for `{e.candidate_id}` under {e.question}, "
                  f"seq {e.seq} ({e.relation}): {e.summary.replace('|', '/')}" for item, e in earlier]
    off = [(c.item.value, name, why) for c in rep.cells for name, why in c.switched_off.items()]
    if off:
        lines += ["", "**Canaries switched off by the frozen questions:**", ""]
        lines += [f"- {item}: `{name}`: {why}" for item, name, why in off]
    lines += ["", f"**Scope:** {scope_line(rep.cells)}", "", f"Judged by `{JUDGE_VERSION}` (this code's version)."]
    return "\n".join(lines)
