"""Throughput legs: vLLM's OpenAI API server on loopback plus `vllm bench serve` (fixed-length
random workload, ignore EOS), one leg per concurrency of one arm in one round, each with its own
warm-up. One server start serves all of the round's concurrencies for this arm; every leg
records the client, the API server, the EngineCore and its workers as they ended.

    python -m tica.legs.throughput --out ROUND_ARM_DIR --arm bi0 --model MODEL_DIR --round 1 --slot 1 \
        --concurrencies 1,2 --input-len 64 --output-len 16 --num-prompts 8 --num-warmups 2

writes ROUND_ARM_DIR/c1/, ROUND_ARM_DIR/c2/ (each a sealed leg with bench.json).
The crossed AB/BA order across rounds is the launcher's job (tica.legs.runner).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tica.legs import common
from tica.legs.telemetry import Sampler, engine_counts, read_counters

FAULTS = ("kill-engine-core", "truncate-workload")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def recorded_command(cmd: list[str]) -> list[str]:
    """A server command as a leg records it: the value of `--port` (a free loopback port, so it
    differs between the arms' servers) as `{port}`, not to be read as a difference of the arms."""
    return [("{port}" if i and cmd[i - 1] == "--port" else a) for i, a in enumerate(cmd)]


# the engine flags of the settings a throughput leg runs under (tica.legs.vllm_kernels.rollout.ENGINES, as
# server flags): eager (no CUDA graphs, no prefix caching: the earlier H200 runs), production (vLLM's default
# compile with CUDA graphs, prefix caching, chunked prefill, as verl runs vLLM), graphs (the same with decode
# CUDA graphs of the eager kernels and no compile)
EAGER_ENGINE = ("--enforce-eager", "--no-enable-prefix-caching")
PRODUCTION_ENGINE = ("--enable-prefix-caching", "--enable-chunked-prefill", "--max-num-batched-tokens", "8192")
GRAPHS_ENGINE = PRODUCTION_ENGINE + ("--compilation-config", '{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}')
SERVER_ENGINES = {"eager": EAGER_ENGINE, "production": PRODUCTION_ENGINE, "graphs": GRAPHS_ENGINE}


class Server:
    """The API server process and what became of it and of its engine processes."""

    def __init__(self, model: str, log_path: Path, *, port: int, max_model_len: int, gpu_memory_utilization: float,
                 seed: int, shutdown_timeout: int, extra: list[str] | None = None,
                 env: dict[str, str] | None = None, engine: tuple[str, ...] = EAGER_ENGINE) -> None:
        self.port = port
        self.log_path = log_path
        self.shutdown_timeout = shutdown_timeout
        # --shutdown-timeout is always passed: vLLM's default (0) force-kills the EngineCore at once
        self.args = ["--model", model, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
                     "--gpu-memory-utilization", str(gpu_memory_utilization), *engine, "--seed", str(seed),
                     "--disable-uvicorn-access-log",
                     "--shutdown-timeout", str(shutdown_timeout), *(extra or [])]
        self.cmd = [sys.executable, "-m", "tica.legs.api_server", *self.args]
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=env, preexec_fn=common.stoppable())
        # what each process is, by content, read from it at first sight (its exit record's identity)
        self.identities = common.ProcessIdentities()
        self.identities.see(self.proc.pid)
        self.engine_pids: list[int] = []
        self.worker_pids: list[int] = []
        self.names: dict[int, str] = {}  # pid -> the OS's name for it while it ran
        self.stop_evidence = ""

    @property
    def recorded_cmd(self) -> list[str]:
        return recorded_command(self.cmd)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_healthy(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"API server exited with {self.proc.returncode} before it was healthy; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self._find_engine_processes()
                        return
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"API server not healthy after {timeout:.0f} s; see {self.log_path}")

    def _find_engine_processes(self) -> None:
        # only what the OS names an engine (vLLM titles it VLLM::EngineCore): never another child in its place
        self.engine_pids = [p for p in common.children_of(self.proc.pid) if "Engine" in (common.process_name(p) or "")]
        self.worker_pids = [w for e in self.engine_pids for w in common.children_of(e)
                            if "Worker" in (common.process_name(w) or "") or "VLLM" in (common.process_name(w) or "")]
        self.names = {p: n for p in self.engine_pids + self.worker_pids if (n := common.process_name(p))}
        self.identities.see(*self.engine_pids, *self.worker_pids)

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM, then wait: vLLM's own shutdown (up to --shutdown-timeout for the EngineCore)
        plus a margin, before the producer would SIGKILL the server itself."""
        grace = self.shutdown_timeout + 60.0 if grace is None else grace
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
                self.stop_evidence = f"exited after SIGTERM (grace {grace:.0f} s)"
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.stop_evidence = f"did not exit within {grace:.0f} s of SIGTERM; the producer sent SIGKILL"
        else:
            self.stop_evidence = f"had already exited with {self.proc.returncode} before the producer stopped it"
        # the server's engine processes get a moment to disappear after it
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(common.pid_alive(p) for p in self.engine_pids + self.worker_pids):
            time.sleep(0.2)
        self._log.close()

    def records(self) -> list[dict]:
        text = self.log_path.read_text(errors="replace")
        recs = []
        code = self.proc.returncode
        killed_by_us = "SIGKILL" in self.stop_evidence
        server_rec = common.process_record("api_server", self.proc.pid, code, evidence=self.stop_evidence, name="api_server",
                                               identity=self.identities.of(self.proc.pid))
        if killed_by_us:
            server_rec["end_state"] = "killed"
        recs.append(server_rec)
        exits = common.reported_exits(text)
        force = {int(m.group(1)): m.group(0).strip() for m in re.finditer(r"[^\n]*force killing[^\n]*? pid (\d+)", text)}
        died = common.first_match(r"[^\n]*(died unexpectedly|EngineDeadError|Engine core proc \S+ died)[^\n]*", text)
        engines = list(dict.fromkeys(self.engine_pids + [p for p, e in exits.items() if e.role == "engine_core"]))
        for pid in engines:
            seen = exits.get(pid)
            ec = seen.exit_code if seen else None
            name = seen.name if seen else (self.names.get(pid) or "EngineCore")
            alive = common.pid_alive(pid)
            if pid in force:
                ev = force[pid]
            elif seen:
                grace = f"; vLLM's process manager gave it {seen.grace} s after SIGTERM" if seen.grace not in (None, "None") else ""
                ev = f"exit code reported after vLLM's own shutdown (TICA_PROC_EXIT, exitcode={ec}){grace}"
            elif died:
                ev = died
            else:
                ev = "gone after the server stopped; exit code not reported (server did not reach its shutdown path)"
            recs.append(common.process_record("engine_core", pid, ec, evidence=ev, force_killed=pid in force, alive=alive, name=name,
                                              identity=self.identities.of(pid)))
        workers = list(dict.fromkeys(self.worker_pids + [p for p, e in exits.items() if e.role == "worker"]))
        for pid in workers:
            seen = exits.get(pid)
            ec = seen.exit_code if seen else None
            alive = common.pid_alive(pid)
            if pid in force:
                ev = force[pid]
            elif seen:
                ev = f"exit code reported by its EngineCore after vLLM's executor shutdown (TICA_PROC_EXIT, exitcode={ec})"
            elif alive:
                ev = "still running after the server stopped"
            else:
                ev = "gone after its EngineCore stopped; grandchild of the server, exit code not reported"
            recs.append(common.process_record("worker", pid, ec, evidence=ev, force_killed=pid in force, alive=alive,
                                              name=seen.name if seen else (self.names.get(pid) or "worker"),
                                              identity=self.identities.of(pid)))
        return recs

    def reap_leftovers(self) -> list[str]:
        """After the records are taken: SIGKILL engine processes still alive, so none outlives the leg."""
        return common.reap_leftovers(self.engine_pids + self.worker_pids)


@dataclass(frozen=True)
class ClientRun:
    """One `vllm bench serve` process: its exit record and when it ran (the throughput leg's work)."""

    record: dict
    started_at: str
    ended_at: str
    telemetry: dict | None = None  # what it ran under (tica.legs.telemetry)


def run_client(leg_dir: Path, server: Server, model: str, *, concurrency: int, num_prompts: int, num_warmups: int,
               input_len: int, output_len: int, seed: int, metadata: dict[str, str],
               served_before: int | None = None) -> ClientRun:
    args = ["--backend", "vllm", "--base-url", server.url, "--model", model, "--tokenizer", model,
            "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-range-ratio", "0", "--ignore-eos", "--max-concurrency", str(concurrency),
            "--num-prompts", str(num_prompts), "--num-warmups", str(num_warmups), "--seed", str(seed),
            "--save-result", "--result-dir", str(leg_dir), "--result-filename", "bench.json",
            "--metadata", *[f"{k}={v}" for k, v in metadata.items()]]
    cmd = [sys.executable, "-m", "tica.legs.bench_client", *args]
    counters_before = read_counters(server.url)
    with open(leg_dir / "client.log", "wb") as log, Sampler() as sampler:
        started_at, t0 = common.now(), time.monotonic()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=common.stoppable())
        identity = common.process_identity(proc.pid)  # read while it runs (or, ended, is not yet reaped)
        code = proc.wait()
        ended_at = common.now()
    rec = common.process_record("client", proc.pid, code,
                                evidence=f"vllm bench serve exited {code} after {time.monotonic() - t0:.1f} s "
                                         "(the producer's child: wait())", identity=identity)
    rec["command"] = cmd
    telemetry = sampler.summary(served_before=served_before, cuda_graphs=None)
    telemetry.update(engine_counts(counters_before, read_counters(server.url)))
    return ClientRun(rec, started_at, ended_at, telemetry)


def parse_concurrencies(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_num_prompts(text: str, concurrencies: list[int]) -> dict[int, int]:
    if ":" not in text:
        return {c: int(text) for c in concurrencies}
    table = {int(k): int(v) for k, v in (part.split(":") for part in text.split(","))}
    missing = [c for c in concurrencies if c not in table]
    if missing:
        raise SystemExit(f"--num-prompts lacks concurrencies {missing}")
    return table


def add_server_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True)
    ap.add_argument("--arm", required=True, choices=common.ARM_ENV)
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=0, help="0: a free loopback port")
    ap.add_argument("--server-timeout", type=float, default=600)
    ap.add_argument("--bi1-attempt-engine", action="store_true")
    ap.add_argument("--shutdown-timeout", type=_non_negative_int, default=common.SHUTDOWN_TIMEOUT_S,
                    help="vLLM's --shutdown-timeout (s), always passed to the server and recorded; "
                         f"0 = vLLM force-kills its EngineCore at once (default {common.SHUTDOWN_TIMEOUT_S})")


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def resolved_workload(args, c: int, num_prompts: int, server: Server | None, weights: str) -> dict:
    """weights: tica.models.hashing.weights_hash of the folder the server loaded."""
    return {"model": str(Path(args.model).resolve()), "weights_hash": weights,
            "backend": "vllm", "dataset_name": "random", "input_len": args.input_len, "output_len": args.output_len,
            "random_range_ratio": 0, "ignore_eos": True, "concurrency": c, "num_prompts": num_prompts,
            "num_warmups": args.num_warmups, "seed": args.seed, "max_model_len": args.max_model_len,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            # what the server was given (its command carries it, --enforce-eager and
            # --no-enable-prefix-caching included; what vLLM resolved is kernels.rollout); no server started: None
            "shutdown_timeout": server.shutdown_timeout if server else None, "server_command": server.recorded_cmd if server else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_args(ap)
    ap.add_argument("--round", type=int, default=1)
    ap.add_argument("--slot", type=int, default=1, help="position of this arm within the round (1 = first)")
    ap.add_argument("--concurrencies", default="1,2")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--num-prompts", default="8", help="N, or per concurrency '1:4,2:8'")
    ap.add_argument("--num-warmups", type=int, default=2)
    ap.add_argument("--fault", default=None, help=f"planted faults, comma-separated, of {FAULTS} (canaries/tests only)")
    args = ap.parse_args(argv)
    common.set_arm_env(args.arm)
    common.grant_worker_shutdown(args.shutdown_timeout)
    faults = set(args.fault.split(",")) if args.fault else set()
    if faults - set(FAULTS):
        raise SystemExit(f"unknown --fault {sorted(faults - set(FAULTS))}; one of {FAULTS}")
    concurrencies = parse_concurrencies(args.concurrencies)
    num_prompts = parse_num_prompts(args.num_prompts, concurrencies)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with common.pipes_context() as pipes:
        legs = {c: common.Leg(out / f"c{c}", item="throughput", arm=args.arm, producer="tica.legs.throughput",
                              round=args.round, slot=args.slot, concurrency=c, tee_log=False) for c in concurrencies}
        from tica.models.hashing import weights_hash

        weights = weights_hash(args.model)
        if args.arm == "bi1" and not args.bi1_attempt_engine:
            from tica.legs import engine

            checked_at = common.now()
            reason = engine.bi1_unsupported_reason()
            if reason is not None:
                for c, leg in legs.items():
                    leg.meta["resolved_config"] = resolved_workload(args, c, num_prompts[c], None, weights)
                    leg.begin(checked_at)  # the only work: asking vLLM whether it can run BI=1 here
                    leg.end()
                    leg.finish(not_run_reason=reason)
                pipes.log.info(f"throughput {args.arm} round {args.round}: not run: {reason}")
                return 0
        server_log = out / "server.log"
        server = Server(str(Path(args.model).resolve()), server_log, port=args.port or free_port(),
                        max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization, seed=args.seed,
                        shutdown_timeout=args.shutdown_timeout)
        clients: dict[int, ClientRun] = {}
        try:
            pipes.log.info(f"throughput {args.arm} round {args.round}: starting API server on {server.url}")
            server.wait_healthy(args.server_timeout)
            for i, c in enumerate(concurrencies):
                clients[c] = run_concurrency(args, legs[c], server, c, num_prompts[c], faults,
                                             last=i == len(concurrencies) - 1, log=pipes.log, served_before=i)
        finally:
            server.stop()
        server_recs = server.records()
        cleanup = server.reap_leftovers()
        for c, leg in legs.items():
            leg.meta["resolved_config"] = resolved_workload(args, c, num_prompts[c], server, weights)
            from tica.legs.engine import served_engine_kernels

            # the engine's resolved config and kernels as its EngineCore reported them (api_server.py);
            # nothing reported: unrecorded, never guessed
            leg.meta["kernels"] = {"rollout": served_engine_kernels(server_log.read_text(errors="replace")
                                                                    if server_log.is_file() else "")}
            run = clients.get(c)
            if run is not None:  # the leg's work is its bench's own run; a leg whose client never ran has no times
                leg.begin(run.started_at)
                leg.end(run.ended_at)
                leg.meta["telemetry"] = run.telemetry
                leg.processes.append(run.record)
            else:
                leg.processes.append(common.process_record("client", None, None, evidence="client never started: server failed"))
            leg.processes.extend(server_recs)
            if cleanup:
                leg.meta.setdefault("resolved_config", {})["producer_cleanup"] = cleanup
            shutil.copy2(server_log, leg.dir / "server.log")
            leg.finish()
        pipes.report_custom_message({"legs": [str(l.dir) for l in legs.values()], "item": "throughput", "arm": args.arm,
                                     "round": args.round})
    return 0


def run_concurrency(args, leg: common.Leg, server: Server, c: int, n: int, faults: set[str], *, last: bool,
                    log, served_before: int | None = None) -> ClientRun:
    """One concurrency's bench run (with the planted faults it asks for), logged from its bench.json."""
    run_n = n
    if "truncate-workload" in faults:
        run_n = max(1, n // 2)
        leg.meta.setdefault("resolved_config", {}).setdefault("planted_faults", []).append(f"truncate-workload: client sent {run_n} of {n} prompts")
    if "kill-engine-core" in faults and last:
        for pid in server.engine_pids:
            os.kill(pid, signal.SIGKILL)
        leg.meta.setdefault("resolved_config", {}).setdefault("planted_faults", []).append(
            f"kill-engine-core: SIGKILL to EngineCore {server.engine_pids} before this leg's client")
        time.sleep(2)
    run = run_client(leg.dir, server, str(Path(args.model).resolve()), concurrency=c, num_prompts=run_n,
                     num_warmups=args.num_warmups, input_len=args.input_len, output_len=args.output_len,
                     seed=args.seed, metadata={"arm": args.arm, "round": str(args.round),
                                               "slot": str(args.slot), "concurrency": str(c)},
                     served_before=served_before)
    bench = leg.dir / "bench.json"
    if bench.is_file():
        b = json.loads(bench.read_text())
        log.info(f"throughput {args.arm} r{args.round} c={c}: completed {b.get('completed')}/{n}, "
                 f"{b.get('output_throughput', 0):.1f} out tok/s, TTFT {b.get('mean_ttft_ms', 0):.0f} ms")
    return run


if __name__ == "__main__":
    sys.exit(main())
