"""No false pass, set level: acceptance reads the verdicts and the checks of those verdicts.

A module-scoped track is materialized once through `tica.acceptance.materialize` (candidate
recorded, question frozen, legs built after the freeze and bound to the candidate, judged, checks
appended) into a real DuckDB ledger; the report accepts it (the negative control). Each test works
on its own copy of that ledger and breaks one thing at the set level."""

from __future__ import annotations

import datetime as _dt
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.bound_receipts import build_bound
from tica import checks
from tica.acceptance import LegBatch, Materialized, materialize, record_candidate_change, report
from tica.binding import Candidate
from tica.candidate import CandidateIdentity, identify
from tica.canaries import default_questions, edit_meta
from tica.errors import FrozenQuestionError, ManifestError
from tica.evidence import COVERS, Component, EvidenceItem
from tica.ledger import Ledger
from tica.manifest import LoadedManifest, load_manifest
from tica.records import freeze_question, record_verdict
from tica.verdict import Verdict

from .conftest import E, manifest_data, utcnow, write_manifest

TRACK = "false-pass"
# The hash of each item's question the track asks now (the report refuses a verdict under another).
IN_FORCE: dict[EvidenceItem, str] = {item: q.hash for item, q in default_questions().items()}


@dataclass
class Track:
    root: Path
    ledger_path: Path
    manifest: Path
    loaded: LoadedManifest
    identity: CandidateIdentity
    candidate: Candidate
    questions: dict[EvidenceItem, Path]
    materialized: dict[EvidenceItem, Materialized]


def _materialize(ledger: Ledger, track: Track | None, item: EvidenceItem, dest: Path, *, loaded=None, identity=None,
                 questions=None, legs=None, upstream=()) -> Materialized:
    loaded = loaded or track.loaded
    identity = identity or track.identity
    cand = Candidate.of(loaded, identity)
    qpath = (questions or track.questions)[item]

    def run_legs(question, candidate_id):  # after the freeze, as a Dagster run would
        return [LegBatch(legs=legs if legs is not None else build_bound(item, question, cand, dest))]
    # the track's other questions frozen with it, as Dagster does: clean exit's and the artifacts'
    # criteria are frozen before the legs they cover ran
    return materialize(ledger, loaded, identity, item, qpath, run_legs, upstream,
                       track_questions=list((questions or track.questions).values()))


def write_questions(folder: Path) -> dict[EvidenceItem, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for item, q in default_questions().items():
        path = folder / f"{item.value}.yaml"
        path.write_text(yaml.safe_dump(q.model_dump(mode="json"), sort_keys=False))
        out[item] = path
    return out


def accepted_track(tmp_path_factory) -> Track:
    """The accepted track, materialized once per session: tests/conftest.py's `baseline` fixture,
    shared by this module, test_acceptance_trust.py and tests/core/test_report_cli.py (each test
    works on a copy of its ledger)."""
    root = tmp_path_factory.mktemp("accepted-track")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TICA_CACHE_DIR", str(root / "fingerprint-cache"))
        manifest = write_manifest(root / "candidate", manifest_data(track=TRACK))
        loaded = load_manifest(manifest)
        identity = identify(loaded)
        track = Track(root, root / "ledger.duckdb", manifest, loaded, identity, Candidate.of(loaded, identity),
                      write_questions(root / "questions"), {})
        ledger = Ledger(track.ledger_path)
        for item in EvidenceItem:  # clean exit and artifacts over the legs they cover, as Dagster does
            upstream = [leg for covered in COVERS.get(item, ()) for leg in track.materialized[covered].current.own_legs]
            track.materialized[item] = _materialize(ledger, track, item, root / "legs" / item.value, upstream=upstream)
        rep = report(ledger, TRACK, identity, questions=IN_FORCE)
        assert rep.accepted, ("negative control: the bound, frozen-first track must be accepted", rep.why_not)
    return track


@pytest.fixture
def track(baseline, tmp_path) -> tuple[Track, Ledger]:
    """The accepted track on a copy of its ledger, for this test alone."""
    for src in baseline.ledger_path.parent.glob(baseline.ledger_path.name + "*"):
        if not src.name.endswith(".lock"):
            shutil.copy2(src, tmp_path / src.name)
    return baseline, Ledger(tmp_path / baseline.ledger_path.name)


def cell_of(rep, item: EvidenceItem):
    return next(c for c in rep.cells if c.item is item)


def test_a_track_bound_to_its_candidate_and_frozen_before_its_legs_is_accepted(track):
    t, ledger = track
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    assert rep.accepted and all(c.verdict == "pass" and not c.blocking for c in rep.cells)


# ------------------------------------------------------------------ frozen before the first leg


def test_evidence_judged_after_the_fact_is_never_accepted(track, tmp_path):
    """Legs that started a day before the question was frozen, rerun into the accepted track."""
    t, ledger = track
    early = build_bound(E.FORWARD, default_questions()[E.FORWARD], t.candidate, tmp_path / "early",
                        started=utcnow() - _dt.timedelta(days=1))
    mat = _materialize(ledger, t, E.FORWARD, tmp_path, legs=early)
    assert mat.current.cell.verdict is Verdict.PASS  # the criteria and binding hold; the timing does not
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    cell = cell_of(rep, E.FORWARD)
    assert not rep.accepted and cell.after_the_fact and not cell.accepted
    assert any("forward: judged after the fact" in w and "frozen_before_run" in w for w in rep.why_not), rep.why_not


def test_legs_that_record_no_start_time_cannot_show_they_ran_after_the_freeze(track, tmp_path):
    t, ledger = track
    legs = build_bound(E.CLEAN_EXIT, default_questions()[E.CLEAN_EXIT], t.candidate, tmp_path / "legs")
    edit_meta(legs[0], lambda m: m.update(started_at=None))
    _materialize(ledger, t, E.CLEAN_EXIT, tmp_path, legs=legs)
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    cell = cell_of(rep, E.CLEAN_EXIT)
    assert not cell.accepted and any("record no start" in b for b in cell.blocking), cell.blocking


def test_receipts_sealed_before_the_question_was_frozen_are_judged_after_the_fact(baseline, tmp_path):
    ledger = Ledger(tmp_path / "fresh.duckdb")
    claimed = utcnow() + _dt.timedelta(hours=2)
    legs = build_bound(E.CLEAN_EXIT, default_questions()[E.CLEAN_EXIT], baseline.candidate, tmp_path / "sealed-first",
                       started=claimed)  # sealed now, before the freeze below
    time.sleep(0.01)
    _materialize(ledger, baseline, E.CLEAN_EXIT, tmp_path, legs=legs,
                 questions=write_questions(tmp_path / "questions"))
    cell = cell_of(report(ledger, TRACK, baseline.identity, questions=IN_FORCE), E.CLEAN_EXIT)
    assert not cell.accepted, f"FALSE PASS: {cell.shown}: {cell.summary}"
    assert cell.after_the_fact or any("seal" in b for b in cell.blocking)


# ------------------------------------------------------------------ the checks of a verdict


def _rerun(ledger: Ledger, t: Track, item: EvidenceItem, outcomes) -> str:
    judged = t.materialized[item].current
    return record_verdict(ledger, t.identity.candidate_id, judged.cell, rerun_of=judged.verdict_id,
                          checks=tuple(outcomes), rerun_reason="false-pass suite")


def test_a_verdict_without_its_checks_is_not_accepted(track):
    t, ledger = track
    _rerun(ledger, t, E.BACKWARD, ())
    cell = cell_of(report(ledger, TRACK, t.identity, questions=IN_FORCE), E.BACKWARD)
    assert cell.verdict == "pass" and not cell.accepted and cell.shown == "pass, checks missing"
    assert cell.missing_checks == checks.REQUIRED[E.BACKWARD]
    for name in checks.REQUIRED[E.BACKWARD]:
        assert f"check {name} was never run on this verdict" in cell.blocking


@pytest.mark.parametrize("missing", checks.REQUIRED[E.UPDATE])
def test_a_verdict_missing_a_required_check_row_is_not_accepted(missing, track):
    t, ledger = track
    _rerun(ledger, t, E.UPDATE, [o for o in t.materialized[E.UPDATE].current.checks if o.name != missing])
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    assert not rep.accepted
    assert cell_of(rep, E.UPDATE).blocking == (f"check {missing} was never run on this verdict",)


def test_a_pass_whose_blocking_check_failed_is_not_accepted(track, tmp_path, monkeypatch):
    """Every canary of forward reported missed, forward re-materialized: the cell passes, the check fails."""
    import tica.canaries

    t, ledger = track
    real = tica.canaries.run_canaries
    monkeypatch.setattr(tica.canaries, "run_canaries",
                        lambda **kw: [r.model_copy(update={"broken": True, "got": "pass"}) for r in real(**kw)])
    mat = _materialize(ledger, t, E.FORWARD, tmp_path / "legs")
    assert mat.current.cell.verdict is Verdict.PASS
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    cell = cell_of(rep, E.FORWARD)
    assert not rep.accepted and cell.shown == "pass, not accepted"
    assert any("check canaries_caught failed" in b for b in cell.blocking), cell.blocking


@pytest.mark.parametrize("name", [checks.RECEIPTS, checks.QUALITY_SUMS])
def test_a_failed_blocking_check_takes_acceptance_away(name, track):
    t, ledger = track
    outcomes = [checks.CheckOutcome(o.name, False if o.name == name else o.passed, o.blocking, o.description)
                for o in t.materialized[E.QUALITY].current.checks]
    assert any(o.name == name for o in outcomes)
    _rerun(ledger, t, E.QUALITY, outcomes)
    cell = cell_of(report(ledger, TRACK, t.identity, questions=IN_FORCE), E.QUALITY)
    assert not cell.accepted and any(f"check {name} failed" in b for b in cell.blocking)


def test_a_required_check_that_failed_blocks_acceptance_whatever_its_row_says(track):
    t, ledger = track
    outcomes = [checks.CheckOutcome(o.name, False, False, "no canary was caught") if o.name == checks.CANARIES else o
                for o in t.materialized[E.BACKWARD].current.checks]
    _rerun(ledger, t, E.BACKWARD, outcomes)
    cell = cell_of(report(ledger, TRACK, t.identity, questions=IN_FORCE), E.BACKWARD)
    assert not cell.accepted, f"FALSE PASS: {cell.shown}"
    assert any(checks.CANARIES in b for b in cell.blocking)


def test_a_receipt_resealed_after_the_ledger_recorded_it_is_not_the_receipt_judged(track, tmp_path):
    t, ledger = track
    legs = build_bound(E.BACKWARD, default_questions()[E.BACKWARD], t.candidate, tmp_path / "legs")
    _materialize(ledger, t, E.BACKWARD, tmp_path, legs=legs)
    assert cell_of(report(ledger, TRACK, t.identity, questions=IN_FORCE), E.BACKWARD).accepted
    edit_meta(legs[0], lambda m: m["resolved_config"].update(note="edited after it was recorded"))
    _materialize(ledger, t, E.BACKWARD, tmp_path, legs=legs)
    cell = cell_of(report(ledger, TRACK, t.identity, questions=IN_FORCE), E.BACKWARD)
    assert cell.verdict == "pass" and not cell.accepted
    assert any("check receipts_sealed failed" in b and "the ledger recorded" in b for b in cell.blocking), cell.blocking


def test_a_receipt_tampered_before_judging_is_inconclusive_and_unaccepted(track, tmp_path):
    t, ledger = track
    legs = build_bound(E.QUALITY, default_questions()[E.QUALITY], t.candidate, tmp_path / "legs")
    with (legs[0] / "results.jsonl").open("a") as f:
        f.write("\n")
    mat = _materialize(ledger, t, E.QUALITY, tmp_path, legs=legs)
    assert mat.current.cell.verdict is Verdict.INCONCLUSIVE
    cell = cell_of(report(ledger, TRACK, t.identity, questions=IN_FORCE), E.QUALITY)
    assert not cell.accepted and any("receipts_sealed" in b for b in cell.blocking)


# ------------------------------------------------------------------ the candidate the manifest names now


def _changed(t: Track, tmp_path: Path, **over) -> tuple[LoadedManifest, CandidateIdentity]:
    path = write_manifest(tmp_path / "changed", manifest_data(track=TRACK, **over))
    loaded = load_manifest(path)
    return loaded, identify(loaded)


def test_evidence_for_the_manifest_before_a_backend_change_is_stale(track, tmp_path):
    t, ledger = track
    backends = {**t.loaded.manifest.backends.model_dump(), "attention": "FLASHINFER"}
    _, now = _changed(t, tmp_path, backends=backends)
    rep = report(ledger, TRACK, now, questions=IN_FORCE)
    assert not rep.accepted
    for item in (E.FORWARD, E.BACKWARD, E.UPDATE, E.QUALITY, E.THROUGHPUT, E.CLEAN_EXIT, E.ARTIFACTS):
        cell = cell_of(rep, item)
        assert cell.stale and "backends" in cell.stale_cause and not cell.accepted, (item, cell.stale_cause)


def test_a_changed_evaluation_contract_voids_the_quality_evidence(track, tmp_path):
    t, ledger = track
    contract = {**t.loaded.manifest.eval_contract.model_dump(mode="json"), "scorer": "tica.scorer.boxed/2"}
    _, now = _changed(t, tmp_path, eval_contract=contract)
    rep = report(ledger, TRACK, now, questions=IN_FORCE)
    assert not rep.accepted
    assert cell_of(rep, E.QUALITY).stale and "eval_contract" in cell_of(rep, E.QUALITY).stale_cause
    assert cell_of(rep, E.FORWARD).accepted  # a contract change touches quality (and artifacts) only


def test_a_recorded_invalidation_keeps_the_old_candidates_evidence_stale(track, tmp_path):
    """The sensor saw the checkpoint change: the invalidation is in the ledger, whoever reads the report."""
    t, ledger = track
    path = write_manifest(tmp_path / "new-weights", manifest_data(track=TRACK), weights=b"other checkpoint" * 64)
    loaded = load_manifest(path)
    new = identify(loaded)
    changes = record_candidate_change(ledger, loaded, new, dict(t.identity.components))
    assert [c.component for c in changes] == [Component.WEIGHTS]
    for current in (new, t.identity):
        rep = report(ledger, TRACK, current, questions=IN_FORCE)
        assert not rep.accepted
        assert all(c.stale and "weights" in c.stale_cause for c in rep.cells), [c.stale_cause for c in rep.cells]


def test_a_change_recorded_then_reverted_makes_the_evidence_hold_again(track, tmp_path):
    """Fresh is computed from fingerprints: weights changed and recorded (every item stale), then
    changed back and recorded (every item holds again); the invalidation rows stay in the ledger."""
    t, ledger = track
    path = write_manifest(tmp_path / "new-weights", manifest_data(track=TRACK), weights=b"other checkpoint" * 64)
    loaded = load_manifest(path)
    new = identify(loaded)
    record_candidate_change(ledger, loaded, new, dict(t.identity.components))
    assert not any(c.accepted for c in report(ledger, TRACK, new, questions=IN_FORCE).cells)
    rows = ledger.rows("SELECT count(*) AS n FROM invalidations")[0]["n"]
    back = record_candidate_change(ledger, load_manifest(t.identity.manifest_path), t.identity, dict(new.components))
    assert [c.component for c in back] == [Component.WEIGHTS]
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    assert rep.accepted, rep.why_not
    assert ledger.rows("SELECT count(*) AS n FROM invalidations")[0]["n"] == 2 * rows  # the history stays
    assert not any(r["stale"] for r in ledger.rows("SELECT stale FROM track_verdicts WHERE track = ?", [TRACK]))
    # negative control: the candidate with the other weights has no evidence of its own
    assert not any(c.accepted for c in report(ledger, TRACK, new, questions=IN_FORCE).cells)


def test_evidence_judged_for_another_candidate_of_the_track_is_not_this_candidates(track, tmp_path):
    """Forward rerun for a candidate with other weights on the same track: the newest forward verdict
    is that candidate's; the report of the candidate the manifest names keeps its own verdict, and
    the other's verdict is stale for every item it has not judged for the other candidate."""
    t, ledger = track
    path = write_manifest(tmp_path / "other", manifest_data(track=TRACK), weights=b"other checkpoint" * 64)
    loaded = load_manifest(path)
    other = identify(loaded)
    mat = _materialize(ledger, t, E.FORWARD, tmp_path / "legs", loaded=loaded, identity=other)
    assert mat.current.cell.verdict is Verdict.PASS
    cell = cell_of(report(ledger, TRACK, t.identity, questions=IN_FORCE), E.FORWARD)
    assert cell.candidate_id == t.identity.candidate_id and cell.verdict_id == t.materialized[E.FORWARD].current.verdict_id
    assert cell.accepted and not cell.earlier  # the other's verdict does not hold for this candidate
    rep = report(ledger, TRACK, other, questions=IN_FORCE)
    assert cell_of(rep, E.FORWARD).candidate_id == other.candidate_id
    backward = cell_of(rep, E.BACKWARD)
    assert backward.candidate_id == t.identity.candidate_id and not backward.accepted and "weights" in backward.stale_cause


def test_an_unreadable_manifest_names_no_candidate_and_accepts_nothing(track, tmp_path):
    t, ledger = track
    broken = tmp_path / "broken.yaml"
    broken.write_text(t.manifest.read_text().replace("track:", "track: [", 1))
    with pytest.raises(ManifestError):
        load_manifest(broken)
    rep = report(ledger, TRACK, None, questions=IN_FORCE)
    assert not rep.accepted and rep.candidate_id is None
    assert all(not c.accepted and "manifest could not be read" in c.stale_cause for c in rep.cells)


def test_an_item_with_no_verdict_is_not_accepted(baseline, tmp_path):
    ledger = Ledger(tmp_path / "partial.duckdb")
    _materialize(ledger, baseline, E.CLEAN_EXIT, tmp_path / "legs", questions=write_questions(tmp_path / "q"))
    rep = report(ledger, TRACK, baseline.identity, questions=IN_FORCE)
    assert cell_of(rep, E.CLEAN_EXIT).accepted and not rep.accepted
    assert "forward: not run (no verdict recorded)" in rep.why_not


# ------------------------------------------------------------------ frozen questions


def test_a_question_edited_after_freezing_is_refused(track, tmp_path):
    t, ledger = track
    path = tmp_path / "quality.yaml"
    shutil.copy(t.questions[E.QUALITY], path)
    assert freeze_question(ledger, path).name == "gsm8k-30-greedy"  # the frozen one, unchanged
    data = yaml.safe_load(path.read_text())
    data["criteria"]["threshold_points"] = 50.0
    path.write_text(yaml.safe_dump(data))
    verdicts = ledger.rows("SELECT count(*) AS n FROM verdicts")[0]["n"]
    with pytest.raises(FrozenQuestionError, match="gsm8k-30-greedy"):
        freeze_question(ledger, path)
    with pytest.raises(FrozenQuestionError):
        _materialize(ledger, t, E.QUALITY, tmp_path / "legs", questions={E.QUALITY: path})
    assert ledger.rows("SELECT count(*) AS n FROM verdicts")[0]["n"] == verdicts
