"""What every item's canaries are made of: a synthetic leg written and sealed as a producer
writes one (`leg_meta`, `proc`, `write_leg`), a sealed leg edited and resealed (`edit_meta`), and
the planted error's record (`Canary`, with the verdicts it must get). Each item's own builders
and planted errors live with it (tica/items/<item>/canaries.py; tica/canaries.py for the items
not yet in a room), and `tica.canaries` runs them all."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tica.evidence import EvidenceItem
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
