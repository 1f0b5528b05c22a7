"""The update's canaries: a passing receipt set (one BI=1 update leg: the step, its recorded rerun
and a bitwise post-update forward on the updated weights) and one planted error per rule, each of
which the judge must not pass. `tica.canaries` runs them with every other item's."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tica.canary_legs import FAIL, INCONCLUSIVE, Canary, edit_jsonl, edit_meta, perturb_arrays
from tica.canary_legs import ckpt as _ckpt
from tica.canary_legs import forward_files as _forward_files
from tica.canary_legs import grad_rows as _grad_rows
from tica.canary_legs import jsonl as _jsonl
from tica.canary_legs import leg_meta as _meta
from tica.canary_legs import proc as _proc
from tica.canary_legs import set_row as _set_row
from tica.canary_legs import write_leg as _write_leg
from tica.evidence import EvidenceItem
from tica.items.update.criteria import UpdateCriteria
from tica.items.update.receipts import POST_FORWARD_DIR
from tica.metrics import forward_metrics
from tica.question import Question
from tica.seal import seal_leg
from tica.verdict import Verdict

E = EvidenceItem

# The question the built-in canaries and the committed fixtures are judged under.
QUESTION: dict[str, Any] = {
    "name": "real-update", "compared": "weights changed, post-update forward",
    "computation": "one AdamW step, weight sync, forward re-check",
    "pass_line": "weights change, rollout reloads, BI=1 forward still bitwise",
    "criteria": {"item": "update"}}


def build_update(question: Question, dest: Path) -> list[Path]:
    c: UpdateCriteria = question.criteria  # type: ignore[assignment]
    updated = "blake3:" + "a9d3" * 16
    # with the rerun an update question may ask for (the same step again: the same grad norm and weights)
    rows = _grad_rows(1, lambda s: {"optimizer": c.optimizer, "weights_changed_tensors": 24,
                                    "weights_total_tensors": 24, "updated_weights_hash": updated,
                                    "reloaded_by_rollout": True,
                                    "tica/update_rerun": {"grad_norm": 0.8 + 0.1 * s, "updated_weights_hash": updated,
                                                          "how": "a fresh trainer, the same weights and batch"}})
    post_steps = list(range(1, c.post_update_steps + 1))
    files = {"metrics.jsonl": _jsonl(rows),
             **_forward_files("bi1", post_steps, 0.01, 3, lambda s: updated, f"{POST_FORWARD_DIR}/")}
    meta = _meta("update", "bi1", trainer="vllm_kernels", processes=[_proc("trainer", 6100), _proc("engine_core", 6101)])
    return [_write_leg(dest / "update_bi1", meta, files)]


def set_rerun(**kv: Any) -> Callable[[list[dict[str, Any]]], None]:
    def f(rows: list[dict[str, Any]]) -> None:
        rows[0]["tica/update_rerun"].update(kv)
    return f


def needs_rerun(question: Question | None) -> str | None:
    if question is not None and getattr(question.criteria, "reproduced_on_rerun", False):
        return None
    return "the question does not ask for a reproducible update (criteria.reproduced_on_rerun off)"


def shift_post_forward(leg: Path, delta: float) -> None:
    """Every post-update rollout logprob off by `delta`, metrics recomputed honestly."""
    post = leg / POST_FORWARD_DIR
    rows = []
    for path in sorted((post / "arrays").glob("step_*.npz")):
        with np.load(path) as z:
            data = {k: z[k] for k in z.files}
        data["rollout_logprobs"] = data["rollout_logprobs"] + np.float32(delta)
        data["decode_logprobs"] = data["rollout_logprobs"].copy()
        np.savez(path, **data)
        rows.append(forward_metrics(data["trainer_logprobs"], data["rollout_logprobs"]))
    edit_jsonl(post / "metrics.jsonl", lambda rs: [{**r, **m} for r, m in zip(rs, rows)], leg)


def as_bi0(leg: Path) -> None:
    """Relabel a leg as the BI=0 arm (arm, switch and trainer together, as a BI=0 producer writes them)."""
    edit_meta(leg, lambda m: (m.update(arm="bi0", trainer="megatron"), m["env"].update(VLLM_BATCH_INVARIANT="0")))


def update_as_bi0(q: Question, legs: list[Path]) -> None:
    """An update leg of the BI=0 arm whose post-update logprobs are off by 0.1: no BI=1 evidence."""
    shift_post_forward(legs[0], 0.1)
    as_bi0(legs[0])


def drop_post_update_step(q: Question, legs: list[Path]) -> None:
    leg = legs[0]
    rows = [json.loads(l) for l in (leg / POST_FORWARD_DIR / "metrics.jsonl").read_text().splitlines() if l.strip()]
    last = rows[-1]["step"]
    (leg / POST_FORWARD_DIR / "arrays" / f"step_{last:04d}.npz").unlink(missing_ok=True)
    edit_jsonl(leg / POST_FORWARD_DIR / "metrics.jsonl", lambda rs: [r for r in rs if r["step"] != last], leg)


# The must_record canary every item has is tica.canaries' (it reads the question, not the item);
# the rerun canaries are switched off where the question asks for no rerun (tica.canaries.SWITCHED_OFF).
CANARIES: tuple[Canary, ...] = (
    Canary("update.weights_change", E.UPDATE, "the optimizer step changes the weights", FAIL,
           lambda q, legs: edit_jsonl(legs[0] / "metrics.jsonl", _set_row(0, weights_changed_tensors=0), legs[0])),
    Canary("update.rollout_reloads", E.UPDATE, "weights synced to the rollout engine", FAIL,
           lambda q, legs: edit_jsonl(legs[0] / "metrics.jsonl", _set_row(0, reloaded_by_rollout=False), legs[0])),
    Canary("update.post_forward_bitwise", E.UPDATE, "forward re-checked after the update", FAIL,
           lambda q, legs: perturb_arrays(legs[0], 1, POST_FORWARD_DIR)),
    Canary("update.post_forward_on_new_weights", E.UPDATE, "the re-check reads the updated weights", FAIL,
           lambda q, legs: edit_jsonl(legs[0] / POST_FORWARD_DIR / "metrics.jsonl",
                                      _set_row(0, checkpoint_version=_ckpt(1)), legs[0])),
    Canary("update.post_forward_present", E.UPDATE, "no post-update forward is not a pass", INCONCLUSIVE,
           lambda q, legs: (shutil.rmtree(legs[0] / POST_FORWARD_DIR), seal_leg(legs[0])) and None),
    Canary("update.post_update_steps", E.UPDATE, "every one of the frozen post-update steps present", INCONCLUSIVE,
           drop_post_update_step),
    Canary("update.rerun_grad_norm", E.UPDATE, "a rerun of the step gives the same grad norm", FAIL,
           lambda q, legs: edit_jsonl(legs[0] / "metrics.jsonl", set_rerun(grad_norm=0.9000001), legs[0])),
    Canary("update.rerun_weights", E.UPDATE, "a rerun of the step gives the same updated weights", FAIL,
           lambda q, legs: edit_jsonl(legs[0] / "metrics.jsonl",
                                      set_rerun(updated_weights_hash="blake3:" + "b7e1" * 16), legs[0])),
    Canary("update.rerun_recorded", E.UPDATE, "no rerun recorded is not a reproducible update", INCONCLUSIVE,
           lambda q, legs: edit_jsonl(legs[0] / "metrics.jsonl", lambda rows: rows[0].pop("tica/update_rerun"),
                                      legs[0])),
    Canary("update.bi1_leg_ran", E.UPDATE, "a BI=1 update leg ran (a BI=0 re-check is no bitwise evidence)",
           frozenset({Verdict.NOT_RUN}), update_as_bi0),
)
