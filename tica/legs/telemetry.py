"""What a throughput leg ran under, sampled read-only while it ran (issue 31: the cause of tiers).

`Sampler` polls `nvidia-smi` (clocks, power, temperature, utilisation, throttle reasons) every
half second in one child process and reads the CPU's load average at the start and the end; it
never changes a GPU setting. Given the processes that serve the leg (by role), it also reads the
CPU time each role used while the leg ran, as a share of one core: a small model's throughput is
bound by the host (the engine's scheduling loop, the API server, the client) rather than the GPU,
and GPU telemetry alone cannot explain its tiers. It also reads the host while the leg ran: the
machine's CPU time stolen by its hypervisor and its busy share (/proc/stat through psutil), the CPU
clock, how many times each role was switched out against its will, and a probe (a separate process
timing one fixed pure-Python loop every half second), whose time rises when the host gives a busy
thread less than a whole core whatever the reason. With each probe it also reads where the engine
core ran: its CPU, that CPU's NUMA node, and how busy the CPU's other hardware threads (its SMT
siblings, which share the core) were since the last reading. At the leg's start and end it times
the same kind of loop pinned to each CPU in turn: a CPU whose physical core the hypervisor shares
with a busy neighbour runs it slower, and the loop time on the engine's own CPU says whether the
engine ran on such a one (the guest sees no neighbour otherwise). `summary()` is the `telemetry`
section of leg.json (tica.receipts.LegTelemetry). A field nothing measured is None (unknown), never 0.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

CPU_SYSFS = Path("/sys/devices/system/cpu")

QUERY = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "utilization.gpu", "clocks_throttle_reasons.active")
# nvidia-smi's clocks_throttle_reasons bits (nvml.h: nvmlClocksEventReasons)
THROTTLE_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
INTERVAL_MS = 500
# the probe: one fixed loop, timed, then a pause; it costs a core about 2% of the leg
PROBE_LOOP, PROBE_PAUSE_S = 200_000, 0.5
PROBE = ("import sys, time\n"
         "n, pause = int(sys.argv[1]), float(sys.argv[2])\n"
         "while True:\n"
         "    t = time.perf_counter()\n"
         "    x = 0\n"
         "    for i in range(n):\n"
         "        x += i\n"
         "    print(round((time.perf_counter() - t) * 1000, 3), flush=True)\n"
         "    time.sleep(pause)\n")


# the pinned loop: shorter (it runs on every CPU, the median of five), at the leg's start and end only
PINNED_LOOP, PINNED_REPEATS = 50_000, 5
PINNED = ("import json, os, sys, time\n"
          "n, reps = int(sys.argv[1]), int(sys.argv[2])\n"
          "out = {}\n"
          "for cpu in map(int, sys.argv[3:]):\n"
          "    try:\n"
          "        os.sched_setaffinity(0, {cpu})\n"
          "    except OSError:\n"
          "        continue\n"
          "    times = []\n"
          "    for _ in range(reps):\n"
          "        t = time.perf_counter()\n"
          "        x = 0\n"
          "        for i in range(n):\n"
          "            x += i\n"
          "        times.append((time.perf_counter() - t) * 1000)\n"
          "    out[cpu] = round(sorted(times)[len(times) // 2], 4)\n"
          "print(json.dumps(out))\n")


def pinned_loop_ms(cpus: list[int], timeout: float = 30.0) -> dict[int, float]:
    """The pinned loop's median time on each of these CPUs now ({} where it could not run; a CPU it
    could not be pinned to is absent)."""
    if not cpus:
        return {}
    try:
        done = subprocess.run([sys.executable, "-c", PINNED, str(PINNED_LOOP), str(PINNED_REPEATS), *map(str, cpus)],
                              capture_output=True, text=True, timeout=timeout, check=False)
        raw = json.loads(done.stdout) if done.returncode == 0 else {}
        return {int(k): float(v) for k, v in raw.items() if float(v) > 0}
    except (OSError, subprocess.TimeoutExpired, ValueError, TypeError, AttributeError):
        return {}


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
        self._host_start: Any = None
        self.host: dict[str, float | None] = {"cpu_steal_pct": None, "cpu_busy_pct": None}
        self._switches_start: dict[str, int | None] = {}
        self.switches: dict[str, float | None] = {}
        self.probe_ms: list[float] = []
        self.cpu_mhz: list[float] = []
        self._probe: subprocess.Popen | None = None
        self._probe_reader: threading.Thread | None = None
        self.engine_cpus: list[int] = []  # the engine core's CPU at each probe
        self.sibling_busy: list[float | None] = []  # its busiest SMT sibling's busy share since the probe before
        self._percpu: Any = None
        self.pinned: list[tuple[int | None, dict[int, float]]] = []  # (engine's CPU, loop ms per CPU) at start, end

    def _read_pinned(self) -> None:
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except OSError:
            return
        self.pinned.append((self._engine_cpu(), pinned_loop_ms(cpus)))

    def _engine_cpu(self) -> int | None:
        """The CPU the engine core is on now (one engine process only: a role of several has no one place)."""
        pids = self.processes.get("engine_core") or []
        try:
            return psutil.Process(pids[0]).cpu_num() if len(pids) == 1 else None
        except (psutil.Error, OSError):
            return None

    def __enter__(self) -> "Sampler":
        self._read_pinned()
        self.load_start = os.getloadavg()[0]
        self._cpu_start = {role: cpu_seconds(pids) for role, pids in self.processes.items()}
        self._switches_start = {role: involuntary_switches(pids) for role, pids in self.processes.items()}
        self._host_start = psutil.cpu_times()
        self._wall_start = time.monotonic()
        self._probe = subprocess.Popen([sys.executable, "-c", PROBE, str(PROBE_LOOP), str(PROBE_PAUSE_S)],
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._probe_reader = threading.Thread(target=self._read_probe, daemon=True)
        self._probe_reader.start()
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

    def _read_probe(self) -> None:
        assert self._probe is not None and self._probe.stdout is not None
        for line in self._probe.stdout:
            ms = _num(line)
            if ms is not None and ms > 0:
                self.probe_ms.append(ms)
            try:
                freq = psutil.cpu_freq()
            except (OSError, NotImplementedError, RuntimeError):
                freq = None
            if freq is not None and freq.current > 0:
                self.cpu_mhz.append(float(freq.current))
            self._read_placement()

    def _read_placement(self) -> None:
        """Where the engine core runs now, and how busy its core's other hardware threads were since
        the last reading (one engine process only: a role of several has no one place)."""
        cpu = self._engine_cpu()
        if cpu is None:
            return
        try:
            percpu = psutil.cpu_times(percpu=True)
        except (psutil.Error, OSError):
            return
        before, self._percpu = self._percpu, percpu
        self.engine_cpus.append(cpu)
        siblings = cpu_siblings(cpu)
        if before is None or not siblings or max(siblings) >= min(len(before), len(percpu)):
            self.sibling_busy.append(None)
            return
        shares = [host_shares(before[c], percpu[c])["cpu_busy_pct"] for c in siblings]
        self.sibling_busy.append(None if None in shares else max(shares))  # type: ignore[type-var]

    def __exit__(self, *exc) -> None:
        self.load_end = os.getloadavg()[0]
        wall = time.monotonic() - self._wall_start
        for role, pids in self.processes.items():
            end, start = cpu_seconds(pids), self._cpu_start.get(role)
            self.cpu_util[role] = round((end - start) / wall, 3) if end is not None and start is not None \
                and wall > 0 and end >= start else None
            n_end, n_start = involuntary_switches(pids), self._switches_start.get(role)
            self.switches[role] = round((n_end - n_start) / wall, 1) if n_end is not None and n_start is not None \
                and wall > 0 and n_end >= n_start else None
        self.host = host_shares(self._host_start, psutil.cpu_times())
        for proc, reader in ((self._proc, self._reader), (self._probe, self._probe_reader)):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if reader is not None:
                reader.join(timeout=5)
        self._read_pinned()

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
            "involuntary_switches_per_s": dict(sorted(self.switches.items())) if self.processes else None,
            **self.host,
            "cpu_mhz_median": round(statistics.median(self.cpu_mhz), 1) if self.cpu_mhz else None,
            "cpu_probe_ms_median": round(statistics.median(self.probe_ms), 3) if self.probe_ms else None,
            "cpu_probe_ms_max": round(max(self.probe_ms), 3) if self.probe_ms else None,
            "cpu_probes": len(self.probe_ms),
            **placement(self.engine_cpus, self.sibling_busy),
            **pinned_summary(self.pinned),
        }


def pinned_summary(readings: list[tuple[int | None, dict[int, float]]]) -> dict[str, Any]:
    """The pinned loop over a leg: its mean time on the engine's CPU (at each reading, the CPU the
    engine was on then; None where any reading lacks it), and the fastest and slowest CPU's time
    over all readings."""
    times = [ms for _, per in readings for ms in per.values()]
    own = [per.get(cpu) if cpu is not None else None for cpu, per in readings]
    return {"engine_cpu_loop_ms": round(statistics.fmean(own), 4) if own and None not in own else None,  # type: ignore[arg-type]
            "cpu_loop_ms_min": round(min(times), 4) if times else None,
            "cpu_loop_ms_max": round(max(times), 4) if times else None}


def placement(cpus: list[int], sibling_busy: list[float | None]) -> dict[str, Any]:
    """The engine core's placement over a leg: the CPUs it was seen on and their NUMA nodes, how often
    it was on another CPU than at the reading before (percent of readings), and its busiest SMT
    sibling's median busy share (None where a reading had none or could not read one)."""
    if not cpus:
        return {"engine_cpus": None, "engine_numa_nodes": None, "engine_cpu_moves_pct": None,
                "engine_sibling_busy_pct": None}
    nodes = {numa_node(c) for c in cpus}
    moves = sum(a != b for a, b in zip(cpus, cpus[1:]))
    read = sibling_busy[1:]  # the first reading has no interval before it
    return {"engine_cpus": sorted(set(cpus)), "engine_numa_nodes": None if None in nodes else sorted(nodes),
            "engine_cpu_moves_pct": round(100 * moves / (len(cpus) - 1), 1) if len(cpus) > 1 else None,
            "engine_sibling_busy_pct": round(statistics.median(read), 1) if read and None not in read else None}


def parse_cpu_list(text: str) -> list[int]:
    """The kernel's CPU list format ("0-3,8,10-11") as CPU numbers."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def cpu_siblings(cpu: int, root: Path | None = None) -> list[int] | None:
    """The other hardware threads of this CPU's core ([] with SMT off; None: unread)."""
    path = (root or CPU_SYSFS) / f"cpu{cpu}" / "topology" / "thread_siblings_list"
    try:
        return [c for c in parse_cpu_list(path.read_text()) if c != cpu]
    except (OSError, ValueError):
        return None


def numa_node(cpu: int, root: Path | None = None) -> int | None:
    """The NUMA node this CPU belongs to (None: unread)."""
    try:
        (node,) = [p.name for p in ((root or CPU_SYSFS) / f"cpu{cpu}").glob("node[0-9]*")]
        return int(node[4:])
    except (OSError, ValueError):
        return None


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


def involuntary_switches(pids: list[int]) -> int | None:
    """How many times these processes were switched out while still runnable (None where any cannot be read)."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).num_ctx_switches().involuntary
        except psutil.Error:
            return None
    return total if pids else None


def host_shares(start: Any, end: Any) -> dict[str, float | None]:
    """The machine's CPU time between two psutil.cpu_times() readings: the share its hypervisor
    stole and the share that was busy (not idle, not waiting on I/O), in percent of all CPUs."""
    if start is None or end is None:
        return {"cpu_steal_pct": None, "cpu_busy_pct": None}
    # guest time is already counted in user (and guest_nice in nice) by /proc/stat: not added twice
    delta = {f: getattr(end, f) - getattr(start, f) for f in end._fields if f not in ("guest", "guest_nice")}
    total = sum(delta.values())
    if total <= 0 or any(v < 0 for v in delta.values()):
        return {"cpu_steal_pct": None, "cpu_busy_pct": None}
    idle = delta.get("idle", 0.0) + delta.get("iowait", 0.0)
    steal = round(100 * delta["steal"] / total, 2) if "steal" in delta else None  # psutil names steal on Linux only
    return {"cpu_steal_pct": steal, "cpu_busy_pct": round(100 * (total - idle) / total, 1)}


# vLLM's Prometheus counters (vllm/v1/metrics/loggers.py), summed over engines: what a leg's
# requests found in the prefix cache, how often the scheduler preempted a request for KV room, and
# the engine's steps (the count and sum of its tokens-per-step histogram): one workload served in
# more, smaller steps is a scheduling difference the clocks do not show; and the time between a
# request's tokens, which vLLM measures on the engine core's clock (vllm/v1/metrics/stats.py), so a
# slow tier that is slow there is slow in the engine, not in the API server or the client
ENGINE_COUNTERS = {"prefix_cache_queries": "vllm:prefix_cache_queries_total",
                   "prefix_cache_hits": "vllm:prefix_cache_hits_total",
                   "preemptions": "vllm:num_preemptions_total",
                   "engine_steps": "vllm:iteration_tokens_total_count",
                   "step_tokens": "vllm:iteration_tokens_total_sum",
                   "itl_count": "vllm:inter_token_latency_seconds_count",
                   "itl_seconds": "vllm:inter_token_latency_seconds_sum"}


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
    """The leg's share of the counters: its prefix-cache hit rate, preemptions, engine steps, tokens
    per step and the engine's mean time between a request's tokens (None: unread)."""
    def delta(key: str) -> float | None:
        if key not in before or key not in after or after[key] < before[key]:
            return None
        return after[key] - before[key]

    queries, hits, preempted = (delta(k) for k in ("prefix_cache_queries", "prefix_cache_hits", "preemptions"))
    rate = round(hits / queries, 4) if queries and hits is not None and hits <= queries else None
    steps, tokens = delta("engine_steps"), delta("step_tokens")
    gaps, seconds = delta("itl_count"), delta("itl_seconds")
    return {"prefix_cache_hit_rate": rate, "preemptions": int(preempted) if preempted is not None else None,
            "engine_steps": int(steps) if steps is not None else None,
            "tokens_per_step": round(tokens / steps, 2) if steps and tokens is not None else None,
            "engine_itl_ms_mean": round(1000 * seconds / gaps, 4) if gaps and seconds is not None else None}


def reset_prefix_cache(base_url: str, timeout: float = 30.0) -> bool:
    """Empty the server's prefix cache (vLLM's dev-mode POST /reset_prefix_cache): whether it said so."""
    import urllib.request

    try:
        req = urllib.request.Request(f"{base_url}/reset_prefix_cache", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except Exception:  # no dev mode, or the server gone: not emptied
        return False

