"""What a throughput leg ran under, sampled read-only while it ran (issue 31: the cause of tiers).

`Sampler` polls `nvidia-smi` (clocks, power, temperature, utilisation, throttle reasons) every
half second in one child process and reads the CPU's load average at the start and the end; it
never changes a GPU setting. Given the processes that serve the leg (by role), it also reads the
CPU time each role used while the leg ran, as a share of one core: a small model's throughput is
bound by the host (the engine's scheduling loop, the API server, the client) rather than the GPU,
and GPU telemetry alone cannot explain its tiers. `summary()` is the `telemetry` section of leg.json
(tica.receipts.LegTelemetry). A field nothing measured is None (unknown), never 0.
"""

from __future__ import annotations

import os
import shutil
import time
import statistics
import subprocess
import threading
from typing import Any

import psutil

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

    def __init__(self, gpu_index: str | None = None, processes: dict[str, list[int]] | None = None) -> None:
        self.processes = processes or {}  # role -> pids whose CPU time this leg reads
        self._cpu_start: dict[str, float | None] = {}
        self._wall_start = 0.0
        self.cpu_util: dict[str, float | None] = {}
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
        self._cpu_start = {role: cpu_seconds(pids) for role, pids in self.processes.items()}
        self._wall_start = time.monotonic()
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
        wall = time.monotonic() - self._wall_start
        for role, pids in self.processes.items():
            end, start = cpu_seconds(pids), self._cpu_start.get(role)
            self.cpu_util[role] = round((end - start) / wall, 3) if end is not None and start is not None \
                and wall > 0 and end >= start else None
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
            # CPU time per role over the leg's wall time (1.0 = one core busy throughout); None: unread
            "cpu_util": dict(sorted(self.cpu_util.items())) if self.processes else None,
        }


def cpu_seconds(pids: list[int]) -> float | None:
    """User plus system CPU seconds of these processes (None where any cannot be read: a role whose
    time is partly unread is unknown, not smaller)."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            return None
        total += t.user + t.system
    return total if pids else None


# vLLM's Prometheus counters (vllm/v1/metrics/loggers.py), summed over engines: what a leg's
# requests found in the prefix cache, how often the scheduler preempted a request for KV room, and
# the engine's steps (the count and sum of its tokens-per-step histogram): one workload served in
# more, smaller steps is a scheduling difference the clocks do not show
ENGINE_COUNTERS = {"prefix_cache_queries": "vllm:prefix_cache_queries_total",
                   "prefix_cache_hits": "vllm:prefix_cache_hits_total",
                   "preemptions": "vllm:num_preemptions_total",
                   "engine_steps": "vllm:iteration_tokens_total_count",
                   "step_tokens": "vllm:iteration_tokens_total_sum"}


def parse_counters(text: str) -> dict[str, float]:
    """ENGINE_COUNTERS' values from a Prometheus text exposition (a counter not exposed is absent)."""
    wanted = {metric: key for key, metric in ENGINE_COUNTERS.items()}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            try:
                value = float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            out[wanted[name]] = out.get(wanted[name], 0.0) + value
    return out


def read_counters(base_url: str, timeout: float = 5.0) -> dict[str, float]:
    """The server's counters now ({} when /metrics cannot be read: unknown)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout) as resp:
            return parse_counters(resp.read().decode("utf-8", "replace"))
    except Exception:  # a server without metrics, or gone: the leg's counters are unknown
        return {}


def engine_counts(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The leg's share of the counters: its prefix-cache hit rate, preemptions, engine steps and
    tokens per step (None: unread)."""
    def delta(key: str) -> float | None:
        if key not in before or key not in after or after[key] < before[key]:
            return None
        return after[key] - before[key]

    queries, hits, preempted = (delta(k) for k in ("prefix_cache_queries", "prefix_cache_hits", "preemptions"))
    rate = round(hits / queries, 4) if queries and hits is not None and hits <= queries else None
    steps, tokens = delta("engine_steps"), delta("step_tokens")
    return {"prefix_cache_hit_rate": rate, "preemptions": int(preempted) if preempted is not None else None,
            "engine_steps": int(steps) if steps is not None else None,
            "tokens_per_step": round(tokens / steps, 2) if steps and tokens is not None else None}


def reset_prefix_cache(base_url: str, timeout: float = 30.0) -> bool:
    """Empty the server's prefix cache (vLLM's dev-mode POST /reset_prefix_cache): whether it said so."""
    import urllib.request

    try:
        req = urllib.request.Request(f"{base_url}/reset_prefix_cache", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except Exception:  # no dev mode, or the server gone: not emptied
        return False

