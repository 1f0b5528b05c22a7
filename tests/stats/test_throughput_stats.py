"""The sign test behind a throughput budget: its bounds, its p-value and its plan agree."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tica.stats import throughput as t
from tica.stats.throughput import ThroughputBasis

BASIS = ThroughputBasis(test=t.SIGN_TEST_MEDIAN, alpha=0.05, rounds=5, pilot_digests=("sha256:" + "0" * 64,))


@pytest.mark.parametrize("alpha", [0.01, 0.03125, 0.05, 0.1, 0.25])
def test_k_is_the_smallest_count_whose_binomial_tail_is_within_alpha(alpha):
    for n in range(1, 40):
        brute = next((k for k in range(n + 1) if stats.binom.sf(k - 1, n, 0.5) <= alpha), None)
        assert t.sign_test_k(n, alpha) == brute
    assert t.sign_test_k(t.min_rounds(alpha), alpha) is not None
    assert t.sign_test_k(t.min_rounds(alpha) - 1, alpha) is None  # control: one round fewer can never pass


def test_the_upper_bound_under_the_budget_is_the_binomial_test_rejecting():
    rng = np.random.default_rng(5)
    for _ in range(400):
        n = int(rng.integers(5, 15))
        d = rng.normal(0.1, 0.03, n)
        budget = float(rng.uniform(0.05, 0.2))
        _, hi = t.median_bounds(d, 0.05)
        assert (hi < budget) == (t.sign_test_p(d, budget) <= 0.05)


def test_median_bounds_vectorise_over_runs():
    d = np.random.default_rng(1).normal(size=(50, 7))
    lo, hi = t.median_bounds(d, 0.05)
    assert lo.shape == hi.shape == (50,)
    for row, l, h in zip(d, lo, hi):
        rl, rh = t.median_bounds(row, 0.05)
        assert (l, h) == (rl, rh) and l <= np.median(row) <= h


def test_too_few_rounds_have_no_bound():
    lo, hi = t.median_bounds([0.01, 0.02, 0.03, 0.04], 0.05)
    assert np.isnan(lo) and np.isnan(hi)


def test_rounds_needed_is_the_first_n_with_enough_power():
    n = t.rounds_needed(0.03, 0.03, 0.05, 0.8)
    p = t.p_under(0.03, 0.03)
    assert t.pass_probability(n, p, 0.05)[0] >= 0.8
    assert all(t.pass_probability(m, p, 0.05)[0] < 0.8 for m in range(1, n))


def test_the_smallest_decidable_margin_at_n_needs_at_most_n_rounds():
    for n in (5, 9, 20, 40):
        m = t.smallest_decidable_margin(n, 0.04, 0.05, 0.8)
        assert t.rounds_needed(m * 1.0001, 0.04, 0.05, 0.8) <= n
    assert t.smallest_decidable_margin(4, 0.04, 0.05, 0.8) is None


def test_a_loss_at_or_over_the_budget_needs_no_finite_number_of_rounds():
    assert t.rounds_needed(0.0, 0.03, 0.05, 0.8) is None
    assert t.rounds_needed(-0.01, 0.03, 0.05, 0.8) is None
    assert t.rounds_needed(0.01, 0.03, 0.05, 0.8) is not None


def test_decide_passes_only_when_every_needed_round_is_under_the_budget():
    assert t.decide([0.02, 0.03, 0.04, 0.05, 0.06], 0.1, BASIS).verdict == "pass"
    d = t.decide([0.02, 0.03, 0.04, 0.05, 0.12], 0.1, BASIS)  # one round over: 4 of 5 under is not enough
    assert d.verdict == "inconclusive" and "inside the noise" in d.reason and d.more_rounds >= 1


def test_decide_fails_a_median_over_the_budget_and_says_what_its_bound_says():
    d = t.decide([0.09, 0.11, 0.12, 0.13, 0.2], 0.1, BASIS)
    assert d.verdict == "fail" and "inside the noise" in d.reason  # lower bound 0.09 < 0.1
    d = t.decide([0.11, 0.12, 0.13, 0.14, 0.2], 0.1, BASIS)
    assert d.verdict == "fail" and "lower bound 0.11 is over the budget too" in d.reason


def test_decide_refuses_fewer_rounds_than_the_basis_and_an_unknown_test():
    assert t.decide([0.01, 0.02, 0.03, 0.04], 0.1, BASIS).verdict == "inconclusive"
    unknown = BASIS.model_copy(update={"test": "bootstrap_mean"})
    d = t.decide([0.01] * 5, 0.1, unknown)
    assert d.verdict == "inconclusive" and "does not know" in d.reason
    assert t.decide([0.01] * 5, 0.1, BASIS).verdict == "pass"  # control
