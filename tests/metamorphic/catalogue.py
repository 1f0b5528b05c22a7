"""Transforms of a receipt set, listed per starting set (a `Case`): each relation's test either
draws one with hypothesis or runs them all, collecting every violation.

A transform is named (the reproduction in a failure message) and applied to a fresh copy of
the case's legs, given in the case's order; it returns the legs handed to the judge."""

from __future__ import annotations

import copy
import datetime as _dt
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tica.evidence import EvidenceItem
from tica.pairing import crossed
from tica.question import Question
from tica.seal import seal_leg

from . import ops
from .conftest import Case

E = EvidenceItem
Fn = Callable[[list[Path]], list[Path]]


@dataclass(frozen=True)
class Transform:
    name: str
    fn: Fn
    tags: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return self.name


def _metas(case: Case) -> list[dict[str, Any]]:
    return [ops.meta(case.root / rel) for rel in case.rel_legs]


def _idx(case: Case) -> dict[str, int]:
    return {rel.name: i for i, rel in enumerate(case.rel_legs)}


def _named(legs: list[Path], name: str) -> Path | None:
    """The leg of that name among the legs handed in (None: a transform before removed it)."""
    return next((leg for leg in legs if leg.name == name), None)


def _has(path: Path | None) -> bool:
    return path is not None and path.is_file()


# ============================================================================ R1: relabel / duplicate


def _dup_leg(name: str) -> Fn:
    def fn(legs: list[Path]) -> list[Path]:
        leg = _named(legs, name)
        if leg is None or not _has(leg / "leg.json") or (leg.parent / (name + "__copy")).exists():
            return legs
        return [*legs, ops.copy_leg(leg, name + "__copy")]
    return fn


def _dup_forward_step(name: str, prefix: str, step: int, relabel: bool, count: int = 1) -> Fn:
    """Copy `step` (metrics row + arrays) `count` times under the next free step numbers; with
    `relabel`, each copy names the checkpoint its new step number would have (as the builder does)."""
    def fn(legs: list[Path]) -> list[Path]:
        leg = _named(legs, name)
        if leg is None:
            return legs
        fdir = leg / prefix if prefix else leg
        for _ in range(count):
            if not _has(fdir / "metrics.jsonl"):
                return legs
            rows = ops.read_rows(fdir / "metrics.jsonl")
            if not any(r.get("step") == step for r in rows):
                return legs
            new = max(r["step"] for r in rows) + 1
            ckpt = None
            if relabel:
                src = next(r for r in rows if r["step"] == step)
                old = src.get("checkpoint_version")
                ckpt = ("blake3:" + f"{new:04x}" * 16) if isinstance(old, str) and prefix == "" else old
            ops.copy_forward_step(fdir, leg, step, new, ckpt)
        return legs
    return fn


def _dup_grad_row(name: str, step: int) -> Fn:
    def fn(legs: list[Path]) -> list[Path]:
        leg = _named(legs, name)
        if leg is None or not _has(leg / "metrics.jsonl"):
            return legs

        def add(rows: list[dict[str, Any]]) -> None:
            src = next((r for r in rows if r["step"] == step), None)
            if src is not None:
                rows.append(dict(copy.deepcopy(src), step=max(r["step"] for r in rows) + 1))
        ops.edit_rows(leg / "metrics.jsonl", add, leg)
        return legs
    return fn


def _dup_problems(k: int | None, arms: Sequence[str] = ("bi1", "bi0"), times: int = 1,
                  hash_spelling: Callable[[str], str] | None = None, no_hashes: bool = False) -> Fn:
    """The first k problems (all: None) copied under new problem ids, same content, in `arms`;
    `hash_spelling` respells the copies' prompt_hash (the same digest), `no_hashes` leaves every
    row without one (a producer that records none)."""
    def fn(legs: list[Path]) -> list[Path]:
        for leg in legs:
            if ops.meta(leg)["arm"] not in arms:
                continue

            def add(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
                chosen = rows if k is None else rows[:k]
                extra = [dict(copy.deepcopy(r), problem_id=f"{r['problem_id']}-dup{t}") for t in range(1, times + 1)
                         for r in chosen]
                if hash_spelling is not None:
                    for r in extra:
                        if isinstance(r.get("prompt_hash"), str):
                            r["prompt_hash"] = hash_spelling(r["prompt_hash"])
                if no_hashes:
                    for r in rows + extra:
                        r.pop("prompt_hash", None)
                return rows + extra
            ops.edit_rows(leg / "results.jsonl", add, leg)
        return legs
    return fn


def _dup_process(name: str, j: int, role: str | None) -> Fn:
    def fn(legs: list[Path]) -> list[Path]:
        leg = _named(legs, name)
        if leg is None or not _has(leg / "leg.json"):
            return legs

        def add(m: dict[str, Any]) -> None:
            if j >= len(m.get("processes") or []):
                return
            p = copy.deepcopy(m["processes"][j])
            p["pid"] = (p.get("pid") or 0) + 50_000
            if role is not None:
                p["role"] = role
            m["processes"].append(p)
        ops.edit_meta(leg, add)
        return legs
    return fn


def _tput_rounds(metas: list[dict[str, Any]]) -> dict[int, list[int]]:
    out: dict[int, set[int]] = {}
    for m in metas:
        if m.get("item") == "throughput" and m.get("concurrency") is not None and m.get("round") is not None:
            out.setdefault(m["concurrency"], set()).add(m["round"])
    return {c: sorted(rs) for c, rs in sorted(out.items())}


def _copy_rounds(plan: dict[int, list[tuple[int, int]]]) -> Fn:
    """At each c, copy round src as round new (both legs), for every (src, new) planned."""
    def fn(legs: list[Path]) -> list[Path]:
        out = list(legs)
        for c, pairs in plan.items():
            for src, new in pairs:
                if any(leg.name.endswith(f"__copy_as_r{new}") and ops.meta(leg).get("concurrency") == c for leg in out):
                    continue
                out += ops.copy_tput_round([l for l in legs if _has(l / "leg.json")], c, src, new)
        return out
    return fn


def _fill_rounds(question: Question, rounds: dict[int, list[int]]) -> dict[int, list[tuple[int, int]]]:
    """Copies that bring every c to the frozen repeats, each from an earlier round of the same
    frozen order (AB from AB), so the copies are in the frozen crossed order."""
    order = list(question.pairing_order) or crossed(question.repeats)
    plan: dict[int, list[tuple[int, int]]] = {}
    for c, present in rounds.items():
        top = max(present)
        for new in range(top + 1, question.repeats + 1):
            want = order[new - 1] if new <= len(order) else "AB"
            src = next((r for r in present if (order[r - 1] if r <= len(order) else "AB") == want), None)
            if src is not None:
                plan.setdefault(c, []).append((src, new))
    return plan


def _single_tput_leg_as_round(name: str, new_round: int) -> Fn:
    def fn(legs: list[Path]) -> list[Path]:
        leg = _named(legs, name)
        if leg is None or (leg.parent / f"{leg.name}__single_as_r{new_round}").exists():
            return legs
        dst = ops.copy_leg(leg, f"{leg.name}__single_as_r{new_round}")
        ops.edit_meta(dst, lambda m: (m.update(round=new_round), ops.shift_times(m, _dt.timedelta(hours=7))))
        ops.edit_json(dst / "bench.json", lambda b: (b.update(round=str(new_round)) if "round" in b else None,
                                                      ops.shift_bench_date(b, _dt.timedelta(hours=7))), dst)
        return [*legs, dst]
    return fn


def duplications(case: Case, sample_legs: int | None = None) -> list[Transform]:
    """R1: a leg, a step, a problem, a round, a process copied and relabelled (never a pass from a non-pass)."""
    metas = _metas(case)
    names = [rel.name for rel in case.rel_legs]
    out: list[Transform] = []
    item = case.item
    if item is E.THROUGHPUT:
        rounds = _tput_rounds(metas)
        fill = _fill_rounds(case.question, rounds)
        if fill:
            out.append(Transform("throughput: fill every c up to the frozen repeats with copies of earlier rounds of "
                                 f"the same order, renumbered ({fill})", _copy_rounds(fill), ("fill",)))
        for c, present in rounds.items():
            top = max(present)
            order = list(case.question.pairing_order)
            for src in present:
                new = top + 1
                if new <= len(order) and order[new - 1] != order[src - 1]:
                    new = top + 2
                out.append(Transform(f"throughput: c={c} round {src} (both legs) copied as round {new}",
                                     _copy_rounds({c: [(src, new)]}), ("round",)))
        singles = list(range(len(names)))[:: max(1, len(names) // (sample_legs or len(names)))]
        for i in singles:
            c, top = metas[i]["concurrency"], max(rounds.get(metas[i]["concurrency"], [0]))
            out.append(Transform(f"throughput: leg {names[i]} alone copied as round {top + 1}",
                                 _single_tput_leg_as_round(names[i], top + 1), ("leg",)))
        return out
    for i, m in enumerate(metas):
        out.append(Transform(f"leg {names[i]} copied as a second {m['arm']} leg (new dir, new pids)", _dup_leg(names[i]),
                             ("leg",)))
    if item in (E.FORWARD, E.ARTIFACTS, E.UPDATE):
        for i, m in enumerate(metas):
            for prefix in ("", "post_forward"):
                mf = case.root / case.rel_legs[i] / prefix / "metrics.jsonl" if prefix else \
                    case.root / case.rel_legs[i] / "metrics.jsonl"
                if not mf.is_file() or (m["item"] == "update" and prefix == ""):
                    continue
                rows = ops.read_rows(mf)
                steps = [r["step"] for r in rows]
                where = f"{names[i]}/{prefix + '/' if prefix else ''}"
                for s in steps:
                    for relabel in (False, True):
                        out.append(Transform(
                            f"{where}: step {s} (metrics row + arrays) copied as step {max(steps) + 1}"
                            + (" with checkpoint_version relabelled" if relabel else " unchanged"),
                            _dup_forward_step(names[i], prefix, s, relabel), ("step",)))
                need = case.question.criteria.min_steps if item is E.FORWARD else \
                    getattr(case.question.criteria, "post_update_steps", 5)
                if len(steps) < need:
                    out.append(Transform(f"{where}: last step {steps[-1]} copied {need - len(steps)} time(s) under new "
                                         "step numbers, checkpoint relabelled, up to the required count",
                                         _dup_forward_step(names[i], prefix, steps[-1], True, need - len(steps)), ("fill",)))
    if item in (E.BACKWARD, E.UPDATE):
        for i, m in enumerate(metas):
            mf = case.root / case.rel_legs[i] / "metrics.jsonl"
            if mf.is_file():
                for r in ops.read_rows(mf):
                    out.append(Transform(f"{names[i]}/metrics.jsonl: step {r['step']} row copied as a new step",
                                         _dup_grad_row(names[i], r["step"]), ("step",)))
    if item is E.QUALITY:
        for k in (1, 5, None):
            out.append(Transform(f"quality: {'all' if k is None else f'first {k}'} problem(s) copied under new "
                                 "problem ids (same prompt, response, outcome) in both arms", _dup_problems(k), ("problem",)))
        out.append(Transform("quality: all problems copied twice under new ids in both arms", _dup_problems(None, times=2),
                             ("problem",)))
        out.append(Transform("quality: all problems copied under new ids in both arms, the copies' prompt_hash "
                             "hex in upper case (the same digest)", _dup_problems(None, hash_spelling=ops.upper_hex),
                             ("problem",)))
        out.append(Transform("quality: all problems copied under new ids in both arms, the copies' prompt_hash "
                             "without its 'sha256:' prefix", _dup_problems(None, hash_spelling=lambda h: h.split(":", 1)[-1]),
                             ("problem",)))
        out.append(Transform("quality: all problems copied under new ids in both arms, no row records prompt_hash",
                             _dup_problems(None, no_hashes=True), ("problem",)))
        out.append(Transform("quality: first problem copied under a new id in the BI=1 arm only",
                             _dup_problems(1, ("bi1",)), ("problem",)))
    if item in (E.CLEAN_EXIT, E.FORWARD, E.BACKWARD, E.UPDATE, E.QUALITY, E.ARTIFACTS):
        roles = ("client", "api_server", "engine_core", "worker")
        for i, m in enumerate(metas):
            for j, p in enumerate(m.get("processes") or []):
                out.append(Transform(f"{names[i]}: process {p['role']} pid {p['pid']} duplicated under a new pid",
                                     _dup_process(names[i], j, None), ("process",)))
                if item is E.CLEAN_EXIT:
                    for role in roles:
                        if role != p["role"]:
                            out.append(Transform(f"{names[i]}: process {p['role']} pid {p['pid']} duplicated as role "
                                                 f"{role} under a new pid", _dup_process(names[i], j, role), ("process",)))
    return out


# ============================================================================ R2: removal


def _rm_leg(name: str) -> Fn:
    def fn(legs: list[Path]) -> list[Path]:
        leg = _named(legs, name)
        if leg is None:
            return legs
        shutil.rmtree(leg)
        return [l for l in legs if l != leg]
    return fn


def _rm_file(name: str, rel: str) -> Fn:
    def fn(legs: list[Path]) -> list[Path]:
        leg = _named(legs, name)
        if leg is None or not _has(leg / rel):
            return legs
        (leg / rel).unlink()
        seal_leg(leg)
        return legs
    return fn


def _rm_row(name: str, rel: str, n: int) -> Fn:
    def fn(legs: list[Path]) -> list[Path]:
        leg = _named(legs, name)
        if leg is None or not _has(leg / rel):
            return legs
        ops.edit_rows(leg / rel, lambda rows: rows[:n] + rows[n + 1:], leg)
        return legs
    return fn


def _rm_process(name: str, j: int) -> Fn:
    def fn(legs: list[Path]) -> list[Path]:
        leg = _named(legs, name)
        if leg is None or not _has(leg / "leg.json"):
            return legs
        ops.edit_meta(leg, lambda m: m["processes"].pop(j) if j < len(m.get("processes") or []) else None)
        return legs
    return fn


def removals(case: Case) -> list[Transform]:
    """R2: one input removed: a leg (not one the planted error edited: that is the passing set
    less a leg, no removal of evidence), a file that is not the seal, a row, a process exit."""
    metas = _metas(case)
    names = [rel.name for rel in case.rel_legs]
    out: list[Transform] = []
    for i, name in enumerate(names):
        if name not in case.changed and len(names) > 1:
            out.append(Transform(f"leg {name} removed from the set", _rm_leg(name), ("leg",)))
    for i, name in enumerate(names):
        leg = case.root / case.rel_legs[i]
        for f in ops.leg_files(leg):
            rel = f.relative_to(leg).as_posix()
            out.append(Transform(f"{name}/{rel} deleted (leg resealed)", _rm_file(name, rel), ("file",)))
            if f.suffix == ".jsonl":
                for n, row in enumerate(ops.read_rows(f)):
                    key = row.get("step", row.get("problem_id"))
                    out.append(Transform(f"{name}/{rel}: row {n + 1} ({key}) deleted (resealed)", _rm_row(name, rel, n),
                                         ("row",)))
        for j, p in enumerate(metas[i].get("processes") or []):
            out.append(Transform(f"{name}/leg.json: process {p['role']} pid {p['pid']} removed from processes (resealed)",
                                 _rm_process(name, j), ("process",)))
    return out


# ============================================================================ R4: receipt-side tolerances

TOLERANCE_KEYS = ("tolerance", "atol", "rtol", "threshold", "token_tolerance", "pass_line", "noise_floor",
                  "threshold_points", "budget", "tier_ratio")
TOLERANCE_VALUES = (0.5, 1.0, 1000, 1e9, "any", True)


def _add_everywhere(where: str, key: str, value: Any, arms: Sequence[str] = ("bi1", "bi0")) -> Fn:
    def fn(legs: list[Path]) -> list[Path]:
        for leg in legs:
            if not _has(leg / "leg.json") or ops.meta(leg)["arm"] not in arms:
                continue
            if where == "resolved_config":
                ops.edit_meta(leg, lambda m: m.setdefault("resolved_config", {}).update({key: value}))
            elif where == "bench":
                if (leg / "bench.json").is_file():
                    ops.edit_json(leg / "bench.json", lambda b: b.update({key: value}), leg)
            else:  # rows of every metrics.jsonl / results.jsonl of the leg
                for f in sorted(leg.rglob("*.jsonl")):
                    ops.edit_rows(f, lambda rows: [r.update({key: value}) for r in rows], leg)
        return legs
    return fn


def tolerance_locations(case: Case) -> list[str]:
    out = ["resolved_config"]
    if any((case.root / rel / "bench.json").is_file() for rel in case.rel_legs):
        out.append("bench")
    if any(list((case.root / rel).rglob("*.jsonl")) for rel in case.rel_legs):
        out.append("rows")
    return out


def tolerances(case: Case, arms: Sequence[str] = ("bi1", "bi0")) -> list[Transform]:
    out = []
    for where in tolerance_locations(case):
        for n, key in enumerate(TOLERANCE_KEYS):
            value = TOLERANCE_VALUES[n % len(TOLERANCE_VALUES)]
            label = {"resolved_config": "leg.json resolved_config", "bench": "bench.json (top level)",
                     "rows": "every metrics.jsonl/results.jsonl row"}[where]
            out.append(Transform(f"{label} of {'every leg' if len(arms) == 2 else arms[0] + ' legs'} gains "
                                 f"{key!r}: {value!r}", _add_everywhere(where, key, value, arms), (where,)))
    return out


# ============================================================================ R6: per-leg rules

MOVABLE = ("processes", "processes:client", "processes:api_server", "processes:engine_core", "env.VLLM_BATCH_INVARIANT", "started_at", "ended_at", "resolved_config.node", "versions.torch",
           "resolved_config.weights_hash", "profiled", "image_digest", "source.commit")


def _same_arm_pairs(case: Case, limit: int | None = None) -> list[tuple[int, int]]:
    metas = _metas(case)
    pairs = []
    for a, ma in enumerate(metas):
        for b, mb in enumerate(metas):
            if a != b and ma["arm"] == mb["arm"] and (ma.get("concurrency") == mb.get("concurrency")
                                                       or ma.get("item") != "throughput"):
                pairs.append((a, b))
    if limit is not None and len(pairs) > limit:
        step = len(pairs) // limit
        pairs = pairs[::step][:limit]
    return pairs


def _take(m: dict[str, Any], key: str) -> Any:
    """Remove key from leg.json m and return what it held; `processes:ROLE` takes that role's exits."""
    if key.startswith("processes:"):
        role = key.split(":", 1)[1]
        taken = [p for p in m.get("processes") or [] if p.get("role") == role]
        m["processes"] = [p for p in m.get("processes") or [] if p.get("role") != role]
        return taken
    value = ops.get_dotted(m, key, None)
    ops.del_dotted(m, key)
    return value


def _held(m: dict[str, Any], key: str) -> Any:
    if key.startswith("processes:"):
        return [p for p in m.get("processes") or [] if p.get("role") == key.split(":", 1)[1]]
    return ops.get_dotted(m, key, None)


def _remove_key(a: str, key: str) -> Fn:
    def fn(legs: list[Path]) -> list[Path]:
        ops.edit_meta(_named(legs, a), lambda m: _take(m, key))
        return legs
    return fn


def _move_key(a: str, b: str, key: str) -> Fn:
    """key removed from leg a and given to leg b (a list is appended to b's; a value b lacks is set)."""
    def fn(legs: list[Path]) -> list[Path]:
        taken: list[Any] = []
        ops.edit_meta(_named(legs, a), lambda m: taken.append(_take(m, key)))
        value = taken[0]
        key_b = "processes" if key.startswith("processes:") else key

        def give(m: dict[str, Any]) -> None:
            have = ops.get_dotted(m, key_b, None)
            if isinstance(have, list) and isinstance(value, list):
                ops.set_dotted(m, key_b, have + value)
            elif have is None and value is not None:
                ops.set_dotted(m, key_b, value)
        ops.edit_meta(_named(legs, b), give)
        return legs
    return fn


def with_second_leg(case: Case) -> tuple[Fn | None, str]:
    """Items whose arms have one leg each get a second leg per arm (a copy, new pids) first."""
    metas = _metas(case)
    arms = [m["arm"] for m in metas]
    if all(arms.count(a) > 1 for a in set(arms)):
        return None, ""

    def fn(legs: list[Path]) -> list[Path]:
        out = list(legs)
        for i, leg in enumerate(legs):
            if arms.count(arms[i]) == 1:
                out.append(ops.copy_leg(leg, leg.name + "__second"))
        return out
    return fn, "each single-leg arm given a copy of its leg (new dir, new pids); then "


def moves(case: Case, limit_pairs: int | None = None) -> list[tuple[Transform, Transform]]:
    """R6: (remove key from leg a, move key from leg a to leg b of the same arm)."""
    metas = _metas(case)
    names = [rel.name for rel in case.rel_legs]
    pre, pre_txt = with_second_leg(case)
    n = len(names)
    if pre is not None:  # the copies follow the originals: leg i's copy
        arms = [m["arm"] for m in metas]
        single = [i for i in range(n) if arms.count(arms[i]) == 1]
        pairs = [(i, n + k) for k, i in enumerate(single)]
        names = names + [names[i] + "__second" for i in single]
    else:
        pairs = _same_arm_pairs(case, limit_pairs)
    out = []
    for a, b in pairs:
        for key in MOVABLE:
            src = metas[a] if a < len(metas) else None
            if src is None or _held(src, key) in (None, [], {}):
                continue

            def chain(*fns: Fn | None) -> Fn:
                def fn(legs: list[Path]) -> list[Path]:
                    for f in fns:
                        if f is not None:
                            legs = f(legs)
                    return legs
                return fn
            out.append((Transform(f"{pre_txt}{key} removed from {names[a]}", chain(pre, _remove_key(names[a], key))),
                        Transform(f"{pre_txt}{key} moved from {names[a]} to {names[b]} (same arm)",
                                  chain(pre, _move_key(names[a], names[b], key)))))
    return out
