"""What TICA writes into the ledger, as typed calls over the append-only API."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tica.candidate import CandidateIdentity, ComponentChange
from tica.checks import CheckOutcome
from tica.errors import FrozenQuestionError, QuestionError
from tica.ledger import Ledger, new_id
from tica.manifest import LoadedManifest
from tica.question import Question, load_question, undecidable
from tica.messages import relative
from tica.seal import seal_digest, verified_files
from tica.verdict import VerdictCell


def record_candidate(ledger: Ledger, identity: CandidateIdentity, loaded: LoadedManifest) -> str:
    """Record a candidate and its component fingerprints once (checked and appended under one
    writer lock, so concurrent recorders write it exactly once); returns its id."""
    cid = identity.candidate_id

    def decide(rows) -> list:
        if rows("SELECT 1 FROM candidates WHERE candidate_id = ?", [cid]):
            return []
        out = [(
            "candidates",
            {
                "candidate_id": cid,
                "track": identity.track,
                "manifest_path": identity.manifest_path,
                "manifest_hash": loaded.text_hash,
                # with the files its fields name, resolved and hashed (they are part of its identity)
                "manifest_json": {**loaded.manifest.model_dump(mode="json"),
                                  **({"named_files": {c.value: f for c, f in loaded.named_files.items()}}
                                     if loaded.named_files else {})},
            },
        )]
        return out + [("components", {"candidate_id": cid, "component": c.value, "fingerprint": fp})
                      for c, fp in identity.components.items()]

    ledger.check_and_append(decide)
    return cid


def freeze_question(ledger: Ledger, path: str | Path) -> Question:
    """Record a question with its hash. A name is frozen to one hash: an edited file must
    become a new question under a new name, and results keep the hash they were judged under.
    The check and the append happen under one writer lock: a name is frozen to exactly one
    hash however many processes freeze it at once."""
    question = load_question(path)
    if (why := undecidable(question)) is not None:
        raise QuestionError(path, *why)

    def decide(rows) -> list:
        frozen = rows("SELECT question_hash, source_path FROM questions WHERE name = ? ORDER BY seq", [question.name])
        hashes = {r["question_hash"] for r in frozen}
        if question.hash in hashes:
            return []
        if hashes:
            raise FrozenQuestionError(
                f"{path}: question {question.name!r} is frozen as {frozen[0]['question_hash']} "
                f"(from {frozen[0]['source_path']}); its criteria cannot change. "
                f"Give the changed question a new name: it is a new question."
            )
        return [(
            "questions",
            {
                "question_hash": question.hash,
                "name": question.name,
                "item": question.item.value,
                "source_path": str(path),
                "body_json": question.canonical_json(),
            },
        )]

    ledger.check_and_append(decide)
    return question


def frozen_question(ledger: Ledger, question_hash: str) -> Question:
    rows = ledger.rows("SELECT body_json FROM questions WHERE question_hash = ?", [question_hash])
    if not rows:
        raise FrozenQuestionError(f"no frozen question {question_hash} in {ledger.path}")
    return Question.model_validate_json(rows[0]["body_json"])


def record_leg(
    ledger: Ledger,
    candidate_id: str,
    question: Question,
    leg_dir: str | Path,
    meta: dict,
    status: str,
) -> str:
    """Record a leg and one receipt row per sealed file."""
    leg_dir = Path(leg_dir)
    leg_id = new_id("leg")
    # only a seal that verifies whole names files: a made-up path (`../../etc/passwd`) or a file
    # changed since sealing is recorded as the seal's problem, never as a receipt
    files, seal_problems = verified_files(leg_dir)
    rows = [
        (
            "legs",
            {
                "leg_id": leg_id,
                "candidate_id": candidate_id,
                "item": question.item.value,
                "arm": meta.get("arm"),
                "round": meta.get("round"),
                "slot": meta.get("slot"),
                "concurrency": meta.get("concurrency"),
                "question_hash": question.hash,
                "status": status,
                "leg_dir": str(leg_dir),
                "detail_json": {
                    "seal": seal_digest(leg_dir) if files else None,
                    "seal_problems": [relative(p) for p in seal_problems[:10]] or None,
                    "versions": meta.get("versions"),
                    "device": meta.get("device"),
                    "not_run_reason": meta.get("not_run_reason"),
                },
            },
        )
    ]
    rows += [
        (
            "receipts",
            {"leg_id": leg_id, "path": rel, "sha256": digest, "size_bytes": (leg_dir / rel).stat().st_size},
        )
        for rel, digest in sorted(files.items())
    ]
    ledger.append_many(rows)
    return leg_id


def record_verdict(ledger: Ledger, candidate_id: str, cell: VerdictCell, rerun_of: str | None = None,
                   checks: Sequence[CheckOutcome] = (), rerun_reason: str | None = None) -> str:
    """Append a verdict with the checks of it, in one transaction; a rerun is linked to the
    verdict it reruns (with why), never replaces it.

    A rerun is of the same candidate, item and question: `rerun_of` must name a verdict judged for
    this candidate and item under `cell.question_hash` (`tica.acceptance.materialize` picks it so).
    A verdict under another question is recorded plainly, never as a rerun: changing criteria is a
    new question, and the report names criteria changed after a result."""
    verdict_id = new_id("verdict")
    rows = [
        (
            "verdicts",
            {
                "verdict_id": verdict_id,
                "candidate_id": candidate_id,
                "item": cell.item.value,
                "question_hash": cell.question_hash,
                "verdict": cell.verdict.value,
                "summary": cell.summary,
                "numbers_json": {"numbers": cell.numbers, "reasons": list(cell.reasons)},
                "receipt_hashes_json": cell.receipt_hashes,
                "judge_version": cell.judge_version,
                "rerun_of": rerun_of,
            },
        )
    ]
    if rerun_of:
        rows.append(
            (
                "reruns",
                {
                    "rerun_id": new_id("rerun"),
                    "original_kind": "verdict",
                    "original_id": rerun_of,
                    "new_id": verdict_id,
                    "reason": rerun_reason or "rerun of the same item for the same candidate",
                },
            )
        )
    rows += [
        (
            "checks",
            {
                "check_id": new_id("check"),
                "verdict_id": verdict_id,
                "name": c.name,
                "blocking": int(c.blocking),
                "passed": int(c.passed),
                "description": c.description,
                "detail_json": c.detail,
            },
        )
        for c in checks
    ]
    ledger.append_many(rows)
    return verdict_id


def record_invalidations(
    ledger: Ledger, old: CandidateIdentity, new: CandidateIdentity, changes: list[ComponentChange]
) -> list[int]:
    """One row per (changed component, voided item), naming the verdicts it voids."""
    current = [r for r in ledger.track_verdicts(new.track) if not r["stale"]]
    by_item: dict[str, list[str]] = {}
    for r in current:
        by_item.setdefault(r["item"], []).append(r["verdict_id"])
    rows = [
        (
            "invalidations",
            {
                "invalidation_id": new_id("inval"),
                "track": new.track,
                "old_candidate_id": old.candidate_id,
                "new_candidate_id": new.candidate_id,
                "component": change.component.value,
                "item": item.value,
                "cause": f"{change.component.value} {change.old[:19]} -> {change.new[:19]}: {change.why}",
                "voided_verdict_ids_json": by_item.get(item.value, []),
            },
        )
        for change in changes
        for item in change.invalidates
    ]
    return ledger.append_many(rows) if rows else []
