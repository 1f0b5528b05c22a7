"""Module backward: gradients finite and reaching the master weights; forward equals the
deployed bytes where weights are quantized. A grad norm of exactly 0 is checked against the
within-group rewards before it is called a fault. The claim is the true on-policy trainer's
backward, so a BI=1 leg must have run. A gradient check the producer recorded (analytic
backward vs float64 autograd, with a planted error per op) is judged: a failed check fails, and
a check whose planted errors were not all detected is not shown able to fail, so it is no pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tica.confounders import require_recorded
from tica.evidence import EvidenceItem
from tica.grad_reading import GRAD_HEADERS, is_quantized, read_grads
from tica.items.backward.criteria import BackwardCriteria
from tica.judging import Findings, cell, led, leg_label, md_table, skipped_leg, wrong_question_cell
from tica.question import Question
from tica.receipts import METRICS_FILE, BackwardStep, Leg, load_leg, load_step_metrics
from tica.verdict import Verdict, VerdictCell


def judge_backward(question: Question, leg_paths: Sequence[str | Path]) -> VerdictCell:
    item = EvidenceItem.BACKWARD
    if (wrong := wrong_question_cell(item, question)) is not None:
        return wrong
    findings = Findings()
    criteria: BackwardCriteria = question.criteria  # type: ignore[assignment]
    legs = [load_leg(p) for p in leg_paths]
    numbers: dict[str, Any] = {"legs": []}
    tables: dict[str, str] = {}
    ran: list[Leg] = []
    for leg in legs:
        label = leg_label(leg)
        if skipped_leg(item, leg, findings):
            continue
        ran.append(leg)
        steps = load_step_metrics(leg.path / METRICS_FILE, BackwardStep)
        reading = read_grads(steps, criteria.min_params_with_grad_fraction,
                             criteria.require_deployed_bytes_forward, is_quantized(leg), label, leg.path,
                             criteria.gradcheck_rel_tol, leg.meta.trainer)
        findings.extend(reading.findings)
        numbers["legs"].append({"path": str(leg.path), "arm": leg.arm, "steps": reading.steps,
                                "verdict": reading.findings.verdict.value})
        tables[f"per step: {leg.arm} {leg.path.name}"] = md_table(GRAD_HEADERS, reading.rows)
    require_recorded(findings, question, [(f"{l.arm} {l.path.name}", l.meta) for l in ran])
    if not legs:
        findings.not_run("no backward leg")
    elif not any(l.arm == "bi1" for l in ran):
        findings.not_run("no BI=1 backward leg ran: the true on-policy trainer's backward has no evidence")
    summary = (findings.deciding() if findings.verdict is Verdict.NOT_RUN
               else led(findings, f"{len(ran)} backward leg(s) judged"))
    return cell(item, question, findings, summary, numbers, tables, {str(l.path): l.digest for l in legs})
