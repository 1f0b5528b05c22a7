"""Issue 31, the tiers' cause, fourth reading: where the engine core ran (replayed; nothing here
touches a GPU).

After the engine's own clock put the slow legs' time inside the engine (tests/test_h200_itl_host.py),
the same throughput legs ran again with each leg reading the engine core's CPUs, how often it moved
and its SMT sibling's load (tests/fixtures/h200/calls/placement/README.md). What the receipts show:
the guest (16 vCPUs, one thread per core, one NUMA node) hides what shares the engine's physical
core, so the sibling's load is unknown, and the vCPU the engine ran on does not separate BI=0's
tiers: one vCPU served a fast and a slow leg."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_h200_engine_steps import _arm_legs
from tests.test_h200_itl_host import _tiers
from tica.items.throughput.tiers import SIGNALS, tier_cause
from tica.receipt_archive import unpacked
from tica.receipts import load_leg
from tica.seal import check_seal

ROOT = Path(__file__).resolve().parents[1]
LEGS = ROOT / "tests" / "fixtures" / "h200" / "calls" / "placement" / "legs.tar.xz"
WHAT = {name: what for name, what, _unit, _rel in SIGNALS}


def _single_cpus(tier) -> set[tuple[int, ...]]:
    """The vCPUs of the legs in a tier whose engine stayed on one vCPU throughout."""
    return {t.engine_cpus for _, t in tier if len(t.engine_cpus) == 1}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> list[Path]:
    return sorted((unpacked(LEGS, tmp_path_factory.mktemp("placement")) / "h200").glob("throughput_*"))


def test_twenty_sealed_legs_each_read_where_its_engine_ran_and_no_sibling_is_invented(dirs):
    assert len(dirs) == 20
    for d in dirs:
        assert check_seal(d) == []
        t = load_leg(d).meta.telemetry
        assert t.engine_cpus and set(t.engine_cpus) <= set(range(16)) and t.engine_numa_nodes == (0,)
        assert t.engine_cpu_moves_pct is not None and t.engine_itl_ms_mean is not None
        assert t.engine_sibling_busy_pct is None  # the guest shows no SMT sibling: unknown, never 0


@pytest.mark.parametrize("c", [1, 64])
def test_bi0_tiers_recur_and_the_engines_own_time_is_slower_in_the_slow_legs(dirs, c):
    legs = _arm_legs(dirs, "bi0", c)
    fast, slow = _tiers(legs)
    assert fast and slow and max(x for x, _ in fast) / min(x for x, _ in slow) > 1.15
    assert WHAT["engine_itl_ms_mean"] in tier_cause(legs)


def test_the_vcpu_the_engine_ran_on_does_not_make_a_leg_fast_or_slow(dirs):
    """At c=1 one vCPU served the engine in a fast and in a slow BI=0 leg (each leg on one vCPU
    throughout). The tiers' cause names neither the moves nor the sibling's load."""
    legs = _arm_legs(dirs, "bi0", 1)
    fast, slow = _tiers(legs)
    shared = _single_cpus(fast) & _single_cpus(slow)
    assert shared, legs
    cause = tier_cause(legs)
    assert WHAT["engine_cpu_moves_pct"] not in cause and WHAT["engine_sibling_busy_pct"] not in cause, cause


def test_the_tiers_table_shows_each_legs_engine_time_and_where_the_engine_ran(dirs):
    """What a person reads in the throughput cell's tiers table: per leg the engine's time between
    tokens and its CPUs with how often it moved, read from that leg's receipt."""
    from tica.evidence import EvidenceItem
    from tica.judges import judge_criteria
    from tica.question import load_question

    question = load_question(ROOT / "demo" / "questions" / "h200-accept" / "throughput.yaml")
    cell = judge_criteria(EvidenceItem.THROUGHPUT, question, dirs)
    table = cell.tables["tiers: what each leg ran under"]
    assert "| engine ITL ms |" in table and "| engine CPUs |" in table
    moved = next(load_leg(d).meta.telemetry for d in dirs if load_leg(d).meta.arm == "bi0"
                 and load_leg(d).meta.concurrency == 1 and len(load_leg(d).meta.telemetry.engine_cpus) == 2)
    assert f"| {moved.engine_itl_ms_mean:g} |" in table
    assert f"{', '.join(map(str, moved.engine_cpus))} ({moved.engine_cpu_moves_pct:g}% moves)" in table
