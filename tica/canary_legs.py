"""What every item's canaries are made of: a synthetic leg written and sealed as a producer
writes one (`leg_meta`, `proc`, `write_leg`), a sealed leg found by what it records (`find_leg`),
edited and resealed (`edit_meta`) or left out of the set (`drop_arm`), and the planted error's
record (`Canary`, with the verdicts it must get). Each item's own builders
and planted errors live with it (tica/items/<item>/canaries.py), and `tica.canaries` runs them all."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tica.evidence import EvidenceItem
from tica.metrics import forward_metrics
from tica.seal import seal_leg
from tica.verdict import Verdict

WEIGHTS = "blake3:" + "5e1f" * 16
IMAGE_VERSIONS = {"python": "3.12.3", "torch": "2.11.0+cu130", "vllm": "0.26.0", "transformers": "4.57.1"}
DEVICE = {"kind": "cuda", "name": "NVIDIA H200", "driver": "580.95.05", "capability": "9.0", "count": 1}
NODE = "h200-node-a (boot 6f1c2a9e-0b7d-4e55-9a3c-2d8e5b1f7c40)"  # resolved_config.node, as tica.legs.common.this_node


def leg_meta(item: str, arm: str, **over: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "schema": "tica.leg/1", "item": item, "arm": arm, "round": None, "slot": None, "concurrency": None,
        "producer": f"tica.legs.{item}", "producer_version": "1",
        "trainer": None,
        "env": {"VLLM_BATCH_INVARIANT": "1" if arm == "bi1" else "0", "VLLM_USE_FLASHINFER_SAMPLER": "0"},
        "versions": dict(IMAGE_VERSIONS), "device": dict(DEVICE),
        "kernels": {"attention": "FLASH_ATTN"},
        "resolved_config": {"model": "/ckpt/qwen3-8b", "weights_hash": WEIGHTS, "max_model_len": 12288,
                            "enforce_eager": False, "enable_prefix_caching": False, "enable_chunked_prefill": False,
                            "tensor_parallel_size": 1, "gpu_memory_utilization": 0.85, "node": NODE},
        "profiled": False, "started_at": "2026-11-29T10:00:00+00:00", "ended_at": "2026-11-29T10:05:00+00:00",
        "processes": [], "not_run_reason": None,
    }
    meta.update(over)
    for p in meta["processes"]:  # what a producer reads from each process while it lives (synthetic here)
        p.setdefault("identity", synthetic_identity(p["role"], p["pid"], arm))
    return meta


_NAMES = {"engine_core": "VLLM::EngineCore", "worker": "VLLM::Worker_TP0", "trainer_engine_core": "VLLM::EngineCore",
          "trainer_worker": "VLLM::Worker_TP0"}


def synthetic_identity(role: str, pid: int, arm: str) -> dict[str, Any]:
    """A synthetic process identity: a create time apart for every pid and arm (an hour before the
    leg's start), the OS's name for the role's process."""
    return {"create_time": round(1795942800.0 + pid * 0.1 + (0.05 if arm == "bi0" else 0.0), 2),
            "name": _NAMES.get(role, "python3")}


def proc(role: str, pid: int) -> dict[str, Any]:
    return {"role": role, "pid": pid, "exit_code": 0, "end_state": "exited", "signal": None, "evidence": None}


def write_leg(leg_dir: Path, meta: dict[str, Any], files: Mapping[str, str | bytes]) -> Path:
    leg_dir.mkdir(parents=True, exist_ok=True)
    (leg_dir / "leg.json").write_text(json.dumps(meta, indent=1))
    for rel, content in files.items():
        p = leg_dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content) if isinstance(content, bytes) else p.write_text(content)
    seal_leg(leg_dir)
    return leg_dir


def load_json(p: Path) -> Any:
    return json.loads(p.read_text())


def dump_json(p: Path, data: Any) -> None:
    p.write_text(json.dumps(data, indent=1))


def edit_meta(leg: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    meta = load_json(leg / "leg.json")
    fn(meta)
    dump_json(leg / "leg.json", meta)
    seal_leg(leg)


def edit_json(path: Path, fn: Callable[[dict[str, Any]], None], reseal: Path | None) -> None:
    """A JSON receipt edited in place (and its leg resealed, unless `reseal` is None)."""
    data = load_json(path)
    fn(data)
    dump_json(path, data)
    if reseal is not None:
        seal_leg(reseal)


def find_leg(legs: Sequence[Path], **want: Any) -> Path:
    """The first leg whose leg.json records every value in `want` (item, arm, round ...)."""
    for leg in legs:
        meta = load_json(leg / "leg.json")
        if all(meta.get(k) == v for k, v in want.items()):
            return leg
    raise LookupError(f"no leg with {want}")


def drop_arm(arm: str) -> Callable[[Any, list[Path]], None]:
    """The receipt set without any leg of `arm` (the list is edited in place)."""
    def mutate(q: Any, legs: list[Path]) -> None:
        legs[:] = [p for p in legs if load_json(p / "leg.json")["arm"] != arm]
    return mutate


def unquantified_confounder(q: Any, legs: Sequence[Path], item: str) -> None:
    """Every BI=0 leg of `item` run with prefix caching on, the BI=1 legs with it off: an arm
    difference no question quantifies (the quality and throughput canaries plant it alike)."""
    for leg in legs:
        meta = load_json(leg / "leg.json")
        if meta["item"] == item and meta["arm"] == "bi0":
            edit_meta(leg, lambda m: m["resolved_config"].update(enable_prefix_caching=True))


Mutation = Callable[[Any, list[Path]], None]


@dataclass(frozen=True)
class Canary:
    name: str
    item: EvidenceItem | None  # None: the recipe-identity gate
    rule: str
    expect: frozenset[Verdict]
    mutate: Mutation


FAIL = frozenset({Verdict.FAIL})
INCONCLUSIVE = frozenset({Verdict.INCONCLUSIVE})
NOT_PASS = frozenset({Verdict.FAIL, Verdict.INCONCLUSIVE})


# ---------------------------------------------------------------- forward and gradient receipts
# (the forward, backward and update canaries build and plant errors in them alike)


def jsonl(rows: Sequence[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def forward_arrays(step: int, arm: str, ref: float, seed: int) -> tuple[bytes, dict[str, Any]]:
    """One step of a fixed-token forward: 3 sequences, 16 tokens; BI=1 bitwise, BI=0 noisy."""
    rng = np.random.default_rng(seed * 1000 + step)
    seq_lens = np.array([5, 7, 4], dtype=np.int32)
    n = int(seq_lens.sum())
    token_ids = rng.integers(0, 32000, n, dtype=np.int32)
    p = rng.uniform(0.2, 0.9, n)
    trainer = np.log(p).astype(np.float32)
    if arm == "bi1":
        rollout = trainer.copy()
    else:
        rollout = np.log(np.clip(p + rng.choice([-1.0, 1.0], n) * ref * rng.uniform(0.5, 1.5, n), 1e-6, 1)).astype(np.float32)
    mask = np.zeros(n, dtype=np.bool_)
    mask[[3, 4, 9, 10, 11, 15]] = True
    buf = io.BytesIO()
    # a mixture of experts' routes, 2 MoE layers x top-2 of 8 experts, the same on both sides
    experts = np.stack([rng.permutation(8)[:2] for _ in range(n * 2)]).reshape(n, 2, 2).astype(np.int32)
    gates = rng.uniform(0.1, 0.9, (n, 2, 2)).astype(np.float32)
    np.savez(buf, token_ids=token_ids, seq_lens=seq_lens, trainer_logprobs=trainer, rollout_logprobs=rollout,
             decode_logprobs=rollout.copy(), decode_mask=mask, rollout_experts=experts, trainer_experts=experts.copy(),
             rollout_gate_weights=gates, trainer_gate_weights=gates.copy())
    return buf.getvalue(), forward_metrics(trainer, rollout)


def forward_files(arm: str, steps: Sequence[int], ref: float, seed: int, checkpoint: Callable[[int], str],
                   prefix: str = "") -> dict[str, str | bytes]:
    files: dict[str, str | bytes] = {}
    rows = []
    for s in steps:
        blob, m = forward_arrays(s, arm, ref, seed)
        files[f"{prefix}arrays/step_{s:04d}.npz"] = blob
        # verl logs the actor's grad norm per training step; BI=0's smoke check reads it.
        grad = {"actor/grad_norm": 0.5 + 0.1 * s} if arm == "bi0" else {}
        rows.append({"step": s, "step_basis": "rollout", "checkpoint_version": checkpoint(s), **m, **grad})
    files[f"{prefix}metrics.jsonl"] = jsonl(rows)
    return files


def ckpt(step: int) -> str:
    return "blake3:" + f"{step:04x}" * 16


def grad_rows(n: int, extra: Callable[[int], dict[str, Any]] = lambda s: {}) -> list[dict[str, Any]]:
    rows = []
    for s in range(1, n + 1):
        rows.append({"step": s, "step_basis": "optimizer", "checkpoint_version": ckpt(s),
                     "actor/grad_norm": 0.8 + 0.1 * s, "grad_finite": True, "params_total": 24,
                     "params_with_grad": 24, "params_nonzero_grad": 24,
                     "within_group_rewards": [[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]],
                     "deployed_bytes_equal": True, **extra(s)})
    return rows


def edit_jsonl(path: Path, fn: Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None], reseal: Path) -> None:
    rows = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    new = fn(rows)
    path.write_text(jsonl(rows if new is None else new))
    seal_leg(reseal)


def set_row(i: int, **kv: Any) -> Callable[[list[dict[str, Any]]], None]:
    def f(rows: list[dict[str, Any]]) -> None:
        rows[i].update(kv)
    return f


def perturb_arrays(leg: Path, step: int, prefix: str = "") -> None:
    """A real mismatch: one rollout logprob off by one ulp, metrics recomputed honestly."""
    path = leg / prefix / "arrays" / f"step_{step:04d}.npz"
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    r = data["rollout_logprobs"].copy()
    r[4] = np.nextafter(r[4], np.float32(0))
    data["rollout_logprobs"] = r
    np.savez(path, **data)
    m = forward_metrics(data["trainer_logprobs"], r)
    edit_jsonl(leg / prefix / "metrics.jsonl", lambda rows: [({**row, **m} if row["step"] == step else row)
                                                              for row in rows], leg)
