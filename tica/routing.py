"""Where a mixture-of-experts model's routing differs between the rollout and the trainer.

A MoE forward records, per scored token and MoE layer, the experts the router chose and their
gate weights, on both sides (the step arrays' `rollout_experts` / `trainer_experts`, shape
tokens x layers x top-k, and optionally `rollout_gate_weights` / `trainer_gate_weights`). In a MoE
the first divergence is usually one token sent to another expert, after which everything
downstream in its sequence differs; this module names that first flip, apart from the logprob
differences at tokens whose routes, and every route before them in their sequence, matched.

A route is the set of experts a token goes to at a layer: the order of the top-k within a row
is the router's sort, not the route. Gate weights are compared per expert, bitwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RouteFlip:
    """The first token and layer whose experts differ (packed token order, then layer)."""

    token: int
    sequence: int
    position: int
    layer: int
    rollout: tuple[int, ...]
    trainer: tuple[int, ...]


@dataclass(frozen=True)
class RoutingComparison:
    tokens: int
    layers: int
    top_k: int
    flips: int  # (token, layer) routes whose expert sets differ
    tokens_rerouted: int  # tokens with a different route at any layer
    first: RouteFlip | None
    weight_diffs: int  # (token, layer) routes with the same experts whose gate weights differ bitwise
    matched_tokens: int  # tokens whose routes, and every route before them in their sequence, match
    logprob_diffs_matched: int  # of those, tokens whose logprobs differ bitwise

    @property
    def identical(self) -> bool:
        return self.flips == 0 and self.weight_diffs == 0

    def sentence(self) -> str:
        if self.identical:
            return f"routing identical at all {self.tokens} tokens x {self.layers} MoE layers (top-{self.top_k})"
        parts = []
        if self.first is not None:
            x = self.first
            parts.append(f"routing differs first at sequence {x.sequence} position {x.position}, MoE layer {x.layer} "
                         f"(rollout experts {list(x.rollout)}, trainer {list(x.trainer)}); {self.flips} of "
                         f"{self.tokens * self.layers} token-layer routes differ, at {self.tokens_rerouted} tokens")
        if self.weight_diffs:
            parts.append(f"gate weights differ bitwise at {self.weight_diffs} token-layer routes with the same experts")
        parts.append(f"{self.logprob_diffs_matched} of {self.matched_tokens} logprobs differ where every route up to "
                     "them matched")
        return "; ".join(parts)


def _sorted_routes(experts: np.ndarray, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    order = np.argsort(experts, axis=-1, kind="stable")
    ex = np.take_along_axis(experts, order, axis=-1)
    return ex, (np.take_along_axis(weights, order, axis=-1) if weights is not None else None)


def compare_routing(seq_lens: np.ndarray, rollout_experts: np.ndarray, trainer_experts: np.ndarray,
                    rollout_logprobs: np.ndarray, trainer_logprobs: np.ndarray,
                    rollout_weights: np.ndarray | None = None, trainer_weights: np.ndarray | None = None
                    ) -> RoutingComparison:
    """The two sides' routes compared (arrays as tica.receipts.load_step_arrays checked them)."""
    n, layers, k = rollout_experts.shape
    seq_lens = np.asarray(seq_lens).ravel()  # the arrays' reader checks its sum, not its shape
    r_ex, r_w = _sorted_routes(rollout_experts, rollout_weights)
    t_ex, t_w = _sorted_routes(trainer_experts, trainer_weights)
    flip = (r_ex != t_ex).any(axis=-1)  # tokens x layers
    weight_diff = np.zeros_like(flip)
    if r_w is not None and t_w is not None:
        bits = r_w.astype(np.float32).view(np.uint32) != t_w.astype(np.float32).view(np.uint32)
        weight_diff = bits.any(axis=-1) & ~flip
    rerouted = flip.any(axis=-1)
    starts = np.concatenate([[0], np.cumsum(seq_lens)[:-1]]).astype(np.int64)
    sequence = np.repeat(np.arange(len(seq_lens)), seq_lens)
    # a token's route "up to it" matches when no token at or before it in its sequence was rerouted
    seen = np.zeros(n, dtype=bool)
    for start, length in zip(starts, seq_lens):
        seen[start:start + length] = np.cumsum(rerouted[start:start + length]) > 0
    matched = ~seen
    lp_diff = rollout_logprobs.astype(np.float32).view(np.uint32) != trainer_logprobs.astype(np.float32).view(np.uint32)
    first = None
    if flip.any():
        token, layer = (int(v) for v in np.argwhere(flip)[0])  # row-major: token first, then layer
        s = int(sequence[token])
        first = RouteFlip(token=token, sequence=s, position=token - int(starts[s]), layer=layer,
                          rollout=tuple(int(e) for e in r_ex[token, layer]),
                          trainer=tuple(int(e) for e in t_ex[token, layer]))
    return RoutingComparison(tokens=n, layers=layers, top_k=k, flips=int(flip.sum()),
                             tokens_rerouted=int(rerouted.sum()), first=first, weight_diffs=int(weight_diff.sum()),
                             matched_tokens=int(matched.sum()), logprob_diffs_matched=int((lp_diff & matched).sum()))


def flip_one_route(experts: np.ndarray, token: int, layer: int, n_experts: int) -> np.ndarray:
    """A copy of `experts` with one route changed: the row's first expert replaced by the lowest
    expert id the row does not hold (the canary's planted routing flip)."""
    out = experts.copy()
    row = set(int(e) for e in out[token, layer])
    out[token, layer, 0] = next(e for e in range(n_experts) if e not in row)
    return out
