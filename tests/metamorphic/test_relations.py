"""Metamorphic relations over sealed receipt sets (relations 1, 2, 4, 6 of the suite).

R1 relabel/duplicate: a leg, a step, a problem, a round or a process copied (and relabelled) never
   turns a non-pass into a pass.
R2 removal: removing one input (a leg, a file that is not the seal, a row, a process exit) never
   turns a non-pass into a pass.
R4 receipt-side tolerances: keys such as `tolerance` or `threshold` written by the producer into
   resolved_config, bench.json or metrics rows never change the verdict.
R6 per-leg rules: a value moved from one leg of an arm to another leg of the same arm never
   covers the leg that lacks it.

Each relation has an `_each` test (every single transform of the catalogue, all violations
collected and listed) and a `_sampled` test (hypothesis: chains of up to three transforms).
Every example also fails on any exception escaping `judge()` (a traceback).
"""

from __future__ import annotations

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from tica.evidence import EvidenceItem
from tica.verdict import Verdict

from . import ops
from .catalogue import Transform, duplications, moves, removals, tolerances
from .conftest import FULL, HYP, Case, Traceback, cap, capped, line, selected
from .variants import NON_PASSING, VARIANTS

E = EvidenceItem
ALL_IDS = selected([v.id for v in VARIANTS])
NON_PASSING_IDS = selected([v.id for v in NON_PASSING])


def _capped(ts: list[Transform], case: Case) -> list[Transform]:
    """By default an even sample of a long catalogue (throughput's); TICA_TESTS=full: all of it."""
    return capped(ts, cap(case.variant.id))


def _apply(case: Case, legs, chain: list[Transform]):
    for t in chain:
        legs = t.fn(legs)
    return legs


def _run(case: Case, candidate, chain: list[Transform]):
    """Judge the case's copy after the chain; (cell, None) or (None, traceback text)."""
    what = " + ".join(t.name for t in chain)
    with case.copy() as legs:
        legs = _apply(case, legs, chain)
        try:
            return case.judge(legs, candidate, what), None
        except Traceback as err:
            return None, str(err)


def _report(case: Case, violations: list[str], relation: str) -> None:
    assert not violations, (f"{relation}: {len(violations)} violation(s) from {case.start()}:\n  - "
                            + "\n  - ".join(violations))


def _never_pass_from_nonpass(case: Case, candidate, transforms: list[Transform], relation: str) -> None:
    violations = []
    for t in transforms:
        cell, tb = _run(case, candidate, [t])
        if tb is not None:
            violations.append(f"{t.name}: {tb}")
        elif not case.passing and cell.verdict is Verdict.PASS:
            violations.append(f"{t.name}: FALSE PASS -> {line(cell)}")
    _report(case, violations, relation)


def _draw_chain(data, catalogue: list[Transform], most: int = 3) -> list[Transform]:
    if not catalogue:
        return []
    return data.draw(st.lists(st.sampled_from(catalogue), min_size=1, max_size=most, unique_by=lambda t: t.name),
                     label="chain")


# ============================================================================ R1: relabel / duplicate


@pytest.mark.parametrize("vid", ALL_IDS)
def test_r1_duplicate_relabel_each(vid, cases, candidate):
    """R1, every single copy: never a pass from a non-pass (from a pass: never a traceback)."""
    case = cases[vid]
    _never_pass_from_nonpass(case, candidate, _capped(duplications(case, sample_legs=8), case), "R1 relabel/duplicate")


@pytest.mark.parametrize("vid", NON_PASSING_IDS)
@HYP
@given(data=st.data())
def test_r1_duplicate_relabel_sampled(vid, cases, candidate, data):
    case = cases[vid]
    chain = _draw_chain(data, duplications(case, sample_legs=8))
    note(f"{case.start()}; chain: {chain}")
    cell, tb = _run(case, candidate, chain)
    assert tb is None, tb
    assert cell.verdict is not Verdict.PASS, f"FALSE PASS after {chain}: {line(cell)}"


# The cases the relation was written for: an inconclusive set whose shortfall copies fill.


def _one(case: Case, candidate, t: Transform):
    cell, tb = _run(case, candidate, [t])
    assert tb is None, tb
    return cell


@pytest.mark.parametrize("vid", ["quality-finer_threshold", "quality-basis_short"])
def test_r1_quality_problems_duplicated_under_new_ids_never_pass(vid, cases, candidate):
    """Quality inconclusive for a threshold finer than 1/N, or a basis that lacks problems: the
    same 30 problems copied under new ids (N = 60) are not 60 problems."""
    case = cases[vid]
    t = next(t for t in duplications(case) if t.name.startswith("quality: all problem(s) copied"))
    cell = _one(case, candidate, t)
    assert cell.verdict is not Verdict.PASS, f"FALSE PASS from {case.start()} after {t.name}: {line(cell)}"


def test_r1_throughput_rounds_copied_as_new_rounds_never_pass(cases, candidate):
    """Throughput inconclusive for 3 of 5 frozen rounds: rounds 1..3 copied as rounds 4 and 5
    (renumbered in leg.json and bench.json, times moved, in the frozen crossed order) are no new rounds."""
    case = cases["throughput-too_few_rounds"]
    t = next(t for t in duplications(case) if "fill" in t.tags)
    cell = _one(case, candidate, t)
    assert cell.verdict is not Verdict.PASS, f"FALSE PASS from {case.start()} after {t.name}: {line(cell)}"


@pytest.mark.parametrize("vid", ["forward-missing_last_step", "update-post_steps_short"])
def test_r1_forward_steps_copied_as_new_steps_never_pass(vid, cases, candidate):
    """A forward (or post-update forward) receipt one step short: its last step's row and arrays
    copied under the next step number are no new measurement."""
    case = cases[vid]
    fills = [t for t in duplications(case) if "fill" in t.tags or ("step" in t.tags and "unchanged" in t.name)]
    violations = []
    for t in fills:
        cell = _one(case, candidate, t)
        if cell.verdict is Verdict.PASS:
            violations.append(f"{t.name}: FALSE PASS -> {line(cell)}")
    _report(case, violations, "R1 step copies")


def test_r1_clean_exit_process_copied_under_missing_role_never_pass(cases, candidate):
    """Clean exit inconclusive for a BI=1 leg without an engine_core exit: another process's exit
    record copied under role engine_core (new pid) is no receipt of the engine's exit."""
    case = cases["clean_exit-engine_core_missing"]
    ts = [t for t in duplications(case) if "as role engine_core" in t.name and "bi1" in t.name]
    assert ts
    _never_pass_from_nonpass(case, candidate, ts, "R1 process relabelled")


# ============================================================================ R2: removal


@pytest.mark.parametrize("vid", NON_PASSING_IDS)
def test_r2_removal_each(vid, cases, candidate):
    """R2, every single removal from a non-passing set: never a pass."""
    case = cases[vid]
    _never_pass_from_nonpass(case, candidate, _capped(removals(case), case), "R2 removal")


@pytest.mark.parametrize("vid", NON_PASSING_IDS)
@HYP
@given(data=st.data())
def test_r2_removal_sampled(vid, cases, candidate, data):
    case = cases[vid]
    chain = _draw_chain(data, removals(case))
    note(f"{case.start()}; chain: {chain}")
    cell, tb = _run(case, candidate, chain)
    assert tb is None, tb
    assert cell.verdict is not Verdict.PASS, f"FALSE PASS after {chain}: {line(cell)}"


# ============================================================================ R4: receipt-side tolerances


@pytest.mark.parametrize("vid", ALL_IDS)
def test_r4_receipt_tolerance_keys_never_change_verdict(vid, cases, candidate):
    """Tolerance-like keys written alike into every leg's resolved_config / bench.json / rows:
    the verdict stays what it was (the question, not the receipt, sets every tolerance)."""
    case = cases[vid]
    violations = []
    for t in capped(tolerances(case), cap(vid, 15)):
        cell, tb = _run(case, candidate, [t])
        if tb is not None:
            violations.append(f"{t.name}: {tb}")
        elif cell.verdict is not case.verdict:
            violations.append(f"{t.name}: verdict {case.verdict.value} -> {line(cell)}")
    _report(case, violations, "R4 receipt tolerance")


@pytest.mark.parametrize("vid", NON_PASSING_IDS)
def test_r4_receipt_tolerance_keys_one_arm_never_make_pass(vid, cases, candidate):
    case = cases[vid]
    ts = capped(tolerances(case, ("bi1",)) + tolerances(case, ("bi0",)), cap(vid, 15))
    _never_pass_from_nonpass(case, candidate, ts, "R4 receipt tolerance (one arm)")


@pytest.mark.parametrize("vid", NON_PASSING_IDS)
@HYP
@given(data=st.data())
def test_r4_receipt_tolerance_sampled(vid, cases, candidate, data):
    case = cases[vid]
    arms = data.draw(st.sampled_from([("bi1", "bi0"), ("bi1",), ("bi0",)]), label="arms")
    chain = _draw_chain(data, tolerances(case, arms))
    note(f"{case.start()}; chain: {chain}")
    cell, tb = _run(case, candidate, chain)
    assert tb is None, tb
    assert cell.verdict is not Verdict.PASS, f"FALSE PASS after {chain}: {line(cell)}"


# ============================================================================ R6: per-leg rules


def _r6(case: Case, candidate, pairs) -> list[str]:
    violations = []
    for remove, move in pairs:
        removed, tb1 = _run(case, candidate, [remove])
        moved, tb2 = _run(case, candidate, [move])
        for tb in (tb1, tb2):
            if tb is not None:
                violations.append(tb)
        if removed is not None and moved is not None and removed.verdict is not Verdict.PASS \
                and moved.verdict is Verdict.PASS:
            violations.append(f"{move.name}: PASS, while [{remove.name}] alone is {line(removed)}\n"
                              f"      moved: {line(moved)}")
    return violations


@pytest.mark.parametrize("vid", [v.id for v in VARIANTS if v.name == "base" or v.id in
                                 ("throughput-too_few_rounds", "clean_exit-engine_core_missing")])
def test_r6_value_moved_within_arm_never_covers_missing(vid, cases, candidate):
    """A value removed from leg A is non-pass; the same value moved to leg B of A's arm must be too."""
    case = cases[vid]
    pairs = capped(moves(case, limit_pairs=12 if FULL else 3), cap(vid))
    _report(case, _r6(case, candidate, pairs), "R6 per-leg rule")


@pytest.mark.parametrize("vid", [v.id for v in VARIANTS if v.name == "base"])
@HYP
@given(data=st.data())
def test_r6_value_moved_sampled(vid, cases, candidate, data):
    case = cases[vid]
    pairs = moves(case, limit_pairs=12)
    if not pairs:
        return
    pair = data.draw(st.sampled_from(pairs), label="move")
    note(f"{case.start()}; {pair[1].name}")
    violations = _r6(case, candidate, [pair])
    assert not violations, violations


# ============================================================================ the starting sets themselves


@pytest.mark.parametrize("vid", ALL_IDS)
def test_starting_set_has_its_verdict(vid, cases):
    """Each starting set is built and has the verdict it was made for (checked in `cases`)."""
    case = cases[vid]
    assert case.verdict in case.variant.expect
    assert all((case.root / rel).is_dir() for rel in case.rel_legs)
    assert ops.meta(case.root / case.rel_legs[0])["schema"] == "tica.leg/1"
