"""Receipts that record a candidate's identity, as an honest producer records it: the canaries'
passing receipt sets (tica.canaries.BUILDERS) with every value the candidate's manifest pins
written where `tica.binding` reads it, work times set, and resealed.

Tests start from such a bound set and break one thing at a time; a bound set itself must pass.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from pathlib import Path
from collections.abc import Callable
from typing import Any

from tica.binding import Candidate, Pin, pins
from tica.canaries import BUILDERS
from tica.evidence import EvidenceItem, sensitive_components
from tica.question import Question, ThroughputCriteria, parse_question
from tica.receipts import BENCH_FILE, CONTRACT_FILE, LEG_FILE
from tica.seal import seal_leg

_RECORDED_DTYPE = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                   "fp32": "float32", "float32": "float32"}


def recorded_value(pin: Pin, key: str) -> Any:
    """What a producer writes at `key` for the pinned value."""
    v = pin.value
    if pin.field == "precision.weights":
        return _RECORDED_DTYPE.get(str(v).lower(), v)
    if pin.field == "backends.attention":
        return re.split(r"[\s(]", str(v).strip(), maxsplit=1)[0]
    if pin.field == "graph_cache.cuda_graph_mode":
        off = str(v).strip().lower().startswith("none")
        return off if key.endswith("enforce_eager") else ("NONE" if off else "FULL")
    return v


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    """Set a dotted key, making the mappings on its way."""
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def _clear(data: dict, dotted: str) -> None:
    node: Any = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        if not isinstance(node, dict) or part not in node:
            return
        node = node[part]
    if isinstance(node, dict):
        node.pop(parts[-1], None)


BENCH_DATE = "%Y%m%d-%H%M%S"  # vllm bench serve's `date`


def _time(leg: Path, key: str) -> _dt.datetime | None:
    try:
        return _dt.datetime.fromisoformat(json.loads((leg / LEG_FILE).read_text())[key])
    except (KeyError, TypeError, ValueError):
        return None


def _start(leg: Path) -> _dt.datetime | None:
    return _time(leg, "started_at")


# A leg is sealed after its work ends: moved work times end this long before the seal.
BEFORE_SEAL = _dt.timedelta(seconds=2)


def stamp_leg(leg: Path, candidate: Candidate, when: Callable[[_dt.datetime], _dt.datetime] | None = None) -> Path:
    """Make one sealed leg record the candidate's identity, move its work times with `when`
    (default: to end just before now, keeping their length), then reseal (the seal's time is now)."""
    meta = json.loads((leg / LEG_FILE).read_text())
    contract_path = leg / CONTRACT_FILE
    contract = json.loads(contract_path.read_text()) if contract_path.is_file() else None
    read_by = set(sensitive_components(EvidenceItem(meta["item"])))
    for pin in pins(candidate):
        if pin.component not in read_by or (pin.items is not None and meta["item"] not in pin.items):
            continue
        if pin.arms is not None and meta["arm"] not in pin.arms:
            continue
        if pin.receipt_keys[0].startswith("contract."):
            if contract is not None:
                set_dotted(contract, pin.receipt_keys[0].removeprefix("contract."), recorded_value(pin, pin.receipt_keys[0]))
            continue
        if pin.absent_ok:
            continue
        if pin.field.startswith("package "):  # recorded under the distribution's import name
            set_dotted(meta, pin.receipt_keys[-1], recorded_value(pin, pin.receipt_keys[-1]))
            continue
        # One place holds the value; a second, disagreeing place would name another candidate.
        for key in pin.receipt_keys[1:]:
            _clear(meta, key)
        set_dotted(meta, pin.receipt_keys[0], recorded_value(pin, pin.receipt_keys[0]))
    if meta["item"] == "forward" and leg.name.endswith("_post_update") and (leg / "metrics.jsonl").is_file():
        # a re-check after an update continues the step numbering: today's producer records where it began
        first = json.loads((leg / "metrics.jsonl").read_text().splitlines()[0])["step"]
        meta.setdefault("resolved_config", {}).setdefault("first_step", first)
    src = candidate.manifest.source
    meta["source"] = {"repository": src.repository, "commit": src.commit, "overlay_digest": src.overlay_digest}
    meta["image_digest"] = candidate.manifest.image.digest
    now = _dt.datetime.now(_dt.timezone.utc)
    start = _start(leg) or now
    end = _time(leg, "ended_at") or start
    move = when or (lambda t: now - BEFORE_SEAL - (end - t))
    for key in ("started_at", "ended_at"):
        try:
            t = _dt.datetime.fromisoformat(meta[key])
        except (KeyError, TypeError, ValueError):
            t = start
        meta[key] = move(t).isoformat()
    (leg / LEG_FILE).write_text(json.dumps(meta, indent=1))
    bench_path = leg / BENCH_FILE
    if bench_path.is_file():  # the result file is stamped when its run ends: it moves with the leg's work
        bench = json.loads(bench_path.read_text())
        if isinstance(bench.get("date"), str):
            stamped = _dt.datetime.strptime(bench["date"], BENCH_DATE).replace(tzinfo=_dt.timezone.utc)
            bench["date"] = move(stamped).astimezone(_dt.timezone.utc).strftime(BENCH_DATE)
            bench_path.write_text(json.dumps(bench, indent=2))
    if contract is not None:
        contract_path.write_text(json.dumps(contract, indent=1))
    seal_leg(leg)
    return leg


def _with_workload(question: Question, candidate: Candidate) -> Question:
    """A throughput question that names no request counts, given the candidate's: the legs a
    producer runs for this candidate run its workload."""
    c = question.criteria
    if not isinstance(c, ThroughputCriteria) or c.num_prompts:
        return question
    counts = {conc: n for conc in c.concurrencies if (n := candidate.manifest.workload.prompts_at(conc)) is not None}
    data = question.model_dump(mode="json")
    data["criteria"]["num_prompts"] = counts
    return parse_question(data)


def build_bound(item: EvidenceItem, question: Question, candidate: Candidate, dest: Path,
                started: _dt.datetime | None = None, compress: bool = True) -> list[Path]:
    """A passing receipt set for the question, recording the candidate (artifacts: the forward
    and update legs it covers), its work times moved to start at `started` (default: now, or so that they end
    just before now where they keep their real lengths).

    `compress` (for legs judged through `tica.acceptance.materialize`, whose question is frozen
    just before): the builders' minutes-apart times keep their order but shrink into the moments
    after `started`, so every leg starts after the freeze and before its own seal. Without it
    the legs keep their real lengths (work times credible enough to order rounds by)."""
    legs = BUILDERS[item](_with_workload(question, candidate), dest)
    first = min((t for leg in legs if (t := _start(leg)) is not None), default=None)
    last = max((t for leg in legs if (t := _time(leg, "ended_at")) is not None), default=first)
    # Legs are sealed after their work: uncompressed times end just before now unless told otherwise
    # (compressed ones start now, after a question frozen just before, and end microseconds later).
    now = _dt.datetime.now(_dt.timezone.utc)
    start = started or (now if compress or first is None or last is None else now - BEFORE_SEAL - (last - first))
    if first is None:
        when = None
    elif compress:
        when = lambda t: start + (t - first) * 1e-6  # noqa: E731
    else:
        when = lambda t: start + (t - first)  # noqa: E731
    return [stamp_leg(leg, candidate, when) for leg in legs]
