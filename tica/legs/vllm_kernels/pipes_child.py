"""One H200 producer command as a Dagster Pipes child, on the GPU(s) its launcher leased:

    python -m tica.legs.vllm_kernels.pipes_child --name bi1 --legs DIR --report FILE [--timeout S]
        [--check-device] -- bi1 --model M --legs DIR --work W [--dry-run]

It opens Dagster Pipes when launched under it (a stdout stand-in otherwise), runs
`python -m tica.legs.vllm_kernels.producers <args after -->` as its own process, forwards the
producer's progress lines as Pipes log lines, and, as `producers all` does for its children,
adds the producer's exit as the launcher observed it to every leg the producer left unsealed in
--legs, seals them, and reports them (a Pipes custom message and --report).

The producer runs as a process of its own, not in-process: a leg's `processes` are exits a
launcher observed, and a producer that dies (vLLM's engine, a CUDA fault) must not take the
report with it. Both die with their parent (PR_SET_PDEATHSIG): a leg never outlives the lease
that holds its GPU.

Imports dagster-pipes only (never dagster: a GPU box may have just dagster-pipes), plus what the
producers themselves import.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tica.legs.common import pipes_context, process_identity, stoppable

PRODUCER = "tica.legs.vllm_kernels.producers"
PROGRESS_PREFIX = "[tica"
LOG_PREFIX = "pipes"
# Exit codes of this child itself (the producer's own exit is in the report and the legs).
BAD_ARGS, DEVICE_MISMATCH = 2, 3

DEVICE_PROBE = r"""
import json, torch
n = torch.cuda.device_count()
props = [torch.cuda.get_device_properties(i) for i in range(n)]
print(json.dumps({"count": n, "devices": [
    {"uuid": str(getattr(p, "uuid", "")) or None, "name": p.name} for p in props]}))
"""


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to signal this process when its parent exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


def _uuid(text: str | None) -> str:
    """nvidia-smi writes GPU-8f1f...; torch may write the bare hex: compare the hex digits."""
    return re.sub(r"[^0-9a-f]", "", (text or "").strip().lower().removeprefix("gpu-"))


def check_device(env: dict[str, str]) -> dict:
    """What a CUDA process started with this environment sees, against the lease. ok: True (it
    sees exactly the leased devices), False (it sees others: the leg must not run), None (the
    probe could not tell; recorded, not fatal)."""
    out: dict = {"cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
                 "leased_uuids": env.get("TICA_GPU_LEASE_UUIDS")}
    try:
        proc = subprocess.run([sys.executable, "-c", DEVICE_PROBE], env=env, capture_output=True, text=True,
                              timeout=300)
        seen = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError, IndexError) as err:
        proc, seen = None, None
        out["error"] = repr(err)[:500]
    if seen is None:
        if proc is not None:
            out["error"] = (proc.stderr or proc.stdout)[-1500:]
        return dict(out, ok=None)
    out["seen"] = seen["devices"]
    want = [x for x in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if x]
    uuids = [_uuid(d["uuid"]) for d in seen["devices"]]
    if out["leased_uuids"] and all(uuids):
        out["ok"] = uuids == [_uuid(u) for u in out["leased_uuids"].split(",")]
    else:
        out["ok"] = seen["count"] == len(want)
    return out


def unsealed_legs(legs: Path) -> list[Path]:
    return sorted(p.parent for p in legs.glob("*/leg.json") if not (p.parent / "seal.json").exists())


def sealed_legs(legs: Path) -> list[Path]:
    return sorted(p.parent for p in legs.glob("*/seal.json"))


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the producer's process group, SIGKILL it after the grace."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_group(pgid: int) -> bool:
    """SIGKILL what is left of a process group; whether anything was."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def run(a: argparse.Namespace, producer_args: list[str]) -> int:
    legs = Path(a.legs)
    legs.mkdir(parents=True, exist_ok=True)
    log_path = Path(a.log) if a.log else legs.parent / f"{a.name}.log"
    env = dict(os.environ)
    report: dict = {"name": a.name, "argv": [a.producer_module, *producer_args],
                    "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
                    "vllm_batch_invariant": env.get("VLLM_BATCH_INVARIANT"),
                    "tica_n_steps": env.get("TICA_N_STEPS"), "child_pid": os.getpid(), "log": str(log_path)}
    with pipes_context() as pipes:
        pipes.log.info(f"{LOG_PREFIX}[{a.name}]: CUDA_VISIBLE_DEVICES={report['cuda_visible_devices']} "
                       f"VLLM_BATCH_INVARIANT={report['vllm_batch_invariant']} pid {os.getpid()}: "
                       f"{' '.join(producer_args[:8])}")
        if a.check_device:
            report["device_check"] = check_device(env)
            pipes.log.info(f"{LOG_PREFIX}[{a.name}]: device check {json.dumps(report['device_check'])[:600]}")
            if report["device_check"]["ok"] is False:
                report.update(rc=None, legs=[], unsealed=[], error="the child does not see the leased device(s)")
                return finish(a, pipes, report, DEVICE_MISMATCH)
        t0 = time.time()
        proc = subprocess.Popen(
            [sys.executable, "-m", a.producer_module, *producer_args], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=stoppable(lambda: die_with_parent(signal.SIGKILL)))
        report["pid"] = proc.pid
        identity = process_identity(proc.pid)  # read while it runs
        stopped: list[str] = []

        def on_signal(signum, _frame):
            stopped.append(f"{signal.Signals(signum).name} to the child: producer stopped")
            stop(proc)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        timer = threading.Timer(a.timeout, lambda: (stopped.append(f"timeout {a.timeout:g} s"), stop(proc)))
        timer.daemon = True
        timer.start()
        lines = [0]

        def pump() -> None:
            assert proc.stdout is not None
            with open(log_path, "wb") as log:
                for raw in proc.stdout:
                    log.write(raw)
                    log.flush()
                    sys.stdout.buffer.write(raw)
                    sys.stdout.flush()
                    line = raw.decode(errors="replace").rstrip()
                    if line.startswith(PROGRESS_PREFIX):
                        pipes.log.info(f"{LOG_PREFIX}[{a.name}]: {line}")
                        lines[0] += 1

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        rc = proc.wait()
        timer.cancel()
        # whatever the producer started and left behind (it would hold the GPU past the lease)
        report["stragglers_killed"] = kill_group(proc.pid)
        reader.join(timeout=10)
        report.update(rc=rc, seconds=round(time.time() - t0, 1), progress_lines=lines[0], stopped=stopped or None)
        text = log_path.read_text(errors="replace")
        report["legs"], report["unsealed"] = seal_new_legs(a.name, legs, proc.pid, rc, text, env, identity)
        level = pipes.log.info if rc == 0 else pipes.log.error
        level(f"{LOG_PREFIX}[{a.name}]: producer exited {rc} after {report['seconds']} s; "
              f"{len(report['legs'])} sealed leg(s)" + (f"; {'; '.join(stopped)}" if stopped else "")
              + ("" if rc == 0 else f"\n{text[-3000:]}"))
        return finish(a, pipes, report, 0)


def seal_new_legs(name: str, legs: Path, pid: int, rc: int, text: str,
                  env: dict[str, str], identity: dict | None = None) -> tuple[list[str], list[str]]:
    """The producer's legs, completed with its observed exit and sealed (as `producers all` does)."""
    from . import legio

    procs = legio.launcher_records(name, pid, rc, text, env, identity)
    unsealed_left = []
    for leg in unsealed_legs(legs):
        try:
            legio.finalize_leg(leg, procs)
        except (OSError, ValueError) as err:
            unsealed_left.append(f"{leg}: {err}")
    return [str(p) for p in sealed_legs(legs)], unsealed_left


def finish(a: argparse.Namespace, pipes, report: dict, code: int) -> int:
    if a.report:
        Path(a.report).parent.mkdir(parents=True, exist_ok=True)
        Path(a.report).write_text(json.dumps(report, indent=1, default=str))
    pipes.report_custom_message(report)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: pipes_child --name NAME --legs DIR [--report FILE] -- <producer command ...>", file=sys.stderr)
        return BAD_ARGS
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="tica.legs.vllm_kernels.pipes_child")
    ap.add_argument("--name", required=True, help="the command's name in logs and reports (bi1, bi0, make-model)")
    ap.add_argument("--legs", required=True, help="where the producer writes its legs (sealed here after it exits)")
    ap.add_argument("--report", default="", help="also write the report here (JSON)")
    ap.add_argument("--log", default="", help="the producer's full output (default: beside --legs)")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--check-device", action="store_true", help="first check what CUDA sees against the lease")
    ap.add_argument("--producer-module", default=PRODUCER, help="module run in place of the producers (tests)")
    a = ap.parse_args(argv[:cut])
    die_with_parent(signal.SIGTERM)
    return run(a, argv[cut + 1:])


if __name__ == "__main__":
    sys.exit(main())
