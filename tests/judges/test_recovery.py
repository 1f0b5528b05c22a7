"""Recovery checker: versioned apart, re-reads the same sealed receipts, keeps the original
status, cannot turn a real failure or a missing value into a pass."""

from __future__ import annotations

from tica.canaries import tput_leg, edit_meta
from tica.judges import judge_criteria
from tica.judges.recovery import RECOVERY_VERSION, recover
from tica.verdict import Verdict

from .conftest import throughput_question

Q = throughput_question()  # with a basis: the untouched set passes


def _as_old_parser_saw_it(cell, verdict):
    return cell.model_copy(update={"verdict": verdict, "judge_version": "tica.judges/1+0ld0ld0ld0ld0ld0"})


def test_a_misparsed_cell_is_corrected_and_the_original_status_kept(receipts):
    legs = receipts("throughput")
    old = _as_old_parser_saw_it(judge_criteria("throughput", Q, legs), Verdict.FAIL)
    rec = recover(old, Q, legs)
    assert rec.refused is None and rec.control_plane_verdict is Verdict.PASS
    assert rec.original_verdict is Verdict.FAIL and rec.original_failure_kept
    assert rec.recovery_version.startswith("tica.recovery/1+") and rec.recovery_version == RECOVERY_VERSION


def test_recovery_cannot_fill_in_a_missing_value(receipts):
    legs = receipts("throughput")
    edit_meta(tput_leg(legs, "bi0", 8, 1), lambda m: m["resolved_config"].pop("num_warmups"))
    old = _as_old_parser_saw_it(judge_criteria("throughput", Q, legs), Verdict.FAIL)
    rec = recover(old, Q, legs)
    assert rec.control_plane_verdict is Verdict.INCONCLUSIVE


def test_recovery_refuses_other_receipts(receipts):
    legs = receipts("throughput")
    old = _as_old_parser_saw_it(judge_criteria("throughput", Q, legs), Verdict.FAIL)
    edit_meta(tput_leg(legs, "bi0", 8, 1), lambda m: m.update(ended_at="2026-11-29T12:00:00+00:00"))
    rec = recover(old, Q, legs)
    assert rec.refused and rec.control_plane_verdict is Verdict.FAIL


def test_recovery_refuses_a_changed_question(receipts):
    legs = receipts("throughput")
    old = _as_old_parser_saw_it(judge_criteria("throughput", Q, legs), Verdict.FAIL)
    rec = recover(old, throughput_question(tier_ratio=1.5), legs)
    assert rec.refused and "new question" in rec.refused and rec.control_plane_verdict is Verdict.FAIL


def test_recovery_with_an_unchanged_judge_is_refused(receipts):
    legs = receipts("throughput")
    cell = judge_criteria("throughput", Q, legs)
    assert recover(cell, Q, legs).refused
