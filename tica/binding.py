"""Binding: a receipt is evidence for a candidate only if what it recorded is what the candidate
manifest pins.

Every value the manifest pins for a component a leg's item is sensitive to (the invalidation
matrix in `tica.evidence`) is looked up in the leg's `leg.json` (and, for quality legs, its
`contract.json`) and compared after a few documented normalizations. A value the receipt records
differently names another candidate; a value it does not record at all leaves the leg unbound
("records nothing where the manifest pins a value"). Either way the leg is not evidence for this
candidate and the cell cannot pass; the reason names the field, both values and the file.

Not bound yet: `backends.dense_gemm`, `backends.moe` and `backends.all_to_all`. Manifests name
them in prose and producers record the GEMM under other names (a linear method, a matmul
function), so there is nothing to compare them with; the recipe and image pins are what hold
them today. `recipe` itself is bound through the recipe-identity receipt, not per leg.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tica import canonical
from tica.candidate import CandidateIdentity
from tica.evidence import Component, EvidenceItem, sensitive_components
from tica.manifest import LoadedManifest, Manifest, Workload
from tica.receipts import CONTRACT_FILE, LEG_FILE, read_receipt
from tica.messages import clip
from tica.question import ThroughputCriteria
from tica.source import WORKING_TREE, same_commit

TRAINER_ITEMS = frozenset({"forward", "backward", "update"})
ENGINE_ITEMS = frozenset({"forward", "update", "quality", "throughput", "clean_exit"})
_PACKAGE = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s;]+)\s*$")


@dataclass(frozen=True)
class Candidate:
    """What a verdict is judged for: the candidate's id, its weights fingerprint and its manifest."""

    candidate_id: str
    weights: str
    manifest: Manifest
    manifest_path: str = ""

    @classmethod
    def of(cls, loaded: LoadedManifest, identity: CandidateIdentity) -> "Candidate":
        return cls(candidate_id=identity.candidate_id, weights=identity.components[Component.WEIGHTS],
                   manifest=loaded.manifest, manifest_path=str(loaded.path))


@dataclass(frozen=True)
class Pin:
    """One value the manifest pins, where a receipt records it and how the two compare."""

    component: Component
    field: str
    value: Any
    receipt_keys: tuple[str, ...]
    same: Callable[[Any, Any], bool]
    items: frozenset[str] | None = None  # leg items that record it (None: every item the component is read by)
    arms: frozenset[str] | None = None  # arms whose legs must record it (None: both)
    absent_ok: bool = False  # the manifest pins absence (no overlay): recording nothing agrees


@dataclass(frozen=True)
class BindingProblem:
    leg: str
    file: str
    component: Component
    field: str
    pinned: Any
    recorded: Any
    kind: Literal["differs", "unrecorded"]

    def __str__(self) -> str:
        if self.kind == "unrecorded":
            return (f"{self.leg}: {self.component.value} not bound: the manifest pins {self.field} = "
                    f"{_show(self.pinned)}; {self.file} records nothing for it")
        return (f"{self.leg}: {self.component.value} names another candidate: the manifest pins {self.field} = "
                f"{_show(self.pinned)}; {self.file} records {_show(self.recorded)}")


def _show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else value
    return clip(text, 80)


# ------------------------------------------------------------------------ comparisons


def _text(a: Any, b: Any) -> bool:
    return str(a).strip() == str(b).strip()


# A wheel's local version label that names only the platform it was built for (torch 2.11.0+cu130,
# vllm 0.26.0+cpu): the same release. Any other label (+mypatch, +g1a2b3c) is another build.
_PLATFORM_LABEL = re.compile(r"(cpu|cu\d+|rocm[\d.]*|xpu|tpu|hpu|neuron)")


def _package_version(pinned: Any, recorded: Any) -> bool:
    pinned, recorded = canonical.version(pinned), canonical.version(recorded)
    release, _, label = recorded.partition("+")
    return pinned == recorded or (pinned == release and bool(_PLATFORM_LABEL.fullmatch(label)))


def _digest(pinned: Any, recorded: Any) -> bool:
    """One digest in any spelling of it (tica.canonical)."""
    return isinstance(recorded, str) and canonical.digest(str(pinned)) == canonical.digest(recorded)


def _unordered(pinned: Any, recorded: Any) -> bool:
    """A set the engine reads without order (stop sequences): the same members, in any order."""
    return (isinstance(recorded, list) and all(isinstance(x, str) for x in recorded)
            and canonical.unordered(pinned) == canonical.unordered(recorded) and len(set(recorded)) == len(recorded))


def _int_set(pinned: Any, recorded: Any) -> bool:
    """Sizes the engine reads as a set (CUDA graph capture sizes): the same integers, in any order."""
    return (isinstance(recorded, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in recorded)
            and canonical.unordered(pinned) == canonical.unordered(recorded))


def _lower(a: Any, b: Any) -> bool:
    return str(a).strip().lower() == str(b).strip().lower()


def _bool(pinned: Any, recorded: Any) -> bool:
    if isinstance(recorded, str) and recorded.lower() in ("true", "false"):
        recorded = recorded.lower() == "true"
    return isinstance(recorded, bool) and recorded is bool(pinned)


def _int(pinned: Any, recorded: Any) -> bool:
    return not isinstance(recorded, bool) and isinstance(recorded, int) and recorded == pinned


def _dtype(pinned: Any, recorded: Any) -> bool:
    a, b = canonical.dtype(str(pinned)), canonical.dtype(str(recorded))
    return a in canonical.DTYPES.values() and a == b


def _first_word(pinned: Any, recorded: Any) -> bool:
    """A backend is pinned by the name vLLM reports, optionally followed by a note:
    `FLASH_ATTN (FA3, num_splits=1)` pins FLASH_ATTN."""
    word = re.split(r"[\s(]", str(pinned).strip(), maxsplit=1)[0]
    rec = str(recorded).strip().removeprefix("AttentionBackendEnum.")
    return bool(word) and word.lower() == rec.lower()


def _commit(pinned: Any, recorded: Any) -> bool:
    return isinstance(recorded, str) and same_commit(str(pinned), recorded)


def _graph_mode(pinned: Any) -> str:
    """`none (enforce_eager)` -> NONE, `full_and_piecewise` -> FULL_AND_PIECEWISE: vLLM's names."""
    return re.split(r"[\s(]", str(pinned).strip(), maxsplit=1)[0].upper()


def _graphs_off(pinned: Any, recorded: Any) -> bool:
    """enforce_eager true means no CUDA graphs: it binds `none` and contradicts any other mode."""
    return isinstance(recorded, bool) and recorded is (_graph_mode(pinned) == "NONE")


def _graph_mode_same(pinned: Any, recorded: Any) -> bool:
    return _graph_mode(pinned) == str(recorded).strip().upper().removeprefix("CUDAGRAPHMODE.")


def _kv_dtype(weights: str) -> Callable[[Any, Any], bool]:
    """vLLM's kv_cache_dtype `auto` is the model's dtype."""
    def same(pinned: Any, recorded: Any) -> bool:
        rec = str(recorded).strip().lower()
        return _dtype(pinned, weights if rec == "auto" else rec) or _text(pinned, recorded)
    return same


def _absent_or(pinned: Any, recorded: Any) -> bool:
    return recorded is None if pinned is None else _digest(pinned, recorded)


# ------------------------------------------------------------------------ what a manifest pins


def _packages(m: Manifest) -> dict[str, str]:
    """Package versions the manifest pins as `name==version` (runner.rollout_engine, runner.trainer)."""
    out = {}
    for text in (m.runner.rollout_engine, m.runner.trainer):
        if match := _PACKAGE.match(text):
            out[match.group(1)] = match.group(2)
    return out


def pins(candidate: Candidate) -> list[Pin]:
    m, C = candidate.manifest, Component
    out = [Pin(C.WEIGHTS, "checkpoint (weights fingerprint)", candidate.weights, ("resolved_config.weights_hash",),
               _digest)]
    # A pinned image binds by its digest alone; no image (null) is a value too: a leg that ran in
    # one is another candidate, and the package versions below are what binds the environment.
    out.append(Pin(C.IMAGE, "image.digest", m.image.digest, ("image_digest",), _absent_or,
                   absent_ok=m.image.digest is None))
    for name, version in _packages(m).items():
        keys = (f"versions.{name}",) + ((f"versions.{name.removesuffix('-cpu')}",) if name.endswith("-cpu") else ())
        out.append(Pin(C.IMAGE, f"package {name}", version, keys, _package_version))
    out.append(Pin(C.SOURCE, "source.commit", m.source.commit, ("source.commit",), _commit))
    # No overlay is a value too: a leg that ran with one is another candidate.
    out.append(Pin(C.SOURCE, "source.overlay_digest", m.source.overlay_digest, ("source.overlay_digest",), _absent_or,
                   absent_ok=m.source.overlay_digest is None))
    out.append(Pin(C.HARDWARE, "hardware.accelerator", m.hardware.accelerator,
                   ("device.name",) if m.hardware.accelerator.lower() != "cpu" else ("device.kind",), _lower))
    if m.hardware.driver:
        out.append(Pin(C.HARDWARE, "hardware.driver", m.hardware.driver, ("device.driver",), _text))
    if m.hardware.accelerator.lower() != "cpu":  # a CPU's device.count is its cores, not a pinned count
        out.append(Pin(C.HARDWARE, "hardware.count_per_node", m.hardware.count_per_node, ("device.count",), _int))
    out.append(Pin(C.RUNNER, "runner.trainer", m.runner.trainer, ("trainer",), _text,
                   items=TRAINER_ITEMS, arms=frozenset({"bi1"})))
    par = m.runner.parallelism
    for field, value, name in (("tp", par.tp, "tensor"), ("pp", par.pp, "pipeline"), ("dp", par.dp, "data"),
                               ("ep", par.ep, "expert"), ("cp", par.cp, "context")):
        out.append(Pin(C.RUNNER, f"runner.parallelism.{field}", value,
                       (f"resolved_config.{name}_parallel_size", f"kernels.rollout.{name}_parallel_size"), _int))
    out.append(Pin(C.PRECISION, "precision.weights", m.precision.weights, ("resolved_config.dtype", "kernels.rollout.dtype"),
                   _dtype))
    out.append(Pin(C.PRECISION, "precision.kv_cache", m.precision.kv_cache,
                   ("resolved_config.kv_cache_dtype", "kernels.rollout.kv_cache_dtype"), _kv_dtype(m.precision.weights),
                   items=ENGINE_ITEMS))
    # The rollout engine's backend: a trainer-only leg (backward) runs no engine to select one.
    out.append(Pin(C.BACKENDS, "backends.attention", m.backends.attention,
                   ("kernels.rollout.attention", "kernels.attention", "resolved_config.attention_backend"), _first_word,
                   items=ENGINE_ITEMS))
    g = m.graph_cache
    out += [
        Pin(C.GRAPH_CACHE, "graph_cache.prefix_caching", g.prefix_caching,
            ("kernels.rollout.prefix_caching", "resolved_config.enable_prefix_caching", "resolved_config.prefix_caching"), _bool),
        Pin(C.GRAPH_CACHE, "graph_cache.chunked_prefill", g.chunked_prefill,
            ("kernels.rollout.chunked_prefill", "resolved_config.enable_chunked_prefill", "resolved_config.chunked_prefill"),
            _bool),
        Pin(C.GRAPH_CACHE, "graph_cache.async_scheduling", g.async_scheduling,
            ("kernels.rollout.async_scheduling", "resolved_config.async_scheduling"), _bool),
        Pin(C.GRAPH_CACHE, "graph_cache.cuda_graph_mode", g.cuda_graph_mode,
            ("kernels.rollout.enforce_eager", "resolved_config.enforce_eager"), _graphs_off),
    ]
    if _graph_mode(g.cuda_graph_mode) != "NONE":  # with graphs on, which mode is part of the candidate
        out.append(Pin(C.GRAPH_CACHE, "graph_cache.cuda_graph_mode (mode)", g.cuda_graph_mode,
                       ("kernels.rollout.cudagraph_mode", "resolved_config.cudagraph_mode"), _graph_mode_same))
    if _graph_mode(g.cuda_graph_mode) != "NONE" and g.cuda_graph_sizes:
        out.append(Pin(C.GRAPH_CACHE, "graph_cache.cuda_graph_sizes", list(g.cuda_graph_sizes),
                       PINNED_WHEN_SET["graph_cache.cuda_graph_sizes"][0], _int_set, items=ENGINE_ITEMS))
    if m.backends.all_to_all is not None:
        out.append(Pin(C.BACKENDS, "backends.all_to_all", m.backends.all_to_all,
                       PINNED_WHEN_SET["backends.all_to_all"][0], _lower, items=ENGINE_ITEMS))
    if g.max_num_batched_tokens is not None:
        out.append(Pin(C.GRAPH_CACHE, "graph_cache.max_num_batched_tokens", g.max_num_batched_tokens,
                       ("kernels.rollout.max_num_batched_tokens", "resolved_config.max_num_batched_tokens"), _int))
    if m.recipe.shutdown_timeout is not None:  # how the engine is stopped: what clean exit judges
        out.append(Pin(C.RECIPE, "recipe.shutdown_timeout", m.recipe.shutdown_timeout,
                       ("resolved_config.shutdown_timeout", "kernels.rollout.shutdown_timeout"), _int,
                       items=ENGINE_ITEMS))
    w = m.workload
    for field, same in (("input_len", _int), ("output_len", _int), ("ignore_eos", _bool), ("warmups", _int),
                        ("seed", _int)):
        key = "num_warmups" if field == "warmups" else field
        out.append(Pin(C.WORKLOAD, f"workload.{field}", getattr(w, field), (f"resolved_config.{key}",), same,
                       items=frozenset({"throughput"})))
    c = m.eval_contract
    for field, value in (("dataset_version", c.dataset_version), ("prompt_template", c.prompt_template),
                         ("thinking_mode", c.thinking_mode), ("repeats", c.repeats), ("scorer", c.scorer),
                         ("length_cap", c.length_cap), ("sampling.temperature", c.sampling.temperature),
                         ("sampling.top_p", c.sampling.top_p), ("sampling.top_k", c.sampling.top_k),
                         ("sampling.seed", c.sampling.seed), ("sampling.n", c.sampling.n),
                         ("sampling.stop", list(c.sampling.stop))):
        if field == "thinking_mode" and value == "n/a":
            value = "none"  # a template without a thinking switch, as receipts spell it ("n/a" is unrecorded there)
        same = _unordered if field == "sampling.stop" else (
            lambda a, b: a == b and type(a) is type(b) or (isinstance(a, (int, float)) and not isinstance(b, bool)
                                                            and isinstance(b, (int, float)) and a == b))
        out.append(Pin(C.EVAL_CONTRACT, f"eval_contract.{field}", value, (f"contract.{field}",), same,
                       items=frozenset({"quality"})))
    return out


# Pins made only when the manifest sets a value: field -> (the receipt keys that bind it, when).
# An empty or null value pins nothing (the engine's default, whatever it resolves to).
PINNED_WHEN_SET: dict[str, tuple[tuple[str, ...], str]] = {
    "graph_cache.cuda_graph_sizes": (("kernels.rollout.cudagraph_capture_sizes", "resolved_config.cudagraph_capture_sizes"),
                                     "when the manifest lists sizes and a CUDA graph mode other than none"),
    "backends.all_to_all": (("kernels.rollout.all2all_backend", "resolved_config.all2all_backend"),
                            "when the manifest names one"),
}


# Manifest fields that are not compared per leg by a Pin above, each with what holds it instead, or
# why nothing can: tests/core/test_manifest_fields.py requires every manifest field to be a Pin's
# field or listed here, and README's pin table is written from both (`pin_table`).
NOT_PINNED_PER_LEG: dict[str, str] = {
    "track": "informational: names the track; part of the candidate id",
    "description": "informational: for a person",
    "checkpoint.path": "the weights fingerprint is computed from it (the weights pin)",
    "checkpoint.root": "the folder the weights fingerprint may follow links into",
    "checkpoint.digest": "the weights fingerprint when the weights are elsewhere (the weights pin)",
    "checkpoint.format": "informational: the files the loader reads are the weights fingerprint, whatever their format",
    "image.reference": "informational: a human tag; the digest identifies the image",
    "source.repository": "informational: the commit identifies the source",
    "hardware.nodes": "UNBOUND: offline engine legs record vLLM's nnodes (resolved_config.nnodes) from 2026-12-04; "
                      "no sealed receipt does yet",
    "hardware.interconnect": "UNBOUND: no producer records the interconnect",
    "runner.rollout_engine": "the `package` pin of its `name==version`",
    "backends.dense_gemm": "UNBOUND: producers name the GEMM by other names (a linear method), nothing to compare",
    "backends.moe": "UNBOUND: vLLM picks the MoE kernel per layer at load; its config holds the request "
                    "(kernel_config.moe_backend, often auto), not the choice",
    "recipe.bi1": "the recipe-identity receipt (tica judge recipe), not a leg",
    "recipe.bi0": "the recipe-identity receipt (tica judge recipe), not a leg",
    "workload.concurrencies": "every throughput leg runs at one of them (concurrency in leg.json)",
    "workload.num_prompts": "every throughput leg's resolved_config.num_prompts at its concurrency",
    "deviations": "informational: the table of deviations from the reference, for the report",
}


_UNBOUND_COMPONENT = {"checkpoint": Component.WEIGHTS, "hardware": Component.HARDWARE, "backends": Component.BACKENDS,
                      "graph_cache": Component.GRAPH_CACHE}


def unbound_pins(candidate: Candidate, item: EvidenceItem) -> list[str]:
    """The fields this candidate's manifest pins (a value, not null or empty) for a component the
    item reads that no receipt records (NOT_PINNED_PER_LEG's UNBOUND): named on every cell, never
    silently taken as checked."""
    dump = candidate.manifest.model_dump(mode="json")
    out = []
    for field, why in NOT_PINNED_PER_LEG.items():
        section, _, name = field.partition(".")
        component = _UNBOUND_COMPONENT.get(section)
        if not why.startswith("UNBOUND") or component is None or component not in sensitive_components(item):
            continue
        value = (dump.get(section) or {}).get(name)
        if value not in (None, "", [], ()):
            out.append(f"{field} = {_show(value)} is pinned but no receipt records it, so no leg is checked against it")
    return out


def pin_table(candidate: Candidate) -> str:
    """Markdown: every manifest field, the receipt field that binds it (or what holds it instead)."""
    rows = ["| manifest field | bound by the leg's | items |", "| --- | --- | --- |"]
    for pin in pins(candidate):
        keys = " or ".join(f"`{k}`" for k in pin.receipt_keys)
        items = ", ".join(sorted(pin.items)) if pin.items else "every item reading the component"
        arms = " (BI=1 legs)" if pin.arms == frozenset({"bi1"}) else ""
        rows.append(f"| `{pin.field}` | {keys}{arms} | {items} |")
    made = {pin.field for pin in pins(candidate)}
    for field, (receipt_keys, when) in PINNED_WHEN_SET.items():
        if field not in made:
            keys = " or ".join(f"`{k}`" for k in receipt_keys)
            rows.append(f"| `{field}` | {keys}, {when} | {', '.join(sorted(ENGINE_ITEMS))} |")
    for field, why in NOT_PINNED_PER_LEG.items():
        rows.append(f"| `{field}` | {why} | |")
    return "\n".join(rows)


# ------------------------------------------------------------------------ reading a receipt


def _lookup(data: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return node is not None, node


def _recorded(leg_dir: Path) -> tuple[dict[str, Any], str | None]:
    """leg.json (with contract.json under `contract`) as recorded; (None-ish, why) when unreadable."""
    try:
        meta = read_receipt(leg_dir / LEG_FILE)
    except (OSError, ValueError) as err:
        return {}, f"{leg_dir / LEG_FILE}: unreadable ({err})"
    if not isinstance(meta, dict):
        return {}, f"{leg_dir / LEG_FILE}: not a JSON object"
    contract = leg_dir / CONTRACT_FILE
    if contract.is_file():
        try:
            meta = {**meta, "contract": read_receipt(contract)}
        except (OSError, ValueError) as err:
            return {}, f"{contract}: unreadable ({err})"
    return meta, None


def bind_leg(leg_dir: str | Path, candidate: Candidate) -> list[BindingProblem | str]:
    """Every way this leg fails to be evidence for the candidate (empty: bound).

    A leg that did not run binds nothing and claims nothing; its cell is `not run` on its own."""
    leg_dir = Path(leg_dir)
    if not leg_dir.is_dir():  # a bare bench JSON records no identity at all
        return [f"{leg_dir.name}: a bare result file records no candidate identity (weights, image, device ...)"]
    meta, unreadable = _recorded(leg_dir)
    if unreadable:
        return [unreadable]
    if meta.get("not_run_reason"):
        return []
    item, arm = str(meta.get("item")), str(meta.get("arm"))
    try:
        read_by = set(sensitive_components(EvidenceItem(item)))
    except ValueError:
        return [f"{leg_dir.name}: leg.json item {item!r} is not an evidence item"]
    problems: list[BindingProblem | str] = []
    for pin in pins(candidate):
        if pin.component not in read_by or (pin.items is not None and item not in pin.items):
            continue
        if pin.arms is not None and arm not in pin.arms:
            continue
        if pin.component is Component.SOURCE and pin.field == "source.commit" and pin.value == WORKING_TREE:
            problems.append(f"{leg_dir.name}: source not bound: the manifest's source.commit is {WORKING_TREE!r}, "
                            "which names no commit (outside a git checkout it cannot be resolved)")
            continue
        problem = _check(pin, meta, leg_dir)
        if problem is not None:
            problems.append(problem)
    problems += _switch_problems(meta, item, arm, leg_dir)
    if item == "throughput":
        problems += _workload_problems(meta, candidate.manifest, leg_dir)
    return problems


ARM_ITEMS = frozenset({"forward", "backward", "update", "quality", "throughput"})
SWITCH = "VLLM_BATCH_INVARIANT"


def _switch_problems(meta: dict[str, Any], item: str, arm: str, leg_dir: Path) -> list[BindingProblem]:
    """The arm is what its one switch selected: a leg of an item that compares or claims an arm
    must record the switch it ran with (vLLM reads it as 0 when unset, so a "BI=1" leg that does
    not record it is not shown to be BI=1). leg.json's own check refuses a contradicting value."""
    if item not in ARM_ITEMS or arm not in ("bi1", "bi0"):
        return []
    recorded = (meta.get("env") or {}).get(SWITCH) if isinstance(meta.get("env"), dict) else None
    want = "1" if arm == "bi1" else "0"
    if recorded is None:
        return [BindingProblem(leg_dir.name, str(leg_dir / LEG_FILE), Component.RECIPE, f"env.{SWITCH} ({arm})", want,
                               None, "unrecorded")]
    if str(recorded) != want:
        return [BindingProblem(leg_dir.name, str(leg_dir / LEG_FILE), Component.RECIPE, f"env.{SWITCH} ({arm})", want,
                               recorded, "differs")]
    return []


def _workload_problems(meta: dict[str, Any], manifest: Manifest, leg_dir: Path) -> list[BindingProblem]:
    """A throughput leg ran the candidate's workload at one of its concurrencies, with the number of
    requests the candidate pins there."""
    w, file = manifest.workload, str(leg_dir / LEG_FILE)
    conc = meta.get("concurrency")
    if isinstance(conc, bool) or not isinstance(conc, int):
        return [BindingProblem(leg_dir.name, file, Component.WORKLOAD, "workload.concurrencies",
                               list(w.concurrencies), conc, "unrecorded" if conc is None else "differs")]
    want = w.prompts_at(conc)
    if want is None:
        return [BindingProblem(leg_dir.name, file, Component.WORKLOAD, "workload.concurrencies", list(w.concurrencies),
                               conc, "differs")]
    ok, recorded = _lookup(meta, "resolved_config.num_prompts")
    if not ok:
        return [BindingProblem(leg_dir.name, file, Component.WORKLOAD, f"workload.num_prompts (c={conc})", want, None,
                               "unrecorded")]
    if not _int(want, recorded):
        return [BindingProblem(leg_dir.name, f"{file} (resolved_config.num_prompts)", Component.WORKLOAD,
                               f"workload.num_prompts (c={conc})", want, recorded, "differs")]
    return []


def workload_disagreements(w: Workload, c: ThroughputCriteria) -> list[str]:
    """Where the candidate's workload and the throughput question ask for different runs: a leg is
    bound by the first and judged by the second, so no leg is evidence under both."""
    out = [f"{name} is {_show(mine)} in the manifest, {_show(theirs)} in the question"
           for name, mine, theirs in (("input_len", w.input_len, c.input_len), ("output_len", w.output_len, c.output_len),
                                      ("ignore_eos", w.ignore_eos, c.ignore_eos), ("warmups", w.warmups, c.warmups))
           if mine != theirs]
    if missing := sorted(set(c.concurrencies) - set(w.concurrencies)):
        out.append(f"the question judges concurrencies {missing} that the manifest's workload does not run")
    for conc in sorted(set(c.concurrencies) & set(w.concurrencies)):
        theirs = (c.num_prompts or {}).get(conc)
        if theirs is not None and theirs != w.prompts_at(conc):
            out.append(f"num_prompts at c={conc} is {w.prompts_at(conc)} in the manifest, {theirs} in the question")
    return out


def _agrees(pin: Pin, recorded: Any) -> bool:
    """A recorded value of a type the comparison cannot read agrees with nothing."""
    try:
        return bool(pin.same(pin.value, recorded))
    except (TypeError, ValueError, AttributeError, OverflowError):
        return False


def _check(pin: Pin, meta: dict[str, Any], leg_dir: Path) -> BindingProblem | None:
    found = [(k, v) for k in pin.receipt_keys for ok, v in [_lookup(meta, k)] if ok]
    file = leg_dir / (CONTRACT_FILE if pin.receipt_keys[0].startswith("contract.") else LEG_FILE)
    if not found and pin.absent_ok:
        return None
    if not found:
        return BindingProblem(leg_dir.name, str(file), pin.component, pin.field, pin.value, None, "unrecorded")
    # Every place the receipt records the value must agree: one contradiction names another candidate.
    for key, value in found:
        if not _agrees(pin, value):
            return BindingProblem(leg_dir.name, f"{file} ({key})", pin.component, pin.field, pin.value, value, "differs")
    return None


def bind_legs(leg_dirs: Sequence[str | Path], candidate: Candidate) -> list[BindingProblem | str]:
    return [p for leg in leg_dirs for p in bind_leg(leg, candidate)]
