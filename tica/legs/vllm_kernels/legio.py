"""Writing leg directories exactly as docs/receipts.md says (stdlib + numpy + tica.seal/metrics).

A leg is written by the process that measured it, except ``processes`` and the seal: the
orchestrator that launched that process waits for its exit code, completes ``processes`` in
leg.json and seals the leg last (``finalize_leg``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

from tica.legs.common import device_info  # noqa: F401 - re-exported for the producers
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


def launcher_records(name: str, pid: int, rc: int | None, text: str, env: dict[str, str]) -> list[dict]:
    """The process records a launcher adds to a producer command's legs: the process it waited on
    and, for commands that ran vLLM's in-process engine, that engine core."""
    rec = process_record("trainer", pid, rc, text,
                         "exit code observed by the launcher (wait()); the trainer and, where this "
                         "process started one, vLLM's in-process engine ran here")
    if name.startswith(NO_ENGINE_COMMANDS):
        return [rec]
    ec = dict(rec, role="engine_core",
              evidence="vLLM's EngineCore ran in-process (InprocClient, VLLM_ENABLE_V1_MULTIPROCESSING="
                       f"{env.get('VLLM_ENABLE_V1_MULTIPROCESSING')}): same process, same exit as the trainer"
                       + (f"; {rec['evidence']}" if rec["end_state"] == "force_killed" else ""))
    return [rec, ec]


def new_meta(item: str, arm: str, *, trainer: str | None, round: int | None = None, slot: int | None = None,
             concurrency: int | None = None) -> dict:
    return {
        "schema": SCHEMA, "item": item, "arm": arm, "round": round, "slot": slot, "concurrency": concurrency,
        "producer": PRODUCER, "producer_version": PRODUCER_VERSION, "trainer": trainer,
        "env": {}, "versions": {}, "device": {}, "kernels": {}, "resolved_config": {},
        "profiled": False, "started_at": now(), "ended_at": None, "processes": [], "not_run_reason": None,
    }


def write_meta(leg_dir: Path, meta: dict) -> None:
    """Write leg.json (unsealed): env/versions/device filled in from this process."""
    leg_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(meta)
    meta["ended_at"] = meta.get("ended_at") or now()
    meta["env"] = meta.get("env") or recorded_env()
    meta["versions"] = meta.get("versions") or versions()
    meta["device"] = meta.get("device") or device_info()
    (leg_dir / "leg.json").write_text(json.dumps(meta, indent=1, default=str))


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
                      decode_logprobs=None, decode_mask=None) -> Path:
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
    n = arrays["token_ids"].size
    assert int(arrays["seq_lens"].sum()) == n
    for k, a in arrays.items():
        assert k == "seq_lens" or a.size == n, (k, a.size, n)
    p = d / f"step_{step:04d}.npz"
    np.savez_compressed(p, **arrays)
    return p


def process_record(role: str, pid: int | None, exit_code: int | None, log_text: str = "", evidence: str = "") -> dict:
    fk = FORCE_KILL_RE.search(log_text or "")
    if exit_code is None:
        state, sig = "running", None
    elif fk:
        state, sig = "force_killed", None
        evidence = (evidence + "; " if evidence else "") + fk.group(0).strip()
    elif exit_code < 0:
        sig = -exit_code
        state = "killed" if sig == 9 else "signalled"
    else:
        state, sig = "exited", None
    return {"role": role, "pid": pid, "exit_code": exit_code, "end_state": state, "signal": sig,
            "evidence": evidence or None}


def finalize_leg(leg_dir: Path, processes: list[dict]) -> dict:
    """Add the launcher-observed process ends to leg.json, then seal (last)."""
    p = leg_dir / "leg.json"
    meta = json.loads(p.read_text())
    have = {(x.get("role"), x.get("pid")) for x in meta.get("processes", [])}
    for rec in processes:
        if (rec["role"], rec["pid"]) not in have:
            meta.setdefault("processes", []).append(rec)
    p.write_text(json.dumps(meta, indent=1, default=str))
    seal_leg(leg_dir)
    return meta
