"""The block-FP8 matrix cells with DeepGEMM off (`_fp8bc`: vLLM's Cutlass block kernel) from one H100
(tests/fixtures/h200/matrix_fp8bc.tar.xz, issue 33, run fp8bc), judged under the question frozen
before the matrix (demo/questions/h200-matrix/forward.yaml). Nothing here touches a GPU: the sealed
receipts came back from two device calls on one machine (the archive's README says how). Four cells:
overlay3 and stock x llama3.2-1b_l4_fp8bc and qwen2.5-0.5b_l4_fp8bc, 10 legs each.

One invariant per test, each beside the control that could make it fail. The matrix judge judges the
logprobs and the cell's name against what the leg recorded; the kernel is not a verdict of its:
`served_kernel` below reads it from the sealed receipt, and an edit to it is refused by the seal (the
judge makes the cell inconclusive) or, resealed, by `served_kernel` itself.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from tests.h200_block_fp8 import (CUTLASS, DEEPGEMM, config, kernel_edit_is_refused, one_logprob_changed_never_passes,
                                  served_kernel, update_record_removed_is_not_judged_after_the_update)
from tica.judges.matrix import matrix_canaries, matrix_cells
from tica.judges.planted import canary_status
from tica.question import load_question
from tica.receipt_archive import unpacked
from tica.receipts import read_receipt
from tica.seal import check_seal, seal_leg
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / "tests" / "fixtures" / "h200" / "matrix_fp8bc.tar.xz"
QUESTION = load_question(ROOT / "demo" / "questions" / "h200-matrix" / "forward.yaml")
RUN = "fp8bc"
LLAMA, QWEN = "llama3.2-1b_l4_fp8bc", "qwen2.5-0.5b_l4_fp8bc"
N_LINEARS = 16  # q/k/v, o, gate/up, down x 4 layers, both shapes
CELL_IDS = [f"{c}/{s}" for c in ("overlay3", "stock") for s in (LLAMA, QWEN)]
CELLS = [tuple(c.split("/")) for c in CELL_IDS]
SCORED = sorted([(x, k) for x in ("c1", "c64", "chunked") for k in ("decode", "prefill")]
                + [("c64", "decode_post_update"), ("c64", "prefill_post_update")])
# tokens scored per (load, scored): the same prompts for both candidates of a shape
N_TOKENS = {
    LLAMA: {("c1", "decode"): 64, ("c1", "prefill"): 663, ("c64", "decode"): 2565, ("c64", "prefill"): 11515,
            ("chunked", "decode"): 137, ("chunked", "prefill"): 2704,
            ("c64", "decode_post_update"): 2732, ("c64", "prefill_post_update"): 11777},
    QWEN: {("c1", "decode"): 64, ("c1", "prefill"): 663, ("c64", "decode"): 2482, ("c64", "prefill"): 11432,
           ("chunked", "decode"): 146, ("chunked", "prefill"): 2713,
           ("c64", "decode_post_update"): 2425, ("c64", "prefill_post_update"): 11470},
}
# the bf16 tensors one AdamW step changed (all of them): llama's lm_head is its own, qwen's is tied and
# its q/k/v carry a bias
N_TENSORS = {LLAMA: 39, QWEN: 50}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> Path:
    return unpacked(ARCHIVE, tmp_path_factory.mktemp("fp8bc"))


@pytest.fixture(scope="module")
def cells(matrix):
    return matrix_cells(QUESTION, matrix)


def pick(cells, candidate: str, shape: str) -> list:
    return [c for c in cells if (c.candidate, c.shape) == (candidate, shape)]


def leg_dir(matrix: Path, candidate: str, shape: str, load: str, scored: str) -> Path:
    return matrix / RUN / f"mx-{candidate}-{shape}-{load}-{scored}"


def all_legs(matrix: Path) -> list[Path]:
    return sorted(p.parent for p in (matrix / RUN).glob("mx-*/leg.json"))



def first_row(leg: Path) -> dict:
    return json.loads((leg / "metrics.jsonl").read_text().splitlines()[0])



def test_every_leg_of_both_calls_is_sealed_once_and_verifies(matrix):
    legs = sorted(p.parent for p in matrix.rglob("seal.json"))
    assert [p.parent.name for p in legs] == [RUN] * 40 and len({p.name for p in legs}) == 40
    assert all(check_seal(leg) == [] for leg in legs)
    # per cell: 8 judged cells (3 loads x decode/prefill, c64 after the update x 2) and 2 planted faults
    expected = {f"{x}-{k}" for x, k in SCORED} | {"c64-fault_hf_final_norm", "c64-fault_log_softmax"}
    for candidate, shape in CELLS:
        prefix = f"mx-{candidate}-{shape}-"
        assert {p.name.removeprefix(prefix) for p in legs if p.name.startswith(prefix)} == expected
    # each call's status: every cell it asked for ran once, rc 0, 10 legs; none left unstarted
    calls = {}
    for call in ("call-1551", "call-1552"):
        status = json.loads((matrix / RUN / "_calls" / call / "status.json").read_text())
        assert status["not_started"] == [], call
        calls[call] = {k: (v["rc"], v["legs"], len(v["tries"])) for k, v in status["cells"].items()}
    assert calls == {"call-1551": {f"overlay3-{LLAMA}": (0, 10, 1)},
                     "call-1552": {f"stock-{LLAMA}": (0, 10, 1), f"overlay3-{QWEN}": (0, 10, 1),
                                   f"stock-{QWEN}": (0, 10, 1)}}


def test_every_leg_records_the_h100_the_versions_and_deepgemm_off(matrix):
    for leg in all_legs(matrix):
        m = read_receipt(leg / "leg.json")
        assert (m["device"]["name"], m["device"]["driver"], m["device"]["capability"]) == (
            "NVIDIA H100 80GB HBM3", "580.159.04", "9.0"), leg.name
        assert (m["versions"]["vllm"], m["versions"]["torch"]) == ("0.26.0", "2.11.0+cu130"), leg.name
        assert m["env"]["VLLM_BATCH_INVARIANT"] == "1" and m["arm"] == "bi1", leg.name
        # the `_fp8bc` cell's process switched DeepGEMM off, and vLLM's engine saw it so
        assert m["env"]["VLLM_USE_DEEP_GEMM"] == "0" == m["resolved_config"]["fp8"]["vllm"]["env"]["VLLM_USE_DEEP_GEMM"]
        rc = m["resolved_config"]
        assert leg.name.startswith(f"mx-{rc['candidate']}-{rc['model_shape']}-"), leg.name
    # both calls ran on the same GPU
    for call in ("call-1551", "call-1552"):
        run_log = (matrix / RUN / "_calls" / call / "run.log").read_text()
        assert "NVIDIA H100 80GB HBM3 (UUID: GPU-f8fc572c-7868-df37-f1d4-750adb0b7e8b)" in run_log, call


@pytest.mark.parametrize("cell", CELLS, ids=CELL_IDS)
def test_vllm_served_every_linear_on_cutlass_block_and_the_trainer_called_the_same_kernel(matrix, cell):
    candidate, shape = cell
    legs = [p for p in all_legs(matrix) if p.name.startswith(f"mx-{candidate}-{shape}-")]
    assert len(legs) == 10
    for leg in legs:
        rc = config(leg)
        fp8 = rc["fp8"]
        assert served_kernel(leg) == CUTLASS, leg.name
        assert rc["quantization"] == "fp8_block" and fp8["not_followed"] == [], leg.name
        assert fp8["vllm"]["linear_kernels"] == {f"Fp8LinearMethod/{CUTLASS}/out torch.bfloat16": N_LINEARS}
        assert len(fp8["vllm"]["fp8_linears"]) == N_LINEARS and fp8["trainer"]["fp8_linears"] == N_LINEARS
        plan = fp8["vllm"]["block"]["plan"]
        assert (plan["weight_block"], plan["use_ue8m0"], plan["deep_gemm_scale_fmt"], plan["deep_gemm_e8m0"]) == (
            [128, 128], False, None, False), leg.name
        assert fp8["trainer"]["ops"]["matmul"] == "ops.cutlass_scaled_mm (block scales)", leg.name
        assert fp8["checkpoint"]["quantization_config"] == {
            "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    # the engine's own log names the kernel the receipts record, and no DeepGEMM kernel
    log = (matrix / RUN / "_calls" / f"{candidate}-{shape}.log").read_text()
    assert f"Selected {CUTLASS} for Fp8LinearMethod" in log and "Selected DeepGemm" not in log


@pytest.mark.parametrize("cell", CELLS, ids=CELL_IDS)
def test_the_trainers_fp8_weights_equal_vllms_on_every_leg_and_layer_0_is_equal_op_by_op(matrix, cell):
    candidate, shape = cell
    legs = [p for p in all_legs(matrix) if p.name.startswith(f"mx-{candidate}-{shape}-")]
    assert len(legs) == 10
    for leg in legs:
        fp8 = config(leg)["fp8"]
        # the weights the trainer quantized equal vLLM's after its own after-load processing
        assert fp8["weights_equal"] == {"linears": N_LINEARS, "equal": N_LINEARS, "differ": []}, leg.name
        # layer 0's linears one op at a time: trainer vs vLLM's module at 1, 7, 64, 300 rows, vLLM's row unmoved
        assert fp8["linear_probe"]["all_equal"] and fp8["linear_probe"]["vllm_batch_invariant"], leg.name
        assert fp8["linear_probe"]["rows"] == [1, 7, 64, 300] and len(fp8["linear_probe"]["linears"]) == 4


@pytest.mark.parametrize("reseal", [True, False], ids=["resealed", "seal_broken"])
def test_a_receipt_whose_recorded_kernel_is_edited_is_refused(matrix, tmp_path, reseal):
    kernel_edit_is_refused(QUESTION, leg_dir(matrix, "overlay3", QWEN, "c64", "decode"), tmp_path / RUN, CUTLASS, DEEPGEMM, reseal)


def test_the_judge_judged_every_cell_once(cells):
    assert Counter((c.run, c.candidate, c.shape) for c in cells) == {(RUN, c, s): 8 for c, s in CELLS}
    for candidate, shape in CELLS:
        got = pick(cells, candidate, shape)
        assert sorted((c.load, c.scored) for c in got) == SCORED
        assert {(c.load, c.scored): c.n_tokens for c in got} == N_TOKENS[shape], (candidate, shape)


@pytest.mark.parametrize("shape", [LLAMA, QWEN])
def test_overlay3_is_bitwise_on_every_cutlass_block_cell_before_and_after_the_update(cells, shape):
    got = pick(cells, "overlay3", shape)
    assert len(got) == 8
    assert all(c.verdict is Verdict.PASS and c.cause is None and c.n_diff == 0 for c in got), \
        [(c.load, c.scored, c.verdict, c.n_diff) for c in got]
    # with the overlay vLLM agrees with itself, decode and prefill, on every load
    assert all(c.vllm_decode_vs_prefill == 0 for c in got)


# the tokens on which stock vLLM's own decode differs from its prefill, per decode cell, as judged
STOCK_DECODE_DIFF = {
    LLAMA: {"c1": 63, "c64": 1578, "chunked": 125, "c64/post_update": 1874},
    QWEN: {"c1": 63, "c64": 1563, "chunked": 134, "c64/post_update": 1652},
}


@pytest.mark.parametrize("shape", [LLAMA, QWEN])
def test_stock_passes_prefill_and_fails_decode_exactly_where_vllms_decode_differs_from_its_prefill(cells, shape):
    stock = pick(cells, "stock", shape)
    assert len(stock) == 8
    assert all(c.verdict is Verdict.PASS for c in stock if c.scored.startswith("prefill"))
    decode = [c for c in stock if c.scored.startswith("decode")]
    for c in decode:
        assert (c.verdict is Verdict.FAIL) == (c.vllm_decode_vs_prefill > 0), (c.load, c.scored)
        assert c.n_diff == c.vllm_decode_vs_prefill, (c.load, c.scored)
    got = {c.load + ("/post_update" if c.scored.endswith("_post_update") else ""): c.n_diff for c in decode}
    assert got == STOCK_DECODE_DIFF[shape]
    assert sum(c.verdict is Verdict.FAIL for c in stock) == 4  # every decode cell, the update's included
    # control: the same loads under overlay3 (above) leave vLLM self-consistent and pass


# vLLM's own prompt logprobs of one sequence scored alone vs in the batch: (differing, scored)
ALONE_VS_BATCH = {
    ("overlay3", LLAMA): {"c64": (0, 255), "chunked": (0, 193)},
    ("overlay3", QWEN): {"c64": (0, 254), "chunked": (0, 203)},
    ("stock", LLAMA): {"c64": (0, 255), "chunked": (103, 193)},
    ("stock", QWEN): {"c64": (2, 254), "chunked": (2, 203)},
}


@pytest.mark.parametrize("cell", CELLS, ids=CELL_IDS)
def test_vllm_scores_one_sequence_alone_as_in_the_batch_with_overlay3_and_not_always_stock(matrix, cell):
    for load, want in ALONE_VS_BATCH[cell].items():
        for scored in ("decode", "prefill"):
            row = first_row(leg_dir(matrix, *cell, load, scored))
            got = (row["tica/vllm_alone_vs_batch_n_bitwise_diff"], row["tica/vllm_alone_vs_batch_n_tokens"])
            assert got == want, (load, scored)


@pytest.mark.parametrize("reseal", [True, False], ids=["resealed", "seal_broken"])
@pytest.mark.parametrize("cell", [("overlay3", QWEN, "c1", "decode"), ("overlay3", LLAMA, "c64", "prefill_post_update"),
                                  ("stock", LLAMA, "chunked", "prefill"), ("stock", QWEN, "c64", "prefill_post_update")],
                         ids=lambda c: "-".join(c))
def test_a_leg_with_one_logprob_changed_never_passes(matrix, tmp_path, reseal, cell):
    one_logprob_changed_never_passes(QUESTION, leg_dir(matrix, *cell), tmp_path / RUN, reseal)


@pytest.mark.parametrize("cell", CELLS, ids=CELL_IDS)
def test_vllm_reloads_the_updated_weights_into_the_same_block_fp8_bytes_the_trainer_computes(matrix, cell):
    candidate, shape = cell
    before = first_row(leg_dir(matrix, candidate, shape, "c64", "decode"))
    for scored in ("decode_post_update", "prefill_post_update"):
        leg = leg_dir(matrix, candidate, shape, "c64", scored)
        u = config(leg)["update"]
        assert u["grad_finite"] and u["grad_norm"] > 0
        assert u["changed_tensors"] == u["total_tensors"] == N_TENSORS[shape]
        assert u["served_checkpoint"]["quantization_config"]["weight_block_size"] == [128, 128]
        assert u["fp8_weights_equal_after_reload"] == {"linears": N_LINEARS, "equal": N_LINEARS, "differ": []}
        # control: the reload changed what vLLM served (else "equal after the reload" would be vacuous)
        assert first_row(leg)["checkpoint_version"] == u["hash"] != before["checkpoint_version"]
    # the cells before the update record none
    assert "update" not in config(leg_dir(matrix, candidate, shape, "c64", "decode"))


def test_a_post_update_cell_whose_update_record_is_removed_is_not_judged_after_the_update(matrix, tmp_path):
    update_record_removed_is_not_judged_after_the_update(QUESTION, leg_dir(matrix, "overlay3", QWEN, "c64", "decode_post_update"), tmp_path / RUN)


def test_every_planted_fault_is_caught_beside_its_control(matrix):
    got = Counter((Path(st.leg).name.split("-c64-")[0], st.target, st.status) for _, st in matrix_canaries(QUESTION, matrix))
    assert got == {(f"mx-{c}-{s}", target, "caught"): 1 for c, s in CELLS
                   for target in ("model.norm:hf_rmsnorm", "logprob:torch.log_softmax")}


@pytest.mark.parametrize("cell", [("overlay3", LLAMA), ("stock", QWEN)], ids="/".join)
def test_a_fault_leg_holding_its_controls_logprobs_is_not_a_canary(matrix, tmp_path, cell):
    control = leg_dir(matrix, *cell, "c64", "decode")
    src = leg_dir(matrix, *cell, "c64", "fault_log_softmax")
    assert canary_status(QUESTION, src, control).status == "caught"  # control
    fault = shutil.copytree(src, tmp_path / RUN / src.name)
    shutil.copytree(control / "arrays", fault / "arrays", dirs_exist_ok=True)
    shutil.copy(control / "metrics.jsonl", fault / "metrics.jsonl")
    seal_leg(fault)
    assert canary_status(QUESTION, fault, control).status == "not_a_canary"
