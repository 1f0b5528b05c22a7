"""A quality threshold made decidable: exact (McNemar) bounds on the discordant pairs.

Each problem is one pair: BI=1 and BI=0 correct or not. Only the discordant problems carry the
difference: b = only BI=1 correct, c = only BI=0 correct, n_d = b + c of N. The score difference
is Delta = p10 - p01 = (2 pi - 1) p_d, where p_d = P(discordant) and pi = P(BI=1 wins | discordant).

The question is an equivalence: pass must mean |Delta| < threshold with confidence 1 - alpha.
Two exact binomial bounds give it, each at alpha/2:

  * pi, given n_d: b ~ Binomial(n_d, pi): the exact McNemar bound (Clopper-Pearson, the interval
    of scipy.stats.binomtest(b, n_d).proportion_ci(method="exact"));
  * p_d: n_d ~ Binomial(N, p_d): its exact upper bound.

Upper bound of Delta = max(2 pi_hi - 1, 0) * p_d_hi, lower bound = min(2 pi_lo - 1, 0) * p_d_hi;
pass when both lie strictly inside +-threshold. If the true Delta >= threshold (> 0), a pass needs
pi > pi_hi or p_d > p_d_hi: probability at most alpha/2 + alpha/2 (the same on the other side), so
the false-pass rate is at most alpha whatever the nuisance p_d. Fail stays the practice's
frozen rule (|score difference| over the threshold), with the exact McNemar p-value of "no
difference" said beside it; between the two the cell is inconclusive.

The bound pays for the unknown discordance rate: with 30 problems no threshold under ~11 points
can pass even with no discordant problem at all. That is what 30 problems can say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from tica.stats._scipy import stats

from tica.stats.bases import EXACT_MCNEMAR_EQUIVALENCE, FAIL, INCONCLUSIVE, PASS, QualityBasis
from tica.stats.bases import QUALITY_TESTS as KNOWN_TESTS

__all__ = ["EXACT_MCNEMAR_EQUIVALENCE", "FAIL", "INCONCLUSIVE", "KNOWN_TESTS", "PASS", "QualityBasis", "QualityDecision",
           "decide", "difference_bounds", "mcnemar_p", "pass_probability", "problems_needed", "repeats_for"]

MAX_PROBLEMS = 1_000_000
_TAIL = 1e-12  # probability of discordant counts left out (each tail) when a power is summed


def difference_bounds(b: np.ndarray | int, c: np.ndarray | int, n: np.ndarray | int,
                      alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided (1 - alpha) lower and upper bounds of p10 - p01 (a proportion, not points)."""
    b, c, n = (np.asarray(v, dtype=float) for v in (b, c, n))
    nd = b + c
    with np.errstate(invalid="ignore", divide="ignore"):
        pi_lo = np.where(b > 0, stats.beta.ppf(alpha / 2, b, nd - b + 1), 0.0)
        pi_hi = np.where(b < nd, stats.beta.ppf(1 - alpha / 2, b + 1, nd - b), 1.0)
        pd_hi = np.where(nd < n, stats.beta.ppf(1 - alpha / 2, nd + 1, n - nd), 1.0)
    return np.minimum(2 * pi_lo - 1, 0.0) * pd_hi, np.maximum(2 * pi_hi - 1, 0.0) * pd_hi


def mcnemar_p(b: int, c: int) -> float:
    """Exact McNemar p-value (two-sided) of 'no difference': a binomial test on the discordant pairs."""
    return float(stats.binomtest(b, b + c, 0.5).pvalue) if b + c else 1.0


def _first_true(pred, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per element, the smallest integer b in [lo, hi] with pred(b) true (hi + 1 when none),
    for a predicate that is false then true as b grows; a vectorised bisection."""
    lo, hi = lo.copy(), hi + 1  # invariant: pred false below lo, true at hi (hi + 1: a sentinel)
    while (open_ := hi > lo).any():
        mid = np.where(open_, (lo + hi) // 2, lo)
        ok = pred(np.minimum(mid, hi - 1))
        hi = np.where(open_ & ok, mid, hi)
        lo = np.where(open_ & ~ok, mid + 1, lo)
    return hi


def pass_probability(n: int, p10: float, p01: float, threshold: float, alpha: float) -> float:
    """Chance that n problems pass when each is BI=1-only correct with p10 and BI=0-only with p01
    (threshold a proportion). Exact: for each discordant count n_d the passing b form an interval
    (both bounds grow with b), found by bisection; n_d tails under 1e-12 are left out."""
    pd = p10 + p01
    if pd <= 0:
        lo, hi = difference_bounds(0, 0, n, alpha)
        return float((hi < threshold) & (lo > -threshold))
    pi = p10 / pd
    nd = np.arange(max(int(stats.binom.ppf(_TAIL, n, pd)), 0), min(int(stats.binom.isf(_TAIL, n, pd)), n) + 1)
    zero = np.zeros_like(nd)
    # first b whose lower bound clears -threshold; first b whose upper bound reaches +threshold
    b_from = _first_true(lambda b: difference_bounds(b, nd - b, n, alpha)[0] > -threshold, zero, nd)
    b_past = _first_true(lambda b: difference_bounds(b, nd - b, n, alpha)[1] >= threshold, zero, nd)
    inside = np.where(b_past > b_from, stats.binom.cdf(b_past - 1, nd, pi) - stats.binom.cdf(b_from - 1, nd, pi), 0.0)
    return float((stats.binom.pmf(nd, n, pd) * inside).sum())


def problems_needed(threshold: float, margin: float, discordance: float, alpha: float, power: float,
                    max_problems: int = MAX_PROBLEMS) -> int | None:
    """About how many paired problems pass with probability >= power when the true |difference|
    is threshold - margin (proportions) and problems disagree at rate `discordance`; None when
    none up to max_problems do (margin <= 0: at or over the threshold, never expected to pass)."""
    if not margin > 0:
        return None
    delta = max(threshold - margin, 0.0)
    pd = min(max(discordance, delta), 1.0)  # at least |delta| of the problems must disagree
    p10, p01 = (pd + delta) / 2, (pd - delta) / 2

    def ok(n: int) -> bool:
        return pass_probability(n, p10, p01, threshold, alpha) >= power

    # Start near the normal approximation, then double and bisect on the exact power. The power
    # is near-monotone in n (a discrete saw-tooth), and the answer is "about" (within 2%).
    z = float(stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power))
    guess = z * z * max(pd, 1e-9) / (margin * margin)
    hi = int(min(max(2.0, guess / 2), max_problems))
    lo = 1
    while not ok(hi):
        if hi >= max_problems:
            return None
        lo, hi = hi, min(hi * 2, max_problems)
    while hi - lo > max(1, hi // 50):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def repeats_for(problems: int, available: int) -> int:
    """Samples per problem and arm to reach `problems` paired outcomes from `available` problems."""
    return max(1, math.ceil(problems / max(available, 1)))


@dataclass(frozen=True)
class QualityDecision:
    verdict: str  # "pass" | "fail" | "inconclusive"
    reason: str
    problems: int
    diff_points: float | None = None
    lower_points: float | None = None
    upper_points: float | None = None
    mcnemar_p: float | None = None
    more_problems: int | None = None

    def numbers(self) -> dict[str, object]:
        return {"decision": self.verdict, "problems": self.problems, "diff_points": self.diff_points,
                "lower_bound_points": self.lower_points, "upper_bound_points": self.upper_points,
                "mcnemar_p": self.mcnemar_p, "more_problems": self.more_problems}


def decide(b: int, c: int, n: int, threshold_points: float, basis: QualityBasis,
           contract_repeats: tuple[int, ...] = (1,)) -> QualityDecision:
    """The decision of the frozen basis over one pairing: b only BI=1 correct, c only BI=0, of n."""
    if basis.test not in KNOWN_TESTS:
        return QualityDecision(INCONCLUSIVE, f"the statistical basis names test {basis.test!r}, which this TICA does "
                               f"not know ({', '.join(KNOWN_TESTS)}): no pass", n)
    if n < basis.problems:
        return QualityDecision(INCONCLUSIVE, f"{n} paired problem(s), the statistical basis needs {basis.problems}: "
                               "no pass", n)
    if any(r != basis.repeats for r in contract_repeats):
        return QualityDecision(INCONCLUSIVE, f"the contracts' repeats {list(contract_repeats)} are not the "
                               f"{basis.repeats} the statistical basis was planned for: no pass", n)
    level = f"{1 - basis.alpha:g}"
    diff = 100.0 * (b - c) / n
    lo, hi = (100.0 * float(v) for v in difference_bounds(b, c, n, basis.alpha))
    p = mcnemar_p(b, c)
    common = dict(problems=n, diff_points=diff, lower_points=lo, upper_points=hi, mcnemar_p=p)
    if abs(diff) > threshold_points + 1e-9:
        how = ("the exact McNemar test finds a difference" if p <= basis.alpha else
               "the exact McNemar test does not separate it from no difference: inside the noise, and a fail by "
               "the frozen rule all the same")
        return QualityDecision(FAIL, f"|difference| {abs(diff):.4g} points over the threshold {threshold_points:g} "
                               f"(McNemar p = {p:.3g}; {how})", **common)
    if hi < threshold_points and lo > -threshold_points:
        return QualityDecision(PASS, f"the {level} bounds of the difference, [{lo:.4g}, {hi:.4g}] points, lie inside "
                               f"+-{threshold_points:g} ({basis.test})", **common)
    total = problems_needed(threshold_points / 100, (threshold_points - abs(diff)) / 100, (b + c) / n,
                            basis.alpha, basis.power)
    more = None if total is None else max(total - n, 1)
    tail = (f"about {more} more paired problems would decide at the measured discordance ({b + c} of {n})"
            if more is not None else "no number of problems is expected to decide at the measured difference")
    return QualityDecision(INCONCLUSIVE, f"inside the noise: the {level} bounds of the difference, [{lo:.4g}, "
                           f"{hi:.4g}] points, reach past +-{threshold_points:g}; {tail}", more_problems=more, **common)
