"""The verl metric family over raw per-token logprob arrays. numpy only: producers on GPU
nodes import this too.

Definitions follow verl's `calculate_debug_metrics` and rollout-correction metrics:
probs are exp(logprob); diff = |p_trainer - p_rollout| over response tokens; k3 KL estimates
KL(rollout || trainer) from rollout samples: r = p_trainer / p_rollout, k3 = mean((r - 1) - log r).
"""

from __future__ import annotations

import numpy as np

PROBS_DIFF_MAX = "training/rollout_probs_diff_max"
PROBS_DIFF_MEAN = "training/rollout_probs_diff_mean"
PROBS_DIFF_STD = "training/rollout_probs_diff_std"
PEARSON = "training/rollout_actor_probs_pearson_corr"
K3_KL = "rollout_corr/k3_kl"
VERL_FORWARD_KEYS = (PROBS_DIFF_MAX, PROBS_DIFF_MEAN, PROBS_DIFF_STD, PEARSON, K3_KL)


def forward_metrics(trainer_logprobs: np.ndarray, rollout_logprobs: np.ndarray) -> dict[str, float]:
    """verl's forward consistency metrics plus the bitwise count TICA judges on."""
    a = np.asarray(trainer_logprobs, dtype=np.float32).ravel()
    b = np.asarray(rollout_logprobs, dtype=np.float32).ravel()
    if a.shape != b.shape:
        raise ValueError(f"trainer has {a.size} logprobs, rollout has {b.size}")
    if a.size == 0:
        raise ValueError("no tokens to compare")
    pa, pb = np.exp(a.astype(np.float64)), np.exp(b.astype(np.float64))
    diff = np.abs(pa - pb)
    if a.size > 1 and pa.std() > 0 and pb.std() > 0:
        pearson = float(np.corrcoef(pa, pb)[0, 1])
    else:
        pearson = 1.0 if np.array_equal(pa, pb) else float("nan")
    log_r = a.astype(np.float64) - b.astype(np.float64)
    k3 = float(np.mean(np.expm1(log_r) - log_r))
    return {
        PROBS_DIFF_MAX: float(diff.max()),
        PROBS_DIFF_MEAN: float(diff.mean()),
        PROBS_DIFF_STD: float(diff.std()),
        PEARSON: pearson,
        K3_KL: k3,
        "tica/n_tokens": int(a.size),
        "tica/n_bitwise_diff": int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32))),
        "tica/logprob_abs_diff_max": float(np.abs(a.astype(np.float64) - b).max()),
    }
