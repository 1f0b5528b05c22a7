"""Throughput pairing: workload receipts first, crossed order, per-round loss, the frozen formula
per concurrency, budgets per target c, overruns apart, invalid rounds kept, tiers, profiling."""

from __future__ import annotations

import json
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tica.canaries import scale_throughput, edit_json, edit_meta, swap_slots, swap_work_times, tput_leg
from tica.judges import judge_criteria
from tica.items.throughput.judge import formal_statistic
from tica.pairing import round_order as expected_order
from tica.question import FORMULA_LABELS, ThroughputFormula
from tica.verdict import Verdict

from .conftest import FIXTURES, question, throughput_question, with_question

Q = throughput_question()  # the committed question with a sign-test basis (conftest.FIXTURE_BASIS)
BARE = question("throughput")  # the committed question as it is: no statistical basis, report-only
MEDIAN_LOSS = ThroughputFormula.MEDIAN_PER_ROUND_PAIRED_LOSS
RATIO = ThroughputFormula.RATIO_OF_MEDIAN_THROUGHPUTS


def _scale(legs, arm, c, r, f):
    scale_throughput(tput_leg(legs, arm, c, r), f)


def _round(cell, c, r):
    return next(x for x in cell.numbers["rounds"] if x["c"] == c and x["round"] == r)


def test_crossed_rounds_under_budget_pass_with_tables(receipts):
    cell = judge_criteria("throughput", Q, receipts("throughput"))
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert set(cell.tables) >= {"per leg (workload receipts)", "per round", "per concurrency"}
    assert [(_round(cell, 8, r)["expected_order"], _round(cell, 8, r)["observed"]) for r in (1, 2, 3)] == [
        ("AB", "bi1/bi0"), ("BA", "bi0/bi1"), ("AB", "bi1/bi0")]
    assert FORMULA_LABELS[MEDIAN_LOSS] in cell.tables["per concurrency"]
    assert cell.numbers["formula_label"] == FORMULA_LABELS[MEDIAN_LOSS]


def test_per_round_loss_is_one_minus_the_throughput_ratio(receipts):
    cell = judge_criteria("throughput", Q, receipts("throughput"))
    r = _round(cell, 32, 2)
    assert r["loss"] == pytest.approx(1 - r["t_bi1"] / r["t_bi0"])
    per_c = cell.numbers["per_concurrency"]["32"]
    assert per_c["statistic"] == pytest.approx(statistics.median(per_c["losses"]))


@pytest.mark.parametrize("field,delta", [("total_output_tokens", -311), ("total_input_tokens", 4096),
                                         ("completed", -1), ("failed", 2)])
def test_a_leg_whose_workload_receipt_mismatches_is_inconclusive_and_never_in_a_loss(receipts, field, delta):
    legs = receipts("throughput")
    p = tput_leg(legs, "bi1", 8, 2)
    edit_json(p / "bench.json", lambda d: d.update({field: d[field] + delta}), p)
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    r = _round(cell, 8, 2)
    assert not r["valid"] and r["loss"] is None and r["reasons"]
    assert cell.numbers["per_concurrency"]["8"]["valid_rounds"] == [1, 3]


def test_a_missing_warmup_receipt_is_unknown_and_required_by_default(receipts):
    legs = receipts("throughput")
    edit_meta(tput_leg(legs, "bi0", 32, 1), lambda m: m["resolved_config"].pop("num_warmups"))
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("c=32: unknown: num_warmups" in r for r in cell.reasons if r.startswith("inconclusive"))


def test_a_leg_run_without_ignore_eos_is_a_workload_mismatch(receipts):
    legs = receipts("throughput")
    edit_meta(tput_leg(legs, "bi0", 64, 3), lambda m: m["resolved_config"].update(ignore_eos=False))
    assert judge_criteria("throughput", Q, legs).verdict is Verdict.INCONCLUSIVE


def test_rounds_out_of_the_frozen_crossed_order_are_invalid(receipts):
    legs = receipts("throughput")
    swap_slots(Q, legs)
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert "frozen order AB" in " ".join(_round(cell, 1, 1)["reasons"])


def _times(p, started, ended):
    edit_meta(p, lambda m: m.update(started_at=started, ended_at=ended))


def test_slots_contradicted_by_credible_work_times_are_invalid(receipts):
    legs = receipts("throughput")
    swap_work_times(Q, legs)  # 50 s legs: credible work times, and they say slot 2 ran first
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert "not before slot 2" in " ".join(_round(cell, 1, 1)["reasons"])


def test_times_stamped_when_leg_json_was_written_do_not_order_legs(receipts):
    """Old producers stamped started_at/ended_at microseconds apart when writing leg.json: not
    work times. Their order is ignored (and said so); round/slot decide."""
    legs = receipts("throughput")
    a, b = tput_leg(legs, "bi1", 8, 1), tput_leg(legs, "bi0", 8, 1)  # slot 1, slot 2
    _times(a, "2026-11-29T22:41:33.859363+00:00", "2026-11-29T22:41:33.859532+00:00")
    _times(b, "2026-11-29T22:41:33.706672+00:00", "2026-11-29T22:41:33.706926+00:00")
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert _round(cell, 8, 1)["valid"]
    assert any("2 leg(s) record no credible work times" in r for r in cell.reasons)
    # control: the same contradiction over credible (seconds-long) times invalidates the round
    _times(a, "2026-11-29T22:41:40+00:00", "2026-11-29T22:42:30+00:00")
    _times(b, "2026-11-29T22:40:00+00:00", "2026-11-29T22:40:50+00:00")
    assert not _round(judge_criteria("throughput", Q, legs), 8, 1)["valid"]


def test_legs_of_one_round_that_overlap_in_time_are_invalid(receipts):
    legs = receipts("throughput")
    a, b = tput_leg(legs, "bi1", 8, 1), tput_leg(legs, "bi0", 8, 1)
    _times(a, "2026-11-29T10:07:00+00:00", "2026-11-29T10:09:30+00:00")  # slot 2 starts at 10:08:00
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE and "overlapped" in " ".join(_round(cell, 8, 1)["reasons"])


def _proc(p, role, **kv):
    def f(m):
        next(x for x in m["processes"] if x["role"] == role).update(kv)
    edit_meta(p, f)


@pytest.mark.parametrize("role,kv,why", [
    ("client", {"exit_code": 1}, "client: client pid"),
    ("api_server", {"end_state": "force_killed", "evidence": "force killing remaining processes count=1"},
     "server: api_server pid"),
    ("engine_core", {"end_state": "signalled", "exit_code": None, "signal": "SIGKILL"}, "server: engine_core pid"),
])
def test_a_leg_whose_exits_are_not_clean_is_invalid_and_never_in_a_loss(receipts, role, kv, why):
    legs = receipts("throughput")
    _proc(tput_leg(legs, "bi1", 32, 2), role, **kv)
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    r = _round(cell, 32, 2)
    assert not r["valid"] and r["loss"] is None and why in " ".join(r["reasons"])
    assert cell.numbers["per_concurrency"]["32"]["valid_rounds"] == [1, 3]


def test_client_and_server_exits_are_each_required(receipts):
    legs = receipts("throughput")
    p = tput_leg(legs, "bi0", 64, 1)
    edit_meta(p, lambda m: m.update(processes=[x for x in m["processes"] if x["role"] != "api_server"]))
    r = _round(judge_criteria("throughput", Q, legs), 64, 1)
    assert not r["valid"] and "server exit not recorded" in " ".join(r["reasons"])
    edit_meta(p, lambda m: m.update(processes=[]))
    reasons = " ".join(_round(judge_criteria("throughput", Q, legs), 64, 1)["reasons"])
    assert "client exit not recorded" in reasons and "server exit not recorded" in reasons


def test_clean_exits_let_the_same_rounds_count(receipts):
    # negative control of the exit tests: the untouched legs' clean exits invalidate nothing
    cell = judge_criteria("throughput", Q, receipts("throughput"))
    assert cell.verdict is Verdict.PASS and all(r["valid"] for r in cell.numbers["rounds"])


def test_a_loss_inside_the_noise_floor_is_reported_as_such(receipts):
    legs = receipts("throughput")
    q = with_question(Q, noise_floor=0.05)  # the fixtures' losses are 0.04 (c=1, 8) and 0.06 (c=32, 64)
    cell = judge_criteria("throughput", q, legs)
    assert cell.verdict is Verdict.PASS
    inside = {c: e["inside_noise_floor"] for c, e in cell.numbers["per_concurrency"].items()}
    assert inside == {"1": True, "8": True, "32": False, "64": False}
    assert any("c=8: loss" in r and "inside the noise floor 0.05" in r for r in cell.reasons)
    # control: with no noise floor nothing is said to be inside it
    assert not any("noise floor" in r for r in judge_criteria("throughput", Q, legs).reasons)


def test_a_retest_round_replaces_an_invalid_one_which_is_kept(receipts, tmp_path):
    legs = receipts("throughput")
    p = tput_leg(legs, "bi1", 8, 2)
    edit_json(p / "bench.json", lambda d: d.update(failed=1, completed=d["completed"] - 1), p)
    # round 4 (retest, order continues crossed: BA), measured anew: round 1's legs with the numbers
    # of another run (a relabelled copy of round 1 is one run counted twice, never a retest)
    import shutil
    for arm, slot in (("bi0", 1), ("bi1", 2)):
        src = tput_leg(legs, arm, 8, 1)
        dst = src.parent / f"retest_c8_r4_{arm}"
        shutil.copytree(src, dst)
        edit_json(dst / "bench.json", lambda d: d.update(round="4", slot=str(slot), failed=0, completed=32,
                                                         date=f"20261129-150{slot}50",
                                                         mean_ttft_ms=d["mean_ttft_ms"] + 1.5), None)
        edit_meta(dst, lambda m: m.update(round=4, slot=slot, started_at=f"2026-11-29T15:0{slot}:00+00:00",
                                          ended_at=f"2026-11-29T15:0{slot}:50+00:00"))
        legs.append(dst)
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert not _round(cell, 8, 2)["valid"] and _round(cell, 8, 4)["valid"]
    assert any("round 2 invalid, kept" in r for r in cell.reasons)


def test_one_target_c_over_budget_fails_even_when_the_average_is_under(receipts):
    legs = receipts("throughput")
    for r in (1, 2, 3):
        _scale(legs, "bi1", 64, r, 0.7 / 0.94)  # loss 0.06 -> 0.30 at c=64 (budget 0.15)
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.FAIL and "c=64" in cell.reasons[0]
    avg = cell.numbers["average_across_concurrencies_not_judged"]
    assert avg < Q.criteria.budget[64]  # the average alone would have hidden it
    assert cell.numbers["aggregate_overruns"][0]["c"] == 64


def test_a_budget_without_a_statistical_basis_is_reported_not_passed(receipts):
    """The practice: without a reviewed statistical basis, report only measured values and do not
    declare the budget passed. Every target c is under its budget here, and none is passed."""
    legs = receipts("throughput")
    cell = judge_criteria("throughput", BARE, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    missing = [r for r in cell.reasons if "no reviewed statistical basis" in r]
    assert len(missing) == 4 and all("reported, not passed (tica plan throughput writes one)" in r for r in missing)
    assert any(r.startswith("inconclusive: c=32: loss 0.06 (median per-round paired loss) under the budget 0.15")
               for r in missing), missing
    assert [e["over_budget"] for e in cell.numbers["per_concurrency"].values()] == [False] * 4  # still reported
    assert "no statistical basis" in cell.summary
    # negative control: the same receipts under the same question with a basis pass
    assert judge_criteria("throughput", Q, legs).verdict is Verdict.PASS


def test_an_overrun_without_a_statistical_basis_still_fails(receipts):
    legs = receipts("throughput")
    for r in (1, 2, 3):
        _scale(legs, "bi1", 64, r, 0.7 / 0.94)  # loss 0.06 -> 0.30 at c=64 (budget 0.15)
    cell = judge_criteria("throughput", BARE, legs)
    assert cell.verdict is Verdict.FAIL and "c=64" in cell.reasons[0] and "aggregate overrun" in cell.reasons[0]


def test_single_round_overrun_is_reported_apart_from_the_aggregate(receipts):
    legs = receipts("throughput")
    _scale(legs, "bi1", 32, 1, 0.84 / 0.94)  # round 1 at c=32: loss 0.16 > 0.15; the median stays under
    cell = judge_criteria("throughput", Q, legs)
    # Not a fail (the median is under the budget), not a pass: with one of 3 rounds over, the sign
    # test's upper bound is not under the budget, so the overrun is inside the noise.
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert cell.numbers["per_concurrency"]["32"]["decision"]["decision"] == "inconclusive"
    assert [r for r in cell.reasons if r.startswith("inconclusive:")] == [
        r for r in cell.reasons if r.startswith("inconclusive: c=32: inside the noise")]
    assert [(o["c"], o["round"]) for o in cell.numbers["single_round_overruns"]] == [(32, 1)]
    assert cell.numbers["aggregate_overruns"] == []
    assert any("single-round overrun" in r for r in cell.reasons)


def test_the_statistic_is_the_frozen_formula_and_labelled(receipts):
    legs = receipts("throughput")
    ratio_q = question("throughput", formula=RATIO.value)
    cell = judge_criteria("throughput", ratio_q, legs)
    assert cell.numbers["formula_label"] == FORMULA_LABELS[RATIO]
    pc = cell.numbers["per_concurrency"]["8"]
    assert pc["statistic"] == pytest.approx(1 - statistics.median(pc["t_bi1"]) / statistics.median(pc["t_bi0"]))


def test_without_a_frozen_formula_the_budget_is_not_declared_passed(receipts):
    q = question("throughput", formula=None, budget=None)
    cell = judge_criteria("throughput", q, receipts("throughput"))
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert all(v["statistic"] is None for v in cell.numbers["per_concurrency"].values())


def test_fast_slow_tiers_in_one_arm_make_attribution_inconclusive(receipts):
    legs = receipts("throughput")
    _scale(legs, "bi0", 8, 2, 0.75)
    _scale(legs, "bi1", 8, 2, 0.75)
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE and any("tiers" in r for r in cell.reasons)
    # what each leg of the tiered arms ran under is shown, and a leg that recorded none says unknown
    table = cell.tables["tiers: what each leg ran under"]
    assert "| 8 | bi0 |" in table and "| 8 | bi1 |" in table
    metas = [json.loads((leg / "leg.json").read_text()) for leg in legs if (leg / "leg.json").is_file()]
    assert metas and not any(m.get("telemetry") for m in metas)  # these fixture legs predate telemetry
    assert "unknown" in table and any("cause is unknown" in r for r in cell.reasons)


def test_tiers_do_not_hide_an_overrun(receipts):
    legs = receipts("throughput")
    _scale(legs, "bi0", 8, 2, 0.75)
    for r in (1, 2, 3):
        _scale(legs, "bi1", 8, r, 0.5)
    assert judge_criteria("throughput", Q, legs).verdict is Verdict.FAIL


def test_a_profiled_leg_never_counts(receipts):
    legs = receipts("throughput")
    edit_meta(tput_leg(legs, "bi0", 32, 3), lambda m: m.update(profiled=True))
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert "profiled" in " ".join(_round(cell, 32, 3)["reasons"])


def test_an_unquantified_confounder_is_not_attributed_to_the_switch(receipts):
    legs = receipts("throughput")
    for p in legs:
        if json.loads((p / "leg.json").read_text())["arm"] == "bi0":
            edit_meta(p, lambda m: m["resolved_config"].update(gpu_memory_utilization=0.9))
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert cell.numbers["unquantified_confounders"] == ["resolved_config.gpu_memory_utilization"]
    q = throughput_question(quantified_confounders={"resolved_config.gpu_memory_utilization": "sweep 2026-11-28"})
    assert judge_criteria("throughput", q, legs).verdict is Verdict.PASS


def test_bare_vllm_bench_files_are_judged_but_confounders_cannot_be_listed():
    q = question("throughput", concurrencies=[8], num_prompts={8: 32}, budget={8: 0.1})
    cell = judge_criteria("throughput", q, sorted((FIXTURES / "bare_bench").iterdir()))
    assert cell.numbers["per_concurrency"]["8"]["statistic"] == pytest.approx(0.05)
    assert cell.verdict is Verdict.INCONCLUSIVE and any("bare bench" in r and "exit receipts" in r for r in cell.reasons)


def test_judging_does_not_depend_on_the_order_legs_are_given(receipts):
    legs = receipts("throughput")
    a = judge_criteria("throughput", Q, legs)
    shuffled = list(legs)
    random.Random(3).shuffle(shuffled)
    b = judge_criteria("throughput", Q, shuffled)
    assert a.verdict == b.verdict and a.numbers["per_concurrency"] == b.numbers["per_concurrency"]


# ---- the statistics themselves

tput = st.floats(min_value=1.0, max_value=1e5, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(tput, tput), min_size=1, max_size=7), st.randoms())
def test_both_formulas_are_independent_of_round_order(pairs, rnd):
    t1, t0 = [a for a, _ in pairs], [b for _, b in pairs]
    idx = list(range(len(pairs)))
    rnd.shuffle(idx)
    for f in ThroughputFormula:
        assert formal_statistic(f, t1, t0) == pytest.approx(formal_statistic(f, [t1[i] for i in idx],
                                                                             [t0[i] for i in idx]))


@settings(max_examples=60, deadline=None)
@given(st.lists(tput, min_size=1, max_size=7), st.floats(min_value=-0.5, max_value=0.9))
def test_the_formulas_agree_when_every_round_has_the_same_loss(t0, loss):
    t1 = [t * (1 - loss) for t in t0]
    assert formal_statistic(MEDIAN_LOSS, t1, t0) == pytest.approx(loss, abs=1e-9)
    assert formal_statistic(RATIO, t1, t0) == pytest.approx(loss, abs=1e-9)


def test_the_formulas_differ_where_they_should():
    # A slow-tier BI=0 round pairs with a slow BI=1 round: the per-round losses see the pairing,
    # the ratio of medians does not. Swapping them after the fact would change the verdict.
    t1, t0 = [90.0, 60.0, 99.0], [100.0, 60.0, 100.0]
    assert formal_statistic(MEDIAN_LOSS, t1, t0) == pytest.approx(0.01)
    assert formal_statistic(RATIO, t1, t0) == pytest.approx(0.10)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["AB", "BA"]), min_size=1, max_size=5), st.integers(1, 12))
def test_retest_rounds_keep_the_order_crossed(order, r):
    order = [order[0]] + [("BA" if order[0] == "AB" else "AB") if i % 2 else order[0] for i in range(1, len(order))]
    if r > len(order):
        assert expected_order(order, r) != expected_order(order, r - 1)
    else:
        assert expected_order(order, r) == order[r - 1]


def test_an_arm_whose_legs_did_not_run_makes_the_pairing_not_run(receipts):
    from tica.canaries import edit_meta

    legs = receipts("throughput")
    for p in legs:
        if json.loads((p / "leg.json").read_text())["arm"] == "bi1":
            (p / "bench.json").unlink()
            edit_meta(p, lambda m: m.update(not_run_reason="vLLM: batch invariance unsupported on cpu"))
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.NOT_RUN and "no bi1 leg ran" in cell.summary


def test_no_legs_at_all_is_not_run_never_a_pass():
    """A track that ran no throughput leg (the TP=2 track measured only the forward) is `not run`."""
    cell = judge_criteria("throughput", Q, [])
    assert cell.verdict is Verdict.NOT_RUN and "not run" in cell.summary
