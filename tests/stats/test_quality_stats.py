"""The exact McNemar bounds behind a quality threshold."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tica.stats import quality as q
from tica.stats.quality import QualityBasis

BASIS = QualityBasis(test=q.EXACT_MCNEMAR_EQUIVALENCE, alpha=0.05, problems=30, min_detectable_difference=3.0,
                     pilot_digests=("sha256:" + "0" * 64,))


@pytest.mark.parametrize("b,c,n", [(1, 1, 30), (0, 0, 30), (5, 2, 100), (0, 3, 50), (12, 4, 400), (30, 0, 30)])
def test_bounds_are_built_from_scipys_exact_binomial_intervals(b, c, n):
    alpha = 0.05
    lo, hi = q.difference_bounds(b, c, n, alpha)
    nd = b + c
    pi = stats.binomtest(b, nd).proportion_ci(1 - alpha, "exact") if nd else None
    pd_hi = stats.binomtest(nd, n).proportion_ci(1 - alpha, "exact").high
    pi_lo, pi_hi = (pi.low, pi.high) if pi else (0.0, 1.0)
    assert float(hi) == pytest.approx(max(2 * pi_hi - 1, 0) * pd_hi, abs=1e-9)
    assert float(lo) == pytest.approx(min(2 * pi_lo - 1, 0) * pd_hi, abs=1e-9)
    assert float(lo) <= (b - c) / n <= float(hi)


def test_thirty_problems_cannot_pass_a_one_problem_threshold():
    """What 30 problems can say: even with no discordant problem the bound is about 11.6 points."""
    lo, hi = q.difference_bounds(0, 0, 30, 0.05)
    assert 100 * float(hi) == pytest.approx(11.57, abs=0.01) and float(lo) == -float(hi)
    d = q.decide(1, 1, 30, 3.34, BASIS)
    assert d.verdict == "inconclusive" and "more paired problems" in d.reason
    assert d.more_problems and d.more_problems > 100


def test_a_large_pairing_with_few_discordant_problems_passes():
    basis = BASIS.model_copy(update={"problems": 1000})
    assert q.decide(2, 1, 1000, 3.0, basis).verdict == "pass"
    assert q.decide(2, 1, 999, 3.0, basis).verdict == "inconclusive"  # control: fewer problems than the basis


def test_over_the_threshold_is_a_fail_by_the_frozen_rule():
    d = q.decide(0, 2, 30, 3.34, BASIS)
    assert d.verdict == "fail" and "McNemar p = 0.5" in d.reason and "inside the noise" in d.reason


def test_an_unknown_test_or_other_repeats_never_pass():
    basis = BASIS.model_copy(update={"problems": 1000})
    assert q.decide(2, 1, 1000, 3.0, basis.model_copy(update={"test": "z_test"})).verdict == "inconclusive"
    assert q.decide(2, 1, 1000, 3.0, basis, contract_repeats=(1, 4)).verdict == "inconclusive"
    assert q.decide(2, 1, 1000, 3.0, basis, contract_repeats=(1, 1)).verdict == "pass"  # control


def test_problems_needed_reaches_the_power_it_promises():
    n = q.problems_needed(0.05, 0.05, 0.1, 0.05, 0.8)
    assert q.pass_probability(n, 0.05, 0.05, 0.05, 0.05) >= 0.8
    assert q.pass_probability(n // 2, 0.05, 0.05, 0.05, 0.05) < 0.8
    assert q.problems_needed(0.05, 0.0, 0.1, 0.05, 0.8) is None  # at the threshold: never expected to pass


def test_the_power_sum_matches_a_simulation():
    rng = np.random.default_rng(3)
    n, p10, p01 = 600, 0.06, 0.04
    counts = rng.multinomial(n, [p10, p01, 1 - p10 - p01], size=20_000)
    lo, hi = q.difference_bounds(counts[:, 0], counts[:, 1], n, 0.05)
    simulated = float(np.mean((hi < 0.06) & (lo > -0.06)))
    assert simulated == pytest.approx(q.pass_probability(n, p10, p01, 0.06, 0.05), abs=0.015)


@pytest.mark.parametrize("n,p10,p01,threshold", [(300, 0.05, 0.05, 0.05), (100, 0.2, 0.1, 0.2), (50, 0.3, 0.0, 0.5)])
def test_the_power_by_bisection_is_the_full_sum_over_every_outcome(n, p10, p01, threshold):
    full = 0.0
    for nd in range(n + 1):
        b = np.arange(nd + 1)
        lo, hi = q.difference_bounds(b, nd - b, n, 0.05)
        within = stats.binom.pmf(b, nd, p10 / (p10 + p01)) * ((hi < threshold) & (lo > -threshold))
        full += stats.binom.pmf(nd, n, p10 + p01) * within.sum()
    assert q.pass_probability(n, p10, p01, threshold, 0.05) == pytest.approx(full, abs=1e-9)
