"""Acceptance through the graph with the real core (judges, binding, canaries, checks): what the
report accepts, and what it must not.

Receipts written when the materialization asks (after the question is frozen) and recording the
candidate are accepted; a blocking check that fails afterwards takes acceptance away; receipts
sealed before the question was frozen are judged after the fact and never accepted."""

from __future__ import annotations

import copy

import yaml
from dagster_project import MANIFEST, TRACK, fresh_defs
from dagster_helpers import build_defs, kept_instance, materialize_track, tick

from tica.acceptance import report
from tica.candidate import identify
from tica.evidence import EvidenceItem
from tica.ledger import Ledger
from tica.manifest import load_manifest
from tica_assets.keys import evidence_key, report_key
from tica_assets.settings import PROJECT_ROOT, Settings

FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "receipts"


def report_meta(instance, track: str = TRACK) -> dict:
    return instance.get_latest_materialization_event(report_key(track)).asset_materialization.metadata


def test_receipts_bound_to_the_candidate_and_frozen_before_are_accepted(project, tmp_path):
    defs = fresh_defs(project)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    result = materialize_track(defs, instance, TRACK)
    assert result.success
    checks = {(e.asset_key.path[-1], e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    failed = {k for k, ok in checks.items() if not ok}  # workload_receipts included: acceptance requires it
    assert not failed, failed
    assert report_meta(instance)["acceptance"].value == "accepted"
    ledger = Ledger(project.settings.ledger_path)
    rows = ledger.rows("SELECT item, verdict, failed_checks, after_the_fact FROM track_verdicts")
    assert {r["item"]: r["verdict"] for r in rows} == {i.value: "pass" for i in EvidenceItem}
    assert not any(r["failed_checks"] or r["after_the_fact"] for r in rows)
    assert ledger.rows("SELECT count(*) AS n FROM checks")[0]["n"] >= 3 * len(EvidenceItem)


def test_the_report_asks_the_question_in_force_and_clean_exit_covers_what_ran(project, tmp_path):
    """Clean exit materialized before the legs it covers is inconclusive (never a pass over the
    legs that were there); a question file edited in place (the track asks another question now,
    which no verdict answers) makes the report's cell stale, naming both questions."""
    defs = fresh_defs(project)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    materialize_track(defs, instance, TRACK, keys=[evidence_key(TRACK, EvidenceItem.CLEAN_EXIT)])
    ledger = Ledger(project.settings.ledger_path)
    first = ledger.rows("SELECT verdict, summary FROM verdicts WHERE item = 'clean_exit'")
    assert [r["verdict"] for r in first] == ["inconclusive"] and "not materialized yet" in first[0]["summary"], first
    materialize_track(defs, instance, TRACK)
    assert report_meta(instance)["cell: quality"].value == "pass"  # negative control
    path = project.settings.questions_dir / "quality.yaml"
    data = yaml.safe_load(path.read_text())
    data["criteria"]["threshold_points"] = 50.0
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert materialize_track(defs, instance, TRACK, job="report").success
    meta = report_meta(instance)
    cell = meta["cell: quality"].value
    assert cell.startswith("stale (was pass) (judged under question test-quality/1 (sha256:"), cell
    assert "the track asks a question not frozen in this ledger (sha256:" in cell, cell
    assert meta["acceptance"].value.startswith("not accepted")
    assert meta["questions_in_force"].value["quality"] != ledger.rows(
        "SELECT question_hash FROM verdicts WHERE item = 'quality' ORDER BY seq DESC LIMIT 1")[0]["question_hash"]


def test_the_report_is_not_accepted_after_a_blocking_check_fails(project, tmp_path, monkeypatch):
    """Issue 10, finding 2: break every canary, re-materialize forward (its check fails, the run
    fails), run the report job alone: not accepted, naming the check."""
    defs = fresh_defs(project)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    assert materialize_track(defs, instance, TRACK).success
    assert report_meta(instance)["acceptance"].value == "accepted"

    import tica.canaries

    real = tica.canaries.run_canaries
    monkeypatch.setattr(tica.canaries, "run_canaries", lambda **kw: [
        r.model_copy(update={"broken": True, "got": "pass"}) for r in real(**kw)])
    forward = materialize_track(defs, instance, TRACK, keys=[evidence_key(TRACK, EvidenceItem.FORWARD)])
    assert not forward.success
    assert materialize_track(defs, instance, TRACK, job="report").success
    acceptance = report_meta(instance)["acceptance"].value
    assert acceptance.startswith("not accepted") and "canaries_caught" in acceptance, acceptance
    assert report_meta(instance)["cell: forward"].value.startswith("pass, not accepted")


def test_receipts_sealed_before_the_question_was_frozen_are_judged_after_the_fact(tmp_path, monkeypatch):
    """The committed H200-shaped receipts (tests/fixtures/receipts), replayed: every cell is
    judged after the fact (its legs started before the question was frozen in this ledger) and the
    report is not accepted, whatever the criteria say."""
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "cache"))
    track = "h200-replay"
    candidates = tmp_path / "candidates"
    (candidates / "ckpt").mkdir(parents=True)
    (candidates / "ckpt" / "model.safetensors").write_bytes(b"h200 weights" * 16)
    manifest = copy.deepcopy(MANIFEST) | {"track": track}
    manifest["hardware"] = {"accelerator": "NVIDIA H200", "count_per_node": 1}
    manifest["workload"] = {"input_len": 8192, "output_len": 1024, "concurrencies": [1, 8, 32, 64], "num_prompts": 8}
    (candidates / f"{track}.yaml").write_text(yaml.safe_dump(manifest))
    settings = Settings(candidates_dir=candidates, questions_dir=FIXTURES / "questions",
                        ledger_path=tmp_path / "ledger.duckdb", data_dir=tmp_path / "data", replay={track: FIXTURES})
    defs = build_defs(settings)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    assert materialize_track(defs, instance, track).success  # after the fact is a verdict, not a crash
    meta = report_meta(instance, track)
    assert meta["acceptance"].value.startswith("not accepted")
    ledger = Ledger(settings.ledger_path)
    late = {r["item"] for r in ledger.rows("SELECT item FROM after_the_fact_verdicts")}
    assert late == {i.value for i in EvidenceItem}
    rep = report(ledger, track, identify(load_manifest(candidates / f"{track}.yaml")))
    assert not rep.accepted and all(c.after_the_fact for c in rep.cells)
    assert all(not c.accepted for c in rep.cells)


def test_a_report_refuses_a_ledger_truncated_since_the_previous_report(project, tmp_path):
    """Issue 11, the anchor: each report records the head it verified, and the next report
    refuses a ledger that no longer holds it, even when the truncated chain verifies on its own."""
    import duckdb

    defs = fresh_defs(project)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    assert materialize_track(defs, instance, TRACK).success
    head = report_meta(instance)["verified_head"].value
    assert materialize_track(defs, instance, TRACK, job="report").success  # negative control: untouched, reported
    ledger = Ledger(project.settings.ledger_path)
    last = ledger.rows("SELECT tbl, seq FROM ledger_chain ORDER BY seq DESC LIMIT 1")[0]
    assert last["seq"] == head["seq"]
    con = duckdb.connect(str(ledger.path))
    con.execute(f"DELETE FROM {last['tbl']} WHERE seq = ?", [last["seq"]])
    con.close()
    assert ledger.verify().ok  # the truncated chain is self-consistent
    result = materialize_track(defs, instance, TRACK, job="report")
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error
    assert "gone" in str(failure.cause or failure.message), failure


def test_the_throughput_cell_shows_per_round_loss_and_the_plan_curve(project, tmp_path):
    defs = fresh_defs(project)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    assert materialize_track(defs, instance, TRACK).success
    meta = instance.get_latest_materialization_event(
        evidence_key(TRACK, EvidenceItem.THROUGHPUT)).asset_materialization.metadata
    for name in ("plot: per-round loss", "plot: plan curve"):
        assert meta[name].value.startswith(f"![{name[6:]}](data:image/png;base64,"), name
    forward = instance.get_latest_materialization_event(
        evidence_key(TRACK, EvidenceItem.FORWARD)).asset_materialization.metadata
    assert "plot: per-round loss" not in forward  # negative control: only throughput has rounds
