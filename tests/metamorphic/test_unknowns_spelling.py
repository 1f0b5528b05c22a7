"""Metamorphic relations 3 and 5.

R3 placeholders: a recorded string value (leg.json env, versions, device, kernels, resolved_config,
   source, image_digest; contract.json; bench.json; metrics/results rows) replaced by a placeholder
   ("unknown", "n/a", "", "?" ...) never yields a pass that deleting the value would not: equal
   placeholders on both arms are unknown on both arms, never "aligned".
R5 spelling: a timestamp in another spelling of the same instant, a digest's case or prefix, a
   number spelled 1 vs 1.0 never turns a non-pass into a pass (`_never_makes_pass`) and, ideally,
   never changes the verdict at all (`_keeps_verdict`: a change there is a refusal of one spelling,
   listed for review, or a bug).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from tica.verdict import Verdict

from . import ops
from .catalogue import Transform
from .conftest import run_transform as _run, FULL, HYP, Case, Traceback, cap, capped, line, one_per_item, selected
from .variants import VARIANTS

ALL_IDS = selected([v.id for v in VARIANTS])
PLACEHOLDERS = ("unknown", "n/a", "N/A", "", "?", "none recorded", "none", "None", "null", "-", "UNKNOWN", " ", "\t",
                "NA", "not recorded", "unset", "undefined", "<unknown>", "n.a.")
# Keys a rule reads (must_record, the node, a step's checkpoint, a problem's prompt): on the passing
# sets every placeholder is tried on them by default; other keys get one placeholder each in turn.
PRIORITY = ("versions.torch", "versions.vllm", "device.name", "kernels.attention", "resolved_config.weights_hash",
            "resolved_config.node", "checkpoint_version", "prompt_hash", "image_digest", "source.commit")
PRIORITY_THROUGHPUT = ("versions.torch", "resolved_config.node", "kernels.attention")
LEG_SECTIONS = ("env", "versions", "device", "kernels", "resolved_config", "source")


def _report(case: Case, violations: list[str], relation: str) -> None:
    assert not violations, (f"{relation}: {len(violations)} violation(s) from {case.start()}:\n  - "
                            + "\n  - ".join(violations))


# ============================================================================ R3: placeholders


def _where(f: Path, leg: Path) -> str:
    return f.relative_to(leg).as_posix()


def recorded_strings(case: Case) -> list[tuple[str, str]]:
    """(file kind, dotted key) of every recorded string value the relation replaces."""
    found: set[tuple[str, str]] = set()
    for rel in case.rel_legs:
        leg = case.root / rel
        m = ops.meta(leg)
        for section in LEG_SECTIONS:
            found |= {("leg.json", k) for k, _ in ops.string_leaves({section: m.get(section) or {}})}
        if isinstance(m.get("image_digest"), str):
            found.add(("leg.json", "image_digest"))
        for side in ("contract.json", "bench.json"):
            if (leg / side).is_file():
                found |= {(side, k) for k, _ in ops.string_leaves(ops.load(leg / side))}
        for f in sorted(leg.rglob("*.jsonl")):
            for row in ops.read_rows(f)[:1]:
                found |= {(f"rows:{_where(f, leg)}", k) for k, v in row.items() if isinstance(v, str)}
    return sorted(found)


def _set_or_delete(kind: str, key: str, value: Any, arms: Sequence[str]) -> Callable[[list[Path]], list[Path]]:
    """Every leg of `arms` that records key: the value replaced by `value` (DELETE: removed)."""
    def fn(legs: list[Path]) -> list[Path]:
        for leg in legs:
            if ops.meta(leg)["arm"] not in arms:
                continue

            def edit(d: dict[str, Any]) -> None:
                if ops.get_dotted(d, key, None) is None:
                    return
                if value is DELETE:
                    ops.del_dotted(d, key)
                else:
                    ops.set_dotted(d, key, value)
            if kind == "leg.json":
                ops.edit_meta(leg, edit)
            elif kind.startswith("rows:"):
                f = leg / kind.removeprefix("rows:")
                if f.is_file():
                    ops.edit_rows(f, lambda rows: [edit(r) for r in rows], leg)
            elif (leg / kind).is_file():
                ops.edit_json(leg / kind, edit, leg)
        return legs
    return fn


DELETE = object()


def placeholder_pairs(case: Case, arms: Sequence[str], every_placeholder: bool = False,
                      priority: Sequence[str] = ()) -> list[tuple[Transform, Transform]]:
    out = []
    keys = recorded_strings(case)
    for n, (kind, key) in enumerate(keys):
        every = every_placeholder or key in priority
        phs = PLACEHOLDERS if every else (PLACEHOLDERS[n % len(PLACEHOLDERS)],)
        side = "both arms" if len(arms) == 2 else f"the {arms[0]} legs"
        for ph in phs:
            out.append((Transform(f"{kind} {key} := {ph!r} in every leg of {side}", _set_or_delete(kind, key, ph, arms)),
                        Transform(f"{kind} {key} deleted in every leg of {side}", _set_or_delete(kind, key, DELETE, arms))))
    return out


def _r3(case: Case, candidate, pairs) -> list[str]:
    violations = []
    deleted_cache: dict[str, Any] = {}
    for placed, deleted in pairs:
        p_cell, tb1 = _run(case, candidate, placed)
        if deleted.name not in deleted_cache:
            deleted_cache[deleted.name] = _run(case, candidate, deleted)
        d_cell, tb2 = deleted_cache[deleted.name]
        for tb in (tb1, tb2):
            if tb is not None and tb not in violations:
                violations.append(tb)
        if p_cell is not None and d_cell is not None and p_cell.verdict is Verdict.PASS \
                and d_cell.verdict is not Verdict.PASS:
            violations.append(f"{placed.name}: PASS, while deleting it is {d_cell.verdict.value} "
                              f"({line(d_cell)[:220]})")
    return violations


@pytest.mark.parametrize("vid", ALL_IDS)
def test_r3_equal_placeholders_never_pass_where_deleting_does_not(vid, cases, candidate):
    case = cases[vid]
    pairs = capped(placeholder_pairs(case, ("bi1", "bi0"), every_placeholder=FULL), cap(vid, 30))
    if case.passing and not FULL:  # every placeholder on the keys a rule reads
        prio = PRIORITY_THROUGHPUT if case.item.value == "throughput" else PRIORITY
        names = {p[0].name for p in pairs}
        pairs += [p for p in placeholder_pairs(case, ("bi1", "bi0"), priority=prio)
                  if p[1].name.split(" ")[1] in prio and p[0].name not in names]
    _report(case, _r3(case, candidate, pairs), "R3 placeholder on both arms")


@pytest.mark.parametrize("vid", [v for v in ALL_IDS if FULL or (v.endswith("-base") and not v.startswith("throughput"))])
def test_r3_one_arm_placeholder_never_pass_where_deleting_does_not(vid, cases, candidate):
    case = cases[vid]
    pairs = capped(placeholder_pairs(case, ("bi1",)) + placeholder_pairs(case, ("bi0",)), cap(vid, 40))
    _report(case, _r3(case, candidate, pairs), "R3 placeholder on one arm")


@pytest.mark.parametrize("vid", ALL_IDS)
@HYP
@given(data=st.data())
def test_r3_placeholder_sampled(vid, cases, candidate, data):
    case = cases[vid]
    keys = recorded_strings(case)
    kind, key = data.draw(st.sampled_from(keys), label="key")
    ph = data.draw(st.sampled_from(PLACEHOLDERS), label="placeholder")
    arms = data.draw(st.sampled_from([("bi1", "bi0"), ("bi1",), ("bi0",)]), label="arms")
    pair = (Transform(f"{kind} {key} := {ph!r} ({arms})", _set_or_delete(kind, key, ph, arms)),
            Transform(f"{kind} {key} deleted ({arms})", _set_or_delete(kind, key, DELETE, arms)))
    note(f"{case.start()}; {pair[0].name}")
    violations = _r3(case, candidate, [pair])
    assert not violations, violations


# ============================================================================ R5: spelling


def _all_legs(fn: Callable[[Path], None]) -> Callable[[list[Path]], list[Path]]:
    def apply(legs: list[Path]) -> list[Path]:
        for leg in legs:
            fn(leg)
        return legs
    return apply


def _times(how: str) -> Callable[[Path], None]:
    def fn(leg: Path) -> None:
        ops.edit_meta(leg, lambda m: m.update({k: ops.respell_time(m[k], how) for k in ("started_at", "ended_at")
                                               if isinstance(m.get(k), str)}))
    return fn


def _meta_str(key: str, respell: Callable[[str], str]) -> Callable[[Path], None]:
    def fn(leg: Path) -> None:
        def edit(m: dict[str, Any]) -> None:
            v = ops.get_dotted(m, key, None)
            if isinstance(v, str):
                ops.set_dotted(m, key, respell(v))
        ops.edit_meta(leg, edit)
    return fn


def _rows_str(keys: Sequence[str], respell: Callable[[str], str]) -> Callable[[Path], None]:
    def fn(leg: Path) -> None:
        for f in sorted(leg.rglob("metrics.jsonl")):
            ops.edit_rows(f, lambda rows: [r.update({k: respell(r[k]) for k in keys if isinstance(r.get(k), str)})
                                           for r in rows], leg)
    return fn


def _number(kind: str, key: str, conv: Callable[[Any], Any]) -> Callable[[Path], None]:
    def edit(d: dict[str, Any]) -> None:
        v = ops.get_dotted(d, key, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            ops.set_dotted(d, key, conv(v))

    def fn(leg: Path) -> None:
        if kind == "leg.json":
            ops.edit_meta(leg, edit)
        elif kind == "rows":
            for f in sorted(leg.rglob("*.jsonl")):
                ops.edit_rows(f, lambda rows: [edit(r) for r in rows], leg)
        elif (leg / kind).is_file():
            ops.edit_json(leg / kind, edit, leg)
    return fn


def _whole(v: Any) -> Any:
    return float(v) if isinstance(v, int) else (int(v) if float(v).is_integer() else v)


def _prefix_upper(text: str) -> str:
    algo, sep, rest = text.partition(":")
    return f"{algo.upper()}:{rest}" if sep else text


def _prefix_drop(text: str) -> str:
    return text.split(":", 1)[1] if ":" in text else text


SPELLINGS: list[tuple[str, Callable[[Path], None]]] = [
    ("timestamps '+00:00' spelled 'Z'", _times("Z")),
    ("timestamps in +05:30, same instant", _times("offset")),
    ("timestamps in -07:00, same instant", _times("negative_offset")),
    ("timestamps with '.000000' microseconds", _times("micro_zero")),
    ("timestamps + 123456 microseconds (every leg alike)", _times("micro")),
    ("timestamps with a space for 'T'", _times("space")),
    ("timestamps without their zone, the UTC wall clock (tica.leg_times reads them as one local clock)",
     _times("naive")),
    ("image_digest hex in upper case", _meta_str("image_digest", ops.upper_hex)),
    ("image_digest prefix 'SHA256:'", _meta_str("image_digest", _prefix_upper)),
    ("image_digest without its 'sha256:' prefix", _meta_str("image_digest", _prefix_drop)),
    ("resolved_config.weights_hash hex in upper case", _meta_str("resolved_config.weights_hash", ops.upper_hex)),
    ("resolved_config.weights_hash prefix 'BLAKE3:'", _meta_str("resolved_config.weights_hash", _prefix_upper)),
    ("source.commit in upper case", _meta_str("source.commit", str.upper)),
    ("metrics checkpoint_version / updated_weights_hash hex in upper case",
     _rows_str(("checkpoint_version", "updated_weights_hash"), ops.upper_hex)),
    ("leg.json resolved_config.tensor_parallel_size 1 -> 1.0", _number("leg.json", "resolved_config.tensor_parallel_size", _whole)),
    ("leg.json resolved_config.max_model_len int -> float", _number("leg.json", "resolved_config.max_model_len", _whole)),
    ("leg.json device.count 1 -> 1.0", _number("leg.json", "device.count", _whole)),
    ("leg.json resolved_config.num_prompts int -> float", _number("leg.json", "resolved_config.num_prompts", _whole)),
    ("leg.json resolved_config.num_warmups int -> float", _number("leg.json", "resolved_config.num_warmups", _whole)),
    ("leg.json resolved_config.gpu_memory_utilization 0.85 -> 0.850", _number("leg.json", "resolved_config.gpu_memory_utilization",
                                                                             lambda v: float(f"{v:.3f}"))),
    ("bench.json burstiness 1.0 -> 1", _number("bench.json", "burstiness", _whole)),
    ("bench.json max_concurrency int -> float", _number("bench.json", "max_concurrency", _whole)),
    ("bench.json num_prompts int -> float", _number("bench.json", "num_prompts", _whole)),
    ("contract.json sampling.temperature 0 -> 0.0", _number("contract.json", "sampling.temperature", _whole)),
    ("contract.json sampling.top_p 1 -> 1.0", _number("contract.json", "sampling.top_p", _whole)),
    ("contract.json sampling.seed 0 -> 0.0", _number("contract.json", "sampling.seed", _whole)),
    ("contract.json length_cap int -> float", _number("contract.json", "length_cap", _whole)),
    ("rows: whole floats -> int (e.g. probs diff max 0.0 -> 0)",
     _number("rows", "training/rollout_probs_diff_max", _whole)),
    ("rows: tica/n_tokens int -> float", _number("rows", "tica/n_tokens", _whole)),
    ("rows: params_total int -> float", _number("rows", "params_total", _whole)),
]


def _spelled(case: Case, candidate) -> list[tuple[str, Any, str | None]]:
    out = []
    for name, fn in SPELLINGS:
        cell, tb = _run(case, candidate, Transform(name, _all_legs(fn)))
        out.append((name, cell, tb))
    return out


_SPELLED: dict[str, list[tuple[str, Any, str | None]]] = {}


def _spelled_once(case: Case, candidate) -> list[tuple[str, Any, str | None]]:
    if case.variant.id not in _SPELLED:
        _SPELLED[case.variant.id] = _spelled(case, candidate)
    return _SPELLED[case.variant.id]


SPELLING_IDS = one_per_item(ALL_IDS)


@pytest.mark.parametrize("vid", SPELLING_IDS)
def test_r5_spelling_never_makes_pass(vid, cases, candidate):
    case = cases[vid]
    violations = []
    for name, cell, tb in _spelled_once(case, candidate):
        if tb is not None:
            violations.append(f"{name}: {tb}")
        elif not case.passing and cell.verdict is Verdict.PASS:
            violations.append(f"every leg's {name}: FALSE PASS -> {line(cell)}")
    _report(case, violations, "R5 spelling (non-pass -> pass)")


@pytest.mark.parametrize("vid", SPELLING_IDS)
def test_r5_spelling_keeps_verdict(vid, cases, candidate):
    """Listed for review: a spelling that changes the verdict (pass -> non-pass is a refusal)."""
    case = cases[vid]
    violations = []
    for name, cell, tb in _spelled_once(case, candidate):
        if tb is None and cell.verdict is not case.verdict:
            violations.append(f"every leg's {name}: {case.verdict.value} -> {line(cell)[:400]}")
    _report(case, violations, "R5 spelling changes the verdict")
