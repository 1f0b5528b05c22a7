"""Verdicts, invalidations and reruns in the ledger views: stale is shown as stale."""

from __future__ import annotations

import copy
import json

from tests.core.conftest import write_manifest
from tica.candidate import diff, identify
from tica.evidence import EvidenceItem
from tica.ledger import Ledger
from tica.manifest import load_manifest
from tica.records import record_candidate, record_invalidations, record_verdict
from tica.verdict import Verdict, VerdictCell


def _cell(item: EvidenceItem, verdict: Verdict = Verdict.PASS) -> VerdictCell:
    return VerdictCell(item=item, verdict=verdict, summary=f"{item.value} {verdict.value}", question_hash="sha256:q")


def _setup(tmp_path, candidate_dir, manifest_data):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    old_loaded = load_manifest(write_manifest(candidate_dir, manifest_data, "track.yaml"))
    old = identify(old_loaded)
    cid = record_candidate(ledger, old, old_loaded)
    ids = {item: record_verdict(ledger, cid, _cell(item)) for item in EvidenceItem}
    return ledger, old, ids


def test_a_scorer_change_makes_only_quality_clean_exit_and_artifacts_stale(tmp_path, candidate_dir, manifest_data):
    # clean exit too: the quality legs rerun under the new contract start new servers, whose exits
    # are checked again (tica.evidence.INVALIDATION_MATRIX, as for a workload change)
    ledger, old, ids = _setup(tmp_path, candidate_dir, manifest_data)
    changed = copy.deepcopy(manifest_data)
    changed["eval_contract"]["scorer"] = "math-verify==0.9.0"
    new_loaded = load_manifest(write_manifest(candidate_dir, changed, "track.yaml"))
    new = identify(new_loaded)
    record_candidate(ledger, new, new_loaded)
    record_invalidations(ledger, old, new, diff(old, new))
    stale = {r["item"]: r for r in ledger.rows("SELECT * FROM stale_evidence")}
    assert set(stale) == {"quality", "clean_exit", "artifacts"}
    assert stale["quality"]["stale_cause"].startswith("eval_contract: eval_contract sha256:")
    voided = ledger.rows("SELECT voided_verdict_ids_json FROM invalidations WHERE item = 'quality'")
    assert ids[EvidenceItem.QUALITY] in voided[0]["voided_verdict_ids_json"]
    fresh = {r["item"] for r in ledger.rows("SELECT item FROM track_verdicts WHERE NOT stale")}
    assert fresh == {"forward", "backward", "update", "throughput"}


def test_a_rerun_is_appended_and_linked_never_replacing_the_failure(tmp_path, candidate_dir, manifest_data):
    ledger, old, ids = _setup(tmp_path, candidate_dir, manifest_data)
    failed = record_verdict(ledger, old.candidate_id, _cell(EvidenceItem.THROUGHPUT, Verdict.FAIL))
    rerun = record_verdict(ledger, old.candidate_id, _cell(EvidenceItem.THROUGHPUT), rerun_of=failed)
    history = ledger.rows("SELECT verdict_id, verdict FROM verdict_history WHERE item = 'throughput' ORDER BY seq")
    assert [h["verdict"] for h in history] == ["pass", "fail", "pass"]
    assert ledger.rows("SELECT original_id, new_id FROM reruns") == [{"original_id": failed, "new_id": rerun}]
    current = ledger.rows("SELECT verdict_id FROM track_verdicts WHERE item = 'throughput'")
    assert current == [{"verdict_id": rerun}]
    assert ledger.verify().ok


def test_a_verdict_judged_on_the_new_candidate_before_the_invalidation_is_not_stale(
    tmp_path, candidate_dir, manifest_data
):
    ledger, old, _ = _setup(tmp_path, candidate_dir, manifest_data)
    changed = copy.deepcopy(manifest_data)
    changed["workload"]["output_len"] = 32
    new_loaded = load_manifest(write_manifest(candidate_dir, changed, "track.yaml"))
    new = identify(new_loaded)
    record_candidate(ledger, new, new_loaded)
    record_verdict(ledger, new.candidate_id, _cell(EvidenceItem.THROUGHPUT))  # judged before the sensor ticked
    record_invalidations(ledger, old, new, diff(old, new))
    stale = {r["item"] for r in ledger.rows("SELECT item FROM track_verdicts WHERE stale")}
    assert "throughput" not in stale and {"clean_exit", "artifacts"} <= stale


def _leg(tmp_path):
    from tica.seal import seal_leg

    leg = tmp_path / "leg"
    leg.mkdir()
    (leg / "leg.json").write_text('{"item": "forward", "arm": "bi1"}')
    (leg / "metrics.jsonl").write_text('{"step": 1}\n')
    seal_leg(leg)
    return leg


def _recorded(tmp_path, leg):
    from tica.canaries import default_questions
    from tica.records import record_leg

    ledger = Ledger(tmp_path / "l.duckdb").init()
    q = default_questions()[EvidenceItem.FORWARD]
    leg_id = record_leg(ledger, "cand", q, leg, {"arm": "bi1"}, "ran")
    receipts = ledger.rows("SELECT path FROM receipts WHERE leg_id = ? ORDER BY path", [leg_id])
    detail = ledger.rows("SELECT detail_json FROM legs WHERE leg_id = ?", [leg_id])[0]["detail_json"]
    return [r["path"] for r in receipts], json.loads(detail) if isinstance(detail, str) else detail


def test_a_seal_naming_a_file_outside_its_leg_records_no_receipt_and_names_the_problem(tmp_path):
    """Issue 32: record_leg wrote a receipt row for `../../etc/passwd` a seal named. Only a seal
    that verifies whole names files; the control, the same leg sealed honestly, records both."""
    leg = _leg(tmp_path)
    assert _recorded(tmp_path / "a", leg)[0] == ["leg.json", "metrics.jsonl"]  # control
    seal = json.loads((leg / "seal.json").read_text())
    seal["files"]["../../etc/passwd"] = "0" * 64
    (leg / "seal.json").write_text(json.dumps(seal))
    paths, detail = _recorded(tmp_path / "b", leg)
    assert paths == [] and "passwd" in json.dumps(detail["seal_problems"]) and detail["seal"] is None


def test_an_unreadable_seal_is_recorded_as_its_problem_not_raised(tmp_path):
    leg = _leg(tmp_path)
    (leg / "seal.json").write_text('{"files": {"leg.json": "a", "leg.json": "b"}}')
    paths, detail = _recorded(tmp_path / "c", leg)
    assert paths == [] and "unreadable seal" in detail["seal_problems"][0]
