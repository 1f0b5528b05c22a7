"""The tiers' cause, named from what each leg ran under (tica.items.throughput.tiers): one relation per
signal, each with its control (the same legs with that signal equal name nothing)."""

from __future__ import annotations

import pytest

from tica.items.throughput.tiers import SIGNALS, tier_cause
from tica.receipts import LegTelemetry

BASE = dict(source="nvidia-smi", samples=40, interval_ms=500, sm_clock_mhz_median=1980.0, mem_clock_mhz_median=3201.0,
            power_w_median=450.0, temperature_c_max=60.0, gpu_util_pct_median=99.0, throttle_reasons=(),
            cpu_load_1m_start=1.0, cpu_load_1m_end=1.0, served_before=1, cuda_graphs=False,
            prefix_cache_hit_rate=0.5, preemptions=4, engine_steps=600, tokens_per_step=40.0,
            cpu_util={"engine_core": 0.5, "api_server": 0.3, "client": 0.4},
            involuntary_switches_per_s={"engine_core": 120.0, "api_server": 40.0, "client": 10.0},
            cpu_steal_pct=0.0, cpu_busy_pct=20.0, cpu_mhz_median=2600.0, cpu_probe_ms_median=8.0,
            cpu_probe_ms_max=9.5, cpu_probes=60, engine_itl_ms_mean=5.0, engine_cpus=(3, 5), engine_numa_nodes=(0,),
            engine_cpu_moves_pct=20.0, engine_sibling_busy_pct=20.0, engine_cpu_loop_ms=2.0, cpu_loop_ms_min=1.9,
            cpu_loop_ms_max=2.2)
_BY_ROLE = ("cpu_util", "involuntary_switches_per_s")


def tel(**over) -> LegTelemetry:
    """`cpu_util.<role>=x` sets one role's CPU time per second (likewise each per-role field)."""
    merged = {**BASE}
    for field in _BY_ROLE:
        roles = {k.partition(".")[2]: over.pop(k) for k in [k for k in over if k.startswith(field + ".")]}
        merged[field] = {**BASE[field], **roles}
    return LegTelemetry(**{**merged, **over})


def base(field: str) -> float:
    name, _, role = field.partition(".")
    return BASE[name][role] if role else BASE[name]


def test_equal_conditions_name_no_cause():
    assert "not found" in tier_cause([(100.0, tel()), (140.0, tel()), (101.0, tel()), (139.0, tel())])


@pytest.mark.parametrize("field,what,_unit,rel", SIGNALS)
def test_each_signal_that_differs_between_the_tiers_is_named(field, what, _unit, rel):
    kind = type(base(field))  # a count stays a whole number
    slow_value = kind(base(field) * (1 - 2 * rel) if base(field) else 3.0)
    legs = [(100.0, tel(**{field: slow_value})), (140.0, tel()), (101.0, tel(**{field: slow_value})), (139.0, tel())]
    assert what in tier_cause(legs)
    # the control: a difference inside the signal's tolerance names nothing
    near = kind(base(field) * (1 - rel / 2))
    assert "not found" in tier_cause([(100.0, tel(**{field: near})), (140.0, tel())])


@pytest.mark.parametrize("field,fast,slow", [("cpu_steal_pct", 0.2, 0.9), ("cpu_busy_pct", 6.0, 10.0),
                                             ("engine_cpu_moves_pct", 0.0, 9.0), ("engine_sibling_busy_pct", 1.0, 5.5)])
def test_a_share_that_differs_by_less_than_its_floor_is_noise_whatever_its_ratio(field, fast, slow):
    assert "not found" in tier_cause([(100.0, tel(**{field: slow})), (140.0, tel(**{field: fast}))])
    # the control: past the floor the same direction is named
    assert "not found" not in tier_cause([(100.0, tel(**{field: slow + 5.0})), (140.0, tel(**{field: fast}))])


def test_throttling_only_in_the_slow_legs_is_named():
    legs = [(100.0, tel(throttle_reasons=("hw_slowdown",))), (140.0, tel())]
    assert "hw_slowdown" in tier_cause(legs)
    assert "not found" in tier_cause([(100.0, tel(throttle_reasons=("hw_slowdown",))),
                                      (140.0, tel(throttle_reasons=("hw_slowdown",)))])


def test_a_slow_first_leg_of_each_server_is_named_warm_up():
    legs = [(100.0, tel(served_before=0)), (140.0, tel(served_before=3)), (139.0, tel(served_before=5))]
    assert "warm-up" in tier_cause(legs)
    assert "not found" in tier_cause([(100.0, tel(served_before=2)), (140.0, tel(served_before=0))])


@pytest.mark.parametrize("untold", [None, tel(samples=0)])
def test_a_leg_without_telemetry_leaves_the_cause_unknown(untold):
    assert "unknown" in tier_cause([(100.0, untold), (140.0, tel())])


def test_the_sampler_never_invents_a_gpu_reading_where_there_is_no_nvidia_smi(monkeypatch):
    from tica.legs import telemetry

    monkeypatch.setattr(telemetry.shutil, "which", lambda name: None)
    with telemetry.Sampler() as s:
        pass
    out = LegTelemetry(**s.summary(served_before=0, cuda_graphs=False))
    assert out.samples == 0 and out.sm_clock_mhz_median is None and out.throttle_reasons is None


def test_throttle_bits_are_named_and_unknown_bits_kept():
    from tica.legs.telemetry import throttle_names

    assert throttle_names(0x8 | 0x4) == ["sw_power_cap", "hw_slowdown"]
    assert throttle_names(0x10000) == ["unknown_0x10000"]


def test_a_host_bound_arm_is_said_so_when_nothing_differs():
    busy = dict(gpu_util_pct_median=45.0, **{"cpu_util.engine_core": 0.97})
    said = tier_cause([(100.0, tel(**busy)), (140.0, tel(**busy)), (101.0, tel(**busy))])
    assert "bound by the host" in said and "not found" in said
    # the controls: a GPU kept busy, or an engine loop with time to spare, is not host-bound
    assert "bound by the host" not in tier_cause([(100.0, tel(**{**busy, "gpu_util_pct_median": 99.0})), (140.0, tel(**{**busy, "gpu_util_pct_median": 99.0}))])
    assert "bound by the host" not in tier_cause([(100.0, tel(**{**busy, "cpu_util.engine_core": 0.5})), (140.0, tel(**{**busy, "cpu_util.engine_core": 0.5}))])
    # an engine whose CPU time was not read is unknown, never host-bound
    unread = tel(gpu_util_pct_median=45.0, cpu_util={"engine_core": None})
    assert "bound by the host" not in tier_cause([(100.0, unread), (140.0, unread)])


def test_the_sampler_reads_each_roles_cpu_time_and_leaves_an_unread_role_unknown(monkeypatch):
    import os

    from tica.legs import telemetry

    monkeypatch.setattr(telemetry.shutil, "which", lambda name: None)
    gone = 2**22 + 12345  # above pid_max's default: no such process
    with telemetry.Sampler(processes={"client": [os.getpid()], "engine_core": [], "api_server": [gone]}) as s:
        t = telemetry.time.process_time()
        while telemetry.time.process_time() - t < 0.05:
            pass
    got = LegTelemetry(**s.summary(served_before=0, cuda_graphs=None)).cpu_util
    assert got["client"] is not None and got["client"] > 0
    assert got["engine_core"] is None and got["api_server"] is None
    with telemetry.Sampler() as s:
        pass
    assert s.summary(served_before=0, cuda_graphs=None)["cpu_util"] is None


def test_the_sampler_reads_the_host_and_its_probe_while_the_leg_runs(monkeypatch):
    """The host's stolen and busy CPU, each role's involuntary switches and the probe's loop times
    are read on any machine (no GPU needed); a role that cannot be read stays unknown."""
    import os

    from tica.legs import telemetry

    monkeypatch.setattr(telemetry.shutil, "which", lambda name: None)
    gone = 2**22 + 12345
    with telemetry.Sampler(processes={"client": [os.getpid()], "api_server": [gone]}) as s:
        deadline = telemetry.time.monotonic() + 1.5
        while telemetry.time.monotonic() < deadline and len(s.probe_ms) < 2:
            telemetry.time.sleep(0.05)
    got = LegTelemetry(**s.summary(served_before=0, cuda_graphs=None))
    assert got.cpu_probes and got.cpu_probes >= 1 and got.cpu_probe_ms_median is not None
    assert got.cpu_probe_ms_max is not None and got.cpu_probe_ms_max >= got.cpu_probe_ms_median
    assert got.cpu_busy_pct is not None and got.cpu_steal_pct is not None
    assert got.involuntary_switches_per_s["client"] is not None and got.involuntary_switches_per_s["api_server"] is None
    assert s._probe is not None and s._probe.poll() is not None  # the probe does not outlive its leg
    # the control: shares read across a counter that went back (another boot) are unknown, never negative
    later = telemetry.psutil.cpu_times()
    assert telemetry.host_shares(later, s._host_start) in ({"cpu_steal_pct": None, "cpu_busy_pct": None},)


def test_host_shares_count_guest_time_once():
    """/proc/stat counts a guest's time inside user already: a host running only guests is 50% busy
    here (user 50 of 100), never more. Control: without guest time the same user time reads the same."""
    from collections import namedtuple

    from tica.legs.telemetry import host_shares

    Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")
    start = Times(*[0.0] * 10)
    with_guest = Times(50.0, 0.0, 0.0, 50.0, 0.0, 0.0, 0.0, 0.0, 50.0, 0.0)
    assert host_shares(start, with_guest) == {"cpu_steal_pct": 0.0, "cpu_busy_pct": 50.0}
    assert host_shares(start, with_guest._replace(guest=0.0)) == host_shares(start, with_guest)


@pytest.mark.parametrize("bad", [{"engine_core": -0.1}, {"engine_core": float("nan")}, {"gpu": 0.5}])
def test_a_cpu_time_out_of_range_or_of_an_unknown_role_is_refused(bad):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        LegTelemetry(**{**BASE, "cpu_util": bad})


def test_a_signal_one_tier_never_recorded_is_said_not_recorded_not_compared():
    legs = [(100.0, tel(prefix_cache_hit_rate=None)), (140.0, tel())]
    cause = tier_cause(legs)
    assert "not found" in cause and "the prefix-cache hit rate not recorded" in cause
    assert "not recorded" not in tier_cause([(100.0, tel()), (140.0, tel())])


def test_a_legs_counters_are_its_own_share_of_the_servers():
    from tica.legs.telemetry import engine_counts, parse_counters

    text = """# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tput"} 2048.0
vllm:prefix_cache_queries_total{engine="0",model_name="tput"} 4096.0
vllm:num_preemptions_total{engine="0",model_name="tput"} 1.0
vllm:prefix_cache_hits_created{engine="0",model_name="tput"} 1.7e9
"""
    before = parse_counters(text)
    assert before == {"prefix_cache_hits": 2048.0, "prefix_cache_queries": 4096.0, "preemptions": 1.0}
    after = {"prefix_cache_hits": 2048.0 + 900, "prefix_cache_queries": 4096.0 + 1000, "preemptions": 1.0}
    unread_steps = {"engine_steps": None, "tokens_per_step": None,  # this text exposes no step histogram
                    "engine_itl_ms_mean": None}
    assert engine_counts(before, after) == {"prefix_cache_hit_rate": 0.9, "preemptions": 0, **unread_steps}
    # unread, or a counter that went back (another server answered): unknown, never 0
    assert engine_counts({}, after) == {"prefix_cache_hit_rate": None, "preemptions": None, **unread_steps}
    assert engine_counts(after, before)["prefix_cache_hit_rate"] is None


def test_the_kernels_cpu_lists_are_read_as_cpu_numbers():
    from tica.legs.telemetry import parse_cpu_list

    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("5") == [5] and parse_cpu_list("") == []


def test_placement_counts_moves_between_readings_and_leaves_a_missing_sibling_unknown():
    """Moves are changes between consecutive readings (3 of 4 here); the sibling's share is the median
    over the readings after the first. Control: one reading without a sibling's share makes it
    unknown, never the median of the rest."""
    from tica.legs.telemetry import placement

    got = placement([2, 2, 7, 2, 3], [None, 10.0, 30.0, 20.0, 90.0])
    assert got["engine_cpus"] == [2, 3, 7] and got["engine_cpu_moves_pct"] == 75.0
    assert got["engine_sibling_busy_pct"] == 25.0
    assert placement([2, 2, 7], [None, 10.0, None])["engine_sibling_busy_pct"] is None
    one = placement([4], [None])  # one reading: no move and no interval to read
    assert one["engine_cpus"] == [4] and one["engine_cpu_moves_pct"] is None and one["engine_sibling_busy_pct"] is None
    assert set(placement([], []).values()) == {None}


@pytest.mark.processes
def test_the_sampler_reads_where_the_engine_ran_and_its_siblings_load(monkeypatch, tmp_path):
    """On this machine, against a busy child standing in for the engine core: its CPUs are read, and
    with a topology that gives every CPU a sibling (a copy of sysfs's layout) the sibling's busy share
    is read too. Control: the same layout with no CPU sharing its core (SMT off) leaves it unknown,
    never 0."""
    import subprocess
    import sys

    from tica.legs import telemetry

    monkeypatch.setattr(telemetry.shutil, "which", lambda name: None)
    cpus = sorted(telemetry.os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        def sample(root):
            monkeypatch.setattr(telemetry, "CPU_SYSFS", root)
            with telemetry.Sampler(processes={"engine_core": [busy.pid]}) as s:
                deadline = telemetry.time.monotonic() + 6
                while telemetry.time.monotonic() < deadline and len(s.engine_cpus) < 3:
                    telemetry.time.sleep(0.05)
            return LegTelemetry(**s.summary(served_before=0, cuda_graphs=None))

        def topology(name: str, siblings) -> telemetry.Path:
            root = tmp_path / name
            for c in range(max(cpus) + 2):
                (root / f"cpu{c}" / "topology").mkdir(parents=True)
                (root / f"cpu{c}" / "topology" / "thread_siblings_list").write_text(siblings(c) + "\n")
                (root / f"cpu{c}" / "node0").mkdir()
            return root

        got = sample(topology("paired", lambda c: f"{c - c % 2}-{c - c % 2 + 1}"))
        assert got.engine_cpus and set(got.engine_cpus) <= set(cpus) and got.engine_numa_nodes == (0,)
        assert got.engine_cpu_moves_pct is not None and got.engine_sibling_busy_pct is not None
        assert got.cpu_loop_ms_min <= got.engine_cpu_loop_ms <= got.cpu_loop_ms_max
        alone = sample(topology("alone", str))
        assert alone.engine_cpus and alone.engine_sibling_busy_pct is None
    finally:
        busy.kill()
        busy.wait()


def test_the_pinned_loop_is_read_on_the_cpu_the_engine_was_on_at_each_reading():
    """Each reading's own CPU of the engine: 2 ms at the start on CPU 1 and 4 ms at the end on CPU 0
    give 3 ms, and the fastest and slowest CPU over both readings frame it. Control: a reading that
    could not tell the engine's CPU, or could not time it, leaves the engine's loop unknown."""
    from tica.legs.telemetry import pinned_summary

    got = pinned_summary([(1, {0: 2.5, 1: 2.0}), (0, {0: 4.0, 1: 2.1})])
    assert got == {"engine_cpu_loop_ms": 3.0, "cpu_loop_ms_min": 2.0, "cpu_loop_ms_max": 4.0}
    assert pinned_summary([(None, {0: 2.5}), (0, {0: 4.0})])["engine_cpu_loop_ms"] is None
    assert pinned_summary([(1, {0: 2.5}), (0, {0: 4.0})])["engine_cpu_loop_ms"] is None
    assert set(pinned_summary([]).values()) == {None}


@pytest.mark.processes
def test_the_pinned_loop_is_slower_on_a_cpu_a_busy_process_shares(monkeypatch):
    """What the reading is for: a CPU whose time the loop shares (here with a busy child pinned to it,
    on a hypervisor with a neighbour on the same physical core) runs the loop slower. Long loops
    here, so the OS's time slices show; control: the same CPU without the child."""
    import subprocess
    import sys

    from tica.legs import telemetry

    cpu = max(telemetry.os.sched_getaffinity(0))
    monkeypatch.setattr(telemetry, "PINNED_LOOP", 2_000_000)
    alone = telemetry.pinned_loop_ms([cpu])[cpu]
    busy = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        telemetry.time.sleep(0.3)
        shared = telemetry.pinned_loop_ms([cpu])[cpu]
    finally:
        busy.kill()
        busy.wait()
    assert shared > 1.25 * alone, (alone, shared)
    assert telemetry.pinned_loop_ms([10_000]) == {}  # a CPU it cannot be pinned to is absent, never 0


def test_longer_legs_multiply_each_legs_prompts_and_a_multiple_under_one_is_refused():
    """--prompts-mult (the GPU producer's longer legs for the tiers): each leg sends max(2, c) x the
    multiple; 0, a negative or a fraction is refused by name, never a leg of no prompts."""
    import argparse

    from tica.legs.vllm_kernels.launcher import _positive_int
    from tica.legs.vllm_kernels.server import _plan

    assert {(leg["c"], leg["num_prompts"]) for leg in _plan(1, (1, 64), _positive_int("4"))} == {(1, 8), (64, 256)}
    for bad in ("0", "-2", "1.5", "", "four"):
        with pytest.raises(argparse.ArgumentTypeError, match="positive integer"):
            _positive_int(bad)


def test_the_tiers_table_shows_the_pinned_loop_where_recorded_and_unknown_where_not():
    from types import SimpleNamespace

    from tica.items.throughput.judge import TIER_COLUMNS, _tier_row

    def cell(t: LegTelemetry) -> str:
        lc = SimpleNamespace(leg=SimpleNamespace(meta=SimpleNamespace(telemetry=t)))
        return _tier_row(1, "bi0", 1, 100.0, lc)[TIER_COLUMNS.index("pinned loop ms: engine CPU (all CPUs)")]

    assert cell(tel()) == "2 (CPUs 1.9 to 2.2)"
    assert cell(tel(engine_cpu_loop_ms=None, cpu_loop_ms_min=None, cpu_loop_ms_max=None)) == "unknown"
    assert cell(tel(engine_cpu_loop_ms=None)).startswith("— (CPUs 1.9")  # the engine's CPU unread, the rest shown
