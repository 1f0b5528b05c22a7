"""Throughput rounds as handed in (audit findings 1 and 7, and leg.json against the bench file).

- At each concurrency the rounds run 1..max with no gap: a round left out leaves that c
  inconclusive, named; a round past the frozen `repeats` stands in only for an invalid round that
  is present, never for an absent one; a round numbered below 1 is refused (and never given a
  frozen order read from the end of the list).
- Two legs whose bench files are one measurement (the same bytes, or the same recorded date,
  duration and counts) never count as two rounds: inconclusive at that c, both legs named.
- A workload value that leg.json's resolved_config and the bench file both record, differently,
  makes the leg invalid, naming both values and both files.

Every test plants one thing in the committed, passing set (fixtures/receipts/throughput: three
crossed rounds per c under the budget) and keeps its negative control: the complete honest set
still passes, or fails as before."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import tica.items.throughput.judge as tput_judge
from tica.canaries import edit_json, edit_meta, scale_throughput, tput_leg
from tica.judges import judge_criteria
from tica.pairing import round_order as expected_order
from tica.verdict import Verdict

from .conftest import throughput_question

Q = throughput_question()  # repeats 3, order AB/BA/AB, a sign-test basis: the honest set passes
C = 32


def judge(legs):
    return judge_criteria("throughput", Q, legs)


def _round(cell, c, r):
    return next(x for x in cell.numbers["rounds"] if x["c"] == c and x["round"] == r)


def _reasons(cell, verdict="inconclusive"):
    return [r for r in cell.reasons if r.startswith(verdict + ":")]


def _without(legs, c, rounds):
    drop = {tput_leg(legs, arm, c, r) for arm in ("bi1", "bi0") for r in rounds}
    return [p for p in legs if p not in drop]


def add_round(legs, c, src, new, factor=1.002):
    """Round `new` at c, run after the others in the frozen crossed order: round `src`'s legs
    measured again (their throughputs moved by `factor`, the loss kept): another measurement."""
    first = "bi1" if expected_order(Q.pairing_order, new) == "AB" else "bi0"
    out = []
    for arm in ("bi1", "bi0"):
        slot = 1 if arm == first else 2
        old = tput_leg(legs, arm, c, src)
        leg = old.parent / f"rerun_c{c:03d}_r{new}_s{slot}_{arm}"
        shutil.copytree(old, leg)
        edit_json(leg / "bench.json", lambda d: d.update(round=str(new), slot=str(slot)), None)
        start = f"2026-11-29T{14 + new}:{10 * slot:02d}:00+00:00"
        edit_meta(leg, lambda m: m.update(round=new, slot=slot, started_at=start,
                                          ended_at=start.replace(":00+", ":50+")))
        scale_throughput(leg, factor)
        out.append(leg)
    return legs + out


def overrun(legs, c, rounds):
    for r in rounds:
        scale_throughput(tput_leg(legs, "bi1", c, r), 0.5)  # loss 0.06 -> 0.53 (budget 0.15)


# ---- the negative control every test below leans on


def test_the_complete_honest_set_passes_with_no_round_missing(receipts):
    cell = judge(receipts("throughput"))
    assert cell.verdict is Verdict.PASS, cell.reasons
    for e in cell.numbers["per_concurrency"].values():
        assert e["valid_rounds"] == [1, 2, 3] and e["missing_rounds"] == [] and e["rounds_below_1"] == []


# ---- rounds 1..max, no gap


def test_dropped_leading_rounds_are_named_and_never_a_pass(receipts):
    """Rounds 1-2 at c=32 were overruns and are left out; reruns 4-5 are handed in instead."""
    legs = receipts("throughput")
    overrun(legs, C, (1, 2))
    control = add_round(add_round(legs, C, 3, 4), C, 1, 5)
    assert judge(control).verdict is Verdict.FAIL  # handed in whole: the overrun stands
    cell = judge(_without(control, C, (1, 2)))
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any(f"c={C}: round(s) [1, 2] missing of rounds 1..5" in r for r in _reasons(cell)), cell.reasons
    assert cell.numbers["per_concurrency"][str(C)]["missing_rounds"] == [1, 2]
    # the reruns do not stand in for rounds that are absent
    assert cell.numbers["per_concurrency"][str(C)]["valid_rounds"] == [3]


def test_dropped_leading_rounds_negative_control(receipts):
    """The honest set with valid reruns past the frozen three: kept, not judged, and it passes."""
    legs = add_round(add_round(receipts("throughput"), C, 3, 4), C, 1, 5)
    cell = judge(legs)
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert cell.numbers["per_concurrency"][str(C)]["valid_rounds"] == [1, 2, 3]
    assert any(f"c={C}: rounds [4, 5] are valid beyond the 3 frozen" in r for r in cell.reasons)
    # the per-round table says which valid rounds the statistic counts
    rows = [line for line in cell.tables["per round"].splitlines() if line.startswith(f"| {C} |")]
    counted = {int(row.split("|")[2]): row.split("|")[9].strip() for row in rows}
    assert counted == {1: "yes", 2: "yes", 3: "yes", 4: "no: beyond the 3 frozen rounds",
                       5: "no: beyond the 3 frozen rounds"}, rows


def test_a_gap_in_the_middle_is_named_and_a_later_round_does_not_fill_it(receipts):
    legs = add_round(receipts("throughput"), 8, 1, 4)
    overrun(legs, 8, (2,))
    cell = judge(_without(legs, 8, (2,)))
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("c=8: round(s) [2] missing of rounds 1..4" in r for r in _reasons(cell)), cell.reasons
    e = cell.numbers["per_concurrency"]["8"]
    assert e["missing_rounds"] == [2] and e["valid_rounds"] == [1, 3]  # round 4 is no stand-in for an absent round
    assert all(v["missing_rounds"] == [] for c, v in cell.numbers["per_concurrency"].items() if c != "8")


def test_a_gap_in_the_middle_negative_control_the_invalid_round_present_is_retested(receipts):
    """The practice's retest: round 2 kept invalid (with its reason), round 4 stands in for it."""
    legs = add_round(receipts("throughput"), 8, 1, 4)
    p = tput_leg(legs, "bi1", 8, 2)
    edit_json(p / "bench.json", lambda d: d.update(failed=1, completed=d["completed"] - 1), p)
    cell = judge(legs)
    assert cell.verdict is Verdict.PASS, cell.reasons
    e = cell.numbers["per_concurrency"]["8"]
    assert e["valid_rounds"] == [1, 3, 4] and e["missing_rounds"] == []
    assert not _round(cell, 8, 2)["valid"] and any("c=8 round 2 invalid, kept" in r for r in cell.reasons)


def test_the_last_round_left_out_is_named(receipts):
    cell = judge(_without(receipts("throughput"), 64, (3,)))
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("c=64: 2 valid round(s) of the 3 frozen (round(s) [3] not handed in)" in r for r in _reasons(cell))


# ---- rounds numbered below 1


def test_expected_order_never_reads_the_frozen_order_from_its_end():
    order = ["AB", "BA", "AB"]
    assert [expected_order(order, r) for r in (1, 2, 3, 4)] == ["AB", "BA", "AB", "BA"]
    for r in (0, -1, -3):
        with pytest.raises(ValueError, match="numbered from 1"):
            expected_order(order, r)


def _numbered_below_one(legs, c, numbers):
    """Good copies of rounds 1.. at c (taken before anything is planted), their round left to
    leg.json and set there to nothing: the round is given as the bench file's own metadata would."""
    out, rounds = [], {}
    for src, new in enumerate(numbers, 1):
        for arm in ("bi1", "bi0"):
            old = tput_leg(legs, arm, c, src)
            leg = old.parent / f"early_c{c:03d}_r{new}_{arm}"
            shutil.copytree(old, leg)
            edit_json(leg / "bench.json", lambda d: d.pop("round"), None)
            edit_meta(leg, lambda m: m.update(round=None))
            scale_throughput(leg, 1.003)
            out.append(leg)
            rounds[leg.name] = new
    return out, rounds


@pytest.fixture
def bench_rounds(monkeypatch):
    """The bench files' round as the loader would hand it over without a lower bound on it
    (receipts.BenchResult.round may or may not refuse r < 1: the judge refuses it either way)."""
    given: dict[str, int] = {}
    real = tput_judge.load_bench_leg

    def load(path):
        leg = real(path)
        if Path(path).name in given:
            leg = dataclasses.replace(leg, bench=leg.bench.model_copy(update={"round": given[Path(path).name]}))
        return leg

    monkeypatch.setattr(tput_judge, "load_bench_leg", load)
    return given


def test_rounds_numbered_zero_or_below_are_refused_and_the_real_rounds_judged(receipts, bench_rounds):
    legs = receipts("throughput")
    extra, rounds = _numbered_below_one(legs, C, (-2, -1, 0))
    overrun(legs, C, (1, 2, 3))
    assert judge(legs).verdict is Verdict.FAIL  # control
    bench_rounds.update(rounds)
    cell = judge(legs + extra)
    assert cell.verdict is Verdict.FAIL, cell.reasons  # the real rounds, over budget, are the ones judged
    e = cell.numbers["per_concurrency"][str(C)]
    assert e["valid_rounds"] == [1, 2, 3] and e["rounds_below_1"] == [-2, -1, 0]
    assert any(f"c={C}: round(s) [-2, -1, 0] numbered below 1" in r for r in _reasons(cell))
    for r in (-2, -1, 0):
        row = _round(cell, C, r)
        assert not row["valid"] and row["loss"] is None and "numbered from 1" in " ".join(row["reasons"])
        assert row["expected_order"] == "-"


def test_rounds_numbered_zero_or_below_beside_an_honest_set_are_no_pass(receipts, bench_rounds):
    legs = receipts("throughput")
    assert judge(legs).verdict is Verdict.PASS  # negative control
    extra, rounds = _numbered_below_one(legs, C, (0,))
    bench_rounds.update(rounds)
    cell = judge(legs + extra)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any(f"c={C}: round(s) [0] numbered below 1" in r for r in _reasons(cell)), cell.reasons


def test_a_bench_file_numbering_a_round_below_one_is_never_a_pass_whoever_refuses_it(receipts):
    """Through the real loader: refused there (unreadable) or by the judge, never judged."""
    legs = receipts("throughput")
    extra, rounds = _numbered_below_one(legs, C, (-2, -1, 0))
    overrun(legs, C, (1, 2, 3))
    for leg in extra:
        edit_json(leg / "bench.json", lambda d: d.update(round=str(rounds[leg.name])), leg)
    cell = judge(legs + extra)
    assert cell.verdict is not Verdict.PASS
    if "per_concurrency" in cell.numbers:
        assert cell.numbers["per_concurrency"][str(C)]["valid_rounds"] == [1, 2, 3]


# ---- one measurement counted twice


def _plain_bench(legs):
    """The set as a plain `vllm bench serve --save-result` writes it: no --metadata (arm, round and
    slot left to leg.json)."""
    for leg in legs:
        edit_json(leg / "bench.json", lambda d: [d.pop(k) for k in ("arm", "round", "slot")], leg)
    return legs


def _reuse_bench(legs, c, src, rounds, reformat=False):
    """Round `src`'s bench file sealed again as rounds `rounds`' (each arm its own), as a stale
    fixed --result-filename leaves it; `reformat`: written out again (other bytes, same run)."""
    for arm in ("bi1", "bi0"):
        raw = (tput_leg(legs, arm, c, src) / "bench.json").read_bytes()
        if reformat:
            raw = json.dumps({**json.loads(raw), "label": "rerun"}, indent=None).encode()
        for r in rounds:
            leg = tput_leg(legs, arm, c, r)
            (leg / "bench.json").write_bytes(raw)
            edit_meta(leg, lambda m: None)  # reseal


def test_the_plain_bench_set_negative_control_passes(receipts):
    """Every bench shares `date` (as the fixtures and canaries write it) and records no round:
    distinct durations make distinct measurements, and the set passes."""
    cell = judge(_plain_bench(receipts("throughput")))
    assert cell.verdict is Verdict.PASS, cell.reasons


@pytest.mark.parametrize("reformat", [False, True], ids=["same-bytes", "same-run-rewritten"])
def test_one_measurement_sealed_as_several_rounds_is_inconclusive_naming_both_legs(receipts, reformat):
    legs = _plain_bench(receipts("throughput"))
    overrun(legs, C, (2, 3))
    assert judge(legs).verdict is Verdict.FAIL  # control: rounds 2 and 3 measured, over budget
    _reuse_bench(legs, C, 1, (2, 3), reformat)
    cell = judge(legs)
    assert cell.verdict is Verdict.INCONCLUSIVE, cell.reasons
    a, b = tput_leg(legs, "bi1", C, 1).name, tput_leg(legs, "bi1", C, 2).name
    named = [r for r in _reasons(cell) if r.startswith(f"inconclusive: c={C}:") and a in r and b in r]
    assert named and "one measurement counted 3 times" in named[0], cell.reasons
    assert ("same content" in named[0]) is (not reformat) and "same run: date 20261129-100000" in named[0]
    for r in (1, 2, 3):  # none of them counts as a round, whichever it belongs to
        row = _round(cell, C, r)
        assert not row["valid"] and "the same measurement as" in " ".join(row["reasons"])
    assert cell.numbers["per_concurrency"][str(C)]["valid_rounds"] == []


def test_a_copy_that_records_another_round_is_still_one_measurement(receipts):
    """Identity is content, not labels: a rerun copied from round 1 that writes its own round into
    the bench file keeps round 1's date, duration and counts. One run, counted once (class 1 of
    issue 27: relabelled copies are no new samples)."""
    legs = add_round(receipts("throughput"), 8, 1, 4, factor=1.0)
    assert (tput_leg(legs, "bi1", 8, 1) / "bench.json").read_bytes() != (tput_leg(legs, "bi1", 8, 4) / "bench.json").read_bytes()
    cell = judge(legs)
    assert cell.verdict is not Verdict.PASS, cell.reasons
    assert any("one measurement counted 2 times" in r for r in _reasons(cell)), cell.reasons


def test_a_rerun_that_measured_other_numbers_is_another_measurement(receipts):
    """Negative control of the identity: the same labels, throughputs moved by 0.2% (another run)."""
    legs = add_round(receipts("throughput"), 8, 1, 4, factor=1.002)
    for arm in ("bi1", "bi0"):
        leg = tput_leg(legs, arm, 8, 4)
        edit_json(leg / "bench.json", lambda d: d.update(date="20261129-181050"), leg)
    cell = judge(legs)
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert not any("same measurement" in r for r in _reasons(cell))


# ---- leg.json against the bench file


@pytest.mark.parametrize("key,bench_key,bench_value,leg_value", [
    ("num_warmups", "num_warmups", "0", 1),
    ("ignore_eos", "ignore_eos", "false", True),
    ("input_len", "input_len", "4096", 8192),
    ("output_len", "random_output_len", "512", 1024),
])
def test_a_bench_file_that_contradicts_leg_json_makes_the_leg_invalid(receipts, key, bench_key, bench_value, leg_value):
    legs = receipts("throughput")
    p = tput_leg(legs, "bi0", 8, 2)
    edit_json(p / "bench.json", lambda d: d.update({bench_key: bench_value}), p)
    cell = judge(legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    row = _round(cell, 8, 2)
    assert not row["valid"] and row["loss"] is None
    why = " ".join(row["reasons"])
    assert f"{p.name}/leg.json resolved_config.{key} = {leg_value!r}" in why, why
    assert f"{p.name}/bench.json {bench_key} = " in why and "disagree" in why
    assert cell.numbers["per_concurrency"]["8"]["valid_rounds"] == [1, 3]


def test_a_request_count_in_leg_json_that_the_bench_file_contradicts_makes_the_leg_invalid(receipts):
    legs = receipts("throughput")
    p = tput_leg(legs, "bi1", 64, 1)
    edit_meta(p, lambda m: m["resolved_config"].update(num_prompts=64))  # the bench file ran 256
    cell = judge(legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    why = " ".join(_round(cell, 64, 1)["reasons"])
    assert "resolved_config.num_prompts = 64" in why and "bench.json num_prompts = 256" in why


def test_a_bench_file_that_agrees_with_leg_json_negative_control_passes(receipts):
    """The same fields recorded in both receipts, as bench metadata strings, and equal: passes."""
    legs = receipts("throughput")
    for p in legs:
        edit_json(p / "bench.json", lambda d: d.update(num_warmups="1", ignore_eos="true", input_len="8192",
                                                       random_output_len="1024"), p)
    cell = judge(legs)
    assert cell.verdict is Verdict.PASS, cell.reasons


def test_the_summary_counts_valid_rounds_per_concurrency():
    """A crossed round is one round at each c: four rounds at c=1 and 64 read "4/4 ... at each of",
    not "8/8", beside a basis that asks 5 rounds; uneven counts are named per c."""
    from types import SimpleNamespace

    from tica.items.throughput.judge import _valid_rounds

    rounds = [SimpleNamespace(c=c, valid=True) for c in (1, 64) for _ in range(4)]
    assert _valid_rounds(rounds) == "4/4 valid rounds at each of c=1, 64"
    rounds[0] = SimpleNamespace(c=1, valid=False)
    assert _valid_rounds(rounds) == "valid rounds c=1 3/4, c=64 4/4"
    assert _valid_rounds(rounds[4:]) == "4/4 valid rounds at c=64"
