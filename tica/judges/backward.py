"""Module backward: gradients finite and reaching the master weights; forward equals the
deployed bytes where weights are quantized. A grad norm of exactly 0 is checked against the
within-group rewards before it is called a fault.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tica.evidence import EvidenceItem
from tica.judges._common import Findings, cell, md_table, wrong_question
from tica.question import BackwardCriteria, Question
from tica.receipts import METRICS_FILE, BackwardStep, Leg, load_leg, load_step_metrics
from tica.verdict import VerdictCell

GRAD_HEADERS = ["step", "basis", "grad norm", "finite", "params with grad", "params total",
                "nonzero grad", "group rewards", "deployed bytes equal", "reading"]


@dataclass
class GradReading:
    findings: Findings = field(default_factory=Findings)
    rows: list[list[Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)


def _zero_advantage(groups: list[list[float]]) -> bool:
    """Every group's rewards are equal: GRPO-style advantages are all 0, so is the gradient."""
    return all(len(set(g)) <= 1 for g in groups)


def read_grads(
    steps: Sequence[BackwardStep],
    min_fraction: float,
    require_deployed_bytes: bool,
    quantized: bool,
    label: str = "",
) -> GradReading:
    r = GradReading()
    f = r.findings
    if not steps:
        f.inconclusive(f"{label}no steps recorded")
        return r
    informative = 0
    for s in steps:
        sf = Findings()
        reading = "gradient reaches weights"
        g = s.grad_norm
        if s.grad_finite is False:
            sf.fail(f"{label}step {s.step}: gradients are not finite")
        if g is None:
            sf.inconclusive(f"{label}step {s.step}: grad norm not recorded")
            reading = "unknown"
        elif not math.isfinite(g):
            sf.fail(f"{label}step {s.step}: grad norm is {g}")
            reading = "non-finite"
        elif g == 0:
            if s.within_group_rewards is None:
                sf.inconclusive(
                    f"{label}step {s.step}: grad norm exactly 0 and no within-group rewards recorded: "
                    "a zero advantage cannot be told from a numerical fault"
                )
                reading = "zero, unexplained"
            elif _zero_advantage(s.within_group_rewards):
                sf.note(f"{label}step {s.step}: grad norm 0 explained: every group has equal rewards, advantage 0")
                reading = "zero advantage (not a fault, not evidence)"
            else:
                sf.fail(f"{label}step {s.step}: grad norm exactly 0 while rewards vary within a group: a numerical fault")
                reading = "zero, a fault"
        if g is not None and math.isfinite(g) and g > 0:
            frac = s.params_with_grad / s.params_total
            if frac < min_fraction:
                sf.fail(
                    f"{label}step {s.step}: gradients reach {s.params_with_grad} of {s.params_total} master "
                    f"parameters ({frac:.0%} < {min_fraction:.0%})"
                )
                reading = "does not reach all weights"
            elif s.params_nonzero_grad == 0:
                sf.fail(f"{label}step {s.step}: grad norm {g:g} but no parameter has a nonzero gradient")
                reading = "contradictory"
            elif s.grad_finite is not False:
                informative += 1
        if s.deployed_bytes_equal is False:
            sf.fail(f"{label}step {s.step}: the trainer's forward does not use the deployed (quantized) bytes")
        elif s.deployed_bytes_equal is None and require_deployed_bytes and quantized:
            sf.inconclusive(f"{label}step {s.step}: weights are quantized and forward = deployed bytes was not checked")
        f.extend(sf)
        r.rows.append([s.step, s.step_basis, g, s.grad_finite, s.params_with_grad, s.params_total,
                       s.params_nonzero_grad, s.within_group_rewards, s.deployed_bytes_equal, reading])
        r.steps.append({"step": s.step, "grad_norm": g, "grad_finite": s.grad_finite,
                        "params_with_grad": s.params_with_grad, "params_total": s.params_total,
                        "reading": reading, "verdict": sf.verdict.value})
    if informative == 0:
        f.inconclusive(f"{label}no step shows a finite, nonzero gradient reaching the weights")
    return r


def is_quantized(leg: Leg) -> bool:
    q = leg.meta.resolved_config.get("quantization")
    return bool(q) and str(q).lower() not in ("none", "bf16", "bfloat16", "fp16", "float16", "fp32")


def judge_backward(question: Question, leg_paths: Sequence[str | Path]) -> VerdictCell:
    item = EvidenceItem.BACKWARD
    findings = Findings()
    if (bad := wrong_question(item, question)) is not None:
        findings.inconclusive(bad)
        return cell(item, question, findings, bad)
    criteria: BackwardCriteria = question.criteria  # type: ignore[assignment]
    legs = [load_leg(p) for p in leg_paths]
    numbers: dict[str, Any] = {"legs": []}
    tables: dict[str, str] = {}
    ran = 0
    for leg in legs:
        label = f"{leg.arm} {leg.path.name}: "
        if leg.meta.item != "backward":
            findings.inconclusive(f"{label}is a {leg.meta.item} leg, not a backward leg")
            continue
        if leg.meta.not_run_reason:
            findings.not_run(f"{label}did not run: {leg.meta.not_run_reason}")
            continue
        ran += 1
        steps = load_step_metrics(leg.path / METRICS_FILE, BackwardStep)
        reading = read_grads(steps, criteria.min_params_with_grad_fraction,
                             criteria.require_deployed_bytes_forward, is_quantized(leg), label)
        findings.extend(reading.findings)
        numbers["legs"].append({"path": str(leg.path), "arm": leg.arm, "steps": reading.steps,
                                "verdict": reading.findings.verdict.value})
        tables[f"per step: {leg.arm} {leg.path.name}"] = md_table(GRAD_HEADERS, reading.rows)
    if not legs:
        findings.not_run("no backward leg")
    summary = f"{ran} backward leg(s) judged"
    return cell(item, question, findings, summary, numbers, tables, {str(l.path): l.digest for l in legs})
