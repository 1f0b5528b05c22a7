"""TP=2 cells of the matrix (issue 34) on the CPU: `<shape>_tp2` serves <shape> with vLLM over two
GPUs and the trainer in vLLM's TP=2 layout (KernelLlama.tp: each rank's shard through the same
kernels, the partial sums added in rank order). Here: the suffix's parsing, the layout's math on
the CPU (rerun bitwise equal to itself, different from TP=1: the negative control that shows the
layout is real), its backward, and the producer's dry run judged (bi0 legs: nothing passes). The
GPU's bits against vLLM's at TP=2 are the two-GPU device call's to show (scripts/h200/NOTES.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tica.judges.matrix import _is_control, matrix_cells
from tica.legs.vllm_kernels.kernels import TorchReference
from tica.legs.vllm_kernels.matrix import (
    base_shape,
    fake_rollout,
    shape_quantization,
    shape_tensor_parallel,
    update_step,
    workload,
)
from tica.legs.vllm_kernels.model import pack
from tica.legs.vllm_kernels.seeded_model import make_model
from tica.matrix_table import SHAPE, shape_table
from tica.question import load_question
from tica.seal import check_seal
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    make_model(d, "tiny", seed=7, device="cpu")
    return d


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny_moe")
    make_model(d, "tiny_moe", seed=7, device="cpu")
    return d


def _trainer(d: Path):
    from tica.legs.vllm_kernels.matrix import trainer_model

    return trainer_model(d, TorchReference, "cpu", moe=d.name.startswith("tiny_moe"))


def test_the_tp2_suffix_serves_its_base_shape_and_combines_with_nothing_yet():
    assert shape_tensor_parallel("llama3.2-1b_l4_tp2") == ("llama3.2-1b_l4", 2)
    assert shape_tensor_parallel("llama3.2-1b_l4") == ("llama3.2-1b_l4", 1)
    assert shape_tensor_parallel("qwen3-30b-a3b_l2_ep2") == ("qwen3-30b-a3b_l2", 2)
    assert base_shape("qwen2.5-0.5b_l4_tp2") == "qwen2.5-0.5b_l4"
    assert base_shape("llama3.2-1b_l4_fp8") == "llama3.2-1b_l4"
    assert shape_quantization("llama3.2-1b_l4_tp2") == ("llama3.2-1b_l4_tp2", None)
    for two in ("llama3.2-1b_l4_fp8_tp2", "llama3.2-1b_l4_tp2_fp8"):
        with pytest.raises(ValueError, match="combines with no other suffix"):
            base_shape(two)


def _logprobs(model, seqs: list[list[int]], tp: int) -> np.ndarray:
    model.tp = tp
    try:
        with torch.no_grad():
            return model.logprobs(*pack(seqs, "cpu")).float().numpy()
    finally:
        model.tp = 1


@pytest.mark.parametrize("shape", ["tiny", "tiny_moe"])
def test_the_tp2_layout_reruns_bitwise_and_differs_from_tp1(shape, request):
    """Two bf16 partial sums added in fp32 and rounded once are not one bf16 matmul's rounding: the
    layout changes bits (the control a real TP=2 run must show beside its pass), and rerunning it
    changes none. The MoE (Qwen3 layout: per-head q/k norms, every expert's rows split over the
    ranks) keeps its routes identical across reruns."""
    model = _trainer(request.getfixturevalue(shape))
    prompts, gens, seeds = workload("c1", model.config["vocab_size"])
    seqs = fake_rollout(model, prompts, gens, seeds)["fulls"] + [list(range(3, 90))]
    a = _logprobs(model, seqs, 2)
    routes = model.routes_array() if shape == "tiny_moe" else None
    b, one = _logprobs(model, seqs, 2), _logprobs(model, seqs, 1)
    assert a.view(np.uint32).tolist() == b.view(np.uint32).tolist()
    if routes is not None:
        assert routes.shape[0] == sum(len(x) for x in seqs)
        _logprobs(model, seqs, 2)
        assert (model.routes_array() == routes).all()
    differ = int(np.count_nonzero(a.view(np.uint32) != one.view(np.uint32)))
    assert differ > 0, "TP=2 and TP=1 agree on every token: the layout is not shown"
    # the same model, rounded differently (on the MoE a near-tie route may flip, moving its token more)
    assert float(np.median(np.abs(a - one))) < 0.05


@pytest.mark.parametrize("shape", ["tiny", "tiny_moe"])
def test_the_update_backward_runs_through_the_tp2_layout(shape, request, tmp_path):
    d = request.getfixturevalue(shape)
    model = _trainer(d)
    model.tp = 2
    prompts, gens, seeds = workload("c16", model.config["vocab_size"])
    ro = fake_rollout(model, prompts[:4], gens[:4], seeds[:4])
    upd = update_step(model, ro, "cpu", tmp_path / "m1", d)
    assert upd["grad_finite"] and upd["changed_tensors"] == upd["total_tensors"] and upd["hash"].startswith("blake3:")


def test_a_tp2_cell_is_not_the_padded_control_of_a_tp1_cell():
    cfg = {"vocab_size": 32001, "architecture": "LlamaForCausalLM", "tensor_parallel_size": 2}
    assert _is_control(cfg, dict(cfg, vocab_size=32064))
    assert not _is_control(cfg, {"vocab_size": 32064, "architecture": "LlamaForCausalLM"})


def test_a_dry_run_of_tp2_cells_is_judged_in_rows_of_their_own(tmp_path):
    """stock/tiny and stock/tiny_tp2 from one base model, and a MoE at TP=2: the TP=2 legs record
    the layout and the (dry run's) all-reduce of both ranks, the trainer_tp1 control differs while
    the product trainer scores its own rollout, the MoE's arrays hold both sides' routes, and the
    table shows tiny and tiny_tp2 as rows of their own; bi0, so nothing passes."""
    work = tmp_path / "work"
    r = subprocess.run([sys.executable, "-m", "tica.legs.vllm_kernels.producers", "matrix", "--dry-run", "--cells",
                        "stock/tiny,stock/tiny_tp2,stock/tiny_moe_tp2", "--loads", "c1", "--out", str(tmp_path / "out"),
                        "--work", str(work), "--budget", "600", "--min-cell-s", "1", "--parallel", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(p.name for p in (work / "models").iterdir()) == ["tiny", "tiny_moe"]
    legs = {p.name: p for p in (work / "legs").iterdir()}
    assert all(check_seal(p) == [] for p in legs.values())
    for kind, shape in (("decode", "tiny_tp2"), ("prefill", "tiny_tp2"), ("prefill", "tiny_moe_tp2")):
        leg = legs[f"mx-stock-{shape}-c1-{kind}"]
        cfg = json.loads((leg / "leg.json").read_text())["resolved_config"]
        assert cfg["tensor_parallel_size"] == 2 and cfg["model_shape"] == shape
        assert len(cfg["all_reduce"]) == 2 and all("dry run" in x["dry_run"].lower() for x in cfg["all_reduce"])
        assert cfg["trainer_tensor_parallel"].startswith("2 ranks")
        v = json.loads((leg / "metrics.jsonl").read_text())["tica/variants"]
        assert v["product"][f"{kind}_n_diff"] == 0 and v["trainer_tp1"][f"{kind}_n_diff"] > 0
        tp1 = json.loads((legs[f"mx-stock-tiny-c1-{kind}"] / "metrics.jsonl").read_text())["tica/variants"]
        assert "trainer_tp1" not in tp1
        assert json.loads((legs[f"mx-stock-tiny-c1-{kind}"] / "leg.json").read_text())[
            "resolved_config"]["tensor_parallel_size"] == 1
    question = load_question(ROOT / "demo" / "questions" / "h200-matrix" / "forward.yaml")
    cells = matrix_cells(question, work)
    assert {(c.shape, c.verdict) for c in cells} == {("tiny", Verdict.INCONCLUSIVE), ("tiny_tp2", Verdict.INCONCLUSIVE),
                                                     ("tiny_moe_tp2", Verdict.INCONCLUSIVE)}
    z = np.load(legs["mx-stock-tiny_moe_tp2-c1-prefill"] / "arrays" / "step_0001.npz")
    assert z["rollout_experts"].shape == z["trainer_experts"].shape == (z["token_ids"].size, 2, 2)
    assert [row[SHAPE] for row in shape_table(cells).rows] == ["tiny", "tiny_moe_tp2", "tiny_tp2"]

