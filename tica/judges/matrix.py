"""The shape and load matrix (issue 14), judged: every cell leg under the frozen forward question,
each failing cell with the cause its own recorded probes name, and each shape's planted faults
beside their control.

A cell is one sealed leg ``mx-<candidate>-<shape>-<load>-<scored>`` (written by
``tica.legs.vllm_kernels.matrix``): one rollout batch, scored on its generated tokens (``decode``,
against vLLM's sampled-token logprobs) or on prompt + response (``prefill``), before or after the
update (``_post_update``). The verdict is ``judge_forward``'s, nothing else. The cause is read, for
a cell that does not pass, from what the leg recorded beside its arrays, in this order:

1. a one-change variant of the trainer that matches bitwise where the product trainer does not
   names the change (e.g. ``vllm_decode_rows``: the generated rows computed as vLLM's pure-decode
   steps compute them, which needs the engine's step composition);
2. vLLM's own prompt logprobs of one sequence differing scored alone and in the load's batch: a
   batch-variant engine (issue 33: FP8 experts quantize their input with one scale over the batch),
   which no trainer can match;
3. vLLM's own decode and prefill logprobs differing on that batch: the rows depend on the engine
   step (a kernel whose launch or tile follows the step, not isolated by a variant);
4. a vocabulary that is not a multiple of 64: isolated when a control shape (the same model with the
   vocabulary padded to 64) passes the same load in the same matrix, "suspected" when no such
   control ran, and not named at all when the same shape passes the same cell under another
   candidate of the run (the trainer's logits path is the candidate-independent part);
5. otherwise ``unexplained``.

A trainer that says it does not follow part of vLLM's computation (an FP8 cell's experts:
``resolved_config.fp8.trainer.experts``) has that sentence added to its cause.

Nothing here makes a cell pass: a cause is only ever attached to a cell that did not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from tica.errors import ReceiptError
from tica.items.forward.judge import judge_forward
from tica.judges.planted import CanaryStatus, canary_status
from tica.question import Question
from tica.receipts import load_jsonl, load_step_arrays, read_receipt, step_arrays_path
from tica.routing import compare_routing
from tica.verdict import Verdict

# A load is any name without '-' (the producer's LOADS grow: a new load is judged, never dropped);
# the shape before it may hold '-'.
LEG_RE = re.compile(r"^mx-(?P<candidate>[a-z0-9]+)-(?P<shape>.+)-(?P<load>[a-z0-9_]+)-"
                    r"(?P<scored>decode|prefill|decode_post_update|prefill_post_update|fault_[a-z_]+)$")
SHAPE_KEYS = ("architecture", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "tie_word_embeddings", "attention_bias")


class MatrixCell(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    run: str
    candidate: str
    overlay_parts: tuple[str, ...]
    shape: str
    load: str
    scored: str
    verdict: Verdict
    n_diff: int | None  # tokens whose logprob differs bitwise; None where the leg could not be read
    n_tokens: int | None
    vllm_decode_vs_prefill: int | None
    cause: str | None  # None exactly when the cell passed
    reasons: tuple[str, ...]
    # a MoE cell's routes compared (tica.routing): None where the leg recorded no routes
    routing: str | None = None


def _row(leg: Path) -> dict:
    rows = load_jsonl(leg / "metrics.jsonl")
    return rows[0] if rows else {}


def _config(leg: Path) -> dict:
    meta = read_receipt(leg / "leg.json")
    return (meta.get("resolved_config") or {}) if isinstance(meta, dict) else {}


def recorded_name(row: dict, cfg: dict) -> dict[str, object]:
    """Each part of a cell's name as the leg recorded running it (None: not recorded)."""
    scored = row.get("tica/scored", cfg.get("scored"))
    if isinstance(scored, str) and "update" in cfg:  # scored after the update vLLM reloaded
        scored = f"{scored}_post_update"
    return {"candidate": cfg.get("candidate"), "shape": cfg.get("model_shape"),
            "load": row.get("tica/load", cfg.get("load")), "scored": scored}


def name_problems(m: re.Match, row: dict, cfg: dict) -> list[str]:
    """Why a cell's folder name is not what its leg recorded running: every part of the name is
    checked against the content (candidate, shape, load, scored), and a part the leg does not
    record cannot be shown."""
    out = []
    for part, value in recorded_name(row, cfg).items():
        if value is None:
            out.append(f"is named for {part} {m[part]!r}, which the leg does not record")
        elif value != m[part]:
            out.append(f"is named for {part} {m[part]!r} but recorded running {part} {value!r}")
    return out


def _pad64(v: int) -> int:
    return -(-v // 64) * 64


def _cause(scored: str, row: dict, cfg: dict, control_passed: bool | None, peer_passed: bool) -> str:
    """Every cause the leg's own probes support, in the module docstring's order, joined."""
    kind = "decode" if scored.startswith("decode") else "prefill"
    variants = row.get("tica/variants")
    if not isinstance(variants, dict) or "product" not in variants:
        return "unknown: the leg recorded no trainer variants to name a cause with"
    causes = []
    product = variants["product"].get(f"{kind}_n_diff")
    for name, v in variants.items():
        if name != "product" and v.get(f"{kind}_n_diff") == 0 and product:
            causes.append(f"{name}: {v.get('changes')} matches bitwise ({product} tokens differ without it)")
    alone = row.get("tica/vllm_alone_vs_batch_n_bitwise_diff")
    engine_only = not causes  # no trainer variant matched: what vLLM does against itself is named, each part
    if engine_only and isinstance(alone, int) and alone > 0:
        causes.append(f"batch-variant engine: vLLM's own prompt logprobs of one sequence differ on {alone} of "
                      f"{row.get('tica/vllm_alone_vs_batch_n_tokens')} tokens scored alone vs in this batch, so no "
                      "trainer can match them")
    self_gap = row.get("tica/vllm_decode_vs_prefill_n_bitwise_diff")
    if engine_only and isinstance(self_gap, int) and self_gap > 0:
        causes.append(f"engine step: vLLM's own decode and prefill logprobs differ on {self_gap} generated tokens "
                      "of this batch, so a row's bits follow the step it ran in (no one-change variant reproduces it)")
    vocab = cfg.get("vocab_size")
    if isinstance(vocab, int) and vocab % 64 and not peer_passed:
        if control_passed:
            causes.append(f"vocabulary {vocab} not a multiple of 64: the same model with {_pad64(vocab)} passes this "
                          "load (control shape); the op is not isolated")
        else:
            causes.append(f"vocabulary {vocab} not a multiple of 64 (suspected: no padded control of this shape "
                          "passed this load in this run)")
    fp8 = cfg.get("fp8")
    experts = ((fp8.get("trainer") or {}).get("experts")) if isinstance(fp8, dict) else None
    if isinstance(experts, str):
        causes.append(f"trainer: {experts}")
    return "; ".join(causes) or "unexplained: no recorded probe accounts for it"


def _routing(leg: Path):
    """The cell's routes compared, or None where its arrays hold none (a dense model's)."""
    arrays = load_step_arrays(step_arrays_path(leg, 1))
    if arrays.rollout_experts is None or arrays.trainer_experts is None:
        return None
    return compare_routing(arrays.seq_lens, arrays.rollout_experts, arrays.trainer_experts,
                           arrays.rollout_logprobs, arrays.trainer_logprobs)


def rank_routes(leg: Path) -> tuple[int, int] | None:
    """An EP cell's trainer ranks: (ranks, token-layer routes where some rank's experts differ from
    ``trainer_experts``); None where the leg recorded one rank only."""
    arrays = load_step_arrays(step_arrays_path(leg, 1))
    ranks = arrays.trainer_experts_ranks
    if ranks is None:
        return None
    differ = (np.sort(ranks, -1) != np.sort(arrays.trainer_experts, -1)[None]).any(-1).any(0)
    return int(ranks.shape[0]), int(differ.sum())


def _is_control(cfg: dict, other: dict) -> bool:
    v = cfg.get("vocab_size")
    return (isinstance(v, int) and v % 64 != 0 and other.get("vocab_size") == _pad64(v)
            and all(cfg.get(k) == other.get(k) for k in SHAPE_KEYS)
            # a TP=2 cell's control is the padded shape at TP=2 (a receipt without the key ran TP=1), an EP cell's at EP
            and cfg.get("tensor_parallel_size", 1) == other.get("tensor_parallel_size", 1)
            and bool(cfg.get("enable_expert_parallel")) == bool(other.get("enable_expert_parallel")))


def matrix_legs(root: Path) -> list[tuple[str, Path, re.Match]]:
    """(run, leg, name match) for every matrix leg under ``root`` (a run folder per child, or legs).
    A leg whose folder is not named as a matrix cell is refused by name, never passed over."""
    out = []
    for d in sorted(root.rglob("leg.json")):
        leg = d.parent
        m = LEG_RE.match(leg.name)
        if m is None:
            raise ReceiptError(d, "<folder name>", f"{leg.name!r} is not a matrix cell "
                               "(mx-<candidate>-<shape>-<load>-<scored>): not judged, and not skipped")
        out.append((leg.parent.name, leg, m))
    return out


def matrix_cells(question: Question, root: str | Path) -> list[MatrixCell]:
    root = Path(root)
    legs = [(run, leg, m) for run, leg, m in matrix_legs(root) if not m["scored"].startswith("fault_")]
    judged: dict[Path, tuple[Verdict, tuple[str, ...]]] = {}
    for _, leg, _ in legs:
        try:
            c = judge_forward(question, [leg])
            judged[leg] = (c.verdict, c.reasons)
        except ReceiptError as err:
            judged[leg] = (Verdict.INCONCLUSIVE, (f"inconclusive: {err}",))
    configs = {leg: _safe(_config, leg, {}) for _, leg, _ in legs}
    cells = []
    for run, leg, m in legs:
        verdict, reasons = judged[leg]
        row, cfg = _safe(_row, leg, {}), configs[leg]
        mislabelled = name_problems(m, row, cfg)
        if mislabelled and verdict is not Verdict.FAIL:
            # the folder's name is a label; what the producer recorded running is the content
            verdict, reasons = Verdict.INCONCLUSIVE, (*(f"inconclusive: {leg.name} {p}" for p in mislabelled), *reasons)
        control = None
        for run2, leg2, m2 in legs:
            if (run2 == run and m2["candidate"] == m["candidate"] and m2["load"] == m["load"]
                    and m2["scored"] == m["scored"] and _is_control(cfg, configs[leg2])):
                control = judged[leg2][0] is Verdict.PASS
        peer_passed = any(run2 == run and m2["candidate"] != m["candidate"] and m2["shape"] == m["shape"]
                          and m2["load"] == m["load"] and m2["scored"] == m["scored"]
                          and judged[leg2][0] is Verdict.PASS for run2, leg2, m2 in legs)
        overlay = cfg.get("source_overlay") or {}
        routing = _safe(_routing, leg, None)
        ranks = _safe(rank_routes, leg, None)
        if cfg.get("enable_expert_parallel") and "moe" in cfg and ranks is None and verdict is Verdict.PASS:
            verdict, reasons = Verdict.INCONCLUSIVE, (
                "inconclusive: an expert-parallel cell that recorded no routes from its trainer's ranks", *reasons)
        if ranks is not None and ranks[1] and verdict is not Verdict.FAIL:
            # the replicated router chose other experts on another rank: not the computation vLLM makes
            verdict, reasons = Verdict.INCONCLUSIVE, (
                f"inconclusive: the trainer's {ranks[0]} EP ranks routed {ranks[1]} token-layer routes differently",
                *reasons)
        cause = None
        if verdict is Verdict.FAIL:
            cause = _cause(m["scored"], row, cfg, control, peer_passed)
            if routing is not None and not routing.identical:  # a MoE's first divergence is its first route flip
                cause = f"{routing.sentence()}; {cause}"
        elif verdict is not Verdict.PASS:
            cause = f"not judged: {verdict.value}"
        cells.append(MatrixCell(
            run=run, candidate=m["candidate"], overlay_parts=tuple(overlay.get("parts") or
                                                                 (["rmsnorm"] if overlay else [])),
            shape=m["shape"], load=m["load"], scored=m["scored"], verdict=verdict,
            n_diff=row.get("tica/n_bitwise_diff"), n_tokens=row.get("tica/n_tokens"),
            vllm_decode_vs_prefill=row.get("tica/vllm_decode_vs_prefill_n_bitwise_diff"),
            cause=cause, reasons=reasons, routing=None if routing is None else routing.sentence() + (
                "" if ranks is None else f"; trainer routes from {ranks[0]} EP ranks, "
                + ("identical" if not ranks[1] else f"{ranks[1]} token-layer routes differ between them"))))
    return cells


def _safe(fn, leg: Path, default):
    try:
        return fn(leg)
    except (OSError, ValueError, ReceiptError):
        return default


def matrix_canaries(question: Question, root: str | Path) -> list[tuple[str, CanaryStatus]]:
    """(run, status) for every planted-fault leg of the matrix, judged beside the control it names."""
    out = []
    for run, leg, m in matrix_legs(Path(root)):
        if not m["scored"].startswith("fault_"):
            continue
        control = _config(leg).get("control")
        if not isinstance(control, str) or not (leg.parent / control).is_dir():
            raise ReceiptError(leg / "leg.json", "resolved_config.control", "names no control leg beside it")
        out.append((run, canary_status(question, leg, leg.parent / control)))
    return out


def summary_table(cells: Iterable[MatrixCell]) -> str:
    """Markdown: one row per (run, candidate, shape, scored), one column per load (pass, or the
    differing tokens)."""
    cells = list(cells)
    known = ("c1", "c16", "c64", "c256s", "c320", "chunked", "packed_limit", "moe_packed")  # the producer's order; others after
    loads = sorted({c.load for c in cells}, key=lambda x: (known.index(x) if x in known else len(known), x))
    grid: dict[tuple, dict[str, str]] = {}
    for c in cells:
        key = (c.run, c.candidate, c.shape, c.scored.replace("_post_update", " (after update)"))
        if c.verdict is Verdict.PASS:
            mark = "pass"
        elif c.verdict is Verdict.FAIL:
            mark = f"{c.n_diff}/{c.n_tokens}"
        else:
            mark = c.verdict.value
        grid.setdefault(key, {})[c.load] = mark
    lines = ["| run | candidate | shape | scored | " + " | ".join(loads) + " |",
             "|---|---|---|---|" + "---|" * len(loads)]
    for key in sorted(grid):
        lines.append("| " + " | ".join(key) + " | " + " | ".join(grid[key].get(x, "—") for x in loads) + " |")
    return "\n".join(lines)
