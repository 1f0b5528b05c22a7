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
from tica.legs.vllm_kernels.model import from_dir, pack
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


def test_the_tp2_suffix_serves_its_base_shape_and_combines_with_nothing_yet():
    assert shape_tensor_parallel("llama3.2-1b_l4_tp2") == ("llama3.2-1b_l4", 2)
    assert shape_tensor_parallel("llama3.2-1b_l4") == ("llama3.2-1b_l4", 1)
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


def test_the_tp2_layout_reruns_bitwise_and_differs_from_tp1(tiny):
    """Two bf16 partial sums added in fp32 and rounded once are not one bf16 matmul's rounding: the
    layout changes bits (the control a real TP=2 run must show beside its pass), and rerunning it
    changes none."""
    model = from_dir(tiny, TorchReference, device="cpu")
    prompts, gens, seeds = workload("c1", model.config["vocab_size"])
    seqs = fake_rollout(model, prompts, gens, seeds)["fulls"] + [list(range(3, 90))]
    a, b, one = _logprobs(model, seqs, 2), _logprobs(model, seqs, 2), _logprobs(model, seqs, 1)
    assert a.view(np.uint32).tolist() == b.view(np.uint32).tolist()
    differ = int(np.count_nonzero(a.view(np.uint32) != one.view(np.uint32)))
    assert differ > 0, "TP=2 and TP=1 agree on every token: the layout is not shown"
    assert np.allclose(a, one, atol=0.05)  # the same model, rounded differently


def test_the_update_backward_runs_through_the_tp2_layout(tiny, tmp_path):
    model = from_dir(tiny, TorchReference, device="cpu")
    model.tp = 2
    prompts, gens, seeds = workload("c16", model.config["vocab_size"])
    ro = fake_rollout(model, prompts[:4], gens[:4], seeds[:4])
    upd = update_step(model, ro, "cpu", tmp_path / "m1", tiny)
    assert upd["grad_finite"] and upd["changed_tensors"] == upd["total_tensors"] and upd["hash"].startswith("blake3:")


def test_a_tp2_cell_is_not_the_padded_control_of_a_tp1_cell():
    cfg = {"vocab_size": 32001, "architecture": "LlamaForCausalLM", "tensor_parallel_size": 2}
    assert _is_control(cfg, dict(cfg, vocab_size=32064))
    assert not _is_control(cfg, {"vocab_size": 32064, "architecture": "LlamaForCausalLM"})


def test_a_dry_run_of_tp2_cells_is_judged_in_rows_of_their_own(tmp_path):
    """stock/tiny and stock/tiny_tp2 from one base model: the TP=2 legs record the layout and the
    (dry run's) all-reduce of both ranks, the trainer_tp1 control differs on every scored token
    while the product trainer scores its own rollout, the MoE TP=2 cell is not run with its reason,
    and the table shows tiny and tiny_tp2 as rows of their own; bi0, so nothing passes."""
    work = tmp_path / "work"
    r = subprocess.run([sys.executable, "-m", "tica.legs.vllm_kernels.producers", "matrix", "--dry-run", "--cells",
                        "stock/tiny,stock/tiny_tp2,stock/tiny_moe_tp2", "--loads", "c1", "--out", str(tmp_path / "out"),
                        "--work", str(work), "--budget", "600", "--min-cell-s", "1", "--parallel", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(p.name for p in (work / "models").iterdir()) == ["tiny", "tiny_moe"]
    legs = {p.name: p for p in (work / "legs").iterdir()}
    assert all(check_seal(p) == [] for p in legs.values())
    for kind in ("decode", "prefill"):
        leg = legs[f"mx-stock-tiny_tp2-c1-{kind}"]
        cfg = json.loads((leg / "leg.json").read_text())["resolved_config"]
        assert cfg["tensor_parallel_size"] == 2 and cfg["model_shape"] == "tiny_tp2"
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
                                                     ("tiny_moe_tp2", Verdict.NOT_RUN)}
    moe = [c for c in cells if c.shape == "tiny_moe_tp2"]
    assert all("does not follow vLLM's TP=2 MoE layout" in c.reasons[0] for c in moe)
    assert [row[SHAPE] for row in shape_table(cells).rows] == ["tiny", "tiny_moe_tp2", "tiny_tp2"]
