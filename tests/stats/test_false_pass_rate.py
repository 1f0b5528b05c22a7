"""Simulations: a pass's error rate stays within the frozen alpha (docs/statistics.md quotes them).

Each scenario draws RUNS independent runs at a known true value, decides every run with the same
function the judges call (vectorised over runs), and counts passes. At the pass line itself a
pass is a false pass: its rate must stay within alpha (allowing three binomial standard errors
of simulation noise). The negative controls show the tests are not simply refusing everything:
well inside the line they pass at about the planned power, past it they pass less than alpha.
Run with `-s` to see the figures.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from tica.stats import quality as q
from tica.stats import throughput as t

RUNS = 20_000
ALPHA = 0.05
BUDGET = 0.10
SD = 0.03


def _se(p: float) -> float:
    return math.sqrt(max(p, 1e-4) * (1 - max(p, 1e-4)) / RUNS)


def _report(name: str, rate: float) -> None:
    print(f"\n[simulation] {name}: {rate:.4f} of {RUNS} runs")


# ---- per-round paired losses whose true median is exactly `median`, in several shapes


def _noise(kind: str, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Noise with median exactly 0."""
    if kind == "normal":
        return rng.normal(0, SD, shape)
    if kind == "two_tier":
        # Half the rounds sit just over the median; under it, a slow BI=0 tier drags some losses far down.
        up = np.abs(rng.normal(0, SD / 3, shape))
        down = -np.where(rng.random(shape) < 0.6, 4 * SD + np.abs(rng.normal(0, SD / 3, shape)),
                         np.abs(rng.normal(0, SD / 3, shape)))
        return np.where(rng.random(shape) < 0.5, up, down)
    if kind == "heavy_tail":
        return SD * rng.standard_cauchy(shape)
    if kind == "skewed":
        return SD * (rng.lognormal(0, 1, shape) - 1.0)  # lognormal(0, 1) has median 1
    raise ValueError(kind)


def _sign_test_passes(losses: np.ndarray, budget: float = BUDGET) -> np.ndarray:
    _, upper = t.median_bounds(losses, ALPHA)
    return upper < budget


@pytest.mark.parametrize("kind", ["normal", "two_tier", "heavy_tail", "skewed"])
@pytest.mark.parametrize("rounds", [5, 8, 12])
def test_at_a_true_loss_on_the_budget_the_false_pass_rate_is_within_alpha(kind, rounds):
    rng = np.random.default_rng(1000 + rounds)
    losses = BUDGET + _noise(kind, rng, (RUNS, rounds))
    rate = float(_sign_test_passes(losses).mean())
    exact = float(stats.binom.sf(t.sign_test_k(rounds, ALPHA) - 1, rounds, 0.5))  # the test's exact size
    _report(f"throughput sign test, true median loss = budget, {kind}, {rounds} rounds (exact size {exact:.4f})", rate)
    assert rate <= ALPHA + 3 * _se(ALPHA)
    assert rate == pytest.approx(exact, abs=4 * _se(exact))


def test_well_under_the_budget_the_sign_test_passes_at_its_planned_power():
    """Negative control: at the minimum detectable difference the design passes about as planned."""
    margin = 2 * SD
    n = t.rounds_needed(margin, SD, ALPHA, 0.8)
    losses = BUDGET - margin + _noise("normal", np.random.default_rng(7), (RUNS, n))
    rate = float(_sign_test_passes(losses).mean())
    planned = float(t.pass_probability(n, t.p_under(margin, SD), ALPHA)[0])
    _report(f"throughput sign test, true loss {margin:g} under the budget, {n} rounds (planned {planned:.3f})", rate)
    assert rate >= 0.8 - 3 * _se(0.8)
    assert rate == pytest.approx(planned, abs=4 * _se(planned))


def test_over_the_budget_passes_are_rarer_than_alpha():
    losses = BUDGET + SD / 2 + _noise("normal", np.random.default_rng(8), (RUNS, 8))
    rate = float(_sign_test_passes(losses).mean())
    _report("throughput sign test, true loss half an SD over the budget, 8 rounds", rate)
    assert rate < ALPHA


def test_the_judges_decision_is_the_simulated_rule():
    """The vectorised rule the simulations count is the one `decide` applies to a run."""
    basis = t.ThroughputBasis(test=t.SIGN_TEST_MEDIAN, alpha=ALPHA, rounds=8, pilot_digests=("sha256:0",))
    losses = BUDGET + _noise("two_tier", np.random.default_rng(9), (400, 8)) - 0.01
    simulated = _sign_test_passes(losses)
    decided = np.array([t.decide(list(row), BUDGET, basis).verdict == "pass" for row in losses])
    assert simulated.any() and not simulated.all()
    assert (simulated == decided).all()


def test_a_t_test_on_the_same_two_tier_losses_would_pass_falsely_far_more_than_alpha():
    """Why the frozen test is not a one-sample t test: with a slow BI=0 tier the mean sits under the
    median, and a t test on the mean passes a median that is exactly on the budget."""
    losses = BUDGET + _noise("two_tier", np.random.default_rng(10), (RUNS, 8))
    p = stats.ttest_1samp(losses, BUDGET, axis=1, alternative="less").pvalue
    rate = float((p <= ALPHA).mean())
    _report("one-sample t test (not used), true median loss = budget, two_tier, 8 rounds", rate)
    assert rate > 5 * ALPHA
    assert float(_sign_test_passes(losses).mean()) <= ALPHA + 3 * _se(ALPHA)  # control: the sign test holds


# ---- quality: paired problems at a known true difference


def _mcnemar_passes(n: int, p10: float, p01: float, threshold: float, seed: int) -> np.ndarray:
    counts = np.random.default_rng(seed).multinomial(n, [p10, p01, 1 - p10 - p01], size=RUNS)
    lo, hi = q.difference_bounds(counts[:, 0], counts[:, 1], n, ALPHA)
    return (hi < threshold) & (lo > -threshold)


@pytest.mark.parametrize("discordance", [0.05, 0.10, 0.30])
@pytest.mark.parametrize("sign", [1, -1])
def test_at_a_true_difference_on_the_threshold_the_mcnemar_false_pass_rate_is_within_alpha(discordance, sign):
    threshold, n = 0.05, 1500
    p10, p01 = (discordance + sign * threshold) / 2, (discordance - sign * threshold) / 2
    rate = float(_mcnemar_passes(n, p10, p01, threshold, seed=int(100 * discordance) + sign).mean())
    _report(f"quality exact McNemar bounds, true |difference| = threshold 5 points, discordance {discordance:g}, "
            f"N {n}, sign {sign:+d}", rate)
    assert rate <= ALPHA + 3 * _se(ALPHA)


def test_with_no_true_difference_the_planned_problems_pass_at_their_power():
    """Negative control: at the planned N and no true difference the bounds pass about as planned."""
    threshold, discordance = 0.05, 0.10
    n = q.problems_needed(threshold, threshold, discordance, ALPHA, 0.8)
    rate = float(_mcnemar_passes(n, discordance / 2, discordance / 2, threshold, seed=21).mean())
    _report(f"quality exact McNemar bounds, no true difference, discordance 0.1, N {n} (planned)", rate)
    assert rate >= 0.8 - 3 * _se(0.8)


def test_past_the_threshold_quality_passes_are_rarer_than_alpha():
    threshold, n = 0.05, 1500
    rate = float(_mcnemar_passes(n, 0.1, 0.025, threshold, seed=22).mean())  # true difference 7.5 points
    _report("quality exact McNemar bounds, true difference 7.5 points past a 5-point threshold, N 1500", rate)
    assert rate < ALPHA


def test_the_quality_judges_decision_is_the_simulated_rule():
    rng = np.random.default_rng(23)
    n = 800
    basis = q.QualityBasis(test=q.EXACT_MCNEMAR_EQUIVALENCE, alpha=ALPHA, problems=n, min_detectable_difference=5.0,
                           pilot_digests=("sha256:0",))
    counts = rng.multinomial(n, [0.05, 0.04, 0.91], size=200)
    lo, hi = q.difference_bounds(counts[:, 0], counts[:, 1], n, ALPHA)
    simulated = (hi < 0.05) & (lo > -0.05)
    decided = np.array([q.decide(int(b), int(c), n, 5.0, basis).verdict == "pass" for b, c, _ in counts])
    assert simulated.any() and not simulated.all()
    assert (simulated == decided).all()
