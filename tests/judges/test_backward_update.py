"""Backward and update: finite gradients reaching the master weights; a grad norm of exactly 0
is checked against within-group rewards before it is a fault; the forward is re-checked on the
updated weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tica.canaries import as_bi0, drop_post_update_step, edit_jsonl, edit_meta, perturb_arrays, shift_post_forward
from tica.judges import judge_criteria
from tica.seal import seal_leg
from tica.verdict import Verdict

from .conftest import leg, question

QB = question("backward")
QU = question("update")


def _set(p, i, **kv):
    edit_jsonl(p / "metrics.jsonl", lambda rows: rows[i].update(kv), p)


def test_finite_gradients_reaching_every_master_param_pass(receipts):
    cell = judge_criteria("backward", QB, receipts("backward"))
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert all(s["reading"] == "gradient reaches weights" for l in cell.numbers["legs"] for s in l["steps"])


def test_non_finite_grad_norm_fails(receipts):
    legs = receipts("backward")
    _set(leg(legs, "bi0"), 0, **{"actor/grad_norm": float("inf")})
    assert judge_criteria("backward", QB, legs).verdict is Verdict.FAIL


def test_gradients_missing_from_some_master_params_fail(receipts):
    legs = receipts("backward")
    _set(leg(legs, "bi1"), 2, params_with_grad=23, params_nonzero_grad=23)
    cell = judge_criteria("backward", QB, legs)
    assert cell.verdict is Verdict.FAIL and "23 of 24" in cell.reasons[0]
    # control: a question that accepts 90% coverage passes the same receipts
    assert judge_criteria("backward", question("backward", min_params_with_grad_fraction=0.9), legs).verdict is Verdict.PASS


def test_zero_grad_norm_with_varied_group_rewards_is_a_fault(receipts):
    legs = receipts("backward")
    _set(leg(legs, "bi1"), 1, **{"actor/grad_norm": 0.0})
    cell = judge_criteria("backward", QB, legs)
    assert cell.verdict is Verdict.FAIL and "numerical fault" in cell.reasons[0]


def test_zero_grad_norm_with_equal_group_rewards_is_zero_advantage_not_a_fault(receipts):
    legs = receipts("backward")
    _set(leg(legs, "bi1"), 1, **{"actor/grad_norm": 0.0, "within_group_rewards": [[1, 1, 1, 1], [0, 0, 0, 0]]})
    cell = judge_criteria("backward", QB, legs)
    assert cell.verdict is Verdict.PASS
    assert any("advantage 0" in r for r in cell.reasons)


def test_zero_grad_norm_without_rewards_cannot_be_called_either_way(receipts):
    legs = receipts("backward")
    _set(leg(legs, "bi1"), 1, **{"actor/grad_norm": 0.0, "within_group_rewards": None})
    assert judge_criteria("backward", QB, legs).verdict is Verdict.INCONCLUSIVE


def test_only_zero_advantage_steps_show_nothing_about_gradients(receipts):
    legs = receipts("backward")
    p = leg(legs, "bi1")
    edit_jsonl(p / "metrics.jsonl", lambda rows: [dict(r, **{"actor/grad_norm": 0.0, "within_group_rewards": [[1, 1]]})
                                                  for r in rows], p)
    assert judge_criteria("backward", QB, legs).verdict is Verdict.INCONCLUSIVE


def test_forward_not_on_deployed_bytes_fails(receipts):
    legs = receipts("backward")
    _set(leg(legs, "bi0"), 0, deployed_bytes_equal=False)
    assert judge_criteria("backward", QB, legs).verdict is Verdict.FAIL


def test_quantized_weights_without_the_deployed_bytes_check_are_inconclusive(receipts):
    legs = receipts("backward")
    p = leg(legs, "bi0")
    edit_jsonl(p / "metrics.jsonl", lambda rows: [dict(r, deployed_bytes_equal=None) for r in rows], p)
    assert judge_criteria("backward", QB, legs).verdict is Verdict.PASS  # unquantified: nothing to check
    edit_meta(p, lambda m: m["resolved_config"].update(quantization="nvfp4"))
    assert judge_criteria("backward", QB, legs).verdict is Verdict.INCONCLUSIVE


def test_real_update_passes(receipts):
    cell = judge_criteria("update", QU, receipts("update"))
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert cell.numbers["legs"][0]["post_forward"]["verdict"] == "pass"
    assert any(t.startswith("post-update forward") for t in cell.tables)


def test_update_that_changes_no_weights_fails(receipts):
    legs = receipts("update")
    _set(legs[0], 0, weights_changed_tensors=3)
    assert judge_criteria("update", QU, legs).verdict is Verdict.FAIL


def test_rollout_not_reloading_the_weights_fails(receipts):
    legs = receipts("update")
    _set(legs[0], 0, reloaded_by_rollout=False)
    assert judge_criteria("update", QU, legs).verdict is Verdict.FAIL


def test_post_update_forward_not_bitwise_fails(receipts):
    legs = receipts("update")
    perturb_arrays(legs[0], 1, "post_forward")
    assert judge_criteria("update", QU, legs).verdict is Verdict.FAIL


def test_post_update_forward_on_the_old_weights_fails(receipts):
    legs = receipts("update")
    p = legs[0] / "post_forward"
    edit_jsonl(p / "metrics.jsonl", lambda rows: rows[0].update(checkpoint_version="blake3:" + "00" * 32), legs[0])
    cell = judge_criteria("update", QU, legs)
    assert cell.verdict is Verdict.FAIL and "not the updated weights" in cell.reasons[0]


def test_update_without_a_post_update_forward_is_not_a_pass(receipts):
    legs = receipts("update")
    shutil.rmtree(legs[0] / "post_forward")
    seal_leg(legs[0])
    assert judge_criteria("update", QU, legs).verdict is Verdict.INCONCLUSIVE
    assert judge_criteria("update", question("update", recheck_forward_bitwise=False), legs).verdict is Verdict.PASS


def test_update_under_another_optimizer_answers_another_question(receipts):
    legs = receipts("update")
    assert judge_criteria("update", question("update", optimizer="muon"), legs).verdict is Verdict.INCONCLUSIVE


# ---- the producer's gradient check (analytic backward vs float64 autograd, planted error per op)

OPS = ("linear", "rms_norm", "fused_add_rms_norm", "rotary", "silu_and_mul", "attention", "logprob")
RUN4 = Path(__file__).resolve().parents[1] / "fixtures" / "h200" / "run4"


def _gradcheck(p, passed, caught):
    _set(p, 0, **{"tica/gradcheck_pass": passed, "tica/gradcheck_controls_caught": caught})


def test_a_gradient_check_the_producer_recorded_as_failed_fails(receipts):
    legs = receipts("backward")
    _gradcheck(leg(legs, "bi1"), True, {op: True for op in OPS})
    assert judge_criteria("backward", QB, legs).verdict is Verdict.PASS  # control: a check that passed
    _gradcheck(leg(legs, "bi1"), False, {op: True for op in OPS})
    cell = judge_criteria("backward", QB, legs)
    assert cell.verdict is Verdict.FAIL and "gradient check failed" in cell.reasons[0]


def test_a_gradient_check_whose_planted_errors_were_all_missed_is_not_a_pass(receipts):
    legs = receipts("backward")
    _gradcheck(leg(legs, "bi1"), True, {op: False for op in OPS})
    cell = judge_criteria("backward", QB, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE and "did not detect the planted backward errors" in cell.reasons[0]


def test_a_gradient_check_without_its_controls_is_not_shown_able_to_fail(receipts):
    legs = receipts("backward")
    _set(leg(legs, "bi1"), 0, **{"tica/gradcheck_pass": True})
    assert judge_criteria("backward", QB, legs).verdict is Verdict.INCONCLUSIVE


def _run4_backward(tmp_path):
    dst = tmp_path / "backward_bi1"
    shutil.copytree(RUN4 / "backward_bi1", dst)
    return dst


def _edit_gradcheck(p, fn):
    data = json.loads((p / "gradcheck.json").read_text())
    fn(data)
    (p / "gradcheck.json").write_text(json.dumps(data))
    seal_leg(p)


def test_the_h200_gradcheck_file_is_recomputed_and_passes(tmp_path):
    cell = judge_criteria("backward", QB, [_run4_backward(tmp_path)])
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert cell.numbers["legs"][0]["steps"][0]["gradcheck_pass"] is True


def test_a_planted_error_the_gradcheck_file_shows_undetected_is_not_a_pass(tmp_path):
    """The file's own `pass` flags still say caught; its numbers say the planted linear error was
    within tol: judged on the numbers, and the receipt contradicts itself."""
    p = _run4_backward(tmp_path)
    _edit_gradcheck(p, lambda d: d["controls"][0]["ops"][0].update(rel_err=[0.001], max_rel_err=0.001))
    cell = judge_criteria("backward", QB, [p])
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("planted backward errors in ['linear'] were not detected" in r for r in cell.reasons)
    assert any("contradicts itself" in r for r in cell.reasons)


def test_an_op_outside_tol_in_the_gradcheck_file_fails(tmp_path):
    p = _run4_backward(tmp_path)
    _edit_gradcheck(p, lambda d: d["check"]["ops"][5].update(rel_err=[0.5, 0.001, 0.001]))
    cell = judge_criteria("backward", QB, [p])
    assert cell.verdict is Verdict.FAIL and "['attention'] is outside the question's tolerance 0.02" in cell.reasons[0]


def test_the_gradcheck_pass_line_is_the_questions_never_the_receipts(tmp_path):
    """Class 4 of issue 27: a receipt that raises its own `tol` over an error does not pass it."""
    p = _run4_backward(tmp_path)
    _edit_gradcheck(p, lambda d: [d["check"]["ops"][5].update(rel_err=[0.03, 0.001, 0.001], tol=1.0, **{"pass": True}),
                                  d["check"].update(tol=1.0, **{"pass": True}), d.update(**{"pass": True})])
    assert judge_criteria("backward", QB, [p]).verdict is Verdict.FAIL
    # control: a question whose frozen tolerance admits the error (and still catches every planted
    # error, each far larger) passes it
    assert judge_criteria("backward", question("backward", gradcheck_rel_tol=0.04), [p]).verdict is Verdict.PASS


def test_a_control_is_caught_only_by_its_own_planted_op(tmp_path):
    """A control whose planted op passes is not caught because another op in it failed."""
    p = _run4_backward(tmp_path)

    def other_op_fails(d):
        control = d["controls"][0]
        good = dict(control["ops"][0], rel_err=[0.001], max_rel_err=0.001)
        control["ops"] = [good, dict(good, op="rms_norm", rel_err=[0.9])]
    _edit_gradcheck(p, other_op_fails)
    cell = judge_criteria("backward", QB, [p])
    assert cell.verdict is not Verdict.PASS
    assert any("planted backward errors in ['linear'] were not detected" in r for r in cell.reasons), cell.reasons


@pytest.mark.parametrize("edit,field", [
    (lambda d: d["check"]["ops"][0].update(finite="false"), "finite"),
    (lambda d: d["check"]["ops"][0].update(rel_err=["0.001"]), "rel_err"),
    (lambda d: d["check"].update(ops=[]), "ops"),
])
def test_gradcheck_values_are_strict_types_never_truthiness(tmp_path, edit, field):
    p = _run4_backward(tmp_path)
    _edit_gradcheck(p, edit)
    cell = judge_criteria("backward", QB, [p])
    assert cell.verdict is Verdict.INCONCLUSIVE and any(field in r for r in cell.reasons), cell.reasons


def test_a_gradcheck_of_other_kernels_is_no_evidence_for_the_legs_backward(tmp_path):
    p = _run4_backward(tmp_path)
    _edit_gradcheck(p, lambda d: d["check"].update(kernels="reference"))
    cell = judge_criteria("backward", QB, [p])
    assert cell.verdict is Verdict.INCONCLUSIVE and any("ran on 'reference'" in r for r in cell.reasons)


def test_a_malformed_gradcheck_file_is_unknown_not_a_pass(tmp_path):
    p = _run4_backward(tmp_path)
    _edit_gradcheck(p, lambda d: d["check"].pop("ops"))
    assert judge_criteria("backward", QB, [p]).verdict is Verdict.INCONCLUSIVE


# ---- the arm that carries the claim

def test_bi0_backward_legs_alone_are_not_run(receipts):
    legs = receipts("backward")
    cell = judge_criteria("backward", QB, [leg(legs, "bi0")])
    assert cell.verdict is Verdict.NOT_RUN and "no BI=1 backward leg ran" in cell.reasons[0]
    # a BI=0 fault is still a fail: not run never hides it
    _set(leg(legs, "bi0"), 0, **{"actor/grad_norm": float("nan"), "grad_finite": False})
    assert judge_criteria("backward", QB, [leg(legs, "bi0")]).verdict is Verdict.FAIL


def test_a_bi0_update_leg_off_by_a_tenth_is_not_run_not_a_pass(receipts):
    legs = receipts("update")
    shift_post_forward(legs[0], 0.1)
    # control: as BI=1 the same re-check fails
    assert judge_criteria("update", QU, legs).verdict is Verdict.FAIL
    as_bi0(legs[0])
    cell = judge_criteria("update", QU, legs)
    assert cell.verdict is Verdict.NOT_RUN and "no BI=1 update leg ran" in cell.reasons[0]


def test_every_frozen_post_update_step_must_be_present(receipts):
    legs = receipts("update")
    assert QU.criteria.post_update_steps == 5
    drop_post_update_step(QU, legs)
    cell = judge_criteria("update", QU, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE and "post-update 4 steps present, the question requires 5" in cell.reasons[0]
    # control: a question that freezes 4 post-update steps passes the same receipts
    assert judge_criteria("update", question("update", post_update_steps=4), legs).verdict is Verdict.PASS


def test_the_default_post_update_steps_is_the_committed_h200_updates():
    from tica.question import UpdateCriteria

    rows = (RUN4 / "update_bi1" / "post_forward" / "metrics.jsonl").read_text().splitlines()
    assert UpdateCriteria().post_update_steps == len([r for r in rows if r.strip()]) == 5


def test_every_post_update_step_must_be_bitwise(receipts):
    legs = receipts("update")
    perturb_arrays(legs[0], 5, "post_forward")  # the last of the five
    cell = judge_criteria("update", QU, legs)
    assert cell.verdict is Verdict.FAIL and "step 5" in cell.reasons[0]


def test_a_post_update_forward_that_does_not_say_which_weights_it_ran_is_not_a_pass(receipts):
    legs = receipts("update")
    assert judge_criteria("update", QU, legs).verdict is Verdict.PASS  # negative control
    p = legs[0] / "post_forward"
    def forget(rows):
        del rows[0]["checkpoint_version"]

    edit_jsonl(p / "metrics.jsonl", forget, legs[0])
    cell = judge_criteria("update", QU, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("checkpoint_version unknown" in r for r in cell.reasons), cell.reasons
