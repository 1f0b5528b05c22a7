"""The MoE probe from one H200 (tests/fixtures/h200/calls/moe_probe, issue 33): vLLM 0.26 against
itself on a seeded Qwen3-MoE-style model, with a dense model of the same widths as the control.
Nothing here touches a GPU; the JSON came back from the device as `scripts/h200/moe_probe.py` wrote it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parent / "fixtures" / "h200" / "calls" / "moe_probe"


def probe(folder: str, model: str) -> dict:
    return json.loads((PROBE / folder / f"{model}_probe_bi1.json").read_text())


@pytest.mark.parametrize("model", ["moe", "dense"])
def test_with_the_overlay_vllm_decodes_what_it_prefills_bitwise(model):
    rec = probe("overlay3", model)
    assert rec["arm"] == "bi1" and rec["overlay_parts"] == ["rmsnorm", "fa_pin_tile"]
    assert rec["decode_vs_prefill"] == {"tokens": 64, "n_bitwise_diff": 0}


@pytest.mark.parametrize("model", ["moe", "dense"])
def test_stock_batch_invariant_vllm_does_not_at_head_dim_64(model):
    """The control: the same probe without the overlay differs on 62 of 64 tokens, MoE or dense alike,
    so the MoE layer is not what the overlay had to fix here."""
    rec = probe("stock", model)
    assert rec["overlay_parts"] == [] and rec["decode_vs_prefill"]["n_bitwise_diff"] == 62


def test_the_moe_path_vllm_chose_is_recorded():
    log = (PROBE / "stock" / "run.log").read_text()
    assert "Using TRITON Unquantized MoE backend" in log and "Qwen3MoeForCausalLM" in log


# ---------------------------------------------------------------- FP8 (session 13, calls 9 and 10)

FP8 = PROBE.parent / "fp8_probe"


def fp8_probe(folder: str, model: str, quant: str) -> dict:
    rec = json.loads((FP8 / folder / f"{model}{'_fp8' if quant == 'fp8' else ''}_probe_bi1.json").read_text())
    assert rec["arm"] == "bi1" and rec["quantization"] == quant and rec["candidate"] == folder
    return rec


@pytest.mark.parametrize("quant", ["none", "fp8"])
def test_dense_fp8_is_as_batch_invariant_as_bf16_with_the_overlay(quant):
    rec = fp8_probe("overlay3", "dense", quant)
    assert rec["batch_invariance"]["n_bitwise_diff"] == 0 and rec["decode_vs_prefill"]["n_bitwise_diff"] == 0


@pytest.mark.parametrize("folder", ["overlay3", "stock"])
def test_fp8_experts_move_with_their_batch_where_bf16_experts_do_not(folder):
    """vLLM 0.26's online-FP8 Triton experts scale their inputs over the whole batch: the prompt's
    logprobs change with its neighbours, overlay or not; the bf16 experts of the same model, served
    in the same session, are the control."""
    fp8, bf16 = fp8_probe(folder, "moe", "fp8"), fp8_probe(folder, "moe", "none")
    assert fp8["batch_invariance"]["n_bitwise_diff"] >= 0.9 * fp8["batch_invariance"]["tokens"]
    assert bf16["batch_invariance"]["n_bitwise_diff"] == 0


def test_the_fp8_kernels_vllm_chose_are_recorded():
    log = (FP8 / "overlay3" / "moe.fp8.kernels.log").read_text()
    assert "Using TRITON Fp8 MoE backend" in log and "CutlassFP8ScaledMMLinearKernel" in log
