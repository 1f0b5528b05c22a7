"""The verl metric family over raw per-token logprob arrays. numpy only: producers on GPU
nodes import this too.

Definitions follow verl's `calculate_debug_metrics` and rollout-correction metrics:
probs are exp(logprob); diff = |p_trainer - p_rollout| over response tokens; k3 KL estimates
KL(rollout || trainer) from rollout samples: r = p_trainer / p_rollout, k3 = mean((r - 1) - log r).

Everything streams over fixed-size chunks: extra memory is a few chunk-sized float64 buffers,
never a full-size temporary, whatever the number of tokens.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

PROBS_DIFF_MAX = "training/rollout_probs_diff_max"
PROBS_DIFF_MEAN = "training/rollout_probs_diff_mean"
PROBS_DIFF_STD = "training/rollout_probs_diff_std"
PEARSON = "training/rollout_actor_probs_pearson_corr"
K3_KL = "rollout_corr/k3_kl"
VERL_FORWARD_KEYS = (PROBS_DIFF_MAX, PROBS_DIFF_MEAN, PROBS_DIFF_STD, PEARSON, K3_KL)

CHUNK = 1 << 18  # elements per chunk: a chunk's float64 buffers (2 MiB each) stay in cache
# exp(x) is finite for x <= 709.78; a bit-identical pair at or below this takes the exact shortcut.
_EXP_SAFE_MAX = 700.0


def _slices(n: int, chunk: int) -> Iterator[slice]:
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    for i in range(0, n, chunk):
        yield slice(i, min(i + chunk, n))


def _flat_f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).ravel()


def n_bitwise_diff(a: np.ndarray, b: np.ndarray, where: np.ndarray | None = None, *, chunk: int = CHUNK) -> int:
    """How many float32 values differ in their bits (-0.0 vs +0.0 and NaN payloads differ), only
    where `where` is set if given. Chunked: no full-size temporary, no masked copies."""
    ua, ub = _flat_f32(a).view(np.uint32), _flat_f32(b).view(np.uint32)
    if ua.shape != ub.shape:
        raise ValueError(f"{ua.size} values against {ub.size}")
    mask = None if where is None else np.asarray(where, dtype=np.bool_).ravel()
    if mask is not None and mask.size != ua.size:
        raise ValueError(f"mask has {mask.size} entries for {ua.size} values")
    buf = np.empty(min(chunk, ua.size), dtype=np.bool_)
    count = 0
    for s in _slices(ua.size, chunk):
        ne = np.not_equal(ua[s], ub[s], out=buf[: s.stop - s.start])
        if mask is not None:
            np.logical_and(ne, mask[s], out=ne)
        count += int(np.count_nonzero(ne))
    return count


@dataclass
class _Stream:
    """Chunk statistics merged pairwise (Chan et al.): running means and centered second moments
    of d = |pa - pb|, pa, pb; maxima kept per chunk so that a NaN propagates as in np.max."""

    n: int = 0
    mean: np.ndarray = field(default_factory=lambda: np.zeros(3))  # d, pa, pb
    m2: np.ndarray = field(default_factory=lambda: np.zeros(4))  # dd, xx, yy, xy
    d_sum: float = 0.0  # the reported means are sums / n: a running mean turns inf + later chunks into NaN
    k3_sum: float = 0.0
    peaks: list[np.ndarray] = field(default_factory=list)  # per chunk: max d, max |log r|, max pa, max pb
    lows: list[np.ndarray] = field(default_factory=list)  # per chunk: min pa, min pb

    def merge(self, n: int, mean: np.ndarray, m2: np.ndarray) -> None:
        if self.n == 0:  # 0 * delta**2 would be NaN where delta**2 overflows
            self.n, self.mean, self.m2 = n, mean, m2
            return
        total = self.n + n
        delta = mean - self.mean
        w = self.n * n / total
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + w * np.array([delta[0] ** 2, delta[1] ** 2, delta[2] ** 2, delta[1] * delta[2]])
        self.n = total


def _stream(a: np.ndarray, b: np.ndarray, chunk: int) -> _Stream:
    """One pass over float32 a, b in chunks; four chunk-sized float64 buffers are all it holds."""
    size = min(chunk, a.size)
    bufs = [np.empty(size) for _ in range(4)]
    st = _Stream()
    for s in _slices(a.size, chunk):
        x, y, r, t = (buf[: s.stop - s.start] for buf in bufs)
        np.copyto(x, a[s])
        np.copyto(y, b[s])
        np.subtract(x, y, out=r)  # log r
        lr_max = np.abs(r, out=t).max()
        # expm1, not exp - 1: near r = 1 the k3 term is ~(log r)^2 / 2 and exp - 1 would cancel it away
        np.expm1(r, out=t)
        st.k3_sum += float(np.subtract(t, r, out=t).sum())
        np.exp(x, out=x)
        np.exp(y, out=y)
        d = np.abs(np.subtract(x, y, out=r), out=r)
        st.peaks.append(np.array([d.max(), lr_max, x.max(), y.max()]))
        st.lows.append(np.array([x.min(), y.min()]))
        d_sum = float(d.sum())
        st.d_sum += d_sum
        mean = np.array([d_sum / d.size, x.mean(), y.mean()])
        d -= mean[0]
        x -= mean[1]
        y -= mean[2]
        # einsum, not np.dot: BLAS threads stall when the cores are busy (50x slower on a loaded box)
        st.merge(d.size, mean, np.array([np.einsum("i,i->", u, v) for u, v in ((d, d), (x, x), (y, y), (x, y))]))
    return st


def _probs_equal(a: np.ndarray, b: np.ndarray, chunk: int) -> bool:
    return all(np.array_equal(np.exp(a[s].astype(np.float64)), np.exp(b[s].astype(np.float64)))
               for s in _slices(a.size, chunk))


def _pearson(st: _Stream, a: np.ndarray, b: np.ndarray, chunk: int) -> float:
    """np.corrcoef of the probs; where either is constant (or n = 1): 1.0 if the probs are equal,
    else NaN. Constant means max == min exactly, not a std that rounding left at 1e-17."""
    peak, low = np.max(st.peaks, axis=0), np.min(st.lows, axis=0)
    _, xx, yy, xy = st.m2
    if st.n > 1 and peak[2] > low[0] and peak[3] > low[1] and xx > 0 and yy > 0:
        # = xy / sqrt(xx * yy) without underflow in the product; exactly 1.0 when xx == yy == xy
        return float(np.clip((xy / xx) * math.sqrt(xx / yy), -1.0, 1.0))
    return 1.0 if _probs_equal(a, b, chunk) else float("nan")


def _identical_and_exp_safe(a: np.ndarray, b: np.ndarray, chunk: int) -> tuple[int, bool]:
    """The bitwise count, and whether the shortcut holds: all bits equal, every value finite and
    exp-safe. The range is checked only while no difference has been seen, each chunk while hot."""
    ua, ub = a.view(np.uint32), b.view(np.uint32)
    buf = np.empty(min(chunk, a.size), dtype=np.bool_)
    count, safe = 0, True
    for s in _slices(a.size, chunk):
        count += int(np.count_nonzero(np.not_equal(ua[s], ub[s], out=buf[: s.stop - s.start])))
        if count == 0 and safe:
            lo, hi = a[s].min(), a[s].max()  # NaN propagates into both and fails the test
            safe = bool(lo > -np.inf and hi <= _EXP_SAFE_MAX)
    return count, count == 0 and safe


def step_content_digest(token_ids: np.ndarray, seq_lens: np.ndarray, trainer_logprobs: np.ndarray,
                        rollout_logprobs: np.ndarray) -> str:
    """A forward step's content identity: its scored token history and both sides' logprobs, in
    the receipt's dtypes (int32, float32). Labels (step number, checkpoint) are left out: a step
    copied under another label is the same measurement."""
    parts = (np.asarray(token_ids, np.int32), np.asarray(seq_lens, np.int32),
             np.asarray(trainer_logprobs, np.float32), np.asarray(rollout_logprobs, np.float32))
    h = hashlib.sha256()
    for i, a in enumerate(parts):
        h.update(b"|" if i else b"")
        h.update(np.ascontiguousarray(a).tobytes())
    return "sha256:" + h.hexdigest()


def forward_metrics(trainer_logprobs: np.ndarray, rollout_logprobs: np.ndarray, *,
                    chunk: int = CHUNK) -> dict[str, float]:
    """verl's forward consistency metrics plus the bitwise count TICA judges on.

    Bit-identical finite arrays (every logprob <= 700, so exp is finite) skip the float work: there
    the full computation gives log r = 0, k3 = expm1(0) - 0 = 0 and d = 0 exactly, and pa, pb are
    the same numbers, so the moments agree and pearson is exactly 1.0 (or 1.0 from the equal-probs
    rule where constant). tests/core/test_metrics.py holds the shortcut to `_full_metrics`' answer.
    """
    a, b = _flat_f32(trainer_logprobs), _flat_f32(rollout_logprobs)
    if a.shape != b.shape:
        raise ValueError(f"trainer has {a.size} logprobs, rollout has {b.size}")
    if a.size == 0:
        raise ValueError("no tokens to compare")
    n_diff, identical = _identical_and_exp_safe(a, b, chunk)
    if identical:
        return _result(a.size, n_diff, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0)
    return _full_metrics(a, b, n_diff, chunk)


def _full_metrics(a: np.ndarray, b: np.ndarray, n_diff: int, chunk: int) -> dict[str, float]:
    st = _stream(a, b, chunk)
    peak = np.max(st.peaks, axis=0)
    return _result(a.size, n_diff, float(peak[0]), st.d_sum / st.n, math.sqrt(st.m2[0] / st.n),
                   _pearson(st, a, b, chunk), st.k3_sum / st.n, float(peak[1]))


def _result(n: int, n_diff: int, mx: float, mean: float, std: float, pearson: float, k3: float,
            lr_max: float) -> dict[str, float]:
    return {
        PROBS_DIFF_MAX: mx,
        PROBS_DIFF_MEAN: mean,
        PROBS_DIFF_STD: std,
        PEARSON: pearson,
        K3_KL: k3,
        "tica/n_tokens": n,
        "tica/n_bitwise_diff": n_diff,
        "tica/logprob_abs_diff_max": lr_max,
    }
