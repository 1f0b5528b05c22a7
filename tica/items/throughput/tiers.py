"""What the legs of fast and slow tiers ran under: a tier's cause named from the legs' telemetry.

Tiers inside one arm (max/min throughput over the question's tier_ratio) keep a concurrency
inconclusive whatever their cause. This says which recorded condition differs between the fast
and the slow legs of that arm (GPU clocks, power, temperature, throttling, CPU load, the CPU time
of the engine, the API server and the client, the prefix-cache hit rate and preemptions of the
leg's requests, the engine's steps, tokens per step and time between tokens, the host's stolen and
busy CPU, its clock, a CPU probe's loop time, involuntary switches, where the engine ran (its moves
between CPUs, its SMT sibling's load, a loop's time pinned to its CPU), how many legs the server ran
before), so a person sees the candidate cause; it never changes a verdict. `tier_shape` adds whether
the slow legs were slow on every token or in a few long pauses.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from tica.receipts import LegTelemetry

# (field, what it is, unit, relative difference between the tiers' medians that counts as differing)
SIGNALS: tuple[tuple[str, str, str, float], ...] = (
    ("sm_clock_mhz_median", "SM clock", " MHz", 0.03),
    ("mem_clock_mhz_median", "memory clock", " MHz", 0.03),
    ("power_w_median", "power", " W", 0.10),
    ("temperature_c_max", "peak temperature", " C", 0.10),
    ("gpu_util_pct_median", "GPU utilisation", "%", 0.10),
    ("cpu_load_1m_end", "CPU load (1 min)", "", 0.5),
    ("cpu_util.engine_core", "the engine's CPU time per second", "", 0.10),
    ("cpu_util.api_server", "the API server's CPU time per second", "", 0.10),
    ("cpu_util.client", "the client's CPU time per second", "", 0.10),
    ("prefix_cache_hit_rate", "the prefix-cache hit rate", "", 0.10),
    ("preemptions", "preemptions", "", 0.5),
    ("engine_steps", "the engine's steps", "", 0.10),
    ("tokens_per_step", "tokens per engine step", "", 0.10),
    ("engine_itl_ms_mean", "the engine's time between a request's tokens", " ms", 0.10),
    ("cpu_probe_ms_median", "the CPU probe's loop time", " ms", 0.10),
    ("cpu_mhz_median", "the CPU clock", " MHz", 0.03),
    ("cpu_steal_pct", "CPU time stolen by the hypervisor", "%", 0.5),
    ("cpu_busy_pct", "the machine's busy CPU share", "%", 0.5),
    ("involuntary_switches_per_s.engine_core", "the engine's involuntary switches per second", "", 0.5),
    ("involuntary_switches_per_s.api_server", "the API server's involuntary switches per second", "", 0.5),
    ("engine_cpu_moves_pct", "how often the engine moved to another CPU", "%", 0.5),
    ("engine_sibling_busy_pct", "the busy share of the engine's SMT sibling", "%", 0.5),
    ("engine_cpu_loop_ms", "a loop's time pinned to the engine's CPU", " ms", 0.10),
)
# below these the difference between two shares is noise, whatever its ratio (percent points)
FLOORS = {"cpu_steal_pct": 1.0, "cpu_busy_pct": 5.0, "engine_cpu_moves_pct": 10.0, "engine_sibling_busy_pct": 5.0}
# an engine loop this busy while the GPU idles this much is bound by the host, not the GPU
HOST_BOUND_ENGINE_CPU, HOST_BOUND_GPU_UTIL = 0.9, 80.0


def _signal(t: LegTelemetry, name: str) -> float | None:
    field, _, role = name.partition(".")
    value = getattr(t, field)
    return (value or {}).get(role) if role else value


def _median(xs: Sequence[float | int | None]) -> float | None:
    got = [float(x) for x in xs if x is not None]
    return statistics.median(got) if got else None


def split_tiers(throughputs: Sequence[float]) -> tuple[list[int], list[int]]:
    """The indices of the fast and the slow legs: split at the geometric middle of the slowest and
    the fastest (the arithmetic one where a throughput is 0)."""
    lo, hi = min(throughputs), max(throughputs)
    mid = math.sqrt(lo * hi) if lo > 0 else (lo + hi) / 2
    return ([i for i, x in enumerate(throughputs) if x >= mid], [i for i, x in enumerate(throughputs) if x < mid])


def tier_cause(legs: Sequence[tuple[float, LegTelemetry | None]]) -> str:
    """One clause: what differs between the fast and the slow legs, or that nothing recorded does."""
    if len(legs) < 2:
        return "too few legs to split into tiers"
    untold = sum(t is None or t.samples == 0 for _, t in legs)
    if untold:
        return f"{untold} of {len(legs)} leg(s) record no telemetry, so the tiers' cause is unknown"
    f_at, s_at = split_tiers([x for x, _ in legs])
    fast, slow = [legs[i][1] for i in f_at], [legs[i][1] for i in s_at]
    found = []
    unread = []  # signals some tier never recorded: not compared, and said so
    for name, what, unit, rel in SIGNALS:
        f, s = _median([_signal(t, name) for t in fast]), _median([_signal(t, name) for t in slow])
        if f is None or s is None:
            unread.append(what)
        elif abs(f - s) > max(rel * max(abs(f), abs(s), 1e-9), FLOORS.get(name, 0.0)):
            found.append(f"{what} {f:g}{unit} in the fast legs against {s:g}{unit} in the slow")
    only_slow = sorted({r for t in slow for r in (t.throttle_reasons or ())} - {r for t in fast for r in (t.throttle_reasons or ())})
    if only_slow:
        found.append(f"throttling ({', '.join(only_slow)}) in the slow legs only")
    first_slow = [t.served_before for t in slow]
    if first_slow and all(n == 0 for n in first_slow) and all((t.served_before or 0) > 0 for t in fast):
        found.append("every slow leg was its server's first (warm-up)")
    if found:
        return "tiers coincide with " + "; ".join(found)
    engine = [_signal(t, "cpu_util.engine_core") for _, t in legs]
    gpu = _median([t.gpu_util_pct_median for _, t in legs])
    if all(e is not None and e >= HOST_BOUND_ENGINE_CPU for e in engine) and gpu is not None and gpu < HOST_BOUND_GPU_UTIL:
        return (f"the arm is bound by the host (its engine's loop kept a core at least {HOST_BOUND_ENGINE_CPU:g} busy "
                f"while the GPU's median utilisation was {gpu:g}%), and nothing recorded differs between the tiers, "
                "so their cause is not found")
    not_read = f" ({', '.join(unread)} not recorded)" if unread else ""
    return ("nothing the legs recorded (clocks, power, temperature, throttling, CPU load and CPU time, prefix-cache "
            f"hits, preemptions, engine steps and their time, the host's CPU, where the engine ran, legs served before) differs between the tiers{not_read}, so their cause is not found")


# of the tiers' throughput gap, how much the median time between tokens must carry to say every
# token was slower, and how little it may carry (with the mean carrying the gap) to say pauses
SHAPE_UNIFORM, SHAPE_PAUSES = 0.5, 0.25


def tier_shape(legs: Sequence[tuple[float, float | None, float | None]]) -> str | None:
    """Whether the slow legs were slow on every token or on a few long pauses, from each leg's
    (throughput, median and mean time between a request's tokens as the client measured them). A
    median moves with every token and hardly with a pause; a mean moves with both. None: not told
    (a leg without those times, too few legs, or neither shape fits)."""
    if len(legs) < 2 or any(med is None or mean is None or med <= 0 or mean <= 0 for _, med, mean in legs):
        return None
    if min(x for x, _, _ in legs) <= 0:
        return None
    f_at, s_at = split_tiers([x for x, _, _ in legs])
    fast, slow = [legs[i] for i in f_at], [legs[i] for i in s_at]
    if not fast or not slow:
        return None
    gap = statistics.median(x for x, _, _ in fast) / statistics.median(x for x, _, _ in slow) - 1
    f_med, s_med = statistics.median(m for _, m, _ in fast), statistics.median(m for _, m, _ in slow)  # type: ignore[misc]
    f_mean, s_mean = statistics.median(m for _, _, m in fast), statistics.median(m for _, _, m in slow)  # type: ignore[misc]
    if gap <= 0:
        return None
    if s_med / f_med - 1 >= SHAPE_UNIFORM * gap:
        return (f"every token was slower in the slow legs, a median time between tokens of {s_med:.3g} ms against "
                f"{f_med:.3g} ms, not a few long pauses")
    if s_med / f_med - 1 < SHAPE_PAUSES * gap and s_mean / f_mean - 1 >= SHAPE_UNIFORM * gap:
        return (f"the slow legs lost their time in a few long pauses, a median time between tokens of {s_med:.3g} ms "
                f"against {f_med:.3g} ms but a mean of {s_mean:.3g} ms against {f_mean:.3g} ms")
    return None
