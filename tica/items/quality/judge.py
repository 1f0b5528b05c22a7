"""Quality pairing: the same problems under the same six-item contract, paired per problem.

If any contract item differs it is not the same score (`inconclusive`, naming the item). The
2x2 of per-problem outcomes must sum to the problem count. Each side's score, the absolute
point difference and the threshold are reported; under greedy decoding a score moves in steps
of 1/N, so a finer threshold is flagged. A difference inside the question's noise floor (in
points) is reported as not distinguishable from noise.

With a reviewed statistical basis (tica.stats.quality) a pass must also mean the difference is
inside the threshold with confidence 1 - alpha (exact McNemar bounds on the discordant pairs);
short of that the cell is inconclusive and says about how many problems would decide. Without
one the frozen rule alone decides, as it always did.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# `import tica.stats.quality`, not `from tica.stats import quality`: JUDGE_VERSION hashes the
# modules named by import statements, and the decision lives in that module.
import tica.stats.quality as threshold_test
from tica import digests
from tica.evidence import EvidenceItem
from tica.judging import Findings, cell, leg_label, md_table, skipped_leg, wrong_question_cell
from tica.confounders import confounder_markdown, confounder_table, require_recorded, unquantified
from tica.items.quality.criteria import QualityCriteria
from tica.items.quality.receipts import load_recorded_contract
from tica.question import Question
from tica.receipts import (CONTRACT_FILE, RESULTS_FILE, Leg, ProblemResult, RecordedEvalContract, load_json, load_leg,
                           load_quality_results)
from tica.verdict import Verdict, VerdictCell

_SHOW = 5


def _ids(ids: Sequence[str]) -> str:
    ids = sorted(ids)
    return ", ".join(ids[:_SHOW]) + (f" (+{len(ids) - _SHOW} more)" if len(ids) > _SHOW else "")


def _truncation(results: Sequence[ProblemResult]) -> float | None:
    flags = [r.truncated for r in results]
    if not flags or any(t is None for t in flags):
        return None
    return sum(1 for t in flags if t) / len(flags)


def _shown(value: Any) -> str:
    return "unknown" if value is None else json.dumps(value)


def _contract(findings: Findings, leg: Leg) -> RecordedEvalContract:
    """The leg's contract as recorded; a leg without contract.json has every item unknown."""
    recorded = load_recorded_contract(leg.path / CONTRACT_FILE)
    if recorded is None:
        findings.inconclusive(f"{leg_label(leg)}contract unknown (no {CONTRACT_FILE}): "
                              "the scores cannot be shown to be the same score")
        return RecordedEvalContract()
    return recorded


SUMMARY_FILE = "summary.json"  # tica.legs.quality: per pass {"correct", "n", "score", "truncated"}


def _summary_agrees(findings: Findings, leg: Leg, results: Sequence[ProblemResult]) -> None:
    """A leg's summary.json, where it has one, must count what its results.jsonl holds (the first
    pass, resolved_config.primary_pass, is the one beside it): a receipt that contradicts itself is
    not judged on either half."""
    path = leg.path / SUMMARY_FILE
    if not path.exists():
        return
    passes = load_json(path)
    name = leg.meta.resolved_config.get("primary_pass") or next(iter(passes), None)
    said = passes.get(name) if isinstance(name, str) else None
    if not isinstance(said, dict):
        findings.inconclusive(f"{leg_label(leg)}{SUMMARY_FILE} has no pass {name!r} to compare with "
                              f"{RESULTS_FILE}")
        return
    n, correct = len(results), sum(r.correct for r in results)
    counted = {"n": n, "correct": correct, "score": correct / n if n else None,
               "truncated": sum(bool(r.truncated) for r in results)}
    for key, value in counted.items():
        if key in said and said[key] != value:
            findings.inconclusive(f"{leg_label(leg)}{SUMMARY_FILE} says {key}={said[key]!r}, "
                                  f"{RESULTS_FILE} counts {value!r}: the receipt contradicts itself")


def _one_problem_per_prompt(findings: Findings, arm: str, results: Sequence[ProblemResult]) -> None:
    """Every problem carries its content identity (prompt_hash) and no two ids share one: N counts
    problems, and relabelled copies would carry the 1/N resolution or a statistical basis over."""
    unnamed = [r.problem_id for r in results if r.prompt_hash is None]
    if unnamed:
        findings.inconclusive(f"{arm}: problems {_ids(unnamed)} record no prompt_hash: without the prompt a copy of "
                              "another problem cannot be told apart, so N is not shown")
    by_prompt: dict[str, set[str]] = {}
    for r in results:
        if r.prompt_hash is not None:
            by_prompt.setdefault(digests.canonical(r.prompt_hash), set()).add(r.problem_id)
    copies = sorted(sorted(ids) for ids in by_prompt.values() if len(ids) > 1)
    if copies:
        findings.inconclusive(f"{arm}: {len(copies)} prompt(s) appear under more than one problem id ("
                              f"{', '.join(copies[0])} have the same prompt_hash): one problem counted "
                              "several times")


def judge_quality(question: Question, leg_paths: Sequence[str | Path]) -> VerdictCell:
    item = EvidenceItem.QUALITY
    if (wrong := wrong_question_cell(item, question)) is not None:
        return wrong
    findings = Findings()
    criteria: QualityCriteria = question.criteria  # type: ignore[assignment]
    legs = [load_leg(p) for p in leg_paths]
    hashes = {str(l.path): l.digest for l in legs}
    by_arm: dict[str, list[Leg]] = {"bi1": [], "bi0": []}
    not_run_arms: set[str] = set()
    for leg in legs:
        if skipped_leg(item, leg, findings):  # another item's leg, or one that did not run
            if leg.meta.item == item.value:
                not_run_arms.add(leg.arm)
            continue
        by_arm[leg.arm].append(leg)
    if not legs:
        findings.not_run("no quality leg ran for this candidate")
        return cell(item, question, findings, "no quality leg ran for this candidate: nothing to pair")
    if any(not by_arm[arm] and arm in not_run_arms for arm in by_arm):
        missing = sorted(a for a in by_arm if not by_arm[a])
        return cell(item, question, findings, f"no {', '.join(missing)} leg ran: nothing to pair",
                    receipt_hashes=hashes)
    for arm, arm_legs in by_arm.items():
        if len(arm_legs) != 1:
            findings.inconclusive(f"{len(arm_legs)} {arm} quality legs: pairing needs exactly one per arm")
    if any(len(v) != 1 for v in by_arm.values()):
        return cell(item, question, findings, "no pair of quality legs to compare", receipt_hashes=hashes)
    l1, l0 = by_arm["bi1"][0], by_arm["bi0"][0]
    require_recorded(findings, question, [(f"{l.arm} {l.path.name}", l.meta) for l in (l1, l0)])
    c1, c0 = (_contract(findings, l) for l in (l1, l0))
    r1, r0 = load_quality_results(l1.path / RESULTS_FILE), load_quality_results(l0.path / RESULTS_FILE)
    for leg, results in ((l1, r1), (l0, r0)):
        _summary_agrees(findings, leg, results)
    tables: dict[str, str] = {}
    numbers: dict[str, Any] = {}

    # 1. The six contract items: a difference in any means these are not the same score, and an
    # item either leg does not record (unknown) cannot be shown the same: never a pass on it.
    contract_rows, differing, unknown = [], [], []
    for (name, v1), (_, v0) in zip(c1.six_items().items(), c0.six_items().items()):
        if v1 is None or v0 is None:
            unknown.append(name)
            sides = " and ".join(f"{arm} {l.path.name}" for arm, l, v in (("BI=1", l1, v1), ("BI=0", l0, v0)) if v is None)
            findings.inconclusive(f"evaluation contract item unknown: {name} (not recorded in {sides})")
            contract_rows.append([name, _shown(v1), _shown(v0), "unknown"])
            continue
        same = v1 == v0
        contract_rows.append([name, json.dumps(v1), json.dumps(v0), same])
        if not same:
            differing.append(name)
            findings.inconclusive(f"evaluation contract differs in {name}: BI=1 {json.dumps(v1)} vs BI=0 {json.dumps(v0)}")
    tables["evaluation contract"] = md_table(["item", "BI=1", "BI=0", "same"], contract_rows)
    numbers["contract_differs"] = differing
    numbers["contract_unknown"] = unknown
    if criteria.greedy and c1.greedy is not None and c0.greedy is not None and not (c1.greedy and c0.greedy):
        findings.inconclusive("the question asks about greedy decoding, the contract samples (temperature > 0)")

    # 2. Per-problem pairing. A problem listed twice in one arm is a retry; none are allowed. A
    # problem is its prompt, not its id: the same prompt under two ids is one problem counted twice.
    for arm, results in (("bi1", r1), ("bi0", r0)):
        dup = [pid for pid, k in Counter(r.problem_id for r in results).items() if k > 1]
        if dup:
            findings.inconclusive(f"{arm}: problems {_ids(dup)} appear more than once (retries are not allowed)")
        _one_problem_per_prompt(findings, arm, results)
    m1 = {r.problem_id: r for r in r1}
    m0 = {r.problem_id: r for r in r0}
    union = set(m1) | set(m0)
    n = criteria.expected_problems if criteria.expected_problems is not None else len(union)
    if criteria.expected_problems is not None and len(union) != criteria.expected_problems:
        findings.inconclusive(f"{len(union)} problems present, the question fixes {criteria.expected_problems}")
    for only, side in ((set(m1) - set(m0), "BI=0"), (set(m0) - set(m1), "BI=1")):
        if only:
            findings.inconclusive(f"problems {_ids(only)} have no {side} result: they cannot be paired")
    prompt_differs = [p for p in set(m1) & set(m0)
                      if m1[p].prompt_hash and m0[p].prompt_hash
                      and digests.canonical(m1[p].prompt_hash) != digests.canonical(m0[p].prompt_hash)]
    if prompt_differs:
        findings.inconclusive(f"problems {_ids(prompt_differs)} have the same id but different prompts")
    both = sorted(set(m1) & set(m0))
    counts = {
        "both_correct": sum(1 for p in both if m1[p].correct and m0[p].correct),
        "only_bi0": sum(1 for p in both if m0[p].correct and not m1[p].correct),
        "only_bi1": sum(1 for p in both if m1[p].correct and not m0[p].correct),
        "both_wrong": sum(1 for p in both if not m1[p].correct and not m0[p].correct),
    }
    total = sum(counts.values())
    if n == 0:
        findings.inconclusive("no problems in either arm: nothing was scored")
    if total != n:
        findings.inconclusive(f"both_correct + only_bi0 + only_bi1 + both_wrong = {total}, not N = {n}")
    tables["pairing (2x2)"] = md_table(
        ["", "BI=0 correct", "BI=0 wrong"],
        [["BI=1 correct", counts["both_correct"], counts["only_bi1"]],
         ["BI=1 wrong", counts["only_bi0"], counts["both_wrong"]]],
    )

    # 3. Scores on the paired problems, the difference in points, the threshold.
    score1 = 100.0 * (counts["both_correct"] + counts["only_bi1"]) / n if n else float("nan")
    score0 = 100.0 * (counts["both_correct"] + counts["only_bi0"]) / n if n else float("nan")
    diff = abs(score1 - score0)
    resolution = 100.0 / n if n else float("nan")
    greedy = criteria.greedy or bool(c1.greedy and c0.greedy)
    finer = greedy and criteria.threshold_points < resolution
    if finer:
        # A score that moves in steps of one problem cannot show a difference finer than one: such a
        # threshold is met only by chance (equal scores), unless a frozen statistical basis decides it.
        (findings.note if criteria.statistical_basis is not None else findings.inconclusive)(
            f"threshold {criteria.threshold_points:g} points is finer than one problem ({resolution:.4g} points of "
            f"{n}) under greedy decoding: smaller differences are invisible"
            + ("" if criteria.statistical_basis is not None else
               ", so the threshold cannot be shown met (no statistical basis is frozen to decide it)")
        )
    if diff > criteria.threshold_points + 1e-9:
        findings.fail(f"|{score1:.4g} - {score0:.4g}| = {diff:.4g} points exceeds the threshold {criteria.threshold_points:g}")
    basis = criteria.statistical_basis
    decision = None
    if basis is not None:
        if c1.repeats is None or c0.repeats is None:
            findings.inconclusive("the statistical basis cannot decide with the number of repeats unknown: no pass")
        elif total == n and n > 0:
            decision = threshold_test.decide(counts["only_bi1"], counts["only_bi0"], n, criteria.threshold_points,
                                             basis, (c1.repeats, c0.repeats))
            {threshold_test.PASS: findings.note, threshold_test.FAIL: findings.note,
             threshold_test.INCONCLUSIVE: findings.inconclusive}[decision.verdict](decision.reason)
            tables["statistical basis"] = md_table(
                ["N", "only BI=1", "only BI=0", "difference (points)", f"lower bound ({1 - basis.alpha:g})",
                 f"upper bound ({1 - basis.alpha:g})", "threshold", "exact McNemar p", "decision",
                 "more problems to decide"],
                [[n, counts["only_bi1"], counts["only_bi0"], decision.diff_points, decision.lower_points,
                  decision.upper_points, criteria.threshold_points, decision.mcnemar_p, decision.verdict,
                  decision.more_problems]])
        else:
            findings.inconclusive("the statistical basis cannot decide a broken pairing: no pass")
        numbers["statistical_basis"] = basis.model_dump(mode="json")
        numbers["decision"] = decision.numbers() if decision is not None else None
    floor = question.noise_floor
    inside_noise = floor > 0 and diff <= floor
    if inside_noise:
        findings.note(f"|diff| {diff:.4g} points is inside the noise floor {floor:g} points: not distinguishable from noise")
    t1, t0 = _truncation(r1), _truncation(r0)
    for arm, t in (("BI=1", t1), ("BI=0", t0)):
        if t is None:
            findings.note(f"{arm} truncation not recorded for every problem: read accuracy without it with care")
    tables["scores"] = md_table(
        ["arm", "score (%)", "correct", "N", "truncation ratio"],
        [["BI=1", score1, counts["both_correct"] + counts["only_bi1"], n, t1],
         ["BI=0", score0, counts["both_correct"] + counts["only_bi0"], n, t0]],
    )
    numbers.update(counts, n=n, score_bi1=score1, score_bi0=score0, abs_diff_points=diff,
                   threshold_points=criteria.threshold_points, one_problem_points=resolution,
                   noise_floor_points=floor, inside_noise_floor=inside_noise,
                   threshold_finer_than_one_problem=finer, truncation_ratio_bi1=t1, truncation_ratio_bi0=t0)

    # 4. Confounders: a pass would attribute the (small) delta to the switch.
    table = confounder_table([l1.meta], [l0.meta], criteria.quantified_confounders)
    tables["confounders"] = confounder_markdown(table)
    numbers["confounders"] = [c.model_dump() for c in table]
    loose = unquantified(table)
    if loose:
        keys = ", ".join(c.key for c in loose)
        if findings.verdict is Verdict.FAIL:
            findings.note(f"the difference is not attributed to the switch alone; unquantified confounders: {keys}")
        else:
            findings.inconclusive(f"unquantified confounders between the arms: {keys}")
    summary = (f"BI=1 {score1:.4g}% vs BI=0 {score0:.4g}% on N={n}, |diff| {diff:.4g} points "
               f"(threshold {criteria.threshold_points:g}"
               + (f"; inside the noise floor {floor:g}" if inside_noise else "") + ")"
               + (f"; basis {basis.test} at alpha {basis.alpha:g}" if basis is not None else ""))
    return cell(item, question, findings, summary, numbers, tables, hashes)
