"""The block-FP8 matrix cell from one H100 (tests/fixtures/h200/matrix_fp8b.tar.xz, issue 33, run
fp8b), judged under the question frozen before the matrix (demo/questions/h200-matrix/forward.yaml).
Nothing here touches a GPU: the sealed receipts came back from the device (the archive's README
says how). Only overlay3/llama3.2-1b_l4_fp8b ran; stock and the Cutlass-block `_fp8bc` cell did not
(DeepGEMM's JIT warm-up took the call's time), and nothing here stands for them.

One invariant per test, each beside the control that could make it fail. The matrix judge judges
the logprobs and the cell's name against what the leg recorded; the kernel is not a verdict of
its: `served_kernel` below reads it from the sealed receipt, and an edit to it is refused by the
seal (the judge makes the cell inconclusive) or, resealed, by `served_kernel` itself.
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
ARCHIVE = ROOT / "tests" / "fixtures" / "h200" / "matrix_fp8b.tar.xz"
QUESTION = load_question(ROOT / "demo" / "questions" / "h200-matrix" / "forward.yaml")
SHAPE, RUN = "llama3.2-1b_l4_fp8b", "fp8b"
N_LINEARS = 16  # q/k/v, o, gate/up, down x 4 layers
CELLS = sorted([(x, k) for x in ("c1", "c64", "chunked") for k in ("decode", "prefill")]
               + [("c64", "decode_post_update"), ("c64", "prefill_post_update")])


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> Path:
    return unpacked(ARCHIVE, tmp_path_factory.mktemp("fp8b"))


@pytest.fixture(scope="module")
def cells(matrix):
    return matrix_cells(QUESTION, matrix)


def leg_dir(matrix: Path, load: str, scored: str) -> Path:
    return matrix / RUN / f"mx-overlay3-{SHAPE}-{load}-{scored}"




def test_every_leg_of_the_call_is_sealed_once_and_verifies_and_only_the_overlay3_cell_ran(matrix):
    legs = sorted(p.parent for p in matrix.rglob("seal.json"))
    assert [p.parent.name for p in legs] == [RUN] * 10 and len({p.name for p in legs}) == 10
    assert all(check_seal(leg) == [] for leg in legs)
    # 8 cells (3 loads x decode/prefill, c64 after the update x 2) and 2 planted faults, overlay3 only
    assert {p.name.removeprefix(f"mx-overlay3-{SHAPE}-") for p in legs} == (
        {f"{x}-{k}" for x, k in CELLS} | {"c64-fault_hf_final_norm", "c64-fault_log_softmax"})
    status = json.loads((matrix / RUN / "_calls" / "session19" / "status.json").read_text())
    assert {k: (v["rc"], v["legs"]) for k, v in status["cells"].items()} == {f"overlay3-{SHAPE}": (0, 10)}
    # the call asked for stock and the Cutlass-block cell too; neither left a leg, a log or a summary
    assert not [p for p in (matrix / RUN).rglob("*") if "stock" in p.name or "_fp8bc" in p.name]


def test_every_leg_records_the_h100_and_versions_it_ran_on(matrix):
    for leg in sorted(p.parent for p in (matrix / RUN).glob("mx-*/leg.json")):
        m = read_receipt(leg / "leg.json")
        assert (m["device"]["name"], m["device"]["driver"], m["device"]["capability"]) == (
            "NVIDIA H100 80GB HBM3", "580.159.04", "9.0"), leg.name
        assert (m["versions"]["vllm"], m["versions"]["torch"]) == ("0.26.0", "2.11.0+cu130"), leg.name
        assert m["env"]["VLLM_BATCH_INVARIANT"] == "1" and m["arm"] == "bi1", leg.name
        assert m["resolved_config"]["candidate"] == "overlay3", leg.name


def test_vllm_served_every_linear_on_deepgemm_and_the_trainer_called_the_same_kernel(matrix):
    for leg in sorted(p.parent for p in (matrix / RUN).glob("mx-*/leg.json")):
        rc = config(leg)
        fp8 = rc["fp8"]
        assert served_kernel(leg) == DEEPGEMM, leg.name
        assert rc["quantization"] == "fp8_block" and fp8["not_followed"] == [], leg.name
        assert fp8["vllm"]["linear_kernels"] == {f"Fp8LinearMethod/{DEEPGEMM}/out torch.bfloat16": N_LINEARS}
        assert len(fp8["vllm"]["fp8_linears"]) == N_LINEARS and fp8["trainer"]["fp8_linears"] == N_LINEARS
        plan = fp8["vllm"]["block"]["plan"]
        assert (plan["weight_block"], plan["use_ue8m0"], plan["deep_gemm_scale_fmt"]) == (
            [128, 128], True, "FLOAT32_CEIL_UE8M0"), leg.name
        assert fp8["trainer"]["ops"]["matmul"] == "DeepGEMM fp8_gemm_nt", leg.name
        assert fp8["checkpoint"]["quantization_config"] == {
            "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
        # the weights the trainer quantized equal vLLM's after its own after-load processing
        assert fp8["weights_equal"] == {"linears": N_LINEARS, "equal": N_LINEARS, "differ": []}, leg.name
        # layer 0's linears one op at a time: trainer vs vLLM's module at 1, 7, 64, 300 rows, vLLM's row unmoved
        assert fp8["linear_probe"]["all_equal"] and fp8["linear_probe"]["vllm_batch_invariant"], leg.name
    # the engine's own log names the kernel the receipts record
    log = (matrix / RUN / "_calls" / f"overlay3-{SHAPE}.log").read_text()
    assert f"Selected {DEEPGEMM} for Fp8LinearMethod" in log


@pytest.mark.parametrize("reseal", [True, False], ids=["resealed", "seal_broken"])
def test_a_receipt_whose_recorded_kernel_is_edited_is_refused(matrix, tmp_path, reseal):
    kernel_edit_is_refused(QUESTION, leg_dir(matrix, "c64", "decode"), tmp_path / RUN, DEEPGEMM, CUTLASS, reseal)


def test_overlay3_is_bitwise_on_every_block_fp8_cell_before_and_after_the_update(cells):
    assert sorted((c.load, c.scored) for c in cells) == CELLS
    assert all(c.run == RUN and c.candidate == "overlay3" and c.shape == SHAPE for c in cells)
    assert all(c.verdict is Verdict.PASS and c.cause is None and c.n_diff == 0 for c in cells), \
        [(c.load, c.scored, c.verdict, c.n_diff) for c in cells]
    # vLLM agrees with itself, decode and prefill, on every load
    assert all(c.vllm_decode_vs_prefill == 0 for c in cells)
    assert {(c.load, c.scored): c.n_tokens for c in cells} == {
        ("c1", "decode"): 64, ("c1", "prefill"): 663, ("c64", "decode"): 2565, ("c64", "prefill"): 11515,
        ("chunked", "decode"): 137, ("chunked", "prefill"): 2704,
        ("c64", "decode_post_update"): 2732, ("c64", "prefill_post_update"): 11777}


def test_vllm_scores_one_sequence_alone_as_in_the_batch(matrix):
    for load in ("c64", "chunked"):
        for scored in ("decode", "prefill"):
            row = json.loads((leg_dir(matrix, load, scored) / "metrics.jsonl").read_text().splitlines()[0])
            assert row["tica/vllm_alone_vs_batch_n_bitwise_diff"] == 0 < row["tica/vllm_alone_vs_batch_n_tokens"]


@pytest.mark.parametrize("reseal", [True, False], ids=["resealed", "seal_broken"])
@pytest.mark.parametrize("cell", [("c1", "decode"), ("c64", "prefill_post_update")], ids=lambda c: "-".join(c))
def test_a_leg_with_one_logprob_changed_never_passes(matrix, tmp_path, reseal, cell):
    one_logprob_changed_never_passes(QUESTION, leg_dir(matrix, *cell), tmp_path / RUN, reseal)


def test_vllm_reloads_the_updated_weights_into_the_same_block_fp8_bytes_the_trainer_computes(matrix):
    before = json.loads((leg_dir(matrix, "c64", "decode") / "metrics.jsonl").read_text().splitlines()[0])
    for scored in ("decode_post_update", "prefill_post_update"):
        leg = leg_dir(matrix, "c64", scored)
        u = config(leg)["update"]
        assert u["grad_finite"] and u["grad_norm"] > 0 and u["changed_tensors"] == u["total_tensors"] == 39
        assert u["served_checkpoint"]["quantization_config"]["weight_block_size"] == [128, 128]
        assert u["fp8_weights_equal_after_reload"] == {"linears": N_LINEARS, "equal": N_LINEARS, "differ": []}
        # control: the reload changed what vLLM served (else "equal after the reload" would be vacuous)
        row = json.loads((leg / "metrics.jsonl").read_text().splitlines()[0])
        assert row["checkpoint_version"] == u["hash"] != before["checkpoint_version"]
    # the cells before the update record none
    assert "update" not in config(leg_dir(matrix, "c64", "decode"))


def test_a_post_update_cell_whose_update_record_is_removed_is_not_judged_after_the_update(matrix, tmp_path):
    update_record_removed_is_not_judged_after_the_update(QUESTION, leg_dir(matrix, "c64", "decode_post_update"), tmp_path / RUN)


def test_every_planted_fault_is_caught_beside_its_control(matrix):
    by = Counter((st.shape, st.target, st.status) for _, st in matrix_canaries(QUESTION, matrix))
    assert by == {(SHAPE, "model.norm:hf_rmsnorm", "caught"): 1, (SHAPE, "logprob:torch.log_softmax", "caught"): 1}


def test_a_fault_leg_holding_its_controls_logprobs_is_not_a_canary(matrix, tmp_path):
    control = leg_dir(matrix, "c64", "decode")
    fault = shutil.copytree(leg_dir(matrix, "c64", "fault_log_softmax"), tmp_path / RUN / f"mx-overlay3-{SHAPE}-c64-fault_log_softmax")
    shutil.copytree(control / "arrays", fault / "arrays", dirs_exist_ok=True)
    shutil.copy(control / "metrics.jsonl", fault / "metrics.jsonl")
    seal_leg(fault)
    assert canary_status(QUESTION, fault, control).status == "not_a_canary"
