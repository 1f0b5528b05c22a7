"""What a throughput leg ran under, sampled read-only while it ran (issue 31: the cause of tiers).

`Sampler` polls `nvidia-smi` (clocks, power, temperature, utilisation, throttle reasons) every
half second in one child process and reads the CPU's load average at the start and the end; it
never changes a GPU setting. `summary()` is the `telemetry` section of leg.json
(tica.receipts.LegTelemetry). A field nothing measured is None (unknown), never 0.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
from typing import Any

QUERY = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "utilization.gpu", "clocks_throttle_reasons.active")
# nvidia-smi's clocks_throttle_reasons bits (nvml.h: nvmlClocksEventReasons)
THROTTLE_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
INTERVAL_MS = 500


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in sorted(THROTTLE_BITS.items()) if mask & bit] + (
        [f"unknown_0x{mask & ~sum(THROTTLE_BITS):x}"] if mask & ~sum(THROTTLE_BITS) else [])


def _num(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]": unknown


class Sampler:
    """`with Sampler(gpu_index) as s: ...; s.summary(served_before=n)`."""

    def __init__(self, gpu_index: str | None = None) -> None:
        self.gpu_index = gpu_index if gpu_index is not None else (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        self.rows: list[tuple[float | None, ...]] = []
        self.masks: list[int] = []
        self.load_start: float | None = None
        self.load_end: float | None = None
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self.error: str | None = None

    def __enter__(self) -> "Sampler":
        self.load_start = os.getloadavg()[0]
        smi = shutil.which("nvidia-smi")
        if smi is None:
            self.error = "no nvidia-smi on this machine"
            return self
        self._proc = subprocess.Popen(
            [smi, f"--id={self.gpu_index}", "--query-gpu=" + ",".join(QUERY), "--format=csv,noheader,nounits",
             f"-lms={INTERVAL_MS}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != len(QUERY):
                continue
            self.rows.append(tuple(_num(p) for p in parts[:-1]))
            try:
                self.masks.append(int(parts[-1], 16))
            except ValueError:
                pass

    def __exit__(self, *exc) -> None:
        self.load_end = os.getloadavg()[0]
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def summary(self, *, served_before: int | None, cuda_graphs: bool | None) -> dict[str, Any]:
        def col(i: int) -> list[float]:
            return [r[i] for r in self.rows if r[i] is not None]

        def med(i: int) -> float | None:
            xs = col(i)
            return round(statistics.median(xs), 1) if xs else None

        sm = col(0)
        mask = 0
        for m in self.masks:
            mask |= m
        return {
            "source": "nvidia-smi" if self._proc is not None else None,
            "samples": len(self.rows), "interval_ms": INTERVAL_MS,
            "sm_clock_mhz_median": med(0), "sm_clock_mhz_min": min(sm) if sm else None,
            "mem_clock_mhz_median": med(1), "power_w_median": med(2),
            "temperature_c_max": max(col(3)) if col(3) else None, "gpu_util_pct_median": med(4),
            # idle is excluded: every leg starts and ends with the GPU idle between requests
            "throttle_reasons": sorted(set(throttle_names(mask)) - {"gpu_idle"}) if self.masks else None,
            "cpu_load_1m_start": round(self.load_start, 2) if self.load_start is not None else None,
            "cpu_load_1m_end": round(self.load_end, 2) if self.load_end is not None else None,
            "served_before": served_before, "cuda_graphs": cuda_graphs,
        }
