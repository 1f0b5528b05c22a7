"""Issue 31, the tiers' cause: the engine-step reading, replayed (nothing here touches a GPU).

The cold-prefix-cache call (tests/test_h200_cold_cache.py) left stock's BI=0 legs in fast and slow
tiers with the cache ruled out. Throughput legs then recorded the engine's steps and tokens per step
over each leg (tica.legs.telemetry), and a device call reran the same cold-cache throughput legs
(tests/fixtures/h200/calls/engine_steps/README.md). What the receipts show: BI=0 still falls into
tiers at c=1 and c=64, and every leg of a concurrency took about the same number of engine steps with
about the same tokens per step, fast or slow: the tiers are not a scheduling difference. What the
judge names beside them is read from the judge, never assumed here."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tica.evidence import EvidenceItem
from tica.items.throughput.tiers import SIGNALS, tier_cause
from tica.judges import judge_criteria
from tica.question import load_question
from tica.receipt_archive import unpacked
from tica.receipts import load_leg

ROOT = Path(__file__).resolve().parents[1]
CALLS = ROOT / "tests" / "fixtures" / "h200" / "calls"
STEPS = CALLS / "engine_steps" / "legs.tar.xz"
COLD = CALLS / "cold_cache" / "legs.tar.xz"
QUESTION = ROOT / "demo" / "questions" / "h200-accept" / "throughput.yaml"
STEP_SIGNALS = {name: (what, rel) for name, what, _unit, rel in SIGNALS if name in ("engine_steps", "tokens_per_step")}


@pytest.fixture(scope="module")
def receipts(tmp_path_factory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("steps")
    steps = sorted((unpacked(STEPS, root / "steps") / "h200").glob("throughput_*"))
    cold = sorted((unpacked(COLD, root / "cold") / "run17").glob("throughput_*"))
    return {"steps": steps, "cold": cold}


@pytest.fixture(scope="module")
def judged(receipts):
    question = load_question(QUESTION)
    return {k: judge_criteria(EvidenceItem.THROUGHPUT, question, v) for k, v in receipts.items()}


def _tier_reason(cell, c: int, arm: str = "bi0") -> str | None:
    return next((r for r in cell.reasons if r.startswith(f"inconclusive: c={c}: {arm} throughput shows fast/slow tiers")), None)


def _arm_legs(dirs: list[Path], arm: str, c: int):
    """(output tok/s, telemetry) of one arm's legs at c, as the judge pairs them."""
    out = []
    for d in dirs:
        meta = load_leg(d).meta
        if meta.arm == arm and meta.concurrency == c:
            out.append((json.loads((d / "bench.json").read_text())["output_throughput"], meta.telemetry))
    return out


def _split(legs):
    """The tiers as tier_cause splits them: at the geometric middle of the slowest and the fastest."""
    lo, hi = min(x for x, _ in legs), max(x for x, _ in legs)
    mid = (lo * hi) ** 0.5
    return [t for x, t in legs if x >= mid], [t for x, t in legs if x < mid]


def test_every_leg_started_cold_and_recorded_its_engine_steps(receipts):
    """The 20 legs each record the cache emptied before them, one hit rate per c (as in the cold-cache
    call), and the engine's steps and tokens per step. Control: the cold-cache legs, recorded before
    the step telemetry, have neither."""
    metas = [load_leg(d).meta for d in receipts["steps"]]
    assert len(metas) == 20 and all(m.telemetry.prefix_cache_reset is True for m in metas)
    for c in (1, 64):
        assert len({m.telemetry.prefix_cache_hit_rate for m in metas if m.concurrency == c}) == 1
    assert all(m.telemetry.engine_steps and m.telemetry.tokens_per_step for m in metas)
    cold = [load_leg(d).meta.telemetry for d in receipts["cold"]]
    assert all(t.engine_steps is None and t.tokens_per_step is None for t in cold)


def test_bi0_tiers_recur_at_both_concurrencies(judged):
    """Judged under the frozen h200-accept throughput question, BI=0 again falls into tiers at c=1 and
    at c=64, and the cell stays inconclusive."""
    cell = judged["steps"]
    assert cell.verdict.name == "INCONCLUSIVE", cell.summary
    for c in (1, 64):
        assert _tier_reason(cell, c) is not None, cell.reasons


@pytest.mark.parametrize("c", [1, 64])
def test_engine_steps_and_tokens_per_step_do_not_separate_bi0s_tiers(receipts, c):
    """Split as the judge splits them, the fast and the slow BI=0 legs took the same engine steps with the
    same tokens per step (medians inside each signal's tolerance): one workload served in as many steps
    either way, so the slow legs' steps took longer, not more of them."""
    fast, slow = _split(_arm_legs(receipts["steps"], "bi0", c))
    assert fast and slow
    for name, (_what, rel) in STEP_SIGNALS.items():
        f = statistics.median(getattr(t, name) for t in fast)
        s = statistics.median(getattr(t, name) for t in slow)
        assert abs(f - s) <= rel * max(f, s), (c, name, f, s)


@pytest.mark.parametrize("c", [1, 64])
def test_the_judge_does_not_name_engine_steps_as_the_tiers_cause(judged, c):
    """The judge's cause for BI=0's tiers, whatever it names, names neither engine steps nor tokens per
    step (both recorded in every leg, so compared and found alike)."""
    reason = _tier_reason(judged["steps"], c)
    assert reason is not None
    for what, _rel in STEP_SIGNALS.values():
        assert what not in reason, reason


def test_control_slow_legs_with_more_smaller_steps_would_be_named(receipts):
    """The negative control: the same c=64 BI=0 legs with the slow legs' steps edited to half as many
    tokens in twice the steps (a scheduling difference) make the tiers' cause name both step signals;
    unedited, it names neither."""
    assert set(STEP_SIGNALS) == {"engine_steps", "tokens_per_step"}  # the judge compares both
    legs = _arm_legs(receipts["steps"], "bi0", 64)
    _fast, slow = _split(legs)
    edited = [(x, t.model_copy(update={"engine_steps": t.engine_steps * 2, "tokens_per_step": t.tokens_per_step / 2})
               if any(t is s for s in slow) else t) for x, t in legs]
    named, recorded = tier_cause(edited), tier_cause(legs)
    for what, _rel in STEP_SIGNALS.values():
        assert what in named, named
        assert what not in recorded, recorded


def test_control_the_cold_cache_legs_lack_steps_so_the_judge_never_names_them(judged):
    """The cold-cache call's legs have no step telemetry: its BI=0 tiers' cause names no engine steps."""
    for c in (1, 64):
        reason = _tier_reason(judged["cold"], c)
        assert reason is not None
        for what, _rel in STEP_SIGNALS.values():
            assert what not in reason, reason
