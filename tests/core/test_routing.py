"""A mixture of experts' routes, rollout against trainer (tica/routing.py, issue 33): the first
token and layer whose experts differ is named, apart from logprob differences where every route up
to the token matched; a route is a set of experts (their order within the top-k is the router's
sort); the forward judge fails a BI=1 step whose routes or gate weights differ even when every
logprob is bitwise equal, and its canary plants exactly that."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from tica import canaries
from tica.evidence import EvidenceItem
from tica.judges import judge_criteria
from tica.receipts import ReceiptError, load_step_arrays
from tica.routing import compare_routing, flip_one_route
from tica.verdict import Verdict

SEQ_LENS = np.array([5, 7, 4], dtype=np.int32)
N, LAYERS, K, EXPERTS = 16, 3, 2, 8


def routes(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    experts = np.stack([rng.permutation(EXPERTS)[:K] for _ in range(N * LAYERS)]).reshape(N, LAYERS, K)
    return experts.astype(np.int32), rng.uniform(0.1, 0.9, (N, LAYERS, K)).astype(np.float32)


def lps(seed: int = 1) -> np.ndarray:
    return np.log(np.random.default_rng(seed).uniform(0.2, 0.9, N)).astype(np.float32)


def compare(r_ex, t_ex, r_lp=None, t_lp=None, r_w=None, t_w=None):
    r_lp = lps() if r_lp is None else r_lp
    return compare_routing(SEQ_LENS, r_ex, t_ex, r_lp, r_lp.copy() if t_lp is None else t_lp, r_w, t_w)


def test_the_same_routes_are_identical():
    ex, w = routes()
    out = compare(ex, ex.copy(), r_w=w, t_w=w.copy())
    assert out.identical and out.first is None and out.matched_tokens == N
    assert out.sentence() == f"routing identical at all {N} tokens x {LAYERS} MoE layers (top-{K})"


@pytest.mark.parametrize("token,layer", list(itertools.product(range(N), range(LAYERS))))
def test_one_flipped_route_is_named_where_it_was_planted(token, layer):
    """Relation: flipping the route at any (token, layer) alone moves the first flip exactly there,
    with one route and one token differing, and the sequence and position read from seq_lens."""
    ex, _ = routes()
    out = compare(ex, flip_one_route(ex, token, layer, EXPERTS))
    starts = np.concatenate([[0], np.cumsum(SEQ_LENS)[:-1]])
    seq = int(np.searchsorted(starts, token, side="right") - 1)
    assert (out.first.token, out.first.layer, out.first.sequence, out.first.position) == (token, layer, seq,
                                                                                          token - int(starts[seq]))
    assert (out.flips, out.tokens_rerouted) == (1, 1) and not out.identical


def test_the_order_of_experts_within_a_route_is_not_the_route():
    """Relation: reversing every top-k row on one side (gate weights with their experts) changes
    nothing; reversing the experts alone leaves the routes equal but the weights differ."""
    ex, w = routes()
    assert compare(ex, ex[..., ::-1].copy(), r_w=w, t_w=w[..., ::-1].copy()).identical
    out = compare(ex, ex[..., ::-1].copy(), r_w=w, t_w=w.copy())
    assert out.flips == 0 and out.weight_diffs > 0


def test_a_gate_weight_one_ulp_off_on_the_same_route_is_a_weight_difference_not_a_flip():
    ex, w = routes()
    t_w = w.copy()
    t_w[3, 1, 0] = np.nextafter(t_w[3, 1, 0], np.float32(1))
    out = compare(ex, ex.copy(), r_w=w, t_w=t_w)
    assert (out.flips, out.weight_diffs) == (0, 1)
    assert "gate weights differ bitwise at 1 token-layer routes" in out.sentence()


def test_logprob_differences_are_counted_only_where_every_route_up_to_the_token_matched():
    """A flip at sequence 1 position 2 (token 7): a logprob differing at token 6 (before it) is
    counted, one at token 9 (after it, same sequence) is attributed to the flip, not counted."""
    ex, _ = routes()
    r_lp = lps()
    for token, counted in ((6, 1), (9, 0), (13, 1)):  # 13 is in sequence 2, whose routes all match
        t_lp = r_lp.copy()
        t_lp[token] = np.nextafter(t_lp[token], np.float32(0))
        out = compare(ex, flip_one_route(ex, 7, 0, EXPERTS), r_lp=r_lp, t_lp=t_lp)
        assert out.logprob_diffs_matched == counted, token
        assert out.matched_tokens == N - 5  # tokens 7..11 of sequence 1 follow the flip


def _npz(tmp_path, **over):
    ex, w = routes()
    lp = lps()
    data = {"token_ids": np.arange(N, dtype=np.int32), "seq_lens": SEQ_LENS, "trainer_logprobs": lp,
            "rollout_logprobs": lp.copy(), "rollout_experts": ex, "trainer_experts": ex.copy(),
            "rollout_gate_weights": w, "trainer_gate_weights": w.copy()}
    data.update(over)
    path = tmp_path / "step_0001.npz"
    np.savez(path, **{k: v for k, v in data.items() if v is not None})
    return path


@pytest.mark.parametrize("over,field", [
    ({"trainer_experts": None}, "rollout_experts"),
    ({"trainer_gate_weights": None}, "trainer_gate_weights"),
    ({"trainer_experts": routes()[0][:, :2].copy()}, "trainer_experts"),
    ({"rollout_experts": np.zeros((N, LAYERS, K), dtype=np.int32), "trainer_experts": np.zeros((N, LAYERS, K), dtype=np.int32)},
     "rollout_experts"),
    ({"trainer_experts": -routes()[0] - 1}, "trainer_experts"),
    ({"trainer_gate_weights": np.full((N, LAYERS, K), np.nan, dtype=np.float32)}, "trainer_gate_weights"),
], ids=["one side", "one side's weights", "another shape", "an expert twice", "a negative id", "NaN weights"])
def test_malformed_routes_are_refused_naming_the_array(tmp_path, over, field):
    with pytest.raises(ReceiptError) as err:
        load_step_arrays(_npz(tmp_path, **over))
    assert err.value.field == field


def test_the_forward_judge_fails_a_bitwise_step_whose_route_flipped_and_its_canary_is_caught(tmp_path):
    """The canary's legs pass as built; flipping one route on the trainer's side, every logprob
    and logged metric unchanged, fails forward naming the route."""
    q = canaries.default_questions()[EvidenceItem.FORWARD]
    legs = canaries.build_forward(q, tmp_path / "legs")
    assert judge_criteria(EvidenceItem.FORWARD, q, legs).verdict is Verdict.PASS
    bi1 = next(p for p in legs if json.loads((p / "leg.json").read_text())["arm"] == "bi1")
    canaries.flip_route(bi1, 2)
    cell = judge_criteria(EvidenceItem.FORWARD, q, legs)
    assert cell.verdict is Verdict.FAIL
    assert any("routing differs first at sequence 1 position 0, MoE layer 1" in r for r in cell.reasons), cell.reasons
