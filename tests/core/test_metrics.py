"""The streamed forward metrics: the same numbers as the straightforward float64 computation, an
exact bitwise count, a bit-identical shortcut that equals the full computation, and extra memory
bounded by the chunk, not by the number of tokens."""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from tica.metrics import (
    CHUNK,
    K3_KL,
    PEARSON,
    PROBS_DIFF_MAX,
    _full_metrics,
    forward_metrics,
    n_bitwise_diff,
)

SMALL = 64  # a chunk small enough that every boundary case below is cheap
SIZES = [1, 2, 7, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL + 5, 1000]


def reference(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """The whole-array float64 computation the streamed one replaced (verl's definitions)."""
    a, b = np.asarray(a, np.float32).ravel(), np.asarray(b, np.float32).ravel()
    pa, pb = np.exp(a.astype(np.float64)), np.exp(b.astype(np.float64))
    diff = np.abs(pa - pb)
    if a.size > 1 and pa.std() > 0 and pb.std() > 0:
        pearson = float(np.corrcoef(pa, pb)[0, 1])
    else:
        pearson = 1.0 if np.array_equal(pa, pb) else float("nan")
    log_r = a.astype(np.float64) - b.astype(np.float64)
    return {
        "training/rollout_probs_diff_max": float(diff.max()),
        "training/rollout_probs_diff_mean": float(diff.mean()),
        "training/rollout_probs_diff_std": float(diff.std()),
        PEARSON: pearson,
        K3_KL: float(np.mean(np.expm1(log_r) - log_r)),
        "tica/n_tokens": int(a.size),
        "tica/n_bitwise_diff": int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32))),
        "tica/logprob_abs_diff_max": float(np.abs(log_r).max()),
    }


def mismatches(got: dict[str, float], want: dict[str, float], rel: float = 1e-9) -> dict[str, tuple]:
    """Keys whose values differ: maxima and counts exactly, sums/moments to `rel` (float rounding)."""
    bad = {}
    for key, w in want.items():
        g = got[key]
        exact = key.endswith("_max") or isinstance(w, int)
        if isinstance(w, float) and math.isnan(w):
            ok = math.isnan(g)
        else:
            ok = g == w if exact else math.isclose(g, w, rel_tol=rel, abs_tol=1e-300)
        if not ok:
            bad[key] = (g, w)
    return bad


def pair(n: int, seed: int, scale: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = -rng.exponential(2.0, n).astype(np.float32)
    return a, (a + rng.normal(0, scale, n)).astype(np.float32)


def identical_metrics(a: np.ndarray, chunk: int = SMALL) -> tuple[dict[str, float], dict[str, float]]:
    """(the shortcut's answer, the full streamed computation's answer) for a against a copy of itself."""
    b = a.copy()
    return forward_metrics(a, b, chunk=chunk), _full_metrics(a, b, 0, chunk)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("scale", [1e-3, 1e-7])  # 1e-7: near a float32 ulp, where k3's expm1 matters
def test_chunked_metrics_equal_the_whole_array_float64_computation(n: int, scale: float) -> None:
    a, b = pair(n, seed=n, scale=scale)
    assert mismatches(forward_metrics(a, b, chunk=SMALL), reference(a, b)) == {}


def test_default_chunk_across_boundaries_equals_the_whole_array_computation() -> None:
    a, b = pair(2 * CHUNK + 3, seed=1)
    assert mismatches(forward_metrics(a, b), reference(a, b)) == {}


def test_comparison_tolerance_catches_one_changed_logprob() -> None:
    # negative control of the two above: their tolerance is not so loose that a real change passes
    a, b = pair(3 * SMALL + 5, seed=2)
    changed = b.copy()
    changed[SMALL] = np.nextafter(changed[SMALL], np.float32(0))
    assert mismatches(forward_metrics(a, changed, chunk=SMALL), reference(a, b)) != {}


def test_bitwise_count_is_exact_across_chunk_boundaries() -> None:
    n = 5 * SMALL + 3
    a = np.random.default_rng(3).normal(-2, 1, n).astype(np.float32)
    b = a.copy()
    at = [0, SMALL - 1, SMALL, 2 * SMALL + 1, n - 1]
    b[at] = np.nextafter(b[at], np.float32(np.inf))
    assert n_bitwise_diff(a, b, chunk=SMALL) == len(at)
    assert forward_metrics(a, b, chunk=SMALL)["tica/n_bitwise_diff"] == len(at)
    assert n_bitwise_diff(a, a.copy(), chunk=SMALL) == 0  # negative control


def test_signed_zero_and_nan_payload_are_bitwise_differences() -> None:
    nan_a = np.array([0x7FC00001], np.uint32).view(np.float32)
    nan_b = np.array([0x7FC00002], np.uint32).view(np.float32)
    a = np.array([0.0, nan_a[0], nan_a[0], -1.5], np.float32)
    b = np.array([-0.0, nan_b[0], nan_a[0], -1.5], np.float32)
    assert a[0] == b[0]  # numerically equal, yet the bits differ
    # +0/-0 differ, the two NaN payloads differ; the same NaN bits and -1.5 are equal bits
    assert n_bitwise_diff(a, b, chunk=1) == 2
    assert forward_metrics(a, b, chunk=1)["tica/n_bitwise_diff"] == 2


def test_where_counts_only_masked_positions() -> None:
    a = np.random.default_rng(4).normal(-2, 1, 3 * SMALL).astype(np.float32)
    filler = a.copy()
    filler[::2] = 0.0  # differs only where the mask is off
    mask = np.zeros(a.size, bool)
    mask[1::2] = True
    assert n_bitwise_diff(a, filler, where=mask, chunk=SMALL) == 0
    assert n_bitwise_diff(a, filler, chunk=SMALL) > 0  # negative control: unmasked, the filler counts


@pytest.mark.parametrize("case", ["random", "constant", "one", "two", "boundary", "very negative"])
def test_bit_identical_shortcut_equals_the_full_computation(case: str) -> None:
    rng = np.random.default_rng(5)
    a = {
        "random": rng.normal(-2, 1.5, 1000).astype(np.float32),
        "constant": np.full(3 * SMALL + 1, -1.3, np.float32),
        "one": np.array([-0.7], np.float32),
        "two": np.array([-0.7, -0.7], np.float32),
        "boundary": rng.normal(-2, 1.5, 2 * SMALL).astype(np.float32),
        "very negative": np.array([-800.0, -900.0, -0.1], np.float32),  # exp underflows to 0
    }[case]
    shortcut, full = identical_metrics(a)
    assert shortcut == full


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 800.0])
def test_non_finite_or_exp_overflow_takes_the_full_computation(value: float) -> None:
    # negative control of the shortcut: where the full computation yields NaN/inf it must be used,
    # and its answer is not the shortcut's zeros
    a = np.random.default_rng(6).normal(-2, 1, 200).astype(np.float32)
    a[SMALL + 3] = value
    with np.errstate(all="ignore"):
        got, full = identical_metrics(a)
        want = reference(a, a.copy())
    assert mismatches(got, full) == {} and mismatches(got, want) == {}
    assert math.isnan(got[K3_KL]) or math.isnan(got[PROBS_DIFF_MAX])  # not the shortcut's 0.0


@pytest.mark.parametrize(("a_value", "b_value", "want"), [(-1.3, -1.3, 1.0), (-1.3, -0.2, math.nan)])
def test_pearson_of_a_constant_side_is_one_if_the_probs_are_equal_else_nan(
    a_value: float, b_value: float, want: float
) -> None:
    # exactly constant (max == min): 12345 copies of exp(-1.3) leave the whole-array std at 5.6e-17,
    # which the old code read as variation (pearson 0.9999999999999998); the streamed one does not
    n = 12345
    a, b = np.full(n, a_value, np.float32), np.full(n, b_value, np.float32)
    got = forward_metrics(a, b, chunk=SMALL)[PEARSON]
    assert (math.isnan(got) and math.isnan(want)) or got == want


def test_pearson_of_varying_probs_is_a_correlation() -> None:
    # negative control of the one above: varying probs get a correlation, not the 1.0/NaN rule
    a, b = pair(1000, seed=7, scale=0.3)
    got = forward_metrics(a, b, chunk=SMALL)[PEARSON]
    assert 0.0 < got < 1.0 and math.isclose(got, reference(a, b)[PEARSON], rel_tol=1e-12)


def _peak_bytes(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


BOUND = 6 * CHUNK * 8  # six float64 chunks; the streamed pass holds four and a bool chunk


def test_extra_memory_is_bounded_by_the_chunk_not_the_token_count() -> None:
    a, b = pair(20_000_000, seed=8)
    assert _peak_bytes(lambda: forward_metrics(a, b)) < BOUND


def test_memory_bound_catches_a_whole_array_computation() -> None:
    # negative control: tracemalloc sees numpy's temporaries, and a full-size float64 one exceeds BOUND
    a, b = pair(2_000_000, seed=9)
    assert _peak_bytes(lambda: reference(a, b)) > BOUND
