"""Issue 31, the tiers' cause, third reading: the engine's own clock and the host (replayed; nothing
here touches a GPU).

The engine-step call (tests/test_h200_engine_steps.py) showed the slow legs ran as many engine steps
as the fast ones, each slower. The same cold-cache throughput legs were run again with the engine's
inter-token latency (vLLM's histogram, on the engine core's clock) and the host's readings (stolen
and busy CPU, CPU clock, a CPU probe, involuntary switches) in every leg
(tests/fixtures/h200/calls/itl_host/README.md). What the receipts show at c=64, in both arms: the
engine's own time between tokens is slower in the slow tier by about as much as the throughput, the
GPU is less busy there, the GPU clocks do not move, and none of the host readings separates the
tiers. So the time is lost inside the engine, on its host side, not in the API server, the client or
a starved host."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tests.test_h200_engine_steps import _arm_legs
from tica.evidence import EvidenceItem
from tica.items.throughput.tiers import SIGNALS, tier_cause
from tica.judges import judge_criteria
from tica.question import load_question
from tica.receipt_archive import unpacked
from tica.receipts import load_leg
from tica.seal import check_seal

ROOT = Path(__file__).resolve().parents[1]
CALLS = ROOT / "tests" / "fixtures" / "h200" / "calls"
LEGS = CALLS / "itl_host" / "legs.tar.xz"
STEPS = CALLS / "engine_steps" / "legs.tar.xz"
QUESTION = ROOT / "demo" / "questions" / "h200-accept" / "throughput.yaml"
WHAT = {name: what for name, what, _unit, _rel in SIGNALS}
HOST = ("cpu_steal_pct", "cpu_busy_pct", "cpu_mhz_median", "cpu_probe_ms_median",
        "involuntary_switches_per_s.engine_core", "involuntary_switches_per_s.api_server", "cpu_util.engine_core")
NEW = ("engine_itl_ms_mean", "cpu_steal_pct", "cpu_busy_pct", "cpu_mhz_median", "cpu_probe_ms_median")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("itl")
    return {"itl": sorted((unpacked(LEGS, root / "itl") / "h200").glob("throughput_*")),
            "steps": sorted((unpacked(STEPS, root / "steps") / "h200").glob("throughput_*"))}


def _tiers(legs):
    """(fast, slow) as tier_cause splits them: at the geometric middle of the slowest and the fastest."""
    mid = (min(x for x, _ in legs) * max(x for x, _ in legs)) ** 0.5
    return [(x, t) for x, t in legs if x >= mid], [(x, t) for x, t in legs if x < mid]


def _median(legs, field: str) -> float:
    name, _, role = field.partition(".")
    return statistics.median((getattr(t, name) or {}).get(role) if role else getattr(t, name) for _, t in legs)


def test_twenty_sealed_legs_each_with_the_engines_clock_and_the_hosts_readings(dirs):
    """Control: the engine-step call's legs, recorded before these readings existed, have none."""
    assert len(dirs["itl"]) == 20
    for d in dirs["itl"]:
        assert check_seal(d) == []
        meta = load_leg(d).meta
        assert meta.device["name"] == "NVIDIA H100 80GB HBM3" and meta.telemetry.prefix_cache_reset is True
        assert all(getattr(meta.telemetry, f) is not None for f in NEW), meta.telemetry
        assert meta.telemetry.cpu_probes and meta.telemetry.involuntary_switches_per_s
    for d in dirs["steps"]:
        assert all(getattr(load_leg(d).meta.telemetry, f) is None for f in NEW)


@pytest.mark.parametrize("arm", ["bi0", "bi1"])
def test_at_c64_the_engines_time_between_tokens_slows_as_much_as_the_throughput(dirs, arm):
    fast, slow = _tiers(_arm_legs(dirs["itl"], arm, 64))
    throughput = statistics.median(x for x, _ in fast) / statistics.median(x for x, _ in slow)
    itl = _median(slow, "engine_itl_ms_mean") / _median(fast, "engine_itl_ms_mean")
    assert throughput > 1.15  # tiers past the question's 1.15
    assert abs(itl / throughput - 1) < 0.05, (itl, throughput)


@pytest.mark.parametrize("arm", ["bi0", "bi1"])
def test_at_c64_the_gpu_is_less_busy_in_the_slow_tier_at_unchanged_clocks(dirs, arm):
    legs = _arm_legs(dirs["itl"], arm, 64)
    fast, slow = _tiers(legs)
    assert _median(slow, "gpu_util_pct_median") < _median(fast, "gpu_util_pct_median")
    assert len({(t.sm_clock_mhz_median, t.mem_clock_mhz_median) for _, t in legs}) == 1
    assert not any(t.throttle_reasons for _, t in legs)


@pytest.mark.parametrize("arm", ["bi0", "bi1"])
def test_at_c64_no_host_reading_separates_the_tiers(dirs, arm):
    """The judge's cause names the engine's time and the GPU's utilisation, none of the host's readings.
    Control: the same legs with the slow tier's probe loop and stolen share edited up are named."""
    legs = _arm_legs(dirs["itl"], arm, 64)
    cause = tier_cause(legs)
    assert WHAT["engine_itl_ms_mean"] in cause and WHAT["gpu_util_pct_median"] in cause
    assert not [f for f in HOST if WHAT[f] in cause], cause
    _fast, slow = _tiers(legs)
    starved = [(x, t.model_copy(update={"cpu_probe_ms_median": t.cpu_probe_ms_median * 2, "cpu_steal_pct": 20.0})
                if any(t is s for _, s in slow) else t) for x, t in legs]
    named = tier_cause(starved)
    assert WHAT["cpu_probe_ms_median"] in named and WHAT["cpu_steal_pct"] in named


def test_judged_the_cell_stays_inconclusive_and_names_the_engines_time_at_c64(dirs):
    cell = judge_criteria(EvidenceItem.THROUGHPUT, load_question(QUESTION), dirs["itl"])
    assert cell.verdict.name == "INCONCLUSIVE", cell.summary
    tiers = [r for r in cell.reasons if "fast/slow tiers" in r]
    at64 = [r for r in tiers if r.startswith("inconclusive: c=64:")]
    assert len(at64) == 2 and all(WHAT["engine_itl_ms_mean"] in r for r in at64), tiers
