"""A throughput budget made decidable: the exact sign test on the median per-round paired loss.

The frozen statistic is the median of the per-round losses d_r = 1 - T_BI1[c,r] / T_BI0[c,r].
Its test must be about the same median and must not assume a shape: throughput noise has
fast/slow tiers (two modes) and rare stalls (a long tail), so neither normality (t test) nor
symmetry (Wilcoxon) holds. For any continuous distribution with median m, the number of rounds
with d_r < m is Binomial(n, 1/2); hence

  * the one-sided (1 - alpha) upper bound of m is the order statistic d_(k), with k the
    smallest count such that P(Binomial(n, 1/2) >= k) <= alpha: m > d_(k) has probability at
    most alpha, whatever the distribution;
  * pass  <=> d_(k) < budget  <=> at least k of n rounds are under the budget
           <=> scipy.stats.binomtest(#under, n, 1/2, alternative="greater").pvalue <= alpha.

A pass therefore says "the median loss is under the budget with confidence 1 - alpha", and the
rule can be checked by eye on the per-round table. Fail stays the practice's frozen rule (the
median over the budget), with the lower bound d_(n-k+1) said beside it; between the two the
cell is inconclusive and says how many more crossed rounds would decide at the measured spread.

The price of making no assumption: at alpha = 0.05 no design under 5 rounds can ever pass
(0.5^4 > 0.05), and at a given spread the sign test needs about 1.6 times the rounds a t test
would. Planning (how many rounds) does assume a shape, a normal spread with the pilot's SD; a
wrong planning assumption costs rounds or power, never a false pass.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tica.stats._scipy import stats

from tica.stats.bases import FAIL, INCONCLUSIVE, PASS, SIGN_TEST_MEDIAN, ThroughputBasis, min_rounds
from tica.stats.bases import THROUGHPUT_TESTS as KNOWN_TESTS

__all__ = ["FAIL", "INCONCLUSIVE", "KNOWN_TESTS", "PASS", "SIGN_TEST_MEDIAN", "ThroughputBasis", "ThroughputDecision",
           "decide", "median_bounds", "min_rounds", "pass_probability", "p_under", "rounds_needed", "sign_test_k",
           "sign_test_p", "smallest_decidable_margin", "spread"]

MAX_ROUNDS = 10_000


def sign_test_k(n: int, alpha: float) -> int | None:
    """How many of n rounds must lie under the budget for the one-sided sign test to reject
    'median >= budget' at alpha; None when even n of n would not."""
    if n < 1:
        return None
    k = int(stats.binom.isf(alpha, n, 0.5)) + 1
    return k if k <= n else None


def median_bounds(losses: Sequence[float] | np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided (1 - alpha) lower and upper confidence bounds of the median along the last axis
    (order statistics d_(n-k+1) and d_(k)); NaN where n rounds are too few for any bound."""
    x = np.sort(np.asarray(losses, dtype=float), axis=-1)
    n = x.shape[-1]
    k = sign_test_k(n, alpha)
    if k is None:
        nan = np.full(x.shape[:-1], np.nan)
        return nan, nan.copy()
    return x[..., n - k], x[..., k - 1]


def sign_test_p(losses: Sequence[float], budget: float) -> float:
    """p-value of 'median >= budget' against 'median < budget' (a round at the budget counts as not under)."""
    under = sum(1 for d in losses if d < budget)
    return float(stats.binomtest(under, len(losses), 0.5, alternative="greater").pvalue)


def pass_probability(n: int | np.ndarray, p_under: float, alpha: float) -> np.ndarray:
    """Chance that n rounds pass when each lies under the budget with probability p_under."""
    n = np.atleast_1d(np.asarray(n, dtype=int))
    k = stats.binom.isf(alpha, n, 0.5) + 1
    prob = stats.binom.sf(k - 1, n, p_under)
    return np.where(k <= n, prob, 0.0)


def p_under(margin: float, sd: float) -> float:
    """Planning model: a round lies under the budget with probability Phi(margin / sd)."""
    if sd <= 0:
        return 1.0 if margin > 0 else 0.5
    return float(stats.norm.cdf(margin / sd))


def rounds_needed(margin: float, sd: float, alpha: float, power: float, max_rounds: int = MAX_ROUNDS) -> int | None:
    """Crossed rounds for the sign test to pass with probability >= power when the true median
    loss sits `margin` under the budget and rounds spread normally with SD `sd`; None when no
    number up to max_rounds does (margin <= 0: a loss at or over the budget is never expected
    to pass)."""
    if not margin > 0 or not math.isfinite(sd):
        return None
    p, start = p_under(margin, sd), 1
    for stop in (128, 2048, max_rounds):  # most answers are small: look there first
        n = np.arange(start, min(stop, max_rounds) + 1)
        ok = np.nonzero(pass_probability(n, p, alpha) >= power)[0]
        if ok.size:
            return int(n[ok[0]])
        start = stop + 1
        if start > max_rounds:
            break
    return None


def smallest_decidable_margin(n: int, sd: float, alpha: float, power: float) -> float | None:
    """The smallest margin under the budget that n rounds decide (pass with probability >=
    power) at spread sd; None when n rounds can never pass at alpha."""
    k = sign_test_k(n, alpha)
    if k is None:
        return None
    # P(Binomial(n, p) >= k) = I_p(k, n - k + 1): the p that gives `power` is a beta quantile.
    p_needed = float(stats.beta.ppf(power, k, n - k + 1))
    return 0.0 if sd <= 0 else sd * float(stats.norm.ppf(p_needed))


def spread(losses: Sequence[float]) -> tuple[float | None, float | None]:
    """(SD, MAD scaled to an SD under normality) of per-round losses; None under two rounds / one round."""
    sd = statistics.stdev(losses) if len(losses) >= 2 else None
    mad = float(stats.median_abs_deviation(losses, scale="normal")) if len(losses) >= 1 else None
    return sd, mad


@dataclass(frozen=True)
class ThroughputDecision:
    verdict: str  # "pass" | "fail" | "inconclusive"
    reason: str
    rounds: int
    statistic: float | None = None
    lower: float | None = None
    upper: float | None = None
    p_value: float | None = None
    sd: float | None = None
    more_rounds: int | None = None

    def numbers(self) -> dict[str, object]:
        return {"decision": self.verdict, "rounds": self.rounds, "median": self.statistic,
                "lower_bound": self.lower, "upper_bound": self.upper, "p_value": self.p_value, "sd": self.sd,
                "more_rounds": self.more_rounds}


def _f(x: float) -> str:
    return f"{x:.4g}"


def decide(losses: Sequence[float], budget: float, basis: ThroughputBasis) -> ThroughputDecision:
    """The decision of the frozen basis at one concurrency, from its valid per-round losses."""
    n = len(losses)
    if basis.test not in KNOWN_TESTS:
        return ThroughputDecision(INCONCLUSIVE, f"the statistical basis names test {basis.test!r}, which this TICA "
                                  f"does not know ({', '.join(sorted(KNOWN_TESTS))}): no pass", n)
    if n < basis.rounds:
        return ThroughputDecision(INCONCLUSIVE, f"{n} valid round(s), the statistical basis needs {basis.rounds}: "
                                  "no pass", n)
    level = f"{1 - basis.alpha:g}"
    med = statistics.median(losses)
    lo, hi = (float(v) for v in median_bounds(losses, basis.alpha))
    p = sign_test_p(losses, budget)
    sd, _ = spread(losses)
    common = dict(rounds=n, statistic=med, lower=lo, upper=hi, p_value=p, sd=sd)
    if med > budget:
        how = (f"its one-sided {level} lower bound {_f(lo)} is over the budget too" if lo > budget else
               f"its one-sided {level} lower bound {_f(lo)} is under the budget: the overrun is inside the noise, "
               "and a fail by the frozen rule all the same")
        return ThroughputDecision(FAIL, f"median loss {_f(med)} over the budget {budget:g}; {how}", **common)
    if hi < budget:
        return ThroughputDecision(PASS, f"the one-sided {level} upper bound of the median loss, {_f(hi)}, is under "
                                  f"the budget {budget:g} ({basis.test}, p = {p:.3g} <= alpha {basis.alpha:g})", **common)
    total = rounds_needed(budget - med, sd if sd is not None else float("nan"), basis.alpha, basis.power)
    more = None if total is None else max(total - n, 1)
    if more is not None:
        tail = (f"about {more} more crossed round(s) would decide at the measured spread (SD {_f(sd or 0.0)}; a new "
                f"question of {n + more} rounds)")
    elif med == budget:
        tail = "the measured median sits on the budget: no number of rounds is expected to decide"
    else:
        tail = f"no number of rounds up to {MAX_ROUNDS} is expected to decide at the measured spread"
    return ThroughputDecision(INCONCLUSIVE, f"inside the noise: median loss {_f(med)}, its one-sided {level} upper "
                              f"bound {_f(hi)} is not under the budget {budget:g}; {tail}", more_rounds=more, **common)
