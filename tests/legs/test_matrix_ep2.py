"""EP=2 cells of the matrix (issue 34) on the CPU: `<moe_shape>_ep2` serves the MoE with vLLM at TP=2
and enable_expert_parallel=True, the trainer in vLLM's EP layout (KernelMoe._ep_moe, ep.py: whole
experts per rank by vLLM's expert map, each rank's experts with the other rank's slots zero, the
partials all-reduced). Here: the expert map against vLLM's, the layout's math (reruns bitwise, differs
from TP=1 and from the TP=2 layout, equals TP=1's routed output under moe_sum's rounding at top-2),
planted faults, both ranks' routes, the backward, and the producer's dry run judged (bi0: nothing
passes). The GPU's bits against vLLM at EP=2 are the two-GPU device call's to show."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tica.errors import ReceiptError
from tica.judges.matrix import matrix_cells, rank_routes
from tica.legs.vllm_kernels import moe as moe_mod
from tica.legs.vllm_kernels.ep import (
    check_expert_maps,
    engine_expert_digests,
    engine_expert_maps,
    engine_maps_differ,
    expert_map,
    local_experts,
    placement,
)
from tica.legs.vllm_kernels.kernels import TorchReference
from tica.legs.vllm_kernels.matrix import EP_DENSE, ep_rank_record, update_step, workload
from tica.legs.vllm_kernels.model import pack
from tica.legs.vllm_kernels.moe import TorchMoeReference
from tica.legs.vllm_kernels.seeded_model import make_model
from tica.matrix_table import SHAPE, shape_table
from tica.question import load_question
from tica.receipts import load_step_arrays
from tica.seal import check_seal
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[2]
# the vLLM 0.26.0 wheel, where this checkout has it staged (the expert map is then run from its source)
WHEEL = Path(os.environ.get("TICA_VLLM_WHEEL", ROOT / ".devstage/whl/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"))


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny_moe")
    make_model(d, "tiny_moe", seed=7, device="cpu")
    return d


def _trainer(d: Path):
    from tica.legs.vllm_kernels.matrix import trainer_model

    return trainer_model(d, TorchReference, "cpu", moe=True)


def _seqs(vocab: int) -> list[list[int]]:
    prompts, _, _ = workload("c16", vocab)
    return [p + list(range(3, 40)) for p in prompts[:3]]


def _logprobs(model, seqs, tp: int, ep: bool) -> np.ndarray:
    model.tp, model.ep = tp, ep
    try:
        with torch.no_grad():
            return model.logprobs(*pack(seqs, "cpu")).float().numpy()
    finally:
        model.tp, model.ep = 1, False


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


def _flips(a: np.ndarray, b: np.ndarray) -> int:
    return int((np.sort(a, -1) != np.sort(b, -1)).any(-1).sum())


# ------------------------------------------------------------------------------- the expert map
# vLLM 0.26's determine_expert_map, read from its source (fused_moe/expert_map_manager.py) and its
# ParallelConfig.expert_placement_strategy docstring: 2 ranks, 4/5/8 experts, rank -> map
VLLM_MAPS = {
    ("linear", 4): [[0, 1, -1, -1], [-1, -1, 0, 1]],
    ("round_robin", 4): [[0, -1, 1, -1], [-1, 0, -1, 1]],
    ("linear", 5): [[0, 1, 2, -1, -1], [-1, -1, -1, 0, 1]],  # the remainder to the first ranks
    ("round_robin", 5): [[0, -1, 1, -1, 2], [-1, 0, -1, 1, -1]],
    ("linear", 8): [[0, 1, 2, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 0, 1, 2, 3]],
}


def test_the_expert_map_is_vllms_for_both_placements():
    for (strategy, n), want in VLLM_MAPS.items():
        maps = [expert_map(2, r, n, strategy) for r in range(2)]
        assert [m.tolist() for m in maps] == want, (strategy, n)
        check_expert_maps(maps, n)
    assert local_experts(expert_map(2, 1, 5, "round_robin")).tolist() == [1, 3]
    assert expert_map(2, 0, 8, "round_robin").tolist() != VLLM_MAPS[("linear", 8)][0]  # the strategies differ


@pytest.mark.skipif(not WHEEL.is_file(), reason="vLLM 0.26.0's wheel is not staged here (TICA_VLLM_WHEEL)")
def test_the_expert_map_is_the_one_vllms_own_source_computes():
    """determine_expert_map compiled from the wheel's own source and run beside ep.expert_map."""
    src = zipfile.ZipFile(WHEEL).read("vllm/model_executor/layers/fused_moe/expert_map_manager.py").decode()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "determine_expert_map")
    ns = {"torch": torch, "ExpertPlacementStrategy": str}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "expert_map_manager.py", "exec"), ns)
    for strategy in ("linear", "round_robin"):
        for n in (2, 5, 8, 60, 128):
            for r in range(2):
                local, vmap, _ = ns["determine_expert_map"](2, r, n, strategy)
                assert torch.equal(expert_map(2, r, n, strategy), vmap) and local == int((vmap >= 0).sum())


def test_placement_is_linear_unless_the_model_has_expert_groups():
    """determine_expert_placement_strategy: round_robin only with num_expert_group > 1 (no EPLB, no
    redundant experts), so Qwen3-MoE, Mixtral and Qwen2-MoE are placed linearly."""
    assert placement("linear", None) == placement("round_robin", None) == placement("round_robin", 1) == "linear"
    assert placement("round_robin", 8) == "round_robin"
    with pytest.raises(ValueError, match="expert placement"):
        placement("random", None)


def test_a_wrong_expert_map_is_refused_and_the_engines_is_compared():
    """The trainer's maps must hold every expert on exactly one rank at local indices 0..n-1; the
    engine's maps (read from each worker) must be the trainer's, else the cells are not run."""
    good = [expert_map(2, r, 8) for r in range(2)]
    check_expert_maps(good, 8)
    lost = [good[0], torch.where(torch.arange(8) == 7, -1, good[1]).to(torch.int32)]
    twice = [good[0], torch.tensor([0, 1, 2, 3, 4, 5, 6, 7], dtype=torch.int32)]
    shifted = [good[0], torch.where(good[1] >= 0, good[1] + 1, -1).to(torch.int32)]
    for bad, why in ((lost, "held by"), (twice, "held by"), (shifted, "local indices")):
        with pytest.raises(ValueError, match=why):
            check_expert_maps(bad, 8)
    layers = ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    same = [{n: m.tolist() for n in layers} for m in good]
    assert engine_maps_differ(same, good) is None
    rr = [{n: expert_map(2, r, 8, "round_robin").tolist() for n in layers} for r in range(2)]
    assert "rank 0 of the engine holds expert map" in engine_maps_differ(rr, good)
    assert "did not run expert parallelism" in engine_maps_differ([{}, {}], good)
    assert "from 1 ranks" in engine_maps_differ(same[:1], good)

    class Layer(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.register_buffer("_expert_map", m)

    net = torch.nn.ModuleDict({"a": Layer(good[1]), "b": torch.nn.Linear(2, 2)})
    assert engine_expert_maps(net) == {"a": good[1].tolist()}


# ------------------------------------------------------------------------------- the layout's math
def test_the_ep2_layout_reruns_bitwise_and_differs_from_tp1_and_the_tp2_layout(tiny_moe):
    """Measured on tiny_moe (Qwen3 layout, 8 experts, top-2; bf16 on the CPU reference, 3 sequences,
    557 rows): EP=2 reruns bitwise with both ranks' routes equal; against TP=1 all 554 scored logprobs
    differ (the attention's partial sums, as at TP=2, and the reference's per-rank rounding) and 6 of
    1114 token-layer routes flip; against the TP=2 layout (every expert's rows split over the ranks)
    all 554 differ and 3 routes flip."""
    model = _trainer(tiny_moe)
    seqs = _seqs(model.config["vocab_size"])
    a = _logprobs(model, seqs, 2, True)
    routes, ranks = model.routes_array(), model.rank_routes_array()
    b = _logprobs(model, seqs, 2, True)
    assert _bits(a).tolist() == _bits(b).tolist() and (model.routes_array() == routes).all()
    assert ranks.shape == (2, *routes.shape) and (ranks == routes[None]).all()
    one = _logprobs(model, seqs, 1, False)
    r1 = model.routes_array()
    tp2 = _logprobs(model, seqs, 2, False)
    r2 = model.routes_array()
    assert model.rank_routes_array() is None  # the TP layout records one route
    assert int((_bits(a) != _bits(one)).sum()) > 0, "EP=2 and TP=1 agree on every token: the layout is not shown"
    assert int((_bits(a) != _bits(tp2)).sum()) > 0, "EP=2 and the TP=2 layout agree: the expert split is not shown"
    assert float(np.median(np.abs(a - one))) < 0.05 and float(np.median(np.abs(a - tp2))) < 0.05
    assert _flips(routes, r1) <= 0.02 * routes[..., 0].size and _flips(routes, r2) <= 0.02 * routes[..., 0].size


class MoeSumKernels:
    """vLLM's experts' rounding in plain torch: each (token, slot) row of the down projection rounded
    to bf16 (fused_moe_kernel's output, gate weight applied to its fp32 accumulator), then moe_sum
    adding the top-k rows in slot order, rounding each add; a slot of another rank's expert is zero."""

    route = staticmethod(TorchMoeReference.route)

    @staticmethod
    def experts(x, w13, w2, weights, ids, expert_map=None):
        T, k = ids.shape
        rows = torch.zeros(T, k, w2.shape[1], dtype=x.dtype)
        for t in range(T):
            for j in range(k):
                e = int(ids[t, j]) if expert_map is None else int(expert_map[ids[t, j]])
                if e < 0:
                    continue
                g, u = (x[t].float() @ w13[e].float().t()).to(x.dtype).float().chunk(2)
                act = (torch.nn.functional.silu(g) * u).to(x.dtype).float()
                rows[t, j] = ((act @ w2[e].float().t()) * weights[t, j]).to(x.dtype)
        out = rows[:, 0]
        for j in range(1, k):
            out = out + rows[:, j]  # bf16 + bf16: one rounding per add, as moe_sum's scalar_t sum
        return out


def _moe_outputs(model, h, top_k: int):
    model.moe_kernels, model.top_k = MoeSumKernels, top_k
    with torch.no_grad():
        model.tp, model.ep = 1, False
        one = model._moe(0, "model.layers.0.", h)
        model.tp, model.ep = 2, True
        ep = model._moe(0, "model.layers.0.", h)
    model.tp, model.ep = 1, False
    return one, ep


def test_the_ep2_routed_output_equals_tp1s_at_top2_and_only_the_sum_order_differs_past_it(tiny_moe):
    """Under moe_sum's rounding a top-2 route's output is round(a + b) whichever rank holds a and b
    (the other rank's row is 0 and the all-reduce rounds once), so EP=2's MoE block equals TP=1's
    bitwise; at top-4 a rank's partial sums its own slots first, so the bits differ (measured: 1537
    of 4096 elements here, each within bf16 rounding): the all-reduce order, not the experts' math."""
    model = _trainer(tiny_moe)
    h = (torch.randn(64, model.config["hidden_size"], generator=torch.Generator().manual_seed(3)) * 0.5).to(
        model.compute_dtype)
    one, ep = _moe_outputs(model, h, 2)
    assert torch.equal(one, ep)
    one4, ep4 = _moe_outputs(model, h, 4)
    differ = int((one4 != ep4).sum())
    assert differ > 0, "top-4: EP=2 equals TP=1 bitwise, the sum order is not shown"
    assert torch.allclose(one4.float(), ep4.float(), rtol=2 ** -6, atol=2 ** -10)


def test_a_planted_fault_in_the_ep2_layout_is_caught(tiny_moe, monkeypatch):
    """One rank's partial dropped (its experts computed as zero) or a map that loses an expert: the
    first changes the logprobs against the true layout's, the second is refused before any forward."""
    model = _trainer(tiny_moe)
    seqs = _seqs(model.config["vocab_size"])[:1]
    good = _logprobs(model, seqs, 2, True)
    real = moe_mod.moe_block

    def rank1_dropped(kernels, x, logits, w13, w2, top_k, renormalize, m=None):
        out, w, ids = real(kernels, x, logits, w13, w2, top_k, renormalize, m)
        return (out * 0 if m is not None and int(m[-1]) >= 0 else out), w, ids

    monkeypatch.setattr(moe_mod, "moe_block", rank1_dropped)
    dropped = _logprobs(model, seqs, 2, True)
    assert int((_bits(dropped) != _bits(good)).sum()) > 0.9 * good.size
    monkeypatch.setattr(moe_mod, "moe_block", real)
    monkeypatch.setattr(moe_mod, "expert_map", lambda n, r, e, s: torch.full((e,), -1, dtype=torch.int32)
                        if r == 1 else expert_map(n, r, e, s))
    with pytest.raises(ValueError, match="held by"):
        _logprobs(model, seqs, 2, True)


def test_routing_receipts_of_both_ranks_are_recorded_and_a_differing_rank_is_seen(tiny_moe, tmp_path):
    """Both ranks' routes per packed token; the leg's arrays hold them beside trainer_experts and the
    judge counts the routes where a rank differs (a rank's route flipped here: one is counted)."""
    from tica.legs.vllm_kernels import legio

    model = _trainer(tiny_moe)
    seqs = _seqs(model.config["vocab_size"])[:1]
    _logprobs(model, seqs, 2, True)
    ranks = model.rank_routes_array()
    n = ranks.shape[1]
    assert ep_rank_record(ranks)["differing_from_rank0"] == [0, 0]
    flipped = ranks.copy()
    flipped[1, 5, 1] = [e for e in range(8) if e not in flipped[1, 5, 1]][:2]
    assert ep_rank_record(flipped)["differing_from_rank0"] == [0, 1]
    lp = np.full(n, -1.0, np.float32)
    for name, arr in (("same", ranks), ("flipped", flipped)):
        legio.write_step_arrays(tmp_path / name, 1, token_ids=np.zeros(n), seq_lens=[n], trainer_logprobs=lp,
                                rollout_logprobs=lp, rollout_experts=ranks[0], trainer_experts=ranks[0],
                                trainer_experts_ranks=arr)
    assert rank_routes(tmp_path / "same") == (2, 0) and rank_routes(tmp_path / "flipped") == (2, 1)
    np.savez(tmp_path / "one.npz", token_ids=np.zeros(n, np.int32), seq_lens=np.array([n], np.int32),
             trainer_logprobs=lp, rollout_logprobs=lp, rollout_experts=ranks[0], trainer_experts=ranks[0],
             trainer_experts_ranks=ranks[:1])
    with pytest.raises(ReceiptError, match="two or more ranks"):
        load_step_arrays(tmp_path / "one.npz")


def test_the_ep2_ranks_gradients_add_up_to_the_whole_blocks():
    """float64: the two ranks' blocks (each its local experts, the other's slots zero) summed give the
    TP=1 block's output and, through the analytic backward, its gradients in x, the router logits
    and every expert's weights; with the planted centring error the router's gradient differs."""
    from tica.legs.vllm_kernels import autograd as A
    from tica.legs.vllm_kernels.moe_backward import MOE_OP, moe_block

    g = torch.Generator().manual_seed(5)
    T, H, E, inter, k = 40, 16, 8, 8, 2
    base = [torch.randn(T, H, generator=g, dtype=torch.float64), torch.randn(T, E, generator=g, dtype=torch.float64),
            torch.randn(E, 2 * inter, H, generator=g, dtype=torch.float64) * 0.2,
            torch.randn(E, H, inter, generator=g, dtype=torch.float64) * 0.2]
    cot = torch.randn(T, H, generator=g, dtype=torch.float64)

    def grads(ep: bool):
        xs = [t.clone().requires_grad_(True) for t in base]
        x, logits, w13, w2 = xs
        if ep:
            maps = [expert_map(2, r, E) for r in range(2)]
            out = sum(moe_block(TorchMoeReference, x, logits, w13[local_experts(m)], w2[local_experts(m)], k, True, m)[0]
                      for m in maps)
        else:
            out = moe_block(TorchMoeReference, x, logits, w13, w2, k, True)[0]
        (out * cot).sum().backward()
        return out.detach(), [t.grad for t in xs]

    one, g1 = grads(False)
    ep, g2 = grads(True)
    assert torch.allclose(one, ep, rtol=1e-12, atol=1e-12)
    assert all(torch.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(g1, g2))
    with A.planted_backward_error(MOE_OP):
        _, bad = grads(True)
    assert not torch.allclose(bad[1], g1[1], rtol=1e-6, atol=1e-9)


def test_the_update_backward_runs_through_the_ep2_layout(tiny_moe, tmp_path):
    model = _trainer(tiny_moe)
    model.tp, model.ep = 2, True
    prompts, gens, seeds = workload("c16", model.config["vocab_size"])
    from tica.legs.vllm_kernels.matrix import fake_rollout

    ro = fake_rollout(model, prompts[:2], gens[:2], seeds[:2])
    upd = update_step(model, ro, "cpu", tmp_path / "m1", tiny_moe)
    assert upd["grad_finite"] and upd["changed_tensors"] == upd["total_tensors"] and upd["hash"].startswith("blake3:")


# ------------------------------------------------------------------------------- the producer's dry run
def test_an_ep2_cell_is_not_the_padded_control_of_a_tp2_cell():
    from tica.judges.matrix import _is_control

    cfg = {"vocab_size": 32001, "architecture": "Qwen3MoeForCausalLM", "tensor_parallel_size": 2,
           "enable_expert_parallel": True}
    assert _is_control(cfg, dict(cfg, vocab_size=32064))
    assert not _is_control(cfg, dict(cfg, vocab_size=32064, enable_expert_parallel=False))


def test_a_dry_run_of_an_ep2_cell_is_judged_in_rows_of_its_own(tmp_path):
    """stock/tiny_moe_ep2 runs: its legs record vLLM's expert maps and the EP layout, the trainer_tp1
    and trainer_no_ep controls differ while the product trainer scores its own rollout, the arrays
    hold both ranks' routes, and the table shows tiny_moe_ep2 as a row of its own; bi0, so nothing
    passes. A dense shape's `_ep2` is written not run, with its reason."""
    work = tmp_path / "work"
    r = subprocess.run([sys.executable, "-m", "tica.legs.vllm_kernels.producers", "matrix", "--dry-run", "--cells",
                        "stock/tiny_moe_ep2,overlay3/tiny_ep2", "--loads", "c1", "--out", str(tmp_path / "out"),
                        "--work", str(work), "--budget", "600", "--min-cell-s", "1", "--parallel", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    legs = {p.name: p for p in (work / "legs").iterdir()}
    assert sorted(legs) == ["mx-overlay3-tiny_ep2-c1-decode", "mx-overlay3-tiny_ep2-c1-prefill",
                            "mx-stock-tiny_moe_ep2-c1-decode", "mx-stock-tiny_moe_ep2-c1-prefill"]
    assert all(check_seal(p) == [] for p in legs.values())
    for kind in ("decode", "prefill"):
        leg = legs[f"mx-stock-tiny_moe_ep2-c1-{kind}"]
        cfg = json.loads((leg / "leg.json").read_text())["resolved_config"]
        assert cfg["enable_expert_parallel"] is True and cfg["tensor_parallel_size"] == 2
        ep = cfg["expert_parallel"]
        assert ep["placement"] == "linear" and ep["expert_maps"] == VLLM_MAPS[("linear", 8)]
        assert len(cfg["all_reduce"]) == 2 and all("dry run" in x["dry_run"].lower() for x in cfg["all_reduce"])
        row = json.loads((leg / "metrics.jsonl").read_text())
        v = row["tica/variants"]
        assert v["product"][f"{kind}_n_diff"] == 0
        assert v["trainer_tp1"][f"{kind}_n_diff"] > 0 and v["trainer_no_ep"][f"{kind}_n_diff"] > 0
        assert row["tica/ep_rank_routes"]["differing_from_rank0"] == [0, 0]
        z = load_step_arrays(leg / "arrays" / "step_0001.npz")
        assert z.trainer_experts_ranks.shape == (2, *z.trainer_experts.shape)
        assert (z.trainer_experts_ranks == z.trainer_experts[None]).all()
    dense = json.loads((legs["mx-overlay3-tiny_ep2-c1-decode"] / "leg.json").read_text())
    assert dense["not_run_reason"] == EP_DENSE and dense["resolved_config"]["enable_expert_parallel"] is True
    question = load_question(ROOT / "demo" / "questions" / "h200-matrix" / "forward.yaml")
    cells = matrix_cells(question, work)
    verdicts = {(c.shape, c.scored): c.verdict for c in cells}
    assert set(verdicts.values()) == {Verdict.INCONCLUSIVE, Verdict.NOT_RUN}
    assert verdicts[("tiny_ep2", "decode")] is verdicts[("tiny_ep2", "prefill")] is Verdict.NOT_RUN
    assert all(c.routing.endswith("trainer routes from 2 EP ranks, identical") for c in cells if c.shape == "tiny_moe_ep2")
    assert [row[SHAPE] for row in shape_table(cells).rows] == ["tiny_ep2", "tiny_moe_ep2"]


@pytest.mark.parametrize("case", ["ranks_equal", "rank_flipped", "ranks_missing"])
def test_an_ep_cell_passes_only_with_both_ranks_routes_equal(case, tmp_path):
    """A passing MoE cell of the H100 matrix (matrix_moe.tar.xz) recast as an EP cell: with both ranks'
    routes recorded and equal it still passes (the control); with one rank's route flipped, or with no
    ranks' routes at all, it does not pass, though every logprob and trainer_experts are unchanged."""
    from tica.canary_legs import edit_meta
    from tica.receipt_archive import unpacked
    from tica.seal import seal_leg

    src = unpacked(ROOT / "tests" / "fixtures" / "h200" / "matrix_moe.tar.xz", tmp_path / "src")
    leg = tmp_path / "root" / "moe1" / "mx-overlay3-qwen3-30b-a3b_l2-c1-prefill"
    shutil.copytree(src / "moe1" / leg.name, leg)
    edit_meta(leg, lambda m: m["resolved_config"].update(enable_expert_parallel=True))
    if case != "ranks_missing":
        path = leg / "arrays" / "step_0001.npz"
        with np.load(path) as z:
            data = {k: z[k] for k in z.files}
        ranks = np.stack([data["trainer_experts"]] * 2)
        if case == "rank_flipped":
            from tica.routing import flip_one_route

            ranks[1] = flip_one_route(ranks[1], token=5, layer=1, n_experts=128)
        np.savez(path, **data, trainer_experts_ranks=ranks)
        seal_leg(leg)
    question = load_question(ROOT / "demo" / "questions" / "h200-matrix" / "forward.yaml")
    (cell,) = matrix_cells(question, tmp_path / "root")
    if case == "ranks_equal":
        assert cell.verdict is Verdict.PASS and cell.routing.endswith("trainer routes from 2 EP ranks, identical")
    else:
        assert cell.verdict is Verdict.INCONCLUSIVE
        assert ("routed 1 token-layer routes differently" if case == "rank_flipped"
                else "recorded no routes from its trainer's ranks") in cell.reasons[0]


def test_the_reload_check_compares_each_ranks_experts_by_digest(tiny_moe):
    """After an update vLLM's workers report a digest of each rank's w13/w2; the trainer's bytes of
    that rank's experts must give the same digest (control: a rank holding the other rank's experts)."""
    from tica.legs.vllm_kernels.ep import reloaded_experts_equal

    model = _trainer(tiny_moe)
    model.tp, model.ep = 2, True

    def worker(m: torch.Tensor) -> torch.nn.Module:
        """A rank's model as vLLM names it: model.layers.<i>.mlp.experts.w13_weight / w2_weight."""
        layers = torch.nn.ModuleList()
        for i in range(model.n_layers):
            layer = torch.nn.Module()
            layer.mlp = torch.nn.Module()
            layer.mlp.experts = torch.nn.Module()
            if i in model.sparse_layers:
                w13, w2 = model.expert_weights(f"model.layers.{i}.")
                layer.mlp.experts.w13_weight = torch.nn.Parameter(w13[local_experts(m)].detach().clone())
                layer.mlp.experts.w2_weight = torch.nn.Parameter(w2[local_experts(m)].detach().clone())
            layers.append(layer)
        net = torch.nn.Module()
        net.model = torch.nn.Module()
        net.model.layers = layers
        return net

    maps = model.expert_maps()
    ranks = [engine_expert_digests(worker(m)) for m in maps]
    got = reloaded_experts_equal(ranks, model)
    n = 2 * 2 * len(model.sparse_layers)  # ranks x (w13, w2) x MoE layers
    assert got == {"tensors": n, "equal": n, "differ": []}
    swapped = reloaded_experts_equal(ranks[::-1], model)
    assert swapped["equal"] == 0 and len(swapped["differ"]) == got["tensors"]
