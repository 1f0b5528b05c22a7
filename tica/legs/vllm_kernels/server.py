"""The throughput legs (``producers throughput``, run by ``all --throughput``): `vllm serve` BI=0 and
BI=1 side by side on one GPU, one client process running every leg's `vllm bench serve` in the
crossed order AB/BA/AB (``producers bench-client``) until the device-time deadline, the servers
stopped with SIGTERM and their ends recorded; legs past the deadline are written as not run, with why.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

# the core fingerprint of a model folder, as the manifest's checkpoint.path hashes (no cache file)
from tica.models.hashing import weights_hash

from .legio import log

CONCURRENCIES = (1, 8, 32, 64)


def _healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001
        return False


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, comm) of every live descendant of pid, from /proc."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        rest = text[text.rfind(")") + 2:].split()
        comm = text[text.find("(") + 1:text.rfind(")")]
        parent[int(stat.parent.name)] = (int(rest[1]), comm)
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        for k, (pp, comm) in parent.items():
            if pp == cur:
                out.append((k, comm))
                todo.append(k)
    return sorted(out)


def _alive(pid: int) -> bool:
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return st[st.rfind(")") + 2:].split()[0] != "Z"


def _server_cmd(model: Path, port: int, max_len: int, util: float) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "bfloat16", "--max-model-len", str(max_len),
            "--gpu-memory-utilization", str(util), "--enforce-eager", "--no-enable-prefix-caching",
            "--attention-backend", "FLASH_ATTN", "--seed", "0", "--served-model-name", "tput"]


def cmd_throughput(a) -> int:
    from . import legio

    legs = Path(a.legs)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    model = Path(a.model)
    deadline = float(a.deadline)
    in_len, out_len = a.input_len, a.output_len
    max_len = in_len + out_len + 64
    servers = {}
    ports = {"bi0": 8100, "bi1": 8101}
    plan = []
    for r in range(1, a.rounds + 1):
        order = ["bi0", "bi1"] if r % 2 == 1 else ["bi1", "bi0"]
        for slot, arm in enumerate(order, 1):
            for c in CONCURRENCIES:
                plan.append({"arm": arm, "round": r, "slot": slot, "c": c, "num_prompts": max(2, c) * a.prompts_mult,
                             "num_warmups": 1})
    summary = {"plan": plan, "servers": {}, "legs": [], "not_run": []}
    # servers one after the other (two starting at once confuse each other's memory profiling)
    for arm in ("bi0", "bi1"):
        env = dict(os.environ, VLLM_BATCH_INVARIANT="1" if arm == "bi1" else "0")
        logf = open(work / f"server-{arm}.log", "wb")
        t = time.time()
        p = subprocess.Popen(_server_cmd(model, ports[arm], max_len, a.util), env=env, stdout=logf,
                             stderr=subprocess.STDOUT, start_new_session=True)
        while time.time() - t < 240 and p.poll() is None and not _healthy(ports[arm]):
            time.sleep(1)
        ok = _healthy(ports[arm])
        time.sleep(0.5)
        kids = _descendants(p.pid)
        servers[arm] = {"children": kids, "proc": p, "log": work / f"server-{arm}.log", "env": {k: v for k, v in env.items()
                        if k.startswith(legio.RECORDED_ENV_PREFIXES)}, "start_s": time.time() - t, "healthy": ok}
        log(f"server {arm} pid {p.pid} healthy={ok} after {time.time() - t:.1f}s")
        if not ok:
            break
    client_env = dict(os.environ)
    client_env.pop("VLLM_BATCH_INVARIANT", None)
    spec = work / "bench_plan.json"
    ready = all(s["healthy"] for s in servers.values()) and len(servers) == 2
    run_plan = plan if ready else []
    spec.write_text(json.dumps({"plan": run_plan, "ports": ports, "model": str(model), "tokenizer": str(model),
                                "in": in_len, "out": out_len, "deadline": deadline, "results": str(work / "bench")}))
    client_rc, client_pid = None, None
    if run_plan:
        clog = open(work / "client.log", "wb")
        cp = subprocess.Popen([sys.executable, "-m", "tica.legs.vllm_kernels.producers", "bench-client", str(spec)],
                              env=client_env, stdout=clog, stderr=subprocess.STDOUT)
        client_pid = cp.pid
        try:
            client_rc = cp.wait(timeout=max(30, deadline - time.time() + 20))
        except subprocess.TimeoutExpired:
            cp.kill()
            client_rc = cp.wait()
    # stop servers: SIGTERM, 40 s grace, then SIGKILL (recorded)
    ends = {}
    for arm, s in servers.items():
        if s["proc"].poll() is None:
            s["proc"].send_signal(signal.SIGTERM)
    for arm, s in servers.items():
        p = s["proc"]
        try:
            rc = p.wait(timeout=40)
            how = "SIGTERM, exited on its own"
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
            how = "did not exit within 40 s of SIGTERM: SIGKILL"
        text = Path(s["log"]).read_text(errors="replace")
        ends[arm] = [legio.process_record("api_server", p.pid, rc, text, how)]
        for kpid, comm in s["children"]:
            gone = not _alive(kpid)
            fk = legio.FORCE_KILL_RE.search(text)
            role = "engine_core" if "engine" in comm.lower() or "core" in comm.lower() else "worker"
            ends[arm].append({"role": role, "pid": kpid, "exit_code": None,
                              "end_state": ("force_killed" if fk else "exited") if gone else "running",
                              "signal": None,
                              "evidence": (f"child {comm!r} of the API server; " +
                                           (fk.group(0) if fk else "gone after the API server's exit, no 'force "
                                            "killing' line in its log") +
                                           "; its exit code went to its parent (the API server) and is not "
                                           "observable from the launcher")})
        summary["servers"][arm] = {"pid": p.pid, "exit_code": rc, "start_s": s["start_s"], "healthy": s["healthy"],
                                   "end": ends[arm]}
        log(f"server {arm} exit {rc} ({how})")
    clog_text = (work / "client.log").read_text(errors="replace") if (work / "client.log").exists() else ""
    client_rec = legio.process_record("client", client_pid, client_rc, clog_text,
                                      "one client process ran every leg's `vllm bench serve` in order "
                                      "(vllm.benchmarks.serve.main, the code behind the CLI)")
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
        s = servers.get(leg["arm"])
        meta["env"] = dict((s or {}).get("env") or {}, VLLM_BATCH_INVARIANT="1" if leg["arm"] == "bi1" else "0")
        meta["kernels"] = {"attention": "FLASH_ATTN", "matmul": "vLLM BI Triton persistent matmul" if leg["arm"] == "bi1"
                           else "vLLM default (cuBLAS)", "cuda_graphs": "off (--enforce-eager, both arms)"}
        meta["resolved_config"] = {"model": str(model), "weights_hash": w_hash, "model_shape": "tput",
                                   "num_prompts": leg["num_prompts"], "num_warmups": leg["num_warmups"],
                                   "input_len": in_len, "output_len": out_len, "ignore_eos": True,
                                   "random_range_ratio": 0, "max_model_len": max_len, "enforce_eager": True,
                                   "prefix_caching": False, "gpu_memory_utilization": a.util,
                                   "server_cmd": " ".join(_server_cmd(model, ports[leg["arm"]], max_len, a.util)),
                                   "warmup_policy": "every leg sends its own warm-up request (full length) before "
                                                    "its measured requests (the workload fixes 1 per leg)",
                                   "co_resident": "both arms' servers stay up on the one GPU for the whole run "
                                                  "(the idle one holds memory, no compute): aligned across arms",
                                   "shrink": a.shrink_note}
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

    est: dict[tuple[str, int], float] = {}
    default = {1: 25.0, 8: 15.0, 32: 25.0, 64: 40.0}
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
                "--num-warmups", str(leg["num_warmups"]), "--seed", "0", "--ready-check-timeout-sec", "0",
                "--disable-tqdm", "--save-result", "--result-dir", str(out), "--result-filename", f"{name}.json",
                "--metadata", f"arm={leg['arm']}", f"round={leg['round']}", f"slot={leg['slot']}"]
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        t = time.time()
        started_at = legio.now()
        try:
            main(parser.parse_args(argv))
            log(f"{name}: {time.time() - t:.1f}s")
        except Exception as err:  # noqa: BLE001
            (out / f"{name}.notrun").write_text(f"bench failed: {err!r}"[:2000])
            log(f"{name}: FAILED {err!r}")
        (out / f"{name}.times.json").write_text(json.dumps({"started_at": started_at, "ended_at": legio.now()}))
        est[(leg["arm"], leg["c"])] = time.time() - t
    return 0
