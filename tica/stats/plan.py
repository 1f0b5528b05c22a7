"""Plans: from a pilot's sealed legs to a question draft with a statistical basis to review.

A throughput pilot is read exactly as the judge reads legs (`check_workload`, `pair_rounds`):
the same workload, order and exit checks decide which rounds measure the noise. Per
concurrency the plan reports the per-round paired losses' median and spread and the
within-arm tiers, and, for a budget B, how many crossed rounds let the frozen sign test pass
with the chosen power when the true loss sits the minimum detectable difference under B
(by default the pilot's own distance to B). A quality pilot (one pair of legs) is read by the
quality judge; the plan gives the number of paired problems the exact McNemar bounds need.

Nothing here freezes anything: the draft is written for a person to review and freeze.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tica.stats._scipy import stats

from tica.errors import ReceiptError
from tica.judges import judge_criteria
from tica.items.throughput.judge import check_workload, not_run_legs, pair_rounds, tier_ratio
from tica.pairing import crossed
from tica.question import QualityCriteria, Question, ThroughputCriteria, ThroughputFormula, parse_question
from tica.receipts import load_bench_leg
from tica.stats import quality as qstats
from tica.stats import throughput as tstats

MAX_PLANNED_ROUNDS = 100
SD_UPPER_LEVEL = 0.8

DRAFT_HEADER = """\
# DRAFT written by `tica plan {item}`: NOT FROZEN. A person reviews the pilot, the test, alpha,
# power, the {what} and the {size} below, edits what must change, and only then freezes it
# (`tica question freeze`). The pilot legs are named by their sealed digests in
# criteria.statistical_basis.pilot_digests; docs/statistics.md says what the test promises.
"""


# ---------------------------------------------------------------- throughput


@dataclass
class PilotConcurrency:
    c: int
    rounds: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    t_bi1: list[float] = field(default_factory=list)
    t_bi0: list[float] = field(default_factory=list)
    invalid: list[tuple[int, list[str]]] = field(default_factory=list)
    unclean_exits: list[int] = field(default_factory=list)  # rounds counted despite their exit receipts


@dataclass
class Pilot:
    per_c: dict[int, PilotConcurrency]
    digests: list[str]
    notes: list[str]
    legs: int


def read_pilot(question: Question, leg_paths: Sequence[str | Path], allow_unclean_exits: bool = False) -> Pilot:
    """Every valid round of the pilot per concurrency (all of them: a pilot has no frozen count).
    With allow_unclean_exits a round whose only problems are its legs' exit receipts is counted
    for the noise and named; the judge never counts it."""
    criteria: ThroughputCriteria = question.criteria  # type: ignore[assignment]
    notes: list[str] = []
    legs, skipped = [], 0
    for p in leg_paths:
        try:
            legs.append(load_bench_leg(p))
        except ReceiptError:
            if not not_run_legs([p]):  # a leg that did not run has no bench to read; anything else is bad input
                raise
            skipped += 1
    if skipped:
        notes.append(f"{skipped} pilot leg(s) did not run and are left out")
    checks = [check_workload(leg, criteria) for leg in legs]
    strict, _ = pair_rounds(question, checks)
    rounds, aside = pair_rounds(question, checks, ignore_exits=allow_unclean_exits)
    for chk, why in aside:
        notes.append(f"{chk.leg.path.name}: set aside ({why})")
    strict_valid = {(r.c, r.number) for r in strict if r.valid}
    per_c = {c: PilotConcurrency(c) for c in criteria.concurrencies}
    digests: set[str] = set()
    for rnd in rounds:
        pc = per_c[rnd.c]
        if not rnd.valid:
            pc.invalid.append((rnd.number, rnd.problems))
            continue
        pc.rounds.append(rnd.number)
        pc.losses.append(rnd.loss)  # type: ignore[arg-type]
        pc.t_bi1.append(rnd.t_bi1)  # type: ignore[arg-type]
        pc.t_bi0.append(rnd.t_bi0)  # type: ignore[arg-type]
        digests |= {lc.leg.digest for lc in rnd.legs}
        if (rnd.c, rnd.number) not in strict_valid:
            pc.unclean_exits.append(rnd.number)
    for pc in per_c.values():
        if pc.unclean_exits:
            notes.append(f"c={pc.c}: rounds {pc.unclean_exits} counted for the noise despite unclean exit receipts "
                         "(--allow-unclean-exits); the judge will not count such rounds")
    return Pilot(per_c=per_c, digests=sorted(digests), notes=notes, legs=len(legs))


@dataclass(frozen=True)
class ThroughputPlanRow:
    c: int
    pilot_rounds: int
    median: float | None
    sd: float | None
    mad: float | None
    tier_bi1: float | None
    tier_bi0: float | None
    budget: float | None
    margin: float | None
    rounds_needed: int | None
    rounds_at_sd_upper: int | None  # the same at the SD's 80% upper confidence bound
    planned: bool = False  # needed rounds within the plan's limit: they set the basis's rounds
    note: str = ""


@dataclass
class ThroughputPlan:
    rows: list[ThroughputPlanRow]
    alpha: float
    power: float
    digests: list[str]
    notes: list[str]

    @property
    def rounds(self) -> int | None:
        """Rounds the basis freezes: enough for every planned target c (all c run every round)."""
        needed = [r.rounds_needed for r in self.rows if r.planned and r.rounds_needed is not None]
        return max(needed) if needed else None

    def basis(self) -> tstats.ThroughputBasis | None:
        if self.rounds is None:
            return None
        return tstats.ThroughputBasis(
            test=tstats.SIGN_TEST_MEDIAN, alpha=self.alpha, power=self.power, rounds=self.rounds,
            min_detectable_difference={r.c: r.margin for r in self.rows if r.planned and r.margin is not None},
            pilot_digests=tuple(self.digests), notes=tuple(self.notes))

    def table(self) -> tuple[list[str], list[list[Any]]]:
        headers = ["c", "pilot rounds", "median paired loss", "SD", "MAD (normal-scaled)", "tiers BI=1 max/min",
                   "tiers BI=0 max/min", "budget", "min detectable difference",
                   f"rounds needed (alpha {self.alpha:g}, power {self.power:g})",
                   f"rounds if the SD is at its {SD_UPPER_LEVEL:g} upper bound", "note"]
        rows = [[r.c, r.pilot_rounds, r.median, r.sd, r.mad, r.tier_bi1, r.tier_bi0, r.budget, r.margin,
                 r.rounds_needed, r.rounds_at_sd_upper, r.note] for r in self.rows]
        return headers, rows

    def to_json(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "power": self.power, "rounds": self.rounds, "notes": self.notes,
                "pilot_digests": self.digests,
                "per_concurrency": [r.__dict__ for r in self.rows]}


def sd_upper(sd: float, n: int, level: float = 0.8) -> float:
    """One-sided `level` upper confidence bound of a normal SD estimated from n values."""
    return sd * math.sqrt((n - 1) / float(stats.chi2.ppf(1 - level, n - 1)))


def plan_throughput(question: Question, pilot: Pilot, budgets: Mapping[int, float], alpha: float, power: float,
                    margins: Mapping[int, float] | None = None, max_rounds: int = MAX_PLANNED_ROUNDS) -> ThroughputPlan:
    criteria: ThroughputCriteria = question.criteria  # type: ignore[assignment]
    notes = list(pilot.notes)
    rows = []
    for c in criteria.concurrencies:
        pc = pilot.per_c[c]
        n = len(pc.losses)
        med = statistics.median(pc.losses) if pc.losses else None
        sd, mad = tstats.spread(pc.losses) if pc.losses else (None, None)
        t1, t0 = tier_ratio(pc.t_bi1), tier_ratio(pc.t_bi0)
        budget = budgets.get(c)
        margin, needed, needed_hi, note = None, None, None, []
        if any(x is not None and x > criteria.tier_ratio for x in (t1, t0)):
            note.append(f"fast/slow tiers (> {criteria.tier_ratio:g}): find their cause before trusting this spread")
        if pc.invalid:
            note.append(f"{len(pc.invalid)} invalid round(s) left out")
        if budget is not None:
            if n < 2:
                note.append(f"{n} valid pilot round(s): at least 2 crossed rounds are needed to measure the spread")
            else:
                assert med is not None and sd is not None
                margin = (margins or {}).get(c, budget - med)
                if margin <= 0:
                    note.append(f"the pilot's median loss {med:.4g} is at or over the budget {budget:g}: no number "
                                "of rounds is expected to pass (the frozen rule would fail it); --mdd plans for "
                                "another true loss")
                    margin = None
                else:
                    needed = tstats.rounds_needed(margin, sd, alpha, power)
                    needed_hi = tstats.rounds_needed(margin, sd_upper(sd, n, SD_UPPER_LEVEL), alpha, power)
                    if needed is None:
                        note.append(f"more than {tstats.MAX_ROUNDS} rounds at this spread")
                    elif needed > max_rounds:
                        note.append(f"{needed} rounds is over the limit of {max_rounds}: not planned")
                    if n < 5:
                        note.append(f"an SD from {n} rounds is rough")
        planned = needed is not None and needed <= max_rounds
        rows.append(ThroughputPlanRow(c, n, med, sd, mad, t1, t0, budget, margin, needed, needed_hi, planned,
                                      "; ".join(note)))
    unplanned = [r.c for r in rows if r.budget is not None and not r.planned]
    if unplanned:
        notes.append(f"no rounds planned for c={unplanned}: the draft keeps their budgets, and the judge will not "
                     "pass them on this design")
    return ThroughputPlan(rows=rows, alpha=alpha, power=power, digests=pilot.digests, notes=notes)


def throughput_draft(question: Question, plan: ThroughputPlan, budgets: Mapping[int, float],
                     source: str | Path = "<draft>") -> Question:
    """The question with the basis filled in: budgets, rounds, a crossed order of that length."""
    basis = plan.basis()
    if basis is None:
        raise ValueError("no target concurrency could be planned")
    data = question.model_dump(mode="json")
    data["name"] = f"{question.name}-planned"
    data["repeats"] = basis.rounds
    data["pairing_order"] = crossed(basis.rounds, question.pairing_order[0])
    data["pass_line"] = (f"the one-sided {1 - plan.alpha:g} upper bound of the median per-round paired loss (exact "
                         "sign test) is under the budget at every target c")
    data["criteria"]["formula"] = ThroughputFormula.MEDIAN_PER_ROUND_PAIRED_LOSS.value
    data["criteria"]["budget"] = {str(c): b for c, b in sorted(budgets.items())}
    data["criteria"]["statistical_basis"] = basis.model_dump(mode="json")
    return parse_question(data, source)


# ---------------------------------------------------------------- quality


@dataclass(frozen=True)
class QualityPlan:
    n: int
    only_bi1: int
    only_bi0: int
    diff_points: float
    mcnemar_p: float
    threshold_points: float
    margin_points: float | None
    problems: int | None
    repeats: int
    available: int
    greedy: bool
    alpha: float
    power: float
    digests: list[str]
    notes: list[str]

    def basis(self) -> qstats.QualityBasis | None:
        if self.problems is None or self.margin_points is None:
            return None
        return qstats.QualityBasis(test=qstats.EXACT_MCNEMAR_EQUIVALENCE, alpha=self.alpha, power=self.power,
                                   problems=self.problems, repeats=self.repeats,
                                   min_detectable_difference=self.margin_points, pilot_digests=tuple(self.digests),
                                   notes=tuple(self.notes))

    def table(self) -> tuple[list[str], list[list[Any]]]:
        headers = ["pilot N", "only BI=1", "only BI=0", "discordant", "difference (points)", "exact McNemar p",
                   "threshold (points)", "min detectable difference (points)",
                   f"paired problems needed (alpha {self.alpha:g}, power {self.power:g})", "repeats", "decoding"]
        return headers, [[self.n, self.only_bi1, self.only_bi0, self.only_bi1 + self.only_bi0, self.diff_points,
                          self.mcnemar_p, self.threshold_points, self.margin_points, self.problems, self.repeats,
                          "greedy" if self.greedy else "sampled"]]

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class PilotError(ValueError):
    """A pilot that cannot measure what the plan needs (the message says why)."""


def plan_quality(question: Question, leg_paths: Sequence[str | Path], alpha: float, power: float,
                 threshold_points: float | None = None, margin_points: float | None = None,
                 available: int | None = None) -> QualityPlan:
    criteria: QualityCriteria = question.criteria  # type: ignore[assignment]
    # The pilot is read by the judge itself, without the frozen count or any basis of the question:
    # a pilot may be smaller than the run it plans.
    data = question.model_dump(mode="json")
    data["criteria"].update(expected_problems=None, statistical_basis=None)
    cell = judge_criteria("quality", parse_question(data), leg_paths)
    if "receipt_error" in cell.numbers:
        e = cell.numbers["receipt_error"]
        raise ReceiptError(e["file"], e["field"], e["message"])
    num = cell.numbers
    if "n" not in num or not num["n"]:
        raise PilotError("the pilot is not one BI=1 and one BI=0 quality leg that ran: " + "; ".join(cell.reasons))
    if num.get("contract_differs"):
        raise PilotError(f"the pilot's arms differ in their evaluation contract ({', '.join(num['contract_differs'])})")
    n = num["n"]
    if num["both_correct"] + num["only_bi0"] + num["only_bi1"] + num["both_wrong"] != n:
        raise PilotError("the pilot's problems do not pair (the 2x2 does not sum to N): " + "; ".join(cell.reasons))
    b, c = num["only_bi1"], num["only_bi0"]
    theta = criteria.threshold_points if threshold_points is None else threshold_points
    diff = 100.0 * (b - c) / n
    notes: list[str] = []
    margin = theta - abs(diff) if margin_points is None else margin_points
    problems = None
    if not margin > 0:
        notes.append(f"the pilot's |difference| {abs(diff):.4g} points is at or over the threshold {theta:g}: no "
                     "number of problems is expected to pass (the frozen rule would fail it); --mdd plans for "
                     "another true difference")
        margin = None
    else:
        problems = qstats.problems_needed(theta / 100, margin / 100, (b + c) / n, alpha, power)
        if problems is None:
            notes.append(f"more than {qstats.MAX_PROBLEMS} problems at this discordance")
    if b + c == 0:
        notes.append(f"no discordant problem among the pilot's {n}: the plan assumes none, which a larger run may "
                     "not bear out")
    greedy = bool(criteria.greedy)
    have = available if available is not None else n
    repeats = 1
    if problems is not None and problems > have:
        if greedy:
            notes.append(f"{problems} paired problems are needed and {have} are available: under greedy decoding a "
                         "repeat gives the same answers, so only more problems help")
        else:
            repeats = qstats.repeats_for(problems, have)
            notes.append(f"{have} problems available: {repeats} sampled repeats per problem and arm, each repeat its "
                         "own paired row; this counts repeats as independent pairs, which holds only if the switch "
                         "moves every problem alike (docs/statistics.md)")
    return QualityPlan(n=n, only_bi1=b, only_bi0=c, diff_points=diff, mcnemar_p=qstats.mcnemar_p(b, c),
                       threshold_points=theta, margin_points=margin, problems=problems, repeats=repeats,
                       available=have, greedy=greedy, alpha=alpha, power=power,
                       digests=sorted(set(cell.receipt_hashes.values()) - {""}), notes=notes)


def quality_draft(question: Question, plan: QualityPlan, source: str | Path = "<draft>") -> Question:
    basis = plan.basis()
    if basis is None:
        raise ValueError("the number of problems could not be planned")
    data = question.model_dump(mode="json")
    data["name"] = f"{question.name}-planned"
    data["pass_line"] = (f"the {1 - plan.alpha:g} exact McNemar bounds of the score difference lie inside "
                         f"+-{plan.threshold_points:g} points")
    data["criteria"]["threshold_points"] = plan.threshold_points
    data["criteria"]["expected_problems"] = basis.problems
    data["criteria"]["statistical_basis"] = basis.model_dump(mode="json")
    return parse_question(data, source)


def draft_yaml(question: Question, item: str) -> str:
    """The draft's YAML, with the header that says it is not frozen."""
    import yaml

    what, size = ("budgets", "rounds") if item == "throughput" else ("threshold", "problems")
    data = question.model_dump(mode="json")
    return DRAFT_HEADER.format(item=item, what=what, size=size) + yaml.safe_dump(
        data, sort_keys=False, allow_unicode=True, default_flow_style=None, width=100)


__all__ = ["Pilot", "PilotConcurrency", "PilotError", "QualityPlan", "ThroughputPlan", "ThroughputPlanRow",
           "draft_yaml", "plan_quality", "plan_throughput", "quality_draft", "read_pilot",
           "throughput_draft"]
