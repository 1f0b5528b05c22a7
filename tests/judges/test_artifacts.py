"""Final immutable artifacts: sealed receipts, unchanged, weights named by content hash."""

from __future__ import annotations

from tica.canaries import edit_meta
from tica.judges import judge_criteria
from tica.verdict import Verdict

from .conftest import leg, question

Q = question("artifacts")


def _legs(receipts):
    return receipts("forward") + receipts("update") + receipts("quality")


def test_sealed_receipts_with_hashed_weights_pass(receipts):
    cell = judge_criteria("artifacts", Q, _legs(receipts))
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert len(cell.receipt_hashes) == 5 and len(cell.numbers["weights"]) == 1


def test_a_file_changed_after_sealing_fails(receipts):
    legs = _legs(receipts)
    p = leg(legs, "quality_bi0") / "results.jsonl"
    p.write_text(p.read_text().replace('"correct": false', '"correct": true', 1))
    cell = judge_criteria("artifacts", Q, legs)
    assert cell.verdict is Verdict.FAIL and "changed after sealing" in cell.reasons[0]


def test_a_file_added_after_sealing_fails(receipts):
    legs = _legs(receipts)
    (leg(legs, "forward_bi0") / "notes.txt").write_text("rerun with PC on")
    assert judge_criteria("artifacts", Q, legs).verdict is Verdict.FAIL


def test_weights_named_by_a_model_name_fail(receipts):
    legs = _legs(receipts)
    edit_meta(leg(legs, "quality_bi1"), lambda m: m["resolved_config"].update(weights_hash="Qwen/Qwen3-8B"))
    assert judge_criteria("artifacts", Q, legs).verdict is Verdict.FAIL
    assert judge_criteria("artifacts", question("artifacts", require_weights_hash=False), legs).verdict is Verdict.PASS


def test_legs_of_one_candidate_on_different_weights_fail(receipts):
    legs = _legs(receipts)
    edit_meta(leg(legs, "quality_bi1"), lambda m: m["resolved_config"].update(weights_hash="blake3:" + "ab" * 32))
    assert judge_criteria("artifacts", Q, legs).verdict is Verdict.FAIL
