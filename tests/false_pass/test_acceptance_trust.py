"""No false acceptance, set level: what the report trusts a verdict for.

Each test starts from the accepted track of `test_acceptance.py` (its `baseline`: every item
materialized through `tica.acceptance.materialize` into a real DuckDB ledger, clean exit and the
artifacts judged over the legs they cover, as Dagster does), on its own copy of the ledger, and
checks one invariant with its negative control (the honest track, or the honest variant of the
same steps, is accepted):

- clean exit and the artifacts stand only over the legs of the current verdicts they cover (C1);
- a verdict answers the question the track asks now, and a question changed after a non-pass
  result is never accepted nor linked as a rerun (C2);
- verdicts of one track never count for another (C3);
- earlier non-pass verdicts that still hold are shown, the candidate's own verdict is preferred (N1);
- a pass without its item's required checks is shown as such and not accepted (N2, N3);
- the report's anchor is kept when the same ledger is named another way (S1).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tica import checks
from tica.acceptance import (CRITERIA_CHANGED, NEWER_OTHER, RERUN_SINCE, LegBatch, materialize,
                             record_candidate_change, report, report_markdown)
from tica.binding import Candidate
from tica.candidate import identify
from tica.canaries import default_questions, edit_meta
from tica.errors import FrozenQuestionError, LedgerIntegrityError
from tica.evidence import COVERS, INVALIDATION_MATRIX, Component, EvidenceItem, invalidated_by
from tica.ledger import Ledger
from tica.manifest import load_manifest
from tica.question import load_question
from tica.records import record_verdict
from tica.seal import seal_leg
from tica.verdict import Verdict

from .conftest import E, manifest_data, write_manifest
from .test_acceptance import IN_FORCE, TRACK, Track, cell_of, track  # noqa: F401 (fixtures; `baseline`: tests/conftest.py)

_n = itertools.count()


# ---------------------------------------------------------------------------- helpers


def own_legs(t: Track) -> dict[EvidenceItem, list[Path]]:
    """The own legs of each item's current verdict in the accepted track (kept up to date by the test)."""
    return {item: list(m.current.own_legs) for item, m in t.materialized.items()}


def mat(ledger: Ledger, t: Track, item: EvidenceItem, dest: Path, *, loaded=None, identity=None, questions=None,
        upstream=(), tamper=None, legs=None):
    """One materialization as the Dagster asset does it (the track's questions frozen with it; the
    legs written when it asks, after the freeze; `tamper(legs)` edits and reseals them first)."""
    loaded, identity = loaded or t.loaded, identity or t.identity
    cand, qs = Candidate.of(loaded, identity), questions or t.questions
    dest = dest / f"{item.value}-{next(_n)}"

    def run_legs(question, candidate_id):
        own = legs if legs is not None else honest(item, dest, question, cand)
        if tamper:
            tamper(own)
        return [LegBatch(legs=own)]
    return materialize(ledger, loaded, identity, item, qs[item], run_legs, upstream, track_questions=list(qs.values()))


def rerun(ledger: Ledger, t: Track, item: EvidenceItem, own: dict, dest: Path, **kw):
    """`mat`, clean exit and the artifacts given the current legs of what they cover (as Dagster's
    `upstream_legs` does); `own` is kept up to date."""
    upstream = [leg for covered in COVERS.get(item, ()) for leg in own[covered]]
    done = mat(ledger, t, item, dest, upstream=upstream, **kw)
    own[item] = list(done.current.own_legs)
    return done


def cover(ledger: Ledger, t: Track, own: dict, dest: Path, **kw) -> None:
    """Clean exit, then the artifacts, judged again over the legs they cover now."""
    for item in (E.CLEAN_EXIT, E.ARTIFACTS):
        rerun(ledger, t, item, own, dest, **kw)


def honest(item: EvidenceItem, dest: Path, question=None, cand: Candidate | None = None) -> list[Path]:
    from tests.bound_receipts import build_bound

    return build_bound(item, question or default_questions()[item], cand, dest)


def bi1_loses_three(legs: list[Path]) -> None:
    """Quality: BI=1 gets 3 of 30 problems wrong that BI=0 gets right (10 points, over 3.34)."""
    leg = next(p for p in legs if json.loads((p / "leg.json").read_text())["arm"] == "bi1")
    rows = [json.loads(x) for x in (leg / "results.jsonl").read_text().splitlines()]
    done = 0
    for r in rows:
        if r["correct"] and done < 3:
            r["correct"], done = False, done + 1
    (leg / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seal_leg(leg)


def engine_core_killed(legs: list[Path]) -> None:
    """Every EngineCore of these legs force-killed (resealed: what an honest producer records)."""
    def kill(meta):
        for p in meta["processes"]:
            if p["role"] == "engine_core":
                p.update(exit_code=-9, end_state="force_killed", signal=9,
                         evidence="Force killing remaining process EngineCore")
    for leg in legs:
        edit_meta(leg, kill)


def question_file(t: Track, folder: Path, item: EvidenceItem, **criteria) -> Path:
    """A copy of the track's question for `item` under a new name, with criteria changed."""
    data = yaml.safe_load(t.questions[item].read_text())
    data["name"] = f"{data['name']}-{folder.name}"
    data["criteria"].update(criteria)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{item.value}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def in_force(paths: dict[EvidenceItem, Path]) -> dict[EvidenceItem, str]:
    return {item: load_question(p).hash for item, p in paths.items()}


def changed_track(t: Track, tmp_path: Path, name: str, **over):
    path = write_manifest(tmp_path / name, manifest_data(track=TRACK, **over))
    loaded = load_manifest(path)
    return loaded, identify(loaded)


# ---------------------------------------------------------------------------- C1: what clean exit and artifacts cover


def test_clean_exit_stands_only_over_the_legs_of_the_current_verdicts_it_covers(track, tmp_path):
    t, ledger = track
    own = own_legs(t)
    # negative control: an honest quality rerun, with clean exit and the artifacts judged over it, is accepted
    rerun(ledger, t, E.QUALITY, own, tmp_path)
    assert not report(ledger, TRACK, t.identity, questions=IN_FORCE).accepted  # not covered yet
    cover(ledger, t, own, tmp_path)
    assert report(ledger, TRACK, t.identity, questions=IN_FORCE).accepted

    # a quality rerun whose EngineCores were force-killed passes quality; the clean exit on file never saw it
    killed = rerun(ledger, t, E.QUALITY, own, tmp_path, tamper=engine_core_killed)
    legs = killed.current.own_legs
    assert killed.current.cell.verdict is Verdict.PASS
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    ce = cell_of(rep, E.CLEAN_EXIT)
    assert not rep.accepted and ce.stale and not ce.accepted
    assert "quality verdict " + killed.current.verdict_id in ce.stale_cause
    assert sorted(ce.uncovered["quality"]) == sorted(str(p) for p in legs)
    assert all(leg.name in ce.stale_cause for leg in legs), ce.stale_cause
    assert cell_of(rep, E.ARTIFACTS).stale  # nor did the artifacts
    assert cell_of(rep, E.QUALITY).accepted  # the quality cell itself is fine: its exits are clean exit's to judge
    # judged over them, clean exit fails: the killed engines are found, never accepted
    cover(ledger, t, own, tmp_path)
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    assert cell_of(rep, E.CLEAN_EXIT).verdict == "fail" and not rep.accepted


def test_the_artifacts_stand_only_over_the_receipts_of_the_current_verdicts(track, tmp_path):
    t, ledger = track
    own = own_legs(t)
    rerun(ledger, t, E.BACKWARD, own, tmp_path)  # clean exit does not cover backward; the artifacts do
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    art = cell_of(rep, E.ARTIFACTS)
    assert not rep.accepted and art.stale and "backward verdict" in art.stale_cause
    assert cell_of(rep, E.CLEAN_EXIT).accepted
    # negative control: the artifacts judged again over every receipt: accepted
    rerun(ledger, t, E.ARTIFACTS, own, tmp_path)
    assert report(ledger, TRACK, t.identity, questions=IN_FORCE).accepted


def test_a_scorer_change_voids_clean_exit_and_new_quality_legs_must_be_covered(track, tmp_path):
    t, ledger = track
    assert E.CLEAN_EXIT in invalidated_by(Component.EVAL_CONTRACT)
    contract = {**t.loaded.manifest.eval_contract.model_dump(mode="json"), "scorer": "tica.scorer.boxed/2"}
    loaded, b = changed_track(t, tmp_path, "scorer", eval_contract=contract)
    record_candidate_change(ledger, loaded, b, dict(t.identity.components))  # the sensor's tick
    own = own_legs(t)
    # what the matrix used to ask for: quality (its EngineCores killed) and the artifacts, not clean exit
    rerun(ledger, t, E.QUALITY, own, tmp_path, tamper=engine_core_killed, loaded=loaded, identity=b)
    rerun(ledger, t, E.ARTIFACTS, own, tmp_path, loaded=loaded, identity=b)
    rep = report(ledger, TRACK, b, questions=IN_FORCE)
    ce = cell_of(rep, E.CLEAN_EXIT)
    assert not rep.accepted and ce.stale and "eval_contract" in ce.stale_cause
    assert cell_of(rep, E.FORWARD).accepted  # a scorer change still leaves the numerics alone
    # judged again over the new quality legs, clean exit finds the killed engines
    cover(ledger, t, own, tmp_path, loaded=loaded, identity=b)
    assert cell_of(report(ledger, TRACK, b, questions=IN_FORCE), E.CLEAN_EXIT).verdict == "fail"


def test_after_a_scorer_change_honest_reruns_of_quality_and_clean_exit_are_accepted(track, tmp_path):
    """The negative control of the test above: the same change, honest quality legs, clean exit
    and the artifacts rerun over them; forward, update and throughput of the old candidate still hold."""
    t, ledger = track
    contract = {**t.loaded.manifest.eval_contract.model_dump(mode="json"), "scorer": "tica.scorer.boxed/2"}
    loaded, b = changed_track(t, tmp_path, "scorer", eval_contract=contract)
    record_candidate_change(ledger, loaded, b, dict(t.identity.components))
    own = own_legs(t)
    rerun(ledger, t, E.QUALITY, own, tmp_path, loaded=loaded, identity=b)
    cover(ledger, t, own, tmp_path, loaded=loaded, identity=b)
    rep = report(ledger, TRACK, b, questions=IN_FORCE)
    assert rep.accepted, rep.why_not
    assert cell_of(rep, E.FORWARD).candidate_id == t.identity.candidate_id


def test_every_component_that_voids_a_covered_item_voids_what_covers_it():
    for component, (items, _) in INVALIDATION_MATRIX.items():
        for covering, covered in COVERS.items():
            if set(covered) & set(items):
                assert covering in items, (component, covering)
    # negative control: covering is not everything, backward's legs start no vLLM process
    assert E.BACKWARD not in COVERS[E.CLEAN_EXIT] and E.BACKWARD in COVERS[E.ARTIFACTS]


def test_a_covering_judge_that_misses_a_covered_item_is_inconclusive(track, tmp_path):
    t, ledger = track
    own = own_legs(t)
    up = [leg for covered in COVERS[E.CLEAN_EXIT] if covered is not E.QUALITY for leg in own[covered]]

    def run(question, candidate_id):
        return [LegBatch(legs=honest(E.CLEAN_EXIT, tmp_path / f"ce-{next(_n)}", question, t.candidate))]

    # negative control: given every covered item's legs, clean exit passes
    ok = materialize(ledger, t.loaded, t.identity, E.CLEAN_EXIT, t.questions[E.CLEAN_EXIT], run, up + own[E.QUALITY])
    assert ok.current.cell.verdict is Verdict.PASS
    missing = materialize(ledger, t.loaded, t.identity, E.CLEAN_EXIT, t.questions[E.CLEAN_EXIT], run, up,
                          uncovered=["quality: not materialized yet, so its legs cannot be judged"])
    cell = missing.current.cell
    assert cell.verdict is Verdict.INCONCLUSIVE and "quality: not materialized yet" in cell.reasons[0]
    assert not cell_of(report(ledger, TRACK, t.identity, questions=IN_FORCE), E.CLEAN_EXIT).accepted


def test_the_dagster_layer_names_a_covered_item_missing_or_voided(track, tmp_path):
    """tica_assets.evidence.upstream_legs: a covered item not materialized, or judged for a
    candidate voided since, is a reason (the judge goes inconclusive), not a logged warning."""
    from tica_assets.evidence import upstream_legs

    t, ledger = track
    warnings: list[str] = []
    contract = {**t.loaded.manifest.eval_contract.model_dump(mode="json"), "scorer": "tica.scorer.boxed/2"}
    _, b = changed_track(t, tmp_path, "scorer", eval_contract=contract)

    def context(events: dict[str, object]):
        def latest(key):
            return events.get(key.path[-1])
        return SimpleNamespace(instance=SimpleNamespace(get_latest_materialization_event=latest),
                               log=SimpleNamespace(warning=warnings.append))

    def event(item: EvidenceItem, candidate_id: str):
        meta = {"candidate_id": SimpleNamespace(value=candidate_id),
                "leg_dirs": SimpleNamespace(value=[str(p) for p in t.materialized[item].current.own_legs])}
        return SimpleNamespace(asset_materialization=SimpleNamespace(metadata=meta))

    every = {i.value: event(i, t.identity.candidate_id) for i in COVERS[E.CLEAN_EXIT]}
    legs, uncovered = upstream_legs(context(every), ledger, TRACK, E.CLEAN_EXIT, t.identity)
    assert not uncovered and len(legs) == sum(len(t.materialized[i].current.own_legs) for i in COVERS[E.CLEAN_EXIT])
    legs, uncovered = upstream_legs(context({k: v for k, v in every.items() if k != "update"}), ledger, TRACK,
                                    E.CLEAN_EXIT, t.identity)
    assert uncovered == ["update: not materialized yet, so its legs cannot be judged"]
    legs, uncovered = upstream_legs(context(every), ledger, TRACK, E.CLEAN_EXIT, b)  # quality voided for b
    assert len(uncovered) == 1 and uncovered[0].startswith("quality: ") and "eval_contract" in uncovered[0]
    assert warnings  # and said in the run's log


# ---------------------------------------------------------------------------- C2: the question in force


def test_a_looser_question_after_a_failure_is_never_accepted(track, tmp_path):
    t, ledger = track
    own = own_legs(t)
    strict_fail = rerun(ledger, t, E.QUALITY, own, tmp_path, tamper=bi1_loses_three)
    assert strict_fail.current.cell.verdict is Verdict.FAIL
    lax = question_file(t, tmp_path / "lax", E.QUALITY, threshold_points=20.0)
    questions = {**t.questions, E.QUALITY: lax}
    lax_pass = rerun(ledger, t, E.QUALITY, own, tmp_path, tamper=bi1_loses_three, questions=questions)
    assert lax_pass.current.cell.verdict is Verdict.PASS  # 10 points is under 20
    cover(ledger, t, own, tmp_path, questions=questions)
    # the track still asks the strict question: the lax verdict answers another one
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    q = cell_of(rep, E.QUALITY)
    assert not rep.accepted and q.stale
    assert "judged under question gsm8k-30-greedy-lax" in q.stale_cause and "the track asks question gsm8k-30-greedy (" in q.stale_cause
    # the track adopts the lax question after seeing the result: criteria changed after a result
    rep = report(ledger, TRACK, t.identity, questions=in_force(questions))
    q = cell_of(rep, E.QUALITY)
    assert not rep.accepted and not q.stale and not q.accepted
    assert any(b.startswith("criteria changed after a result: fail verdict " + strict_fail.current.verdict_id)
               for b in q.blocking), q.blocking
    assert [e.relation for e in q.earlier] == [CRITERIA_CHANGED]
    assert "criteria changed after a result" in report_markdown(rep)


def test_a_question_changed_after_passes_only_is_accepted_once_rerun(track, tmp_path):
    """The negative control of the test above, and the rule that the cell answers the question in
    force: the track adopts another question with no non-pass result before it; the old verdict
    is stale until quality is rerun under it (and covered again); then it is accepted."""
    t, ledger = track
    own = own_legs(t)
    v2 = question_file(t, tmp_path / "v2", E.QUALITY, threshold_points=3.4)
    questions = {**t.questions, E.QUALITY: v2}
    rep = report(ledger, TRACK, t.identity, questions=in_force(questions))
    q = cell_of(rep, E.QUALITY)
    assert not rep.accepted and q.stale and "not frozen in this ledger" in q.stale_cause  # not run under it yet
    rerun(ledger, t, E.QUALITY, own, tmp_path, questions=questions)
    cover(ledger, t, own, tmp_path, questions=questions)
    rep = report(ledger, TRACK, t.identity, questions=in_force(questions))
    assert rep.accepted, rep.why_not
    assert not report(ledger, TRACK, t.identity, questions=IN_FORCE).accepted  # nor under the old one now


def test_a_question_file_edited_in_place_takes_acceptance_away(track, tmp_path):
    t, ledger = track
    assert report(ledger, TRACK, t.identity, questions=IN_FORCE).accepted  # negative control
    path = tmp_path / "quality.yaml"
    data = yaml.safe_load(t.questions[E.QUALITY].read_text())
    data["criteria"]["threshold_points"] = 50.0
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(FrozenQuestionError):  # no verdict can be recorded under it
        mat(ledger, t, E.QUALITY, tmp_path, questions={**t.questions, E.QUALITY: path})
    rep = report(ledger, TRACK, t.identity, questions={**IN_FORCE, E.QUALITY: load_question(path).hash})
    q = cell_of(rep, E.QUALITY)
    assert not rep.accepted and q.stale and "the track asks a question not frozen in this ledger" in q.stale_cause


def test_a_verdict_under_a_new_question_is_never_linked_as_a_rerun(track, tmp_path):
    t, ledger = track
    own = own_legs(t)
    fail = rerun(ledger, t, E.QUALITY, own, tmp_path, tamper=bi1_loses_three)
    # negative control: a rerun under the same question is linked to the failure it reruns
    again = rerun(ledger, t, E.QUALITY, own, tmp_path)
    assert ledger.rows("SELECT original_id FROM reruns WHERE new_id = ?", [again.current.verdict_id]) == [
        {"original_id": fail.current.verdict_id}]
    lax = question_file(t, tmp_path / "lax", E.QUALITY, threshold_points=20.0)
    other = rerun(ledger, t, E.QUALITY, own, tmp_path, questions={**t.questions, E.QUALITY: lax})
    vid = other.current.verdict_id
    assert ledger.rows("SELECT rerun_of FROM verdicts WHERE verdict_id = ?", [vid]) == [{"rerun_of": None}]
    assert ledger.rows("SELECT * FROM reruns WHERE new_id = ?", [vid]) == []
    # and the report says the criteria changed after the failure
    q = cell_of(report(ledger, TRACK, t.identity, questions={**IN_FORCE, E.QUALITY: load_question(lax).hash}), E.QUALITY)
    assert q.verdict_id == vid and not q.accepted
    assert [(e.verdict_id, e.relation) for e in q.earlier] == [(fail.current.verdict_id, CRITERIA_CHANGED)]


def test_without_the_question_in_force_no_cell_is_accepted(track):
    t, ledger = track
    assert report(ledger, TRACK, t.identity, questions=IN_FORCE).accepted  # negative control
    rep = report(ledger, TRACK, t.identity)
    assert not rep.accepted and all(not c.accepted and any("not known" in b for b in c.blocking) for c in rep.cells)
    rep = report(ledger, TRACK, t.identity, questions={k: v for k, v in IN_FORCE.items() if k is not E.UPDATE})
    assert [c.item for c in rep.cells if not c.accepted] == [E.UPDATE]
    assert cell_of(rep, E.UPDATE).blocking == ("the track asks no question for update now",)


# ---------------------------------------------------------------------------- C3: one track's verdicts


def test_verdicts_of_one_track_never_count_for_another(track, tmp_path):
    t, ledger = track
    assert report(ledger, TRACK, t.identity, questions=IN_FORCE).accepted  # negative control
    own = own_legs(t)
    fail = rerun(ledger, t, E.QUALITY, own, tmp_path, tamper=bi1_loses_three)
    # another track whose manifest resolves to the same components, with its own (laxer) question
    other_path = write_manifest(tmp_path / "lax-track", manifest_data(track="false-pass-lax"))
    loaded = load_manifest(other_path)
    lax_id = identify(loaded)
    assert lax_id.components == t.identity.components and lax_id.candidate_id != t.identity.candidate_id
    lax = question_file(t, tmp_path / "lax", E.QUALITY, threshold_points=20.0)
    lax_run = mat(ledger, t, E.QUALITY, tmp_path, loaded=loaded, identity=lax_id,
                  questions={**t.questions, E.QUALITY: lax}, tamper=bi1_loses_three)
    assert lax_run.current.cell.verdict is Verdict.PASS and lax_run.candidate_id == lax_id.candidate_id
    strict = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    q = cell_of(strict, E.QUALITY)
    assert not strict.accepted and q.verdict_id == fail.current.verdict_id and q.verdict == "fail"
    assert all(c.candidate_id in (None, t.identity.candidate_id) for c in strict.cells)
    assert {e.candidate_id for c in strict.cells for e in c.earlier} <= {t.identity.candidate_id}
    other = report(ledger, "false-pass-lax", lax_id, questions={**IN_FORCE, E.QUALITY: load_question(lax).hash})
    assert cell_of(other, E.QUALITY).verdict_id == lax_run.current.verdict_id
    assert [c.item for c in other.cells if c.verdict_id is not None] == [E.QUALITY]  # only its own verdicts
    tracks = {r["candidate_id"]: r["track"] for r in ledger.rows("SELECT candidate_id, track FROM candidate_tracks")}
    assert tracks[t.identity.candidate_id] == TRACK and tracks[lax_id.candidate_id] == "false-pass-lax"


# ---------------------------------------------------------------------------- N1: earlier verdicts and own verdicts


def test_an_earlier_failure_is_shown_after_its_passing_rerun(track, tmp_path):
    t, ledger = track
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    assert rep.accepted and rep.numbers["earlier_non_pass_count"] == 0  # negative control
    own = own_legs(t)
    fail = rerun(ledger, t, E.QUALITY, own, tmp_path, tamper=bi1_loses_three)
    rerun(ledger, t, E.QUALITY, own, tmp_path)
    cover(ledger, t, own, tmp_path)
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    assert rep.accepted, rep.why_not  # a rerun under the same question is allowed: appended, linked, shown
    q = cell_of(rep, E.QUALITY)
    assert [(e.verdict_id, e.verdict, e.relation) for e in q.earlier] == [(fail.current.verdict_id, "fail", RERUN_SINCE)]
    assert rep.numbers["earlier_non_pass_count"] == 1
    assert rep.numbers["earlier_non_pass"]["quality"][0]["verdict_id"] == fail.current.verdict_id
    md = report_markdown(rep)
    assert "Earlier non-pass verdicts" in md and fail.current.verdict_id in md


def test_the_candidates_own_verdict_wins_over_a_newer_one_for_another_candidate(track, tmp_path):
    """B is A with another workload (quality evidence of A holds for B). B's own quality fails;
    a quality pass for A recorded later (a run started before the manifest changed) is not B's cell."""
    t, ledger = track
    workload = {**t.loaded.manifest.workload.model_dump(mode="json"), "output_len": 512}
    loaded, b = changed_track(t, tmp_path, "workload", workload=workload)
    # negative control: with nothing of B's own, A's quality verdict holds for B
    assert cell_of(report(ledger, TRACK, b, questions=IN_FORCE), E.QUALITY).accepted
    b_fail = mat(ledger, t, E.QUALITY, tmp_path, loaded=loaded, identity=b, tamper=bi1_loses_three)
    a_pass = mat(ledger, t, E.QUALITY, tmp_path)
    assert a_pass.current.cell.verdict is Verdict.PASS
    q = cell_of(report(ledger, TRACK, b, questions=IN_FORCE), E.QUALITY)
    assert q.verdict_id == b_fail.current.verdict_id and q.verdict == "fail" and not q.accepted
    # B's own passing rerun is its cell again, and its earlier failure is shown
    b_pass = mat(ledger, t, E.QUALITY, tmp_path, loaded=loaded, identity=b)
    q = cell_of(report(ledger, TRACK, b, questions=IN_FORCE), E.QUALITY)
    assert q.verdict_id == b_pass.current.verdict_id and q.accepted
    assert [e.verdict_id for e in q.earlier] == [b_fail.current.verdict_id]


def test_a_newer_failure_for_another_candidate_that_holds_blocks_the_own_pass(track, tmp_path):
    t, ledger = track
    workload = {**t.loaded.manifest.workload.model_dump(mode="json"), "output_len": 512}
    loaded, b = changed_track(t, tmp_path, "workload", workload=workload)
    b_pass = mat(ledger, t, E.QUALITY, tmp_path, loaded=loaded, identity=b)
    q = cell_of(report(ledger, TRACK, b, questions=IN_FORCE), E.QUALITY)
    assert q.verdict_id == b_pass.current.verdict_id and q.accepted  # negative control
    a_fail = mat(ledger, t, E.QUALITY, tmp_path, tamper=bi1_loses_three)
    q = cell_of(report(ledger, TRACK, b, questions=IN_FORCE), E.QUALITY)
    assert q.verdict_id == b_pass.current.verdict_id and not q.accepted
    assert [(e.verdict_id, e.relation) for e in q.earlier] == [(a_fail.current.verdict_id, NEWER_OTHER)]
    assert any(a_fail.current.verdict_id in b for b in q.blocking), q.blocking


# ---------------------------------------------------------------------------- N2 / N3: checks


@pytest.mark.parametrize("item, name", [(E.QUALITY, checks.QUALITY_SUMS), (E.THROUGHPUT, checks.WORKLOAD)])
def test_a_pass_without_a_check_its_item_requires_is_not_accepted(item, name, track):
    t, ledger = track
    assert name in checks.REQUIRED[item]
    judged = t.materialized[item].current
    # negative control: the same verdict with every check it carried is accepted
    record_verdict(ledger, t.identity.candidate_id, judged.cell, rerun_of=judged.verdict_id, checks=judged.checks)
    assert report(ledger, TRACK, t.identity, questions=IN_FORCE).accepted
    record_verdict(ledger, t.identity.candidate_id, judged.cell, rerun_of=judged.verdict_id,
                   checks=[c for c in judged.checks if c.name != name])
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    cell = cell_of(rep, item)
    assert not rep.accepted and cell.shown == "pass, checks missing" and cell.missing_checks == (name,)
    assert any(w.startswith(f"{item.value}: pass, checks missing") and name in w for w in rep.why_not), rep.why_not


def test_a_pass_with_none_of_its_checks_is_not_shown_clean(track):
    t, ledger = track
    assert cell_of(report(ledger, TRACK, t.identity, questions=IN_FORCE), E.BACKWARD).shown == "pass"  # control
    judged = t.materialized[E.BACKWARD].current
    record_verdict(ledger, t.identity.candidate_id, judged.cell, rerun_of=judged.verdict_id, checks=())
    rep = report(ledger, TRACK, t.identity, questions=IN_FORCE)
    cell = cell_of(rep, E.BACKWARD)
    assert cell.shown == "pass, checks missing" and cell.missing_checks == checks.REQUIRED[E.BACKWARD]
    assert "backward: pass, checks missing" in " ".join(rep.why_not)
    assert "pass, checks missing" in report_markdown(rep)


# ---------------------------------------------------------------------------- S1: the report's anchor


def test_the_reports_anchor_holds_when_the_same_ledger_is_named_another_way(track, tmp_path, monkeypatch):
    from tica_assets.report import _last_verified, ledger_key

    t, ledger = track
    head = ledger.verify().head
    warnings: list[str] = []

    def context(recorded: str):
        meta = {"verified_head": SimpleNamespace(data={"ledger": recorded, **json.loads(head.to_json())})}
        event = SimpleNamespace(asset_materialization=SimpleNamespace(metadata=meta))
        return SimpleNamespace(instance=SimpleNamespace(get_latest_materialization_event=lambda key: event),
                               asset_key=None, log=SimpleNamespace(warning=warnings.append))

    link = tmp_path / "linked.duckdb"
    os.symlink(ledger.path, link)
    monkeypatch.chdir(ledger.path.parent)
    key = ledger_key(ledger)
    for spelled in (str(ledger.path), ledger.path.name, f"./{ledger.path.name}", str(link),
                    str(ledger.path.parent / ".." / ledger.path.parent.name / ledger.path.name)):
        assert _last_verified(context(spelled), key) == head, spelled
        assert _last_verified(context(key), ledger_key(Ledger(spelled))) == head, spelled
    assert not warnings
    # negative control: another ledger is anchored anew, and says so
    other = tmp_path / "other.duckdb"
    shutil.copy2(ledger.path, other)
    assert _last_verified(context(str(other)), key) is None and warnings
    # Postgres: the address without its password names the ledger
    pg = SimpleNamespace(dsn="postgresql://tica:secret@db/tica", path="postgresql://tica:***@db/tica")
    assert ledger_key(pg) == "postgresql://tica:***@db/tica"
    assert _last_verified(context("postgresql://tica:***@db/tica"), ledger_key(pg)) == head
    assert _last_verified(context("postgresql://tica:***@db2/tica"), ledger_key(pg)) is None
    # what the anchor is for: a ledger that no longer holds the head is refused however it is named
    import duckdb

    last = ledger.rows("SELECT tbl, seq FROM ledger_chain ORDER BY seq DESC LIMIT 1")[0]
    con = duckdb.connect(str(ledger.path))
    con.execute(f"DELETE FROM {last['tbl']} WHERE seq = ?", [last["seq"]])
    con.close()
    anchor = _last_verified(context(ledger.path.name), ledger_key(Ledger(link)))
    with pytest.raises(LedgerIntegrityError):
        report(Ledger(link), TRACK, t.identity, questions=IN_FORCE, last_verified=anchor)


# ---------------------------------------------------------------------------- issue 28: no stale evidence revived


def test_receipts_another_candidate_made_are_not_revived_by_rejudging_under_an_edited_manifest(track, tmp_path):
    """The MoE backend is pinned but no receipt records it, so binding alone cannot tell: the
    forward legs the ledger recorded for the old candidate, judged again for the new one, would
    pass. The ledger knows whose they were."""
    t, ledger = track
    own = own_legs(t)
    backends = {**t.loaded.manifest.backends.model_dump(mode="json"), "moe": "triton (fused_moe, batch invariant)"}
    loaded, b = changed_track(t, tmp_path, "moe", backends=backends)
    assert b.candidate_id != t.identity.candidate_id
    again = mat(ledger, t, E.FORWARD, tmp_path, loaded=loaded, identity=b, legs=own[E.FORWARD])
    assert_no_pass_cell(again.current.cell, "first recorded for")
    # control: fresh legs for the new candidate pass
    fresh = mat(ledger, t, E.FORWARD, tmp_path, loaded=loaded, identity=b)
    assert fresh.current.cell.verdict is Verdict.PASS, fresh.current.cell.reasons


def assert_no_pass_cell(cell, text):
    assert cell.verdict is not Verdict.PASS, cell.reasons
    assert any(text in r for r in cell.reasons), cell.reasons
