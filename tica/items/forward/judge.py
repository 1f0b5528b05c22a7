"""Train–inference forward: logprobs of fixed token histories, trainer vs rollout, per step.

BI=1 passes only with max = mean = 0 at every step (and, where arrays exist, every logprob
bitwise equal); a missing step is not a pass. BI=0 is the practice's smoke check: mean of the
reference's magnitude, max finite (it may approach 1), grad norm finite (a grad norm of exactly
0 is read against the within-group rewards). The question's `arms` say which arms are judged: a
question judging BI=1 needs a BI=1 leg that ran and judges BI=0 legs present (a grad norm they
do not record is noted); a BI=0 smoke question needs a BI=0 leg whose grad norm is recorded.
A BI=0 mean inside the noise floor is reported as indistinguishable from noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tica.confounders import confounder_markdown, confounder_table, require_recorded, unquantified
from tica.evidence import EvidenceItem
from tica.forward_reading import STEP_HEADERS, read_forward
from tica.items.forward.criteria import ForwardCriteria
from tica.judging import Findings, cell, led, leg_label, md_table, skipped_leg, worst, wrong_question_cell
from tica.question import Question
from tica.receipts import Leg, load_leg
from tica.verdict import Verdict, VerdictCell


def _first_step(meta: Any) -> int:
    """The step a forward leg's run began at: 1 unless its producer recorded another (a re-check
    after an update continues the numbering: resolved_config.first_step)."""
    declared = meta.resolved_config.get("first_step") if meta is not None else None
    return declared if isinstance(declared, int) and not isinstance(declared, bool) and declared >= 1 else 1


def _arm_covers(findings: Findings, arm: str, legs: list[tuple[int, list[int]]]) -> None:
    """One arm's forward legs, together, hold every step from the step the run began at (1, or
    the earliest a leg declares) to the last: a step left out of every leg is a missing step, and
    steps dropped from the front leave no gap between the ones present."""
    steps = sorted({s for _, ss in legs for s in ss})
    if not steps:
        return
    first = min(f for f, _ in legs)
    missing = sorted(set(range(first, steps[-1] + 1)) - set(steps))
    if missing:
        findings.inconclusive(f"{arm}: steps {missing} of {first}..{steps[-1]} are in none of the arm's forward legs: "
                              "a missing step is not a pass")
    elif steps[0] < first:
        findings.inconclusive(f"{arm}: steps begin at {steps[0]}, before the step {first} the run says it began at")


def _required_arm(criteria: ForwardCriteria) -> str:
    """The arm whose leg must have run: BI=1 when it is judged (the bitwise claim), else BI=0 (smoke)."""
    return "bi1" if "bi1" in criteria.arms else "bi0"


_NO_LEG = {"bi1": "no BI=1 forward leg: the bitwise claim has no evidence",
           "bi0": "no BI=0 forward leg: the BI=0 smoke check has no evidence"}


def judge_forward(question: Question, leg_paths: Sequence[str | Path]) -> VerdictCell:
    item = EvidenceItem.FORWARD
    if (wrong := wrong_question_cell(item, question)) is not None:
        return wrong
    findings = Findings()
    criteria: ForwardCriteria = question.criteria  # type: ignore[assignment]
    legs: list[Leg] = [load_leg(p) for p in leg_paths]
    numbers: dict[str, Any] = {"legs": [], "arms": list(criteria.arms), "bi0_reference_mean": criteria.bi0_reference_mean,
                               "noise_floor": question.noise_floor}
    tables: dict[str, str] = {}
    arm_verdicts: dict[str, list[Verdict]] = {"bi1": [], "bi0": []}
    arm_steps: dict[str, list[tuple[int, list[int]]]] = {}  # arm -> per leg (its run's first step, its steps)
    ref, factor = criteria.bi0_reference_mean, criteria.bi0_magnitude_factor
    bi0_range = None if ref is None else (ref / factor, ref * factor)
    for leg in legs:
        label = leg_label(leg)
        judged = leg.arm in criteria.arms
        if skipped_leg(item, leg, findings, judged):
            if leg.meta.item == item.value:
                arm_verdicts[leg.arm].append(Verdict.NOT_RUN)
            continue
        reading = read_forward(leg.path, leg.arm, criteria.min_steps, bi0_range, label,
                               grad_norm_required=criteria.bi0_smoke, noise_floor=question.noise_floor)
        arm_steps.setdefault(leg.arm, []).append((_first_step(leg.meta), [s["step"] for s in reading.steps]))
        if leg.arm == "bi1" and leg.meta.trainer == "vllm_engine":
            # The rollout engine scoring its own tokens compares vLLM with itself: no trainer took part.
            reading.findings.inconclusive(f"{label}the trainer is the rollout engine itself (trainer: vllm_engine): "
                                          "a train-inference comparison needs a trainer")
        if judged:
            findings.extend(reading.findings)
            require_recorded(findings, question, [(f"{leg.arm} {leg.path.name}", leg.meta)])
        else:
            findings.note(f"{label}reported, not judged: the question judges {list(criteria.arms)} only")
        arm_verdicts[leg.arm].append(reading.findings.verdict)
        numbers["legs"].append({"path": str(leg.path), "arm": leg.arm, "judged": judged, "steps": reading.steps,
                                "verdict": reading.findings.verdict.value})
        tables[f"per step: {leg.arm} {leg.path.name}"] = md_table(STEP_HEADERS, reading.rows)
    for arm in criteria.arms:  # an arm's legs together: from the step its run began at, none missing
        if arm_steps.get(arm):
            _arm_covers(findings, arm, arm_steps[arm])
        # and no measurement handed in by two of its legs
        seen: dict[str, str] = {}
        for entry in numbers["legs"]:
            if entry["arm"] != arm or not entry["judged"]:
                continue
            leg_name = Path(entry["path"]).name
            for s in {s["content"]: s for s in entry["steps"]}.values():
                other = seen.setdefault(s["content"], leg_name)
                if other != leg_name:
                    findings.inconclusive(f"{arm}: {leg_name} step {s['step']} is a measurement {other} holds too: one "
                                          "measurement counted twice")
    required = _required_arm(criteria)
    if not arm_verdicts[required]:
        findings.not_run(_NO_LEG[required])
    bi1 = [l.meta for l in legs if l.arm == "bi1" and not l.meta.not_run_reason]
    bi0 = [l.meta for l in legs if l.arm == "bi0" and not l.meta.not_run_reason]
    if bi1 and bi0:
        table = confounder_table(bi1, bi0, criteria.quantified_confounders)
        tables["confounders"] = confounder_markdown(table)
        numbers["confounders"] = [c.model_dump() for c in table]
        loose = unquantified(table)
        if loose:
            # BI=1's verdict stands on its own; only the BI=0 magnitude would be misattributed.
            findings.note("BI=0 magnitude is not attributed to the switch alone; unquantified: "
                          + ", ".join(c.key for c in loose))
    summary = _summary(criteria, arm_verdicts, numbers)
    arm = "bi1" if "bi1" in criteria.arms else "bi0"
    if findings.verdict is not (worst(arm_verdicts[arm]) if arm_verdicts[arm] else Verdict.NOT_RUN):
        summary = led(findings, summary)  # the judged arm's own verdict is not the cell's: say what decided it
    return cell(item, question, findings, summary, numbers, tables, {str(l.path): l.digest for l in legs})


def _summary(criteria: ForwardCriteria, arm_verdicts: dict[str, list[Verdict]], numbers: dict[str, Any]) -> str:
    parts = []
    if "bi1" in criteria.arms:
        v1 = worst(arm_verdicts["bi1"]) if arm_verdicts["bi1"] else Verdict.NOT_RUN
        n_steps = max((len(l["steps"]) for l in numbers["legs"] if l["arm"] == "bi1"), default=0)
        parts.append(f"BI=1 {v1.value} over {n_steps} step(s)" if n_steps else "no BI=1 step measured")
    else:
        v0 = worst(arm_verdicts["bi0"]) if arm_verdicts["bi0"] else Verdict.NOT_RUN
        parts.append(f"BI=0 smoke {v0.value}")
    means = [s["mean"] for l in numbers["legs"] if l["arm"] == "bi0" for s in l["steps"] if s["mean"] is not None]
    if means:
        ref = criteria.bi0_reference_mean
        against = f"vs reference {ref:g}" if ref is not None else "(reported; the question names no reference)"
        parts.append(f"BI=0 mean |diff| {min(means):.3g}..{max(means):.3g} {against}")
        floor = numbers["noise_floor"]
        if floor > 0 and max(means) <= floor:
            parts.append(f"inside the noise floor {floor:g}")
    return "; ".join(parts)
