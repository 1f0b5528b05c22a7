"""The FP8 matrix cells from one H100 (tests/fixtures/h200/matrix_fp8.tar.xz, issue 33), judged
under the question frozen before the matrix (demo/questions/h200-matrix/forward.yaml). Nothing here
touches a GPU: the sealed receipts came back from the device (the archive's README says how).

One invariant per test, each beside the control that could make it fail.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.h200_block_fp8 import one_logprob_changed_never_passes
from tica.judges.matrix import matrix_canaries, matrix_cells
from tica.question import load_question
from tica.receipt_archive import unpacked
from tica.receipts import read_receipt
from tica.seal import check_seal
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / "tests" / "fixtures" / "h200" / "matrix_fp8.tar.xz"
QUESTION = load_question(ROOT / "demo" / "questions" / "h200-matrix" / "forward.yaml")
DENSE, MOE = "llama3.2-1b_l4_fp8", "qwen3-30b-a3b_l2_fp8"
CUTLASS = "Fp8PerTensorOnlineLinearMethod/CutlassFP8ScaledMMLinearKernel/out torch.bfloat16"


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> Path:
    return unpacked(ARCHIVE, tmp_path_factory.mktemp("fp8"))


@pytest.fixture(scope="module")
def cells(matrix):
    return matrix_cells(QUESTION, matrix)


def pick(cells, candidate, shape, scored_prefix=""):
    return [c for c in cells if c.candidate == candidate and c.shape == shape and c.scored.startswith(scored_prefix)]


def config(matrix: Path, leg: str) -> dict:
    return read_receipt(matrix / "fp8" / leg / "leg.json")["resolved_config"]


def row(matrix: Path, leg: str) -> dict:
    return json.loads((matrix / "fp8" / leg / "metrics.jsonl").read_text().splitlines()[0])


def test_every_leg_of_both_calls_is_sealed_once_and_verifies(matrix):
    legs = sorted(p.parent for p in matrix.rglob("seal.json"))
    # dense: 3 loads x decode/prefill, c64 after the update x 2, 2 planted faults;
    # MoE: 3 loads x decode/prefill, 3 planted faults, no update
    assert Counter(p.name.split("-")[1] + "/" + p.name.split("-")[2] for p in legs) == {
        "overlay3/llama3.2": 10, "stock/llama3.2": 10, "overlay3/qwen3": 9, "stock/qwen3": 9}
    assert len({p.name for p in legs}) == len(legs) == 38
    assert all(check_seal(leg) == [] for leg in legs)


def test_every_leg_was_served_in_fp8_by_vllms_cutlass_linears_and_the_trainer_took_the_same_linears(matrix):
    for leg in sorted(p.parent.name for p in (matrix / "fp8").glob("mx-*/leg.json")):
        rc = config(matrix, leg)
        fp8 = rc["fp8"]
        n = 16 if DENSE in leg else 6  # dense: q/k/v, o, gate/up, down x 4 layers; MoE: q/k/v, o, router x 2
        assert rc["quantization"] == "fp8", leg
        assert fp8["vllm"]["linear_kernels"] == {CUTLASS: n} and len(fp8["vllm"]["fp8_linears"]) == n, leg
        assert fp8["trainer"]["fp8_linears"] == n and "cutlass_scaled_mm" in fp8["trainer"]["ops"]["matmul"], leg
        assert fp8["weights_equal"] == {"linears": n, "equal": n, "differ": []}, leg
        # the experts: vLLM's FP8 MoE on the MoE shape, none on the dense one
        assert fp8["vllm"]["experts"] == ({"Fp8PerTensorOnlineMoEMethod/TRITON": 2} if MOE in leg else {}), leg


def test_overlay3_is_bitwise_on_every_dense_fp8_cell_before_and_after_the_update(cells):
    got = pick(cells, "overlay3", DENSE)
    assert sorted((c.load, c.scored) for c in got) == sorted(
        [(x, k) for x in ("c1", "c64", "chunked") for k in ("decode", "prefill")]
        + [("c64", "decode_post_update"), ("c64", "prefill_post_update")])
    assert all(c.verdict is Verdict.PASS and c.cause is None and c.n_diff == 0 for c in got), \
        [(c.load, c.scored, c.n_diff) for c in got]
    # with the overlay vLLM agrees with itself, decode and prefill, on every load
    assert all(c.vllm_decode_vs_prefill == 0 for c in got)


def test_stock_dense_fp8_passes_prefill_and_fails_decode_exactly_where_vllms_decode_differs_from_its_prefill(cells):
    stock = pick(cells, "stock", DENSE)
    assert len(stock) == 8
    assert all(c.verdict is Verdict.PASS for c in stock if c.scored.startswith("prefill"))
    decode = [c for c in stock if c.scored.startswith("decode")]
    for c in decode:
        assert (c.verdict is Verdict.FAIL) == (c.vllm_decode_vs_prefill > 0), (c.load, c.scored)
        assert c.n_diff == c.vllm_decode_vs_prefill, (c.load, c.scored)
    assert sum(c.verdict is Verdict.FAIL for c in stock) == 4  # every decode cell, the update's included
    # control: the same loads under overlay3 (above) leave vLLM self-consistent and pass


def test_vllm_reloads_the_updated_weights_into_the_same_fp8_bytes_the_trainer_computes(matrix):
    for candidate in ("overlay3", "stock"):
        for scored in ("decode_post_update", "prefill_post_update"):
            u = config(matrix, f"mx-{candidate}-{DENSE}-c64-{scored}")["update"]
            assert u["grad_finite"] and u["grad_norm"] > 0 and u["changed_tensors"] == u["total_tensors"]
            assert u["fp8_weights_equal_after_reload"] == {"linears": 16, "equal": 16, "differ": []}
        # the cells before the update record none
        assert "update" not in config(matrix, f"mx-{candidate}-{DENSE}-c64-decode")


def test_moe_fp8_fails_every_cell_for_both_candidates_and_the_cause_names_the_fp8_experts(cells):
    moe = [c for c in cells if c.shape == MOE]
    assert len(moe) == 12 and all(c.verdict is Verdict.FAIL for c in moe)
    for c in moe:
        assert "vLLM's FP8 experts are not followed" in c.cause and "vLLM issue 57016" in c.cause, c.cause
        assert c.vllm_decode_vs_prefill > 0  # vLLM differs from itself on every MoE FP8 load
    # where a batch holds more than one sequence, vLLM's own prompt logprobs move with the batch
    batched = [c for c in moe if c.load != "c1"]
    assert len(batched) == 8 and all("batch-variant engine" in c.cause for c in batched)
    # control: overlay3's dense FP8 cells (the same Cutlass linears) pass, so the failure is the experts'
    assert all(c.verdict is Verdict.PASS for c in pick(cells, "overlay3", DENSE))


def test_vllms_fp8_experts_are_batch_variant_and_its_fp8_linears_are_not(matrix):
    for candidate in ("overlay3", "stock"):
        for load in ("c16", "chunked"):
            r = row(matrix, f"mx-{candidate}-{MOE}-{load}-prefill")
            assert r["tica/vllm_alone_vs_batch_n_bitwise_diff"] == r["tica/vllm_alone_vs_batch_n_tokens"] > 0
    # control: the dense FP8 model under overlay3 scores the same sequence alone and in its batch alike
    for load in ("c64", "chunked"):
        assert row(matrix, f"mx-overlay3-{DENSE}-{load}-prefill")["tica/vllm_alone_vs_batch_n_bitwise_diff"] == 0


def test_the_moe_update_was_not_run_and_says_why(matrix, cells):
    for candidate in ("overlay3", "stock"):
        s = json.loads((matrix / "fp8" / "_calls" / f"{candidate}-{MOE}.summary.json").read_text())
        assert s["update"].startswith("not run:") and "57016" in s["update"]
    assert not [c for c in cells if c.shape == MOE and c.scored.endswith("_post_update")]


def test_every_planted_fault_is_caught_beside_its_control(matrix):
    by = Counter((st.shape, st.target, st.status) for _, st in matrix_canaries(QUESTION, matrix))
    assert by == {(DENSE, "model.norm:hf_rmsnorm", "caught"): 2, (DENSE, "logprob:torch.log_softmax", "caught"): 2,
                  (MOE, "model.norm:hf_rmsnorm", "caught"): 2, (MOE, "router:torch_softmax_topk", "caught"): 2,
                  (MOE, "logprob:v2_runner", "caught"): 2}


@pytest.mark.parametrize("reseal", [True, False], ids=["resealed", "seal_broken"])
def test_a_leg_with_one_logprob_changed_never_passes(matrix, tmp_path, reseal):
    one_logprob_changed_never_passes(QUESTION, matrix / "fp8" / f"mx-overlay3-{DENSE}-c64-prefill_post_update", tmp_path / "fp8", reseal)
