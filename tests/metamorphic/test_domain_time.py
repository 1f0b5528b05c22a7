"""Metamorphic relations 7 and 8.

R7 domain: a value that cannot be the quantity it names (a positive logprob, a probability or
   fraction outside [0, 1], a negative count, norm, KL, std or duration) never passes, even when
   it is equal on both arms and every receipt agrees with it (metrics recomputed honestly).
R8 time: a leg that ends before it starts, zone-less (naive) timestamps, naive and aware times
   mixed on one leg, an unreadable time: never a pass, never a traceback, for every item.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tica.evidence import EvidenceItem
from tica.verdict import Verdict

from . import ops
from .catalogue import Transform
from .conftest import run_transform as _run, Case, Traceback, line, selected
from .variants import VARIANTS

E = EvidenceItem
ALL_IDS = selected([v.id for v in VARIANTS])
BASE_IDS = [v.id for v in VARIANTS if v.name == "base"]
Fn = Callable[[list[Path]], list[Path]]


def _never_pass(case: Case, candidate, transforms: list[Transform], relation: str) -> None:
    violations = []
    for t in transforms:
        cell, tb = _run(case, candidate, t)
        if tb is not None:
            violations.append(f"{t.name}: {tb}")
        elif cell.verdict is Verdict.PASS:
            violations.append(f"{t.name}: FALSE PASS -> {line(cell)[:400]}")
    assert not violations, (f"{relation}: {len(violations)} violation(s) from {case.start()}:\n  - "
                            + "\n  - ".join(violations))


def _arm_legs(legs: list[Path], arm: str, item: str | None = None) -> list[Path]:
    return [l for l in legs if ops.meta(l)["arm"] == arm and (item is None or ops.meta(l)["item"] == item)]


def _each_leg(edit: Callable[[Path], None], arm: str | None = None, item: str | None = None,
              first_only: bool = False) -> Fn:
    def fn(legs: list[Path]) -> list[Path]:
        chosen = [l for l in legs if (arm is None or ops.meta(l)["arm"] == arm)
                  and (item is None or ops.meta(l)["item"] == item)]
        for leg in chosen[:1] if first_only else chosen:
            edit(leg)
        return legs
    return fn


def _meta_set(key: str, value: Any) -> Callable[[Path], None]:
    return lambda leg: ops.edit_meta(leg, lambda m: ops.set_dotted(m, key, value))


# ============================================================================ R7: domain


def _positive_logprobs(steps: list[int] | None = None, prefix: str = "", negate: bool = False) -> Callable[[Path], None]:
    """Trainer and rollout logprobs made positive (|lp| + 0.05, or -lp), alike on both sides where
    they were equal; decode logprobs follow the rollout's; metrics recomputed from the arrays."""
    def edit(data: dict[str, np.ndarray]) -> None:
        for key in ("trainer_logprobs", "rollout_logprobs"):
            a = data[key]
            data[key] = (-a if negate else np.abs(a) + np.float32(0.05)).astype(np.float32)
        if "decode_logprobs" in data:
            data["decode_logprobs"] = data["rollout_logprobs"].copy()

    def fn(leg: Path) -> None:
        fdir = leg / prefix if prefix else leg
        ops.recompute_forward(fdir, leg, edit, steps)
    return fn


def _logged(step: int | None, prefix: str = "", **kv: Any) -> Callable[[Path], None]:
    def fn(leg: Path) -> None:
        fdir = leg / prefix if prefix else leg
        ops.logged_only(fdir, leg, step, **kv)
    return fn


def _rows(step: int | None, **kv: Any) -> Callable[[Path], None]:
    def fn(leg: Path) -> None:
        ops.edit_rows(leg / "metrics.jsonl", lambda rows: [r.update(kv) for r in rows if step is None or r["step"] == step],
                      leg)
    return fn


def _bench(**kv: Any) -> Callable[[Path], None]:
    def fn(leg: Path) -> None:
        if (leg / "bench.json").is_file():
            ops.edit_json(leg / "bench.json", lambda b: b.update(kv), leg)
    return fn


def _bench_ms_negative(leg: Path) -> None:
    if (leg / "bench.json").is_file():
        ops.edit_json(leg / "bench.json", lambda b: b.update({k: -abs(v) for k, v in b.items()
                                                              if k.endswith("_ms") and isinstance(v, (int, float))}), leg)


def _contract(key: str, value: Any) -> Callable[[Path], None]:
    def fn(leg: Path) -> None:
        if (leg / "contract.json").is_file():
            ops.edit_json(leg / "contract.json", lambda c: ops.set_dotted(c, key, value), leg)
    return fn


def _summary_score(leg: Path) -> None:
    rows = ops.read_rows(leg / "results.jsonl")
    correct = sum(bool(r["correct"]) for r in rows)
    (leg / "summary.json").write_text(json.dumps({"greedy": {"correct": correct, "n": len(rows), "score": 1.5,
                                                             "truncated": sum(bool(r.get("truncated")) for r in rows)}}))
    ops.edit_meta(leg, lambda m: m["resolved_config"].update(primary_pass="greedy"))


def domain_transforms(item: EvidenceItem) -> list[Transform]:
    T = Transform
    out: list[Transform] = []
    if item is E.FORWARD:
        out += [
            T("forward bi1 arrays: every trainer and rollout logprob positive (|lp| + 0.05, equal on both sides), "
              "metrics recomputed", _each_leg(_positive_logprobs(), "bi1")),
            T("forward bi1 arrays: step 3's logprobs positive, equal on both sides, metrics recomputed",
              _each_leg(_positive_logprobs([3]), "bi1")),
            T("forward bi0 arrays: every logprob negated (positive), metrics recomputed",
              _each_leg(_positive_logprobs(negate=True), "bi0")),
            T("forward bi1 logged only (arrays removed): pearson 1.5 at every step",
              _each_leg(_logged(None, **{"training/rollout_actor_probs_pearson_corr": 1.5}), "bi1")),
            T("forward bi1 logged only: tica/n_tokens -16 at step 2", _each_leg(_logged(2, **{"tica/n_tokens": -16}), "bi1")),
            T("forward bi0 logged only: probs diff max 1.5 (a probability difference > 1) at step 3",
              _each_leg(_logged(3, **{"training/rollout_probs_diff_max": 1.5}), "bi0")),
            T("forward bi0 logged only: probs diff max -0.5 (negative |diff|) at step 3",
              _each_leg(_logged(3, **{"training/rollout_probs_diff_max": -0.5}), "bi0")),
            T("forward bi0 logged only: probs diff std -0.01 at step 3",
              _each_leg(_logged(3, **{"training/rollout_probs_diff_std": -0.01}), "bi0")),
            T("forward bi0 logged only: k3 KL -0.2 (a KL below 0) at step 3",
              _each_leg(_logged(3, **{"rollout_corr/k3_kl": -0.2}), "bi0")),
            T("forward bi0 logged only: pearson 1.5 at step 3",
              _each_leg(_logged(3, **{"training/rollout_actor_probs_pearson_corr": 1.5}), "bi0")),
            T("forward bi0 logged only: mean 0.02 above max 0.012 at step 3",
              _each_leg(_logged(3, **{"training/rollout_probs_diff_mean": 0.02,
                                      "training/rollout_probs_diff_max": 0.012}), "bi0")),
            T("forward bi0 rows: actor/grad_norm -0.5 (a negative norm) at step 2",
              _each_leg(_rows(2, **{"actor/grad_norm": -0.5}), "bi0")),
        ]
    if item is E.BACKWARD:
        out += [
            T("backward bi1: actor/grad_norm -0.9 (a negative norm) at step 2", _each_leg(_rows(2, **{"actor/grad_norm": -0.9}), "bi1")),
            T("backward bi1: actor/grad_norm negative at every step", _each_leg(_rows(None, **{"actor/grad_norm": -0.9}), "bi1")),
            T("backward bi0: actor/grad_norm -0.9 at step 1", _each_leg(_rows(1, **{"actor/grad_norm": -0.9}), "bi0")),
            T("backward bi1: params_with_grad -1 at step 1", _each_leg(_rows(1, params_with_grad=-1, params_nonzero_grad=-1), "bi1")),
        ]
    if item is E.UPDATE:
        out += [
            T("update post_forward arrays: every logprob positive, equal on both sides, metrics recomputed",
              _each_leg(_positive_logprobs(prefix="post_forward"))),
            T("update post_forward logged only: pearson 1.5 at every step",
              _each_leg(_logged(None, "post_forward", **{"training/rollout_actor_probs_pearson_corr": 1.5}))),
            T("update: actor/grad_norm -0.9 (a negative norm)", _each_leg(_rows(None, **{"actor/grad_norm": -0.9}))),
            T("update: weights_changed_tensors -1", _each_leg(_rows(None, weights_changed_tensors=-1))),
        ]
    if item is E.QUALITY:
        out += [
            T("quality contract.json sampling.top_p 1.5 in both arms (a probability > 1)", _each_leg(_contract("sampling.top_p", 1.5))),
            T("quality contract.json sampling.temperature -1 in both arms", _each_leg(_contract("sampling.temperature", -1))),
            T("quality contract.json length_cap -5 in both arms", _each_leg(_contract("length_cap", -5))),
            T("quality contract.json repeats 0 in both arms", _each_leg(_contract("repeats", 0))),
            T("quality contract.json sampling.n -1 in both arms", _each_leg(_contract("sampling.n", -1))),
            T("quality summary.json score 1.5 (counts right) in both arms", _each_leg(_summary_score)),
        ]
    if item is E.THROUGHPUT:
        out += [
            T("throughput bench.json: every *_ms latency negative, every leg", _each_leg(_bench_ms_negative)),
            T("throughput bench.json: mean_ttft_ms -310 on one leg", _each_leg(_bench(mean_ttft_ms=-310.0), first_only=True)),
            T("throughput bench.json: request_rate -1.0 (a negative rate), every leg", _each_leg(_bench(request_rate=-1.0))),
            T("throughput bench.json: burstiness -1.0, every leg", _each_leg(_bench(burstiness=-1.0))),
            T("throughput bench.json: burstiness 0.0, every leg", _each_leg(_bench(burstiness=0.0))),
            T("throughput bench.json: failed -1 on one leg", _each_leg(_bench(failed=-1), first_only=True)),
            T("throughput leg.json: resolved_config.num_warmups -1, every leg", _each_leg(_meta_set("resolved_config.num_warmups", -1))),
        ]
    if item is E.CLEAN_EXIT:
        out += [
            T("clean_exit: every process pid -5", _each_leg(lambda leg: ops.edit_meta(leg, lambda m: [
                p.update(pid=-5) for p in m["processes"]]))),
            T("clean_exit: every process pid 0", _each_leg(lambda leg: ops.edit_meta(leg, lambda m: [
                p.update(pid=0) for p in m["processes"]]))),
            # (an exit code of 0.0 is the number 0 spelled another way: tica.receipts.as_read reads it as 0)
        ]
    return out


CONFIG_DOMAIN = [
    Transform("resolved_config.gpu_memory_utilization 1.7 (a fraction > 1) in every leg",
              _each_leg(_meta_set("resolved_config.gpu_memory_utilization", 1.7))),
    Transform("resolved_config.gpu_memory_utilization -0.5 in every leg",
              _each_leg(_meta_set("resolved_config.gpu_memory_utilization", -0.5))),
    Transform("resolved_config.max_model_len -12288 (a negative length) in every leg",
              _each_leg(_meta_set("resolved_config.max_model_len", -12288))),
    Transform("device.count -1 in every leg", _each_leg(_meta_set("device.count", -1))),
]


@pytest.mark.parametrize("vid", ALL_IDS)
def test_r7_domain_values_never_pass(vid, cases, candidate):
    case = cases[vid]
    ts = domain_transforms(case.item)
    if not ts:
        pytest.skip(f"{case.item.value} reads no such quantity (see the config and time relations)")
    _never_pass(case, candidate, ts, "R7 domain")


@pytest.mark.parametrize("vid", ALL_IDS)
def test_r7_config_domain_values_never_pass(vid, cases, candidate):
    """Config values outside their domain, alike in every leg (no confounder arises)."""
    case = cases[vid]
    _never_pass(case, candidate, CONFIG_DOMAIN, "R7 config domain")


# ============================================================================ R8: time


def _swap(m: dict[str, Any]) -> None:
    m["started_at"], m["ended_at"] = m["ended_at"], m["started_at"]


def _end_before(m: dict[str, Any]) -> None:
    m["ended_at"] = (ops.parse_time(m["started_at"]) - _dt.timedelta(hours=1)).isoformat()


def _end_before_short(m: dict[str, Any]) -> None:
    m["ended_at"] = (ops.parse_time(m["started_at"]) - _dt.timedelta(milliseconds=300)).isoformat()


def _naive(then: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """A contradiction spelled without zones: one local clock orders a leg's own two times."""
    def fn(m: dict[str, Any]) -> None:
        then(m)
        for k in ("started_at", "ended_at"):
            m[k] = ops.respell_time(m[k], "naive")
    return fn


def _mixed(m: dict[str, Any]) -> None:
    m["started_at"] = ops.respell_time(m["started_at"], "naive")


def _mixed_end(m: dict[str, Any]) -> None:
    m["ended_at"] = ops.respell_time(m["ended_at"], "naive")


def _unreadable(m: dict[str, Any]) -> None:
    m["started_at"] = "yesterday at ten"


def _meta_fn(fn: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    return lambda leg: ops.edit_meta(leg, fn)


TIMES: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("started_at and ended_at swapped (ends before it starts)", _swap),
    ("ended_at one hour before started_at", _end_before),
    ("ended_at 0.3 s before started_at", _end_before_short),
    ("zone-less, started_at and ended_at swapped", _naive(_swap)),
    ("zone-less, ended_at 0.3 s before started_at", _naive(_end_before_short)),
    ("naive started_at, aware ended_at (mixed)", _mixed),
    ("aware started_at, naive ended_at (mixed)", _mixed_end),
    ("started_at unreadable ('yesterday at ten')", _unreadable),
]


def time_transforms() -> list[Transform]:
    out = []
    for name, fn in TIMES:
        out.append(Transform(f"first leg: {name}", _each_leg(_meta_fn(fn), first_only=True)))
        out.append(Transform(f"every leg: {name}", _each_leg(_meta_fn(fn))))
    return out


@pytest.mark.parametrize("vid", ALL_IDS)
def test_r8_inconsistent_times_never_pass(vid, cases, candidate):
    case = cases[vid]
    _never_pass(case, candidate, time_transforms(), "R8 time")
