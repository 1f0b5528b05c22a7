"""The mixture-of-experts matrix from one H100 (tests/fixtures/h200/matrix_moe.tar.xz, issue 33),
judged under the question frozen before it (demo/questions/h200-matrix/forward.yaml). Nothing here
touches a GPU: the sealed receipts came back from the device (the archive's README says how).

One invariant per test, each beside the control that could make it fail.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tica.items.forward.canaries import flip_route
from tica.items.forward.judge import judge_forward
from tica.judges.matrix import matrix_canaries, matrix_cells
from tica.question import load_question
from tica.receipt_archive import unpacked
from tica.seal import check_seal
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / "tests" / "fixtures" / "h200" / "matrix_moe.tar.xz"
QUESTION = load_question(ROOT / "demo" / "questions" / "h200-matrix" / "forward.yaml")
SHAPES = ("qwen3-30b-a3b_l2", "mixtral-8x7b_l1", "qwen1.5-moe-a2.7b_l2")
LOADS = ("c1", "c16", "c256s", "chunked")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> Path:
    return unpacked(ARCHIVE, tmp_path_factory.mktemp("moe"))


@pytest.fixture(scope="module")
def cells(matrix):
    return matrix_cells(QUESTION, matrix)


def summary(matrix: Path, candidate: str, shape: str) -> dict:
    return json.loads((matrix / "moe1" / "_calls" / f"{candidate}-{shape}.summary.json").read_text())


def test_every_leg_is_sealed_and_verifies(matrix):
    legs = sorted(p.parent for p in matrix.rglob("seal.json"))
    # per (candidate, shape): 4 loads x decode/prefill, c16 after the update x 2, 3 planted faults
    assert Counter(p.name.split("-")[1] + "-" + p.name.split("-")[2] for p in legs) == \
        {f"{c}-{s.split('-')[0]}": 13 for c in ("overlay3", "stock") for s in SHAPES}
    assert all(check_seal(leg) == [] for leg in legs)


def test_overlay3_is_bitwise_with_identical_routes_on_every_load_of_three_geometries_before_and_after_the_update(cells):
    for shape in SHAPES:
        got = [c for c in cells if c.candidate == "overlay3" and c.shape == shape]
        assert sorted((c.load, c.scored) for c in got) == sorted(
            [(x, k) for x in LOADS for k in ("decode", "prefill")]
            + [("c16", "decode_post_update"), ("c16", "prefill_post_update")])
        assert all(c.verdict is Verdict.PASS and c.cause is None for c in got), [(c.load, c.scored) for c in got]
        assert all(c.routing is not None and c.routing.startswith("routing identical") for c in got)


def test_the_routes_compared_are_vllms_own_record_and_the_trainers(matrix):
    leg = matrix / "moe1" / "mx-overlay3-qwen3-30b-a3b_l2-c256s-decode"
    row = json.loads((leg / "metrics.jsonl").read_text().splitlines()[0])
    assert row["tica/routes"]["decode"].startswith("vLLM's routed experts (enable_return_routed_experts)")
    with np.load(leg / "arrays" / "step_0001.npz") as z:
        assert z["rollout_experts"].shape == (z["token_ids"].size, 2, 8)  # tokens x MoE layers x top-8
        assert (z["rollout_experts"] == z["trainer_experts"]).all()
        assert len(np.unique(z["rollout_experts"])) > 64  # many of the 128 experts are used, not a constant


def test_stock_passes_prefill_and_fails_decode_exactly_where_vllms_decode_differs_from_its_prefill(cells):
    stock = [c for c in cells if c.candidate == "stock"]
    assert all(c.verdict is Verdict.PASS for c in stock if c.scored.startswith("prefill"))
    for c in (c for c in stock if c.scored.startswith("decode")):
        assert (c.verdict is Verdict.FAIL) == (c.vllm_decode_vs_prefill > 0), (c.shape, c.load)
        assert c.verdict is Verdict.PASS or c.n_diff == c.vllm_decode_vs_prefill
    assert sum(c.verdict is Verdict.FAIL for c in stock) == 14  # 15 decode cells; qwen3's c1 agrees with itself


def test_a_failing_cell_names_its_first_route_flip(cells):
    c = next(c for c in cells if (c.candidate, c.shape, c.load, c.scored) == ("stock", "qwen3-30b-a3b_l2", "c16", "decode"))
    assert c.cause.startswith("routing differs first at sequence 1 position 11, MoE layer 1")
    # and apart from the flips, the logprobs that differ where every route up to them matched
    assert "159 of 590 logprobs differ where every route up to them matched" in c.cause
    # control: a failing cell whose routes all match says so and names the step instead
    d = next(c for c in cells if (c.candidate, c.shape, c.load, c.scored) == ("stock", "qwen3-30b-a3b_l2", "c256s", "decode"))
    assert d.routing.startswith("routing identical") and d.cause.startswith("engine step")


def test_one_flipped_route_fails_a_cell_whose_logprobs_all_match(matrix, tmp_path):
    src = matrix / "moe1" / "mx-overlay3-qwen3-30b-a3b_l2-c1-prefill"
    assert judge_forward(QUESTION, [src]).verdict is Verdict.PASS  # control
    leg = shutil.copytree(src, tmp_path / src.name)
    flip_route(leg, 1)  # one token, MoE layer 1, the trainer's side; every logprob unchanged
    c = judge_forward(QUESTION, [leg])
    assert c.verdict is Verdict.FAIL
    assert any("routing differs first at sequence 0 position 5, MoE layer 1" in r for r in c.reasons)


def test_planted_faults_are_caught_and_the_one_that_is_the_engines_own_op_is_called_no_canary(matrix):
    by = Counter((st.target, st.status) for _, st in matrix_canaries(QUESTION, matrix))
    assert by == {("model.norm:hf_rmsnorm", "caught"): 6, ("router:torch_softmax_topk", "caught"): 6,
                  ("logprob:torch.log_softmax", "not_a_canary"): 6}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_update_ran_the_moe_backward_checked_on_the_device_and_vllm_reloaded_every_expert(matrix, shape):
    for candidate in ("overlay3", "stock"):
        u = summary(matrix, candidate, shape)["update"]
        # not every tensor moves: in the last MoE layer an expert no response row chose gets no
        # gradient, and weight decay alone is below a bf16 step (qwen1.5: 376 of 391)
        assert u["grad_finite"] and u["grad_norm"] > 0 and u["changed_tensors"] > 0.9 * u["total_tensors"]
        assert "moe" in u["backward_impls"]
        check = u["moe_backward_check"]
        assert check["pass"] and check["control_caught"] and check["check"]["max_rel_err"] < 2e-2
        r = u["reloaded_experts_equal"]
        moe_layers = 1 if shape.startswith("mixtral") else 2
        assert r["tensors"] == 2 * moe_layers and r["equal"] == r["tensors"] and r["differ"] == []
