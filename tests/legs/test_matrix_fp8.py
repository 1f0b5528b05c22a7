"""FP8 cells of the matrix (issue 33) on the CPU: the trainer's FP8 linear follows vLLM 0.26's online
FP8 (per-tensor weight scale over the fused weight, per-token activation scale by QuantFP8's
formula), a per-tensor activation scale is the batch-variant negative control, the GPU class's
padding and slicing reduce to the reference, and the producer's FP8 plumbing dry-runs (the FP8 ops
emulated in torch: a CPU has no cutlass_scaled_mm). The GPU's bits are the device call's to show."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tica.judges.matrix import _cause
from tica.legs.vllm_kernels import autograd as A
from tica.legs.vllm_kernels.fp8 import (
    FP8_MIN_SCALING_FACTOR,
    Fp8LinearGpu,
    Fp8LinearReference,
    fp8_linear_reference,
    quant_per_tensor_ref,
    quant_per_token_ref,
    scaled_mm_reference,
)
from tica.legs.vllm_kernels.matrix import cell_loads, shape_quantization

ROOT = Path(__file__).resolve().parents[2]


def _acts(seed: int = 0, rows: int = 9, k: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-3, 2, rows).unsqueeze(1)
    x[0] = 0.0  # an all-zero row: the scale's lower clamp
    return x.to(torch.bfloat16)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.element_size() == 1 else t.contiguous().view(torch.int32)


@pytest.mark.parametrize("per_token", [True, False])
def test_the_reference_quantization_is_vllms_quantfp8_forward_native(per_token):
    qf = pytest.importorskip("vllm.model_executor.layers.quantization.input_quant_fp8")
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    shape = GroupShape.PER_TOKEN if per_token else GroupShape.PER_TENSOR
    op = SimpleNamespace(is_group_quant=False, static=False, group_shape=shape, num_token_padding=None)
    x = _acts()
    want_q, want_s = qf.QuantFP8.forward_native(op, x)
    got_q, got_s = quant_per_token_ref(x) if per_token else quant_per_tensor_ref(x)
    assert qf._FP8_MAX == 448.0 and qf._FP8_MIN_SCALING_FACTOR == FP8_MIN_SCALING_FACTOR
    assert got_q.dtype == want_q.dtype == torch.float8_e4m3fn
    assert torch.equal(_bits(got_q), _bits(want_q))
    assert torch.equal(got_s.reshape(-1), want_s.reshape(-1).float())
    if per_token:
        assert got_s.shape == (x.shape[0], 1) and got_s[0, 0] == FP8_MIN_SCALING_FACTOR


def test_per_token_rows_do_not_move_with_the_batch_and_a_per_tensor_scale_does():
    """The property the dense FP8 cells rest on, and its negative control: a row's output alone equals
    its output among other rows with vLLM's per-token scale; with one scale over the batch (what FP8
    experts do, vLLM issue 57016) a large neighbour changes it."""
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(48, 64, generator=g) * 0.05).to(torch.bfloat16)
    x = _acts(2, rows=6)
    big = (torch.randn(1, 64, generator=g) * 300).to(torch.bfloat16)
    batch = torch.cat([x, big])
    for act in ("per_token", "per_tensor"):
        alone = fp8_linear_reference(x[3:4], w, act=act)
        among = fp8_linear_reference(batch, w, act=act)[3:4]
        same = torch.equal(alone.view(torch.int16), among.view(torch.int16))
        assert same == (act == "per_token"), act


def test_the_gpu_linear_pads_and_slices_to_the_reference():
    """Fp8LinearGpu's own plumbing (weight transposed, K and N padded to 16, bias padded, columns
    sliced off) with vLLM's two ops replaced by their torch math: equal to the unpadded reference."""
    def scaled_fp8_quant(x, scale=None, num_token_padding=None, scale_ub=None, use_per_token_if_dynamic=False,
                         group_shape=None):
        assert scale is None and num_token_padding is None and scale_ub is None and group_shape is None
        return quant_per_token_ref(x) if use_per_token_if_dynamic else quant_per_tensor_ref(x)

    def cutlass_scaled_mm(a, b, scale_a, scale_b, out_dtype, bias=None):
        assert a.shape[1] % 16 == 0 and b.shape[0] % 16 == 0 and b.shape[1] % 16 == 0 and b.stride(0) == 1
        return scaled_mm_reference(a, b, scale_a, scale_b, out_dtype, bias)

    lin = Fp8LinearGpu.__new__(Fp8LinearGpu)
    lin._ops = SimpleNamespace(scaled_fp8_quant=scaled_fp8_quant, cutlass_scaled_mm=cutlass_scaled_mm)
    g = torch.Generator().manual_seed(3)
    for n, k in ((8, 64), (48, 40), (128, 64)):  # a MoE router (N=8), K not a multiple of 16, none padded
        w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
        b = (torch.randn(n, generator=g) * 0.1).to(torch.bfloat16)
        x = _acts(4, rows=5, k=k)
        for bias in (None, b):
            got, want = lin(x, w, bias), fp8_linear_reference(x, w, bias)
            assert got.shape == want.shape == (5, n)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (n, k, bias is None)


def test_the_fp8_backward_is_the_bf16_linears_straight_through():
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(7, 32, generator=g, dtype=torch.float64)
    w0 = torch.randn(16, 32, generator=g, dtype=torch.float64) * 0.1
    gy = torch.randn(7, 16, generator=g, dtype=torch.float64)
    grads = []
    for fn in (lambda x, w: A.fp8_linear(Fp8LinearReference(), x.float(), w.float()).double(),
               lambda x, w: x @ w.t()):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        (fn(x, w) * gy).sum().backward()
        grads.append((x.grad, w.grad))
    (dx8, dw8), (dx, dw) = grads
    assert torch.allclose(dx8, dx, rtol=1e-5, atol=1e-6) and torch.allclose(dw8, dw, rtol=1e-5, atol=1e-6)


def test_fp8_shapes_serve_their_base_shape_on_fewer_loads():
    assert shape_quantization("llama3.2-1b_l4_fp8") == ("llama3.2-1b_l4", "fp8")
    assert shape_quantization("qwen3-30b-a3b_l2") == ("qwen3-30b-a3b_l2", None)
    assert cell_loads("", moe=False, quant="fp8") == (["c1", "c64", "chunked"], "c64")
    assert cell_loads("", moe=True, quant="fp8") == (["c1", "c16", "chunked"], "c16")
    assert cell_loads("c1", moe=False, quant="fp8") == (["c1"], "c64")


def test_a_failing_cell_on_a_batch_variant_engine_names_it_and_the_experts_the_trainer_did_not_follow():
    row = {"tica/variants": {"product": {"prefill_n_diff": 91}}, "tica/vllm_alone_vs_batch_n_bitwise_diff": 88,
           "tica/vllm_alone_vs_batch_n_tokens": 91, "tica/vllm_decode_vs_prefill_n_bitwise_diff": 30}
    cfg = {"vocab_size": 512, "fp8": {"trainer": {"experts": "bf16 experts: not followed"}}}
    cause = _cause("prefill", row, cfg, None, False)
    assert cause.startswith("batch-variant engine: vLLM's own prompt logprobs of one sequence differ on 88 of 91")
    # both engine-side causes are named where both apply; the trainer's own gap last
    assert "; engine step: vLLM's own decode and prefill logprobs differ on 30 generated tokens" in cause
    assert cause.endswith("trainer: bf16 experts: not followed")
    # the control: an engine that is batch invariant names the step alone
    alone = _cause("prefill", {**row, "tica/vllm_alone_vs_batch_n_bitwise_diff": 0}, cfg, None, False)
    assert alone.startswith("engine step:") and "batch-variant" not in alone


def _dry(tmp_path: Path, cells: str, loads: str) -> Path:
    work = tmp_path / "work"
    r = subprocess.run([sys.executable, "-m", "tica.legs.vllm_kernels.producers", "matrix", "--dry-run", "--cells", cells,
                        "--loads", loads, "--out", str(tmp_path / "out"), "--work", str(work), "--budget", "600",
                        "--min-cell-s", "1", "--parallel", "1"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return work


def test_a_dry_run_of_fp8_cells_records_the_quantization_and_vllms_batch_evidence(tmp_path):
    """Dense FP8 and MoE FP8 cells on the CPU: one base model built per shape, every leg records the
    quantization, the trainer's FP8 linears and (on a batch of several) vLLM's alone-vs-batch count;
    the MoE FP8 cell's trainer says it does not follow the FP8 experts and its update is not run."""
    work = _dry(tmp_path, "stock/tiny_fp8,overlay3/tiny_moe_fp8", "c1,c16")
    assert sorted(p.name for p in (work / "models").iterdir()) == ["tiny", "tiny_moe"]
    legs = {p.name: p for p in (work / "legs").iterdir()}
    assert {"mx-stock-tiny_fp8-c16-prefill", "mx-overlay3-tiny_moe_fp8-c16-fault_torch_router"} <= set(legs)
    for name, leg in legs.items():
        cfg = json.loads((leg / "leg.json").read_text())["resolved_config"]
        assert cfg["quantization"] == "fp8" and cfg["model_shape"] in ("tiny_fp8", "tiny_moe_fp8")
        assert cfg["fp8"]["trainer"]["fp8_linears"] == (8 if "moe" not in name else 6)
        assert ("experts" in cfg["fp8"]["trainer"]) == ("moe" in name)
    row = json.loads((legs["mx-overlay3-tiny_moe_fp8-c16-prefill"] / "metrics.jsonl").read_text())
    assert row["tica/vllm_alone_vs_batch_n_bitwise_diff"] == 0 and row["tica/vllm_alone_vs_batch_n_tokens"] > 0
    assert "tica/vllm_alone_vs_batch_n_bitwise_diff" not in json.loads(
        (legs["mx-stock-tiny_fp8-c1-prefill"] / "metrics.jsonl").read_text())  # one sequence: nothing beside it
    moe = json.loads((work / "logs" / "overlay3-tiny_moe_fp8.summary.json").read_text())
    assert moe["update"].startswith("not run: the trainer does not follow vLLM's FP8 experts")
    dense = json.loads((work / "logs" / "stock-tiny_fp8.summary.json").read_text())
    assert dense["update"] == "not run: c64 was not among the loads"


def test_a_cell_vllm_could_not_run_is_judged_not_run_with_vllms_reason(tmp_path):
    """What the producer writes where vLLM refuses the quantized engine or its reload: a sealed leg
    with the reason and no measurement; the matrix judge reads it as not run, never as a pass."""
    from tica.judges.matrix import matrix_cells
    from tica.legs.vllm_kernels import legio
    from tica.legs.vllm_kernels.matrix import leg_name, write_not_run_leg
    from tica.question import load_question
    from tica.verdict import Verdict

    reason = "vLLM 0.26 did not start the engine with quantization='fp8': ValueError: planted"
    cfg = {"candidate": "overlay3", "model_shape": "tiny_moe_fp8", "quantization": "fp8"}
    for kind, extra in (("prefill", {}), ("decode_post_update", {"update": {"loss": 0.0}})):
        d = tmp_path / "run" / leg_name("overlay3", "tiny_moe_fp8", "c16", kind)
        write_not_run_leg(d, dict(cfg, load="c16", scored=kind.replace("_post_update", ""), **extra), reason)
        legio.finalize_leg(d, [])
    question = load_question(ROOT / "demo" / "questions" / "h200-matrix" / "forward.yaml")
    cells = matrix_cells(question, tmp_path)
    assert [(c.scored, c.verdict) for c in cells] == [("decode_post_update", Verdict.NOT_RUN),
                                                      ("prefill", Verdict.NOT_RUN)]
    assert all(any("planted" in r for r in c.reasons) and c.cause == "not judged: not run" for c in cells)
