"""The throughput legs (``producers throughput``, run by ``all --throughput``): vLLM's API server BI=0
and BI=1 side by side on one GPU (``tica.legs.api_server``, with the recipe's ``--shutdown-timeout``,
so the EngineCore's exit code is reported), one client process running every leg's `vllm bench
serve` in the question's crossed order (``producers bench-client``) until the device-time deadline,
the servers stopped with SIGTERM and their ends recorded; legs past the deadline are written as
not run, with why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# the core fingerprint of a model folder, as the manifest's checkpoint.path hashes (no cache file)
from tica.models.hashing import weights_hash

from tica.legs.common import SHUTDOWN_TIMEOUT_S, process_identity
from tica.legs.engine import served_engine_kernels
from tica.pairing import Arm, round_arms

from .legio import log

CONCURRENCIES = (1, 8, 32, 64)
BENCH_SEED = 0  # the random dataset's seed of every leg's `vllm bench serve` (the manifest's workload.seed)
STOP_MARGIN_S = 15  # past the EngineCore's shutdown grace before the producer SIGKILLs a server (launcher budgets it)


def _server_extra(attention_backend: str | None) -> list[str]:
    """What the H200 recipe adds to the API server `tica.legs.throughput.Server` starts (None: the
    platform's default backend, for a CPU smoke run)."""
    backend = ["--attention-backend", attention_backend] if attention_backend else []
    return ["--dtype", "bfloat16", *backend, "--served-model-name", "tput"]


# The H200 throughput questions freeze A = BI=0 and a crossed order starting AB: odd rounds BI=0
# first. These defaults are the plan every committed throughput receipt ran under.
ARM_A: Arm = "bi0"
PAIRING_ORDER: tuple[str, ...] = ("AB",)


def _plan(rounds: int, concurrencies: tuple[int, ...], prompts_mult: int, first_round: int = 1,
          arm_a: Arm = ARM_A, pairing_order: Sequence[str] = PAIRING_ORDER) -> list[dict]:
    """Every leg of rounds first_round, first_round + 1, ..., each round's arms in slot order under the
    frozen order with A = arm_a (tica.pairing). first_round > 1 continues a run whose earlier rounds
    an earlier call on the same machine ran."""
    plan = []
    for r in range(first_round, first_round + rounds):
        for slot, arm in enumerate(round_arms(pairing_order, arm_a, r), 1):
            for c in concurrencies:
                plan.append({"arm": arm, "round": r, "slot": slot, "c": c, "num_prompts": max(2, c) * prompts_mult,
                             "num_warmups": 1})
    return plan


def cmd_throughput(a) -> int:
    from tica.legs.throughput import SERVER_ENGINES, Server

    from . import legio

    legs = Path(a.legs)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    model = Path(a.model)
    deadline = float(a.deadline)
    in_len, out_len = a.input_len, a.output_len
    max_len = in_len + out_len + 64
    concurrencies = tuple(getattr(a, "concurrencies", None) or CONCURRENCIES)
    shutdown_timeout = int(getattr(a, "shutdown_timeout", SHUTDOWN_TIMEOUT_S))
    attention_backend = getattr(a, "attention_backend", "FLASH_ATTN")
    servers: dict[str, Server] = {}
    healthy: dict[str, bool] = {}
    start_s: dict[str, float] = {}
    ports = {"bi0": 8100, "bi1": 8101}
    plan = _plan(a.rounds, concurrencies, a.prompts_mult, int(getattr(a, "first_round", 1)),
                 getattr(a, "arm_a", ARM_A), tuple(getattr(a, "pairing_order", PAIRING_ORDER)))
    summary = {"plan": plan, "servers": {}, "legs": [], "not_run": [], "shutdown_timeout": shutdown_timeout}
    # servers one after the other (two starting at once confuse each other's memory profiling); each
    # through tica.legs.api_server (vLLM's server, unchanged) so the EngineCore's exit code is reported
    engine = getattr(a, "engine", "eager")
    production = engine != "eager"  # CUDA graphs and prefix caching on
    arm_env = {arm: dict(getattr(a, "arm_env", None) or {}).get(arm, os.environ) for arm in ("bi0", "bi1")}
    cold = bool(getattr(a, "cold_prefix_cache", False))
    if cold:  # vLLM serves /reset_prefix_cache only in its dev mode; both arms alike
        arm_env = {arm: dict(env, VLLM_SERVER_DEV_MODE="1") for arm, env in arm_env.items()}
    for arm in ("bi0", "bi1"):
        env = dict(arm_env[arm], VLLM_BATCH_INVARIANT="1" if arm == "bi1" else "0")
        t = time.time()
        servers[arm] = Server(str(model), work / f"server-{arm}.log", port=ports[arm], max_model_len=max_len,
                              gpu_memory_utilization=a.util, seed=0, shutdown_timeout=shutdown_timeout,
                              extra=_server_extra(attention_backend), env=env,
                              engine=SERVER_ENGINES[engine])
        try:
            servers[arm].wait_healthy(240)
            healthy[arm] = True
        except RuntimeError as err:
            healthy[arm] = False
            log(f"server {arm}: {err}")
        start_s[arm] = time.time() - t
        log(f"server {arm} pid {servers[arm].proc.pid} healthy={healthy[arm]} after {start_s[arm]:.1f}s "
            f"(engine {servers[arm].engine_pids}, workers {servers[arm].worker_pids})")
        if not healthy[arm]:
            break
    server_env = {arm: {k: v for k, v in dict(arm_env[arm], VLLM_BATCH_INVARIANT="1" if arm == "bi1" else "0").items()
                        if k.startswith(legio.RECORDED_ENV_PREFIXES)} for arm in ("bi0", "bi1")}
    client_env = dict(os.environ)
    client_env.pop("VLLM_BATCH_INVARIANT", None)
    spec = work / "bench_plan.json"
    ready = len(healthy) == 2 and all(healthy.values())
    run_plan = plan if ready else []
    spec.write_text(json.dumps({"plan": run_plan, "ports": ports, "model": str(model), "tokenizer": str(model),
                                "in": in_len, "out": out_len, "deadline": deadline, "results": str(work / "bench"),
                                "cuda_graphs": production,  # as the servers run (resolved_config)
                                "cold_prefix_cache": cold,
                                # whose CPU time each leg reads (tica.legs.telemetry): an engine not found is unread
                                "processes": {arm: {"api_server": [s.proc.pid], "engine_core": list(s.engine_pids)}
                                              for arm, s in servers.items()}}))
    client_rc, client_pid, client_identity = None, None, {}
    if run_plan:
        clog = open(work / "client.log", "wb")
        cp = subprocess.Popen([sys.executable, "-m", "tica.legs.vllm_kernels.producers", "bench-client", str(spec)],
                              env=client_env, stdout=clog, stderr=subprocess.STDOUT)
        client_pid = cp.pid
        client_identity = process_identity(cp.pid)  # read while it runs
        try:
            client_rc = cp.wait(timeout=max(30, deadline - time.time() + 20))
        except subprocess.TimeoutExpired:
            cp.kill()
            client_rc = cp.wait()
    # stop each: one SIGTERM (a second would make uvicorn skip its graceful path), then vLLM's own
    # shutdown (the EngineCore gets --shutdown-timeout) plus a margin before the producer's SIGKILL
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(servers) or 1) as pool:  # both at once: the device-time deadline counts the slower
        list(pool.map(lambda srv: srv.stop(grace=shutdown_timeout + STOP_MARGIN_S), servers.values()))
    ends: dict[str, list[dict]] = {}
    for arm, s in servers.items():
        ends[arm] = s.records()
        left = s.reap_leftovers()
        summary["servers"][arm] = {"pid": s.proc.pid, "exit_code": s.proc.returncode, "start_s": start_s.get(arm),
                                   "healthy": healthy.get(arm), "stop": s.stop_evidence, "end": ends[arm],
                                   "reaped_after_records": left}
        log(f"server {arm} exit {s.proc.returncode} ({s.stop_evidence}); "
            + ", ".join(f"{r['role']} {r.get('pid')}: {r.get('end_state')} {r.get('exit_code')}" for r in ends[arm]))
    clog_text = (work / "client.log").read_text(errors="replace") if (work / "client.log").exists() else ""
    client_rec = legio.process_record("client", client_pid, client_rc, clog_text,
                                      "one client process ran every leg's `vllm bench serve` in order "
                                      "(vllm.benchmarks.serve.main, the code behind the CLI)",
                                      identity=client_identity)
    results = work / "bench"
    w_hash = weights_hash(model)  # the folder both servers loaded
    for leg in plan:
        name = f"throughput_{leg['arm']}_r{leg['round']}_c{leg['c']}"
        d = legs / name
        # the leg's work: its own `vllm bench serve` run (none: the leg was not run, no times)
        ran = bench_times(results, name)
        meta = legio.new_meta("throughput", leg["arm"], trainer=None, round=leg["round"], slot=leg["slot"],
                              concurrency=leg["c"], started_at=ran.get("started_at"))
        meta["ended_at"] = ran.get("ended_at")
        alive = results / f"{name}.alive.json"
        if alive.is_file():
            meta["alive_at_end"] = json.loads(alive.read_text())
        tele = results / f"{name}.telemetry.json"
        if tele.is_file():
            meta["telemetry"] = json.loads(tele.read_text())
        meta["env"] = server_env[leg["arm"]]
        s = servers.get(leg["arm"])
        # what the arm's server logged resolving (parallel sizes, dtypes, caching, shutdown), never a label
        # written by arm: the kernels the switch selects are its consequence, not a second difference
        # the EngineCore's own report (TICA_ENGINE_CONFIG, api_server.py), checked against vLLM's log line
        meta["kernels"] = {"rollout": served_engine_kernels(s.log_path.read_text(errors="replace")
                                                            if s and s.log_path.is_file() else "")}
        meta["resolved_config"] = {"model": str(model), "weights_hash": w_hash,
                                   "model_shape": getattr(a, "model_shape", None) or "tput",
                                   "candidate": getattr(a, "candidate", None),
                                   "num_prompts": leg["num_prompts"], "num_warmups": leg["num_warmups"],
                                   "input_len": in_len, "output_len": out_len, "ignore_eos": True, "seed": BENCH_SEED,
                                   "random_range_ratio": 0, "max_model_len": max_len, "enforce_eager": not production,
                                   "prefix_caching": production, "engine": engine, "gpu_memory_utilization": a.util,
                                   "shutdown_timeout": shutdown_timeout, "attention_backend": attention_backend,
                                   "server_cmd": " ".join(s.recorded_cmd) if s else None,
                                   "warmup_policy": "every leg sends its own warm-up request (full length) before "
                                                    "its measured requests (the workload fixes 1 per leg)",
                                   "co_resident": "both arms' servers stay up on the one GPU for the whole run "
                                                  "(the idle one holds memory, no compute): aligned across arms",
                                   "shrink": a.shrink_note, "cold_prefix_cache": cold}
        res = results / f"{name}.json"
        d.mkdir(parents=True, exist_ok=True)
        if res.exists():
            shutil.copy(res, d / "bench.json")
            meta["processes"] = list(ends.get(leg["arm"]) or []) + [client_rec]
            summary["legs"].append(name)
        else:
            why = (results / f"{name}.notrun").read_text() if (results / f"{name}.notrun").exists() else \
                "not reached: the run's device-time deadline came first" if ready else "servers did not become healthy"
            meta["not_run_reason"] = why
            meta["processes"] = list(ends.get(leg["arm"]) or []) + ([client_rec] if client_pid else [])
            summary["not_run"].append({"leg": name, "why": why})
        if s is not None and s.log_path.is_file():
            shutil.copy(s.log_path, d / "server.log")
        legio.write_meta(d, meta)
        legio.finalize_leg(d, [])
    (legs.parent / "throughput_summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return 0


def bench_times(results: Path, name: str) -> dict:
    """When one leg's `vllm bench serve` ran ({} where it never started), as cmd_bench_client wrote."""
    p = results / f"{name}.times.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def cmd_bench_client(a) -> int:
    """Run the plan's legs in order in one process; each leg is one `vllm bench serve`."""
    spec = json.loads(Path(a.spec).read_text())
    out = Path(spec["results"])
    out.mkdir(parents=True, exist_ok=True)
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from . import legio

    from tica.legs.telemetry import Sampler, engine_counts, read_counters, reset_prefix_cache

    est: dict[tuple[str, int], float] = {}
    served = {"bi0": 0, "bi1": 0}  # legs each arm's server ran before this one (its warm-up state)
    # a leg's first estimate, measured at 8192 in / 1024 out on a 1.7B model: scaled by the tokens asked
    scale = min(1.0, (spec["in"] + spec["out"]) / (8192 + 1024))
    default = {c: s * scale for c, s in {1: 25.0, 8: 15.0, 32: 25.0, 64: 40.0}.items()}
    stop = False
    current_round = None
    for leg in spec["plan"]:
        name = f"throughput_{leg['arm']}_r{leg['round']}_c{leg['c']}"
        if leg["round"] != current_round:
            current_round = leg["round"]
            legs_r = [x for x in spec["plan"] if x["round"] == current_round]
            need = sum(est.get((x["arm"], x["c"]), default.get(x["c"], 60.0)) for x in legs_r)
            left = spec["deadline"] - time.time()
            if stop or need > left:
                stop = True
                why = (f"not run: device-time deadline (round {current_round} estimated at {need:.0f}s from the "
                       f"legs measured so far, {max(0.0, left):.0f}s left); a round runs whole or not at all, so "
                       "no round is half-crossed")
        if stop:
            (out / f"{name}.notrun").write_text(why)
            continue
        port = spec["ports"][leg["arm"]]
        argv = ["--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}", "--model", "tput",
                "--tokenizer", spec["tokenizer"], "--dataset-name", "random", "--random-input-len", str(spec["in"]),
                "--random-output-len", str(spec["out"]), "--random-range-ratio", "0", "--ignore-eos",
                "--max-concurrency", str(leg["c"]), "--num-prompts", str(leg["num_prompts"]),
                "--num-warmups", str(leg["num_warmups"]), "--seed", str(BENCH_SEED), "--ready-check-timeout-sec", "0",
                "--disable-tqdm", "--save-result", "--result-dir", str(out), "--result-filename", f"{name}.json",
                "--metadata", f"arm={leg['arm']}", f"round={leg['round']}", f"slot={leg['slot']}"]
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        t = time.time()
        started_at = legio.now()
        roles = {"client": [os.getpid()], **spec.get("processes", {}).get(leg["arm"], {})}
        base_url = f"http://127.0.0.1:{port}"
        emptied = reset_prefix_cache(base_url) if spec.get("cold_prefix_cache") else None
        counters_before = read_counters(base_url)
        with Sampler(processes=roles) as sampler:
            try:
                main(parser.parse_args(argv))
                log(f"{name}: {time.time() - t:.1f}s")
            except Exception as err:  # noqa: BLE001
                (out / f"{name}.notrun").write_text(f"bench failed: {err!r}"[:2000])
                log(f"{name}: FAILED {err!r}")
        (out / f"{name}.times.json").write_text(json.dumps({"started_at": started_at, "ended_at": legio.now()}))
        # read after the leg's end: the processes that served it (its exits are read once, at the run's end)
        (out / f"{name}.alive.json").write_text(json.dumps(legio.alive_now(roles)))
        telemetry = sampler.summary(served_before=served[leg["arm"]], cuda_graphs=spec.get("cuda_graphs"))
        telemetry.update(engine_counts(counters_before, read_counters(base_url)), prefix_cache_reset=emptied)
        (out / f"{name}.telemetry.json").write_text(json.dumps(telemetry))
        served[leg["arm"]] += 1
        est[(leg["arm"], leg["c"])] = time.time() - t
    return 0
