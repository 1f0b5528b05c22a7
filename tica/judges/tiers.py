"""What the legs of fast and slow tiers ran under: a tier's cause named from the legs' telemetry.

Tiers inside one arm (max/min throughput over the question's tier_ratio) keep a concurrency
inconclusive whatever their cause. This says which recorded condition differs between the fast
and the slow legs of that arm (GPU clocks, power, temperature, throttling, CPU load, how many
legs the server ran before), so a person sees the candidate cause; it never changes a verdict.
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
)


def _median(xs: Sequence[float | int | None]) -> float | None:
    got = [float(x) for x in xs if x is not None]
    return statistics.median(got) if got else None


def tier_cause(legs: Sequence[tuple[float, LegTelemetry | None]]) -> str:
    """One clause: what differs between the fast and the slow legs, or that nothing recorded does."""
    if len(legs) < 2:
        return "too few legs to split into tiers"
    untold = sum(t is None or t.samples == 0 for _, t in legs)
    if untold:
        return f"{untold} of {len(legs)} leg(s) record no telemetry, so the tiers' cause is unknown"
    lo, hi = min(x for x, _ in legs), max(x for x, _ in legs)
    mid = math.sqrt(lo * hi) if lo > 0 else (lo + hi) / 2
    fast = [t for x, t in legs if x >= mid]
    slow = [t for x, t in legs if x < mid]
    found = []
    for name, what, unit, rel in SIGNALS:
        f, s = _median([getattr(t, name) for t in fast]), _median([getattr(t, name) for t in slow])
        if f is not None and s is not None and abs(f - s) > rel * max(abs(f), abs(s), 1e-9):
            found.append(f"{what} {f:g}{unit} in the fast legs against {s:g}{unit} in the slow")
    only_slow = sorted({r for t in slow for r in (t.throttle_reasons or ())} - {r for t in fast for r in (t.throttle_reasons or ())})
    if only_slow:
        found.append(f"throttling ({', '.join(only_slow)}) in the slow legs only")
    first_slow = [t.served_before for t in slow]
    if first_slow and all(n == 0 for n in first_slow) and all((t.served_before or 0) > 0 for t in fast):
        found.append("every slow leg was its server's first (warm-up)")
    if found:
        return "tiers coincide with " + "; ".join(found)
    return "nothing the legs recorded (clocks, power, temperature, throttling, CPU load, legs served before) differs between the tiers, so their cause is not found"
