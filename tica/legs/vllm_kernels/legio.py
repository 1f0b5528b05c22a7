"""Writing leg directories exactly as docs/receipts.md says (stdlib + numpy + tica.seal/metrics).

A leg is written by the process that measured it, except ``processes`` and the seal: the
orchestrator that launched that process waits for its exit code, completes ``processes`` in
leg.json and seals the leg last (``finalize_leg``).

Every leg records, as the CPU producers' `Leg` does: ``source`` and ``image_digest`` (what ran,
None where unknown) and ``started_at`` / ``ended_at``, the moments its work started and ended,
which the producer passes in (``new_meta(started_at=...)``, ``meta["ended_at"]``): never the
moment leg.json was written.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from tica.legs.common import device_info  # noqa: F401 - re-exported for the producers
from tica.legs.common import image_digest, source_record, this_node
from tica.metrics import forward_metrics
from tica.seal import seal_leg

SCHEMA = "tica.leg/1"
PRODUCER = "tica.legs.vllm_kernels.producers"
PRODUCER_VERSION = "1"
RECORDED_ENV_PREFIXES = ("VLLM_", "TICA_", "CUDA_", "NCCL_", "CUBLAS", "TORCH_", "HF_", "TRANSFORMERS_",
                         "PYTHONHASHSEED", "OMP_", "NVSHMEM_", "DO_NOT_TRACK")
FORCE_KILL_RE = re.compile(r"force killing remaining process(?:es)?[^\n]*")
ERROR_RE = re.compile(r"(Traceback \(most recent call last\)|EngineDeadError|died unexpectedly)")


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


def log(msg: str) -> None:
    """A producer's progress line (pipes_child forwards each one as a Pipes log line)."""
    print(f"[tica {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def recorded_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(RECORDED_ENV_PREFIXES)}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for key in ("torch", "vllm", "transformers", "triton", "numpy", "safetensors", "tokenizers"):
        mod = sys.modules.get(key)
        v = getattr(mod, "__version__", None) if mod is not None else None
        if v is None:
            try:
                v = metadata.version(key)
            except metadata.PackageNotFoundError:
                v = None
        if v is not None:
            out[key] = str(v)
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch.version, "cuda", None):
        out["cuda_runtime"] = str(torch.version.cuda)
    return out


# producer commands that start no vLLM engine
NO_ENGINE_COMMANDS = ("make-model", "make_model", "bi0-megatron", "bi0_megatron")


def launcher_records(name: str, pid: int, rc: int | None, text: str, env: dict[str, str],
                     identity: dict | None = None) -> list[dict]:
    """The process record a launcher adds to a producer command's legs: the one process it waited
    on, as the trainer. Where that command ran vLLM's engine core inside the same process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0) that is said in the evidence, not recorded as an
    EngineCore of its own: it had no process, no exit of its own. An EngineCore that was a process
    of its own is recorded, with its own pid, by the producer that shut it down. `identity`: what
    `tica.legs.common.process_identity` read from the process while it ran (absent: none read)."""
    evidence = "exit code observed by the launcher (wait())"
    if not name.startswith(NO_ENGINE_COMMANDS) and env.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        evidence += ("; vLLM's engine core ran inside this process (InprocClient, "
                     "VLLM_ENABLE_V1_MULTIPROCESSING=0): no EngineCore process of its own")
    return [process_record("trainer", pid, rc, text, evidence, identity=identity)]


_WRITTEN: list[Path] = []  # the leg dirs this process wrote (write_meta), in order


def kernels_arm() -> str:
    """The arm a vLLM-kernels leg ran, read from its environment: bi1 under VLLM_BATCH_INVARIANT=1
    (enforced on the GPU), bi0 otherwise (a CPU dry run), so its leg.json never contradicts its env."""
    return "bi1" if os.environ.get("VLLM_BATCH_INVARIANT") == "1" else "bi0"


def new_meta(item: str, arm: str, *, trainer: str | None, round: int | None = None, slot: int | None = None,
             concurrency: int | None = None, started_at: str | None = None) -> dict:
    """A leg.json skeleton. started_at: when the leg's work started (None: not known); the producer
    sets ``ended_at`` when the work ends."""
    return {
        "schema": SCHEMA, "item": item, "arm": arm, "round": round, "slot": slot, "concurrency": concurrency,
        "producer": PRODUCER, "producer_version": PRODUCER_VERSION, "trainer": trainer,
        "env": {}, "versions": {}, "device": {}, "kernels": {}, "resolved_config": {},
        "profiled": False, "source": source_record(), "image_digest": image_digest(),
        "started_at": started_at, "ended_at": None, "processes": [], "not_run_reason": None,
    }


def write_meta(leg_dir: Path, meta: dict) -> None:
    """Write leg.json (unsealed): env/versions/device/source/image and the node
    (resolved_config.node) filled in from this process where the meta has none. The times are
    the producer's: nothing is stamped here."""
    leg_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(meta)
    meta.setdefault("started_at", None)
    meta.setdefault("ended_at", None)
    meta["env"] = meta.get("env") or recorded_env()
    meta["versions"] = meta.get("versions") or versions()
    meta["device"] = meta.get("device") or device_info()
    loaded = source_record(meta["env"])  # the overlay is the one the recorded env loads, whoever set the source
    meta["source"] = {**(meta.get("source") or loaded), "overlay_digest": loaded["overlay_digest"]}
    if "image_digest" not in meta:
        meta["image_digest"] = image_digest()
    # the throughput judge's one-node rule reads it (run13's legs, written before this, record none)
    meta["resolved_config"] = {"node": this_node(), **(meta.get("resolved_config") or {})}
    if meta["ended_at"] and meta.get("item") != "throughput" and not meta.get("alive_at_end"):
        # this process ran the leg's work and is the one its launcher records as the trainer: read
        # alive after the work, it lets its one exit stand for every leg it wrote (clean exit)
        meta["alive_at_end"] = alive_now({"trainer": [os.getpid()]})
    _write_meta(leg_dir, meta)
    if leg_dir not in _WRITTEN:
        _WRITTEN.append(leg_dir)


def alive_now(pids_by_role: dict[str, list[int]]) -> list[dict]:
    """The processes read alive now, by content (`LiveProcess` entries): a pid whose identity cannot
    be read (gone, or a create time alone) is left out, never guessed."""
    from tica.legs.common import process_identity

    out = []
    for role, pids in pids_by_role.items():
        for pid in pids:
            ident = process_identity(pid)
            if ident.get("create_time") and (ident.get("name") or ident.get("cmdline")):
                out.append({"role": role, "pid": pid, "identity": ident, "read_at": now()})
    return out


def legs_written() -> list[Path]:
    return list(_WRITTEN)


def _write_meta(leg_dir: Path, meta: dict) -> None:
    from tica.receipts import write_leg_meta  # pydantic only once a leg is written, after vLLM is set up

    write_leg_meta(leg_dir, meta)


def add_processes(leg_dirs: list[Path], processes: list[dict]) -> None:
    """Add process records this process observed (e.g. its own EngineCore child's exit) to legs it
    wrote, still unsealed; a sealed leg is never rewritten."""
    if not processes:
        return
    for d in leg_dirs:
        p = d / "leg.json"
        if not p.is_file() or (d / "seal.json").exists():
            continue
        meta = json.loads(p.read_text())
        have = {(x.get("role"), x.get("pid")) for x in meta.get("processes", [])}
        meta.setdefault("processes", []).extend(r for r in processes if (r["role"], r["pid"]) not in have)
        _write_meta(d, meta)


def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, default=float) + "\n")


def step_row(step: int, checkpoint: str, trainer_lp: np.ndarray, rollout_lp: np.ndarray, extra: dict | None = None) -> dict:
    row = {"step": step, "step_basis": "rollout", "checkpoint_version": checkpoint}
    row.update(forward_metrics(trainer_lp, rollout_lp))
    if extra:
        row.update(extra)
    return row


def write_step_arrays(forward_dir: Path, step: int, *, token_ids, seq_lens, trainer_logprobs, rollout_logprobs,
                      decode_logprobs=None, decode_mask=None, rollout_experts=None, trainer_experts=None,
                      trainer_experts_ranks=None) -> Path:
    d = forward_dir / "arrays"
    d.mkdir(parents=True, exist_ok=True)
    arrays = {
        "token_ids": np.asarray(token_ids, dtype=np.int32),
        "seq_lens": np.asarray(seq_lens, dtype=np.int32),
        "trainer_logprobs": np.asarray(trainer_logprobs, dtype=np.float32),
        "rollout_logprobs": np.asarray(rollout_logprobs, dtype=np.float32),
    }
    if decode_logprobs is not None:
        arrays["decode_logprobs"] = np.asarray(decode_logprobs, dtype=np.float32)
        arrays["decode_mask"] = np.asarray(decode_mask, dtype=np.bool_)
    if rollout_experts is not None or trainer_experts is not None:  # a MoE's routes: both sides, [tokens, layers, k]
        arrays["rollout_experts"] = np.asarray(rollout_experts, dtype=np.int32)
        arrays["trainer_experts"] = np.asarray(trainer_experts, dtype=np.int32)
    if trainer_experts_ranks is not None:  # expert parallelism: every rank's routes, [ranks, tokens, layers, k]
        arrays["trainer_experts_ranks"] = np.asarray(trainer_experts_ranks, dtype=np.int32)
    n = arrays["token_ids"].size
    assert int(arrays["seq_lens"].sum()) == n
    for k, a in arrays.items():
        assert k == "seq_lens" or a.shape[k == "trainer_experts_ranks"] == n, (k, a.shape, n)
    p = d / f"step_{step:04d}.npz"
    np.savez_compressed(p, **arrays)
    return p


def process_record(role: str, pid: int | None, exit_code: int | None, log_text: str = "", evidence: str = "",
                   identity: dict | None = None) -> dict:
    """The end of one process from its exit code. A "force killing" line in its log is vLLM killing
    one of this process's children, not this process: it goes into the evidence (which the
    clean-exit judge reads: still not a clean exit), never into this process's own end state."""
    fk = FORCE_KILL_RE.search(log_text or "")
    if fk:
        evidence = (evidence + "; " if evidence else "") + "its log: " + fk.group(0).strip()
    if exit_code is None:  # the caller saw no exit code: ended (or not) unseen, never "clean"
        state, sig = "gone", None
    elif exit_code < 0:
        sig = -exit_code
        state = "killed" if sig == 9 else "signalled"
    else:
        state, sig = "exited", None
    rec = {"role": role, "pid": pid, "exit_code": exit_code, "end_state": state, "signal": sig,
           "evidence": evidence or None}
    if identity:  # read from the process while it lived (tica.legs.common.process_identity); else unknown
        rec["identity"] = dict(identity)
    return rec


def finalize_leg(leg_dir: Path, processes: list[dict]) -> dict:
    """Add the launcher-observed process ends to leg.json, then seal (last)."""
    p = leg_dir / "leg.json"
    meta = json.loads(p.read_text())
    have = {(x.get("role"), x.get("pid")) for x in meta.get("processes", [])}
    for rec in processes:
        if (rec["role"], rec["pid"]) not in have:
            meta.setdefault("processes", []).append(rec)
    _write_meta(leg_dir, meta)
    seal_leg(leg_dir)
    return meta


def pack_out(out: Path, legs: Path, logs: Path, status: dict) -> None:
    """What a device call brings back under $OUT: the sealed legs, the logs, the status."""
    import tarfile

    with tarfile.open(out / "receipts.tgz", "w:gz") as tf:
        tf.add(legs, arcname="h200")
    with tarfile.open(out / "logs.tgz", "w:gz") as tf:
        tf.add(logs, arcname="logs")
    (out / "status.json").write_text(json.dumps(status, indent=1, default=str))
