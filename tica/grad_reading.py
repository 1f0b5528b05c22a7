"""Reading a trainer's gradient receipts (the backward's and the update's steps): gradients finite
and reaching the master weights, a grad norm of exactly 0 read against the within-group rewards,
forward equal to the deployed bytes where weights are quantized, and the producer's gradient
check (the backward's room, tica/items/backward/, and the update's, tica/items/update/, both read it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tica.errors import ReceiptError
from tica.judging import Findings
from tica.receipts import GRADCHECK_REL_TOL
from tica.receipts import GRADCHECK_FILE, BackwardStep, GradcheckFile, GradcheckOp, Leg, load_gradcheck

GRAD_HEADERS = ["step", "basis", "grad norm", "finite", "params with grad", "params total",
                "nonzero grad", "group rewards", "deployed bytes equal", "gradient check", "reading"]


@dataclass
class GradReading:
    findings: Findings = field(default_factory=Findings)
    rows: list[list[Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)


def zero_advantage(groups: list[list[float]]) -> bool:
    """Every group's rewards are equal: GRPO-style advantages are all 0, so is the gradient."""
    return all(len(set(g)) <= 1 for g in groups)


def _op_passes(op: GradcheckOp, tol: float) -> bool:
    return op.finite and all(math.isfinite(x) for x in op.rel_err) and max(op.rel_err) < tol


@dataclass
class GradCheck:
    """gradcheck.json recomputed from its per-op errors under the question's tolerance (the
    producer's `pass` flags and tolerances are not read)."""

    ops: list[str]
    failing: list[str]
    caught: dict[str, bool]
    kernels: str | None = None

    @property
    def missed(self) -> list[str]:
        return [op for op in self.ops if not self.caught.get(op)]

    @property
    def passes(self) -> bool:
        return not self.failing and not self.missed


def recompute_gradcheck(data: GradcheckFile, tol: float) -> GradCheck:
    """A control is caught only by its own planted op failing: another op's failure in it is no
    evidence that the check sees the planted error."""
    caught: dict[str, bool] = {}
    for control in data.controls:
        if control.planted is None:
            continue
        planted = [o for o in control.ops if o.op == control.planted]
        caught[control.planted] = caught.get(control.planted, False) or (
            bool(planted) and not all(_op_passes(o, tol) for o in planted))
    ops = data.check.ops
    return GradCheck(ops=[o.op for o in ops], failing=[o.op for o in ops if not _op_passes(o, tol)], caught=caught,
                     kernels=data.check.kernels)


def _judge_gradcheck_rows(steps: Sequence[BackwardStep], f: Findings, label: str) -> None:
    for s in steps:
        if s.gradcheck_pass is False:
            f.fail(f"{label}step {s.step}: the producer's gradient check failed (tica/gradcheck_pass false)")
        caught = s.gradcheck_controls_caught
        missed = sorted(op for op, c in (caught or {}).items() if not c)
        if not caught:
            f.inconclusive(f"{label}step {s.step}: the gradient check's planted-error controls are not recorded: "
                           "it is not shown able to fail")
        elif missed:
            f.inconclusive(f"{label}step {s.step}: the gradient check did not detect the planted backward errors in "
                           f"{missed}: it is not shown able to fail, so its pass is no evidence")


def read_gradcheck(steps: Sequence[BackwardStep], leg_dir: Path | None, label: str = "", tol: float = GRADCHECK_REL_TOL,
                   trainer: str | None = None) -> Findings:
    """Judge the gradient check a producer recorded (metrics.jsonl flags and, where present,
    gradcheck.json, which is recomputed under the question's tolerance and wins); none recorded:
    nothing to judge here. The check must be of the leg's own kernels (its trainer)."""
    f = Findings()
    rows = [s for s in steps if s.gradcheck_pass is not None or s.gradcheck_controls_caught is not None]
    path = leg_dir / GRADCHECK_FILE if leg_dir is not None else None
    if path is None or not path.is_file():
        _judge_gradcheck_rows(rows, f, label)
        return f
    try:
        gc = recompute_gradcheck(load_gradcheck(path), tol)
    except ReceiptError as err:
        f.inconclusive(f"{label}{GRADCHECK_FILE}: {err.field}: {err.message}")
        return f
    if gc.kernels is None:
        f.inconclusive(f"{label}{GRADCHECK_FILE}: the kernels checked are not recorded (check.kernels): the check is "
                       "not shown to be of this leg's backward")
    elif trainer is not None and gc.kernels != trainer:
        f.inconclusive(f"{label}{GRADCHECK_FILE}: the check ran on {gc.kernels!r}, the leg's trainer is {trainer!r}: "
                       "it is no evidence for this backward")
    if gc.failing:
        f.fail(f"{label}{GRADCHECK_FILE}: the analytic backward of {gc.failing} is outside the question's tolerance "
               f"{tol:g} of float64 autograd")
    if gc.missed:
        f.inconclusive(f"{label}{GRADCHECK_FILE}: the planted backward errors in {gc.missed} were not detected: the "
                       "check is not shown able to fail, so its pass is no evidence")
    for s in rows:
        said = {"tica/gradcheck_pass": s.gradcheck_pass, "tica/gradcheck_controls_caught": s.gradcheck_controls_caught}
        actual = {"tica/gradcheck_pass": gc.passes,
                  "tica/gradcheck_controls_caught": {op: gc.caught.get(op, False) for op in s.gradcheck_controls_caught or {}}}
        for key, value in said.items():
            if value is not None and value != actual[key]:
                f.inconclusive(f"{label}step {s.step}: metrics.jsonl says {key}={value!r}, {GRADCHECK_FILE} gives "
                               f"{actual[key]!r}; the receipt contradicts itself")
    return f


def read_grads(
    steps: Sequence[BackwardStep],
    min_fraction: float,
    require_deployed_bytes: bool,
    quantized: bool,
    label: str = "",
    leg_dir: Path | None = None,
    tol: float = GRADCHECK_REL_TOL,
    trainer: str | None = None,
) -> GradReading:
    r = GradReading()
    f = r.findings
    if not steps:
        f.inconclusive(f"{label}no steps recorded")
        return r
    f.extend(read_gradcheck(steps, leg_dir, label, tol, trainer))
    present = [s.step for s in steps]  # every step from 1 (or where the run began): a dropped step is no pass
    missing = sorted(set(range(1, present[-1] + 1)) - set(present))
    if missing:
        f.inconclusive(f"{label}steps {missing} missing from 1 to {present[-1]}: a missing step is not a pass")
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
            elif zero_advantage(s.within_group_rewards):
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
                       s.params_nonzero_grad, s.within_group_rewards, s.deployed_bytes_equal, s.gradcheck_pass, reading])
        r.steps.append({"step": s.step, "grad_norm": g, "grad_finite": s.grad_finite,
                        "params_with_grad": s.params_with_grad, "params_total": s.params_total,
                        "gradcheck_pass": s.gradcheck_pass, "reading": reading, "verdict": sf.verdict.value})
    if informative == 0:
        f.inconclusive(f"{label}no step shows a finite, nonzero gradient reaching the weights")
    return r


def is_quantized(leg: Leg) -> bool:
    q = leg.meta.resolved_config.get("quantization")
    return bool(q) and str(q).lower() not in ("none", "bf16", "bfloat16", "fp16", "float16", "fp32")
