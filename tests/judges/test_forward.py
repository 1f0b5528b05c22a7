"""Forward: BI=1 passes only with max = mean = 0 at every step; a missing step is not a pass;
BI=0 reports its magnitude against the reference; arrays, when present, are the truth."""

from __future__ import annotations

import numpy as np

from tica.canaries import logged_only, perturb_arrays, perturb_arrays_keep_metrics, drop_step, edit_meta
from tica.judges import judge_criteria
from tica.verdict import Verdict

from .conftest import leg, question

Q = question("forward")


def test_bitwise_bi1_and_reference_sized_bi0_pass(receipts):
    cell = judge_criteria("forward", Q, receipts("forward"))
    assert cell.verdict is Verdict.PASS, cell.reasons
    bi1 = next(l for l in cell.numbers["legs"] if l["arm"] == "bi1")
    assert [s["step"] for s in bi1["steps"]] == [1, 2, 3, 4, 5]
    assert all(s["max"] == 0 and s["mean"] == 0 and s["source"] == "arrays" for s in bi1["steps"])
    assert "per step: bi1 forward_bi1" in cell.tables and "| step |" in cell.tables["per step: bi1 forward_bi1"]


def test_per_step_numbers_carry_step_basis_and_checkpoint(receipts):
    cell = judge_criteria("forward", Q, receipts("forward"))
    for l in cell.numbers["legs"]:
        for s in l["steps"]:
            assert s["step_basis"] == "rollout" and s["checkpoint_version"].startswith("blake3:")
        assert min(s["step"] for s in l["steps"]) == 1  # never padded with a step 0


def test_bi1_logged_max_nonzero_at_one_step_fails(receipts):
    legs = receipts("forward")
    logged_only(leg(legs, "bi1"), 4, **{"training/rollout_probs_diff_max": 2.0 ** -20})
    cell = judge_criteria("forward", Q, legs)
    assert cell.verdict is Verdict.FAIL and "step 4" in cell.reasons[0]


def test_bi1_logged_all_zero_without_arrays_passes(receipts):
    # negative control of the one above: a verl receipt (no arrays) that is all zeros passes
    legs = receipts("forward")
    logged_only(leg(legs, "bi1"), 4)
    assert judge_criteria("forward", Q, legs).verdict is Verdict.PASS


def test_bi1_logged_mean_nonzero_fails(receipts):
    legs = receipts("forward")
    logged_only(leg(legs, "bi1"), 2, **{"training/rollout_probs_diff_mean": 1e-12})
    assert judge_criteria("forward", Q, legs).verdict is Verdict.FAIL


def test_bi1_one_ulp_in_the_arrays_fails_even_when_logged_honestly(receipts):
    legs = receipts("forward")
    perturb_arrays(leg(legs, "bi1"), 3)
    cell = judge_criteria("forward", Q, legs)
    assert cell.verdict is Verdict.FAIL
    step3 = next(l for l in cell.numbers["legs"] if l["arm"] == "bi1")["steps"][2]
    assert step3["n_bitwise_diff"] == 1


def test_metrics_claiming_zero_over_nonzero_arrays_are_judged_on_the_arrays(receipts):
    legs = receipts("forward")
    perturb_arrays_keep_metrics(leg(legs, "bi1"), 1)
    cell = judge_criteria("forward", Q, legs)
    assert cell.verdict is Verdict.FAIL
    assert any("contradicts itself" in r for r in cell.reasons)


def test_decode_logprobs_differing_from_prefill_fail_bi1(receipts):
    legs = receipts("forward")
    p = leg(legs, "bi1")
    path = p / "arrays" / "step_0002.npz"
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    d = data["decode_logprobs"].copy()
    d[np.flatnonzero(data["decode_mask"])[0]] += np.float32(1e-3)
    data["decode_logprobs"] = d
    np.savez(path, **data)
    from tica.seal import seal_leg
    seal_leg(p)
    cell = judge_criteria("forward", Q, legs)
    assert cell.verdict is Verdict.FAIL and any("decode" in r for r in cell.reasons)


def test_a_missing_step_is_not_a_pass(receipts):
    legs = receipts("forward")
    drop_step(leg(legs, "bi1"), 3)
    cell = judge_criteria("forward", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE and "steps [3] missing" in cell.reasons[0]


def test_fewer_steps_than_the_question_requires_is_not_a_pass(receipts):
    legs = receipts("forward")
    drop_step(leg(legs, "bi1"), None)
    assert judge_criteria("forward", Q, legs).verdict is Verdict.INCONCLUSIVE
    assert judge_criteria("forward", question("forward", min_steps=4), legs).verdict is Verdict.PASS  # control


def test_a_step_with_no_max_recorded_is_missing(receipts):
    legs = receipts("forward")
    logged_only(leg(legs, "bi1"), 2, **{"training/rollout_probs_diff_max": None})
    assert judge_criteria("forward", Q, legs).verdict is Verdict.INCONCLUSIVE


def test_bi0_far_from_the_reference_magnitude_fails(receipts):
    legs = receipts("forward")
    logged_only(leg(legs, "bi0"), 2, scale_mean=200.0)
    cell = judge_criteria("forward", Q, legs)
    assert cell.verdict is Verdict.FAIL and "BI=0 mean" in cell.reasons[0]


def test_bi0_magnitude_is_judged_against_the_questions_reference(receipts):
    legs = receipts("forward")
    assert judge_criteria("forward", question("forward", bi0_reference_mean=0.5), legs).verdict is Verdict.FAIL
    cell = judge_criteria("forward", question("forward", bi0_reference_mean=0.012), legs)
    assert cell.verdict is Verdict.PASS and "BI=0 mean |diff|" in cell.summary


def test_without_a_reference_bi0_is_reported_not_judged(receipts):
    """A question may name no independent BI=0 reference (e.g. random weights): then the
    magnitude is reported; the negative control above shows a named reference is enforced."""
    legs = receipts("forward")
    logged_only(leg(legs, "bi0"), 2, scale_mean=200.0)
    cell = judge_criteria("forward", question("forward", bi0_reference_mean=None), legs)
    assert cell.verdict is Verdict.PASS and "the question names no reference" in cell.summary


def test_bi1_leg_that_did_not_run_is_not_run(receipts):
    legs = receipts("forward")
    edit_meta(leg(legs, "bi1"), lambda m: m.update(
        not_run_reason="NotImplementedError: VLLM_BATCH_INVARIANT is only supported on CUDA and XPU"))
    cell = judge_criteria("forward", Q, legs)
    assert cell.verdict is Verdict.NOT_RUN and "NotImplementedError" in cell.reasons[0]


def test_without_a_bi1_leg_there_is_no_pass(receipts):
    legs = receipts("forward")
    assert judge_criteria("forward", Q, [leg(legs, "bi0")]).verdict is Verdict.NOT_RUN


def test_confounders_between_arms_are_tabulated(receipts):
    cell = judge_criteria("forward", Q, receipts("forward"))
    keys = {c["key"]: c["status"] for c in cell.numbers["confounders"]}
    assert keys["env.VLLM_BATCH_INVARIANT"] == "switch" and keys["trainer"] == "unquantified"
    assert "confounders" in cell.tables


def test_metrics_claiming_a_diff_over_bitwise_arrays_are_not_a_pass_either(receipts):
    # The arrays say bitwise, the log says otherwise: judged on the arrays, but a receipt that
    # contradicts itself is not evidence either way.
    legs = receipts("forward")
    p = leg(legs, "bi1")
    from tica.canaries import edit_jsonl
    edit_jsonl(p / "metrics.jsonl", lambda rows: rows[1].update({"training/rollout_probs_diff_max": 0.5}), p)
    cell = judge_criteria("forward", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE and "contradicts itself" in cell.reasons[0]


# ---- a question scoped to one arm; the BI=0 smoke check (mean magnitude, max, grad norm)

QBI0 = question("forward", arms=["bi0"])


def _grad_norms(p, values, rewards=None):
    from tica.canaries import edit_jsonl

    def f(rows):
        for r, g in zip(rows, values):
            r["actor/grad_norm"] = g
            if rewards is not None:
                r["within_group_rewards"] = rewards
    edit_jsonl(p / "metrics.jsonl", f, p)


def test_a_bi0_smoke_question_needs_no_bi1_leg_and_passes_with_grad_norms(receipts):
    legs = receipts("forward")
    _grad_norms(leg(legs, "bi0"), [0.5, 0.6, 0.7, 0.8, 0.9])
    cell = judge_criteria("forward", QBI0, [leg(legs, "bi0")])
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert cell.summary.startswith("pass: BI=0 smoke pass")
    # control: the default question (BI=1 judged) gives the same BI=0 leg no pass without a BI=1 leg
    assert judge_criteria("forward", Q, [leg(legs, "bi0")]).verdict is Verdict.NOT_RUN


def test_a_bi0_smoke_check_without_a_recorded_grad_norm_is_inconclusive(receipts):
    from tica.canaries import edit_jsonl

    legs = receipts("forward")
    p = leg(legs, "bi0")  # verl-style metrics, but this BI=0 leg logged no actor/grad_norm
    edit_jsonl(p / "metrics.jsonl", lambda rows: [{k: v for k, v in r.items() if k != "actor/grad_norm"} for r in rows], p)
    cell = judge_criteria("forward", QBI0, [p])
    assert cell.verdict is Verdict.INCONCLUSIVE and "grad norm not recorded" in cell.reasons[0]


def test_a_non_finite_bi0_grad_norm_fails_the_smoke_check(receipts):
    legs = receipts("forward")
    _grad_norms(leg(legs, "bi0"), [0.5, float("inf"), 0.7, 0.8, 0.9])
    cell = judge_criteria("forward", QBI0, [leg(legs, "bi0")])
    assert cell.verdict is Verdict.FAIL and "step 2: BI=0 grad norm is inf" in cell.reasons[0]
    # a question judging both arms reads a recorded grad norm too
    assert judge_criteria("forward", Q, legs).verdict is Verdict.FAIL


def test_a_zero_bi0_grad_norm_is_read_against_the_group_rewards(receipts):
    legs = receipts("forward")
    p = leg(legs, "bi0")
    _grad_norms(p, [0.0, 0.6, 0.7, 0.8, 0.9], rewards=[[1.0, 0.0, 1.0, 1.0]])
    assert judge_criteria("forward", QBI0, [p]).verdict is Verdict.FAIL
    _grad_norms(p, [0.0, 0.6, 0.7, 0.8, 0.9], rewards=[[1.0, 1.0, 1.0, 1.0]])
    cell = judge_criteria("forward", QBI0, [p])
    assert cell.verdict is Verdict.PASS and any("advantage 0" in r for r in cell.reasons)


def test_a_bi0_smoke_question_with_no_bi0_leg_is_not_run(receipts):
    legs = receipts("forward")
    cell = judge_criteria("forward", QBI0, [leg(legs, "bi1")])
    assert cell.verdict is Verdict.NOT_RUN and "no BI=0 forward leg" in cell.reasons[0]


def test_a_bi1_only_question_reports_bi0_without_judging_it(receipts):
    legs = receipts("forward")
    logged_only(leg(legs, "bi0"), 2, scale_mean=200.0)
    assert judge_criteria("forward", Q, legs).verdict is Verdict.FAIL  # control: judged when in arms
    cell = judge_criteria("forward", question("forward", arms=["bi1"]), legs)
    assert cell.verdict is Verdict.PASS and any("reported, not judged" in r for r in cell.reasons)


def test_a_bi0_mean_inside_the_noise_floor_is_reported_as_such(receipts):
    from .conftest import with_question

    legs = receipts("forward")
    cell = judge_criteria("forward", with_question(question("forward", bi0_reference_mean=None), noise_floor=0.5), legs)
    assert cell.verdict is Verdict.PASS
    assert "inside the noise floor 0.5" in cell.summary and any("not distinguishable from noise" in r for r in cell.reasons)
    assert "inside the noise floor" not in judge_criteria("forward", Q, legs).summary  # control: floor 0
