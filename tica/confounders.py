"""Confounders: every difference between the arms' receipts other than the switch itself.

The practice lists confounders first, then compares: each is aligned or quantified separately,
and a delta under an unquantified confounder is not attributed to the switch. What a leg did not
record is `unknown`, never aligned: a key recorded in neither arm is a row of its own, and the
question's `must_record` names the keys whose being unknown makes a cell inconclusive.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from tica.judging import Findings, md_table
from tica.question import Question
from tica.receipts import LegMeta, is_unknown, recorded_value

SWITCH_KEYS = ("env.VLLM_BATCH_INVARIANT",)

# Fields that name the leg rather than describe the arm; telemetry is what each leg measured it
# ran under (clocks, load), compared between tiers (tica.items.throughput.tiers), not a setting of an arm.
_LEG_IDENTITY = {"schema", "item", "arm", "round", "slot", "concurrency", "started_at", "ended_at",
                 "processes", "not_run_reason", "profiled", "errors", "telemetry", "alive_at_end"}

# The practice's named confounders, so the table says which known one a raw key is.
_KNOWN: tuple[tuple[str, str], ...] = (
    (r"prefix_caching", "prefix caching"),
    (r"gpu_memory_utilization", "gpu_memory_utilization"),
    (r"^trainer$|training_backend|train_backend", "training backend"),
    (r"route_replay|\br3\b|routing_replay", "route-replay path"),
    (r"sampler", "sampler"),
    (r"enforce_eager|cuda_?graph|cudagraph|compilation", "CUDA graphs"),
    (r"chunked_prefill", "chunked prefill"),
    (r"tensor_parallel|\btp\b", "TP"),
    (r"async_scheduling", "async scheduling"),
    (r"weights_hash|model$", "weights"),
    (r"^kernels(\.|$)", "kernel/backend selection"),
    (r"^versions(\.|$)", "package versions"),
    (r"^device(\.|$)", "hardware"),
)

# Shown unquoted; a recorded string is shown JSON-quoted, so the two never read alike.
UNKNOWN = "unknown"


class Confounder(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    bi1: tuple[str, ...]
    bi0: tuple[str, ...]
    known_as: str | None
    status: Literal["switch", "quantified", "unquantified", "unknown"]
    note: str = ""


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = UNKNOWN if is_unknown(value) else json.dumps(value, sort_keys=True)


def arm_profile(meta: LegMeta) -> dict[str, str]:
    """Every arm-describing value of a leg, flattened to dotted keys."""
    out: dict[str, str] = {}
    for key, value in meta.model_dump(mode="json", by_alias=True).items():
        if key not in _LEG_IDENTITY:
            _flatten(key, value, out)
    return out


def _known_as(key: str) -> str | None:
    for pattern, name in _KNOWN:
        if re.search(pattern, key):
            return name
    return None


def _quantified(key: str, quantified: Mapping[str, str]) -> str | None:
    for k, note in quantified.items():
        if key == k or key.startswith(k + "."):
            return note
    return None


def confounder_table(
    bi1: Sequence[LegMeta], bi0: Sequence[LegMeta], quantified: Mapping[str, str] | None = None
) -> list[Confounder]:
    """Keys whose values differ between the arms, or within an arm across its legs, and keys
    recorded in neither arm (status `unknown`: not shown aligned)."""
    quantified = quantified or {}
    p1 = [arm_profile(m) for m in bi1]
    p0 = [arm_profile(m) for m in bi0]
    keys = sorted({k for p in (*p1, *p0) for k in p})
    rows = []
    for key in keys:
        v1 = tuple(sorted({p.get(key, UNKNOWN) for p in p1}))
        v0 = tuple(sorted({p.get(key, UNKNOWN) for p in p0}))
        if v1 == v0 == (UNKNOWN,):
            rows.append(Confounder(key=key, bi1=v1, bi0=v0, known_as=_known_as(key), status="unknown",
                                   note="recorded in neither arm: unknown, not aligned"))
            continue
        if v1 == v0 and len(v1) == 1:
            continue
        if key in SWITCH_KEYS and v1 == ('"1"',) and v0 == ('"0"',):
            status, note = "switch", "the single switch that selects the arm"
        elif key in SWITCH_KEYS:  # unknown in some leg, or not one value per arm: the arm is not shown
            status, note = "unquantified", "the switch is not recorded as 1 (BI=1) vs 0 (BI=0) in every leg"
        elif (q := _quantified(key, quantified)) is not None:
            status, note = "quantified", q
        else:
            status, note = "unquantified", ""
        rows.append(Confounder(key=key, bi1=v1, bi0=v0, known_as=_known_as(key), status=status, note=note))
    return rows


def unquantified(table: Sequence[Confounder]) -> list[Confounder]:
    return [c for c in table if c.status == "unquantified"]


def unknown(table: Sequence[Confounder]) -> list[Confounder]:
    return [c for c in table if c.status == "unknown"]


def unrecorded(meta: LegMeta, keys: Sequence[str]) -> list[str]:
    """The keys of `keys` this leg did not record (absent, null or empty)."""
    return [k for k in keys if recorded_value(meta, k) is None]


def require_recorded(findings: Findings, question: Question, legs: Iterable[tuple[str, LegMeta]]) -> None:
    """Each leg must record every field the question names; an unknown one is no pass."""
    for name, meta in legs:
        missing = unrecorded(meta, question.must_record)
        if missing:
            findings.inconclusive(f"{name}: {', '.join(missing)} not recorded (unknown); the question requires it")


def confounder_markdown(table: Sequence[Confounder]) -> str:
    return md_table(
        ["key", "known as", "BI=1", "BI=0", "status", "note"],
        [(c.key, c.known_as, ", ".join(c.bi1), ", ".join(c.bi0), c.status, c.note) for c in table],
    )
