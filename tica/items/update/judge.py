"""Real update: one optimizer step, weight sync to the rollout engine, forward re-checked on
the updated weights. The claim is BI=1's: a BI=1 leg must have run, and its post-update forward
must be bitwise equal at every one of the question's `post_update_steps` steps (fewer is not a
pass). A BI=0 leg's post-update forward is reported, never a bitwise claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tica import digests
from tica.evidence import EvidenceItem
from tica.forward_reading import STEP_HEADERS, read_forward
from tica.grad_reading import GRAD_HEADERS, is_quantized, read_grads
from tica.items.update.criteria import UpdateCriteria
from tica.items.update.receipts import POST_FORWARD_DIR
from tica.judging import Findings, cell, led, leg_label, skipped_leg, md_table, wrong_question_cell
from tica.confounders import require_recorded
from tica.question import Question
from tica.receipts import METRICS_FILE, Leg, UpdateStep, load_leg, load_step_metrics
from tica.verdict import Verdict, VerdictCell

UPDATE_HEADERS = ["step", "optimizer", "tensors changed", "tensors total", "updated weights", "reloaded by rollout",
                  "rerun"]


def rerun_findings(s: UpdateStep, label: str) -> Findings:
    """The question asks for a reproducible update: the recorded rerun's grad norm and updated
    weights must equal the step's own, compared here from the values, never from the producer's flags."""
    f = Findings()
    r = s.rerun
    if r is None:
        f.inconclusive(f"{label}step {s.step}: no rerun of the update recorded, so its reproducibility is unknown")
        return f
    if s.grad_norm is None or not s.updated_weights_hash:
        f.inconclusive(f"{label}step {s.step}: the step's own grad norm or updated weights hash is unknown, so the "
                       "rerun has nothing to match")
        return f
    if r.grad_norm != s.grad_norm:
        f.fail(f"{label}step {s.step}: the rerun's grad norm {r.grad_norm!r} differs from the step's {s.grad_norm!r}")
    if digests.canonical(r.updated_weights_hash) != digests.canonical(s.updated_weights_hash):
        f.fail(f"{label}step {s.step}: the rerun's updated weights {r.updated_weights_hash} differ from the step's "
               f"{s.updated_weights_hash}")
    return f


def rerun_cell(s: UpdateStep) -> str:
    if s.rerun is None:
        return "not run"
    verdict = rerun_findings(s, "").verdict
    return {Verdict.PASS: "same grad norm and weights", Verdict.FAIL: "differs"}.get(verdict, "unknown")


def judge_update(question: Question, leg_paths: Sequence[str | Path]) -> VerdictCell:
    item = EvidenceItem.UPDATE
    if (wrong := wrong_question_cell(item, question)) is not None:
        return wrong
    findings = Findings()
    criteria: UpdateCriteria = question.criteria  # type: ignore[assignment]
    legs = [load_leg(p) for p in leg_paths]
    numbers: dict[str, Any] = {"legs": [], "post_update_steps": criteria.post_update_steps}
    tables: dict[str, str] = {}
    ran: list[Leg] = []
    for leg in legs:
        label = leg_label(leg)
        if skipped_leg(item, leg, findings):
            continue
        ran.append(leg)
        f = Findings()
        steps: list[UpdateStep] = load_step_metrics(leg.path / METRICS_FILE, UpdateStep)
        grads = read_grads(steps, 1.0, False, is_quantized(leg), label, leg.path, criteria.gradcheck_rel_tol,
                           leg.meta.trainer)
        f.extend(grads.findings)
        rows = []
        for s in steps:
            if s.optimizer != criteria.optimizer:
                f.inconclusive(f"{label}step {s.step}: optimizer {s.optimizer!r}, the question asks about {criteria.optimizer!r}")
            frac = s.weights_changed_tensors / s.weights_total_tensors
            if frac < criteria.min_weight_change_fraction:
                f.fail(f"{label}step {s.step}: {s.weights_changed_tensors} of {s.weights_total_tensors} weight tensors "
                       f"changed ({frac:.0%} < {criteria.min_weight_change_fraction:.0%}): the step did not update")
            if s.reloaded_by_rollout is False:
                f.fail(f"{label}step {s.step}: the rollout engine did not reload the updated weights")
            elif s.reloaded_by_rollout is None:
                f.inconclusive(f"{label}step {s.step}: weight sync to the rollout engine not recorded")
            if not s.updated_weights_hash:
                f.inconclusive(f"{label}step {s.step}: updated weights not named by a content hash")
            elif digests.canonical(s.updated_weights_hash) in {
                    digests.canonical(h) for h in (leg.meta.resolved_config.get("weights_hash"),
                                                   getattr(s, "weights_hash_before", None)) if isinstance(h, str)}:
                f.fail(f"{label}step {s.step}: the updated weights {s.updated_weights_hash} are the weights the step "
                       "started from: nothing was updated")
            if criteria.reproduced_on_rerun:
                f.extend(rerun_findings(s, label))
            rows.append([s.step, s.optimizer, s.weights_changed_tensors, s.weights_total_tensors,
                         s.updated_weights_hash, s.reloaded_by_rollout, rerun_cell(s)])
        post_dir = leg.path / POST_FORWARD_DIR
        post: dict[str, Any] | None = None
        if not (post_dir / METRICS_FILE).is_file():
            if criteria.recheck_forward_bitwise:
                f.inconclusive(f"{label}no post-update forward ({POST_FORWARD_DIR}/): the update's forward was not re-checked")
        else:
            # BI=1 must stay bitwise after the update; BI=0's post-update magnitude is reported only.
            check_bi1 = leg.arm == "bi1" and criteria.recheck_forward_bitwise
            reading = read_forward(post_dir, leg.arm if check_bi1 else "bi0",
                                   criteria.post_update_steps if check_bi1 else 1, None, f"{label}post-update ")
            f.extend(reading.findings)
            tables[f"post-update forward: {leg.arm} {leg.path.name}"] = md_table(STEP_HEADERS, reading.rows)
            post = {"steps": reading.steps, "verdict": reading.findings.verdict.value}
            updated = steps[-1].updated_weights_hash if steps else None
            served = {digests.canonical(s["checkpoint_version"]) for s in reading.steps
                      if s["checkpoint_version"] is not None}
            if updated and any(s["checkpoint_version"] is None for s in reading.steps):
                f.inconclusive(f"{label}post-update forward: checkpoint_version unknown, so it is not shown to have "
                               f"run on the updated weights {updated}")
            if updated and served and served != {digests.canonical(updated)}:
                f.fail(f"{label}post-update forward ran on {sorted(served)}, not the updated weights {updated}")
        findings.extend(f)
        tables[f"per step: {leg.arm} {leg.path.name}"] = md_table(GRAD_HEADERS, grads.rows)
        tables[f"update: {leg.arm} {leg.path.name}"] = md_table(UPDATE_HEADERS, rows)
        numbers["legs"].append({"path": str(leg.path), "arm": leg.arm, "steps": grads.steps, "update": [
            dict(zip(UPDATE_HEADERS, r)) for r in rows], "post_forward": post, "verdict": f.verdict.value})
    require_recorded(findings, question, [(f"{l.arm} {l.path.name}", l.meta) for l in ran])
    if not legs:
        findings.not_run("no update leg")
    elif not any(l.arm == "bi1" for l in ran):
        findings.not_run("no BI=1 update leg ran: the update's bitwise re-check has no evidence")
    summary = (findings.deciding() if findings.verdict is Verdict.NOT_RUN
               else led(findings, f"{len(numbers['legs'])} update leg(s) judged"))
    return cell(item, question, findings, summary, numbers, tables, {str(l.path): l.digest for l in legs})
