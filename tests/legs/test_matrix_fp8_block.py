"""Block-FP8 cells of the matrix (issue 33, `<shape>_fp8b`) on the CPU: the checkpoint writer is vLLM's
per_block_cast_to_fp8 math, the UE8M0 requant is vLLM's requant_weight_ue8m0_inplace, the per-token-group
activation quant is QuantFP8's group formula, each invariant beside its negative control (a 64-column
group, a batch-wide activation scale, a block straddling two fused shards, a kernel the trainer does
not call); the GPU class's plumbing reduces to the reference; the engine readers on fakes; the
producer dry-runs the cell, its update re-quantized and reloaded. vLLM's functions compared here are
the CPU build's (0.32.0); their bodies are the same in the 0.26.0 wheel (per_block_cast_to_fp8,
_ceil_to_ue8m0, _quantize_group_native: identical; requant_weight_ue8m0_inplace: its docstring only).
The GPU's bits (DeepGEMM, the CUDA quant op) are the device call's to show."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tica.legs.vllm_kernels import fp8_block as B
from tica.legs.vllm_kernels.matrix import cell_loads, shape_quantization

ROOT = Path(__file__).resolve().parents[2]


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _w(n=256, k=384, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[:128, :128] *= 40  # one block far larger than the rest: per-block scales matter
    return w.to(torch.bfloat16)


def _acts(rows=6, k=384, seed=1) -> torch.Tensor:
    """Activations with an outlier in the first column of every 128-column group (as LLM activations
    have): a group's scale is set by its outlier, so the group size changes the other columns' bits."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    x[:, ::128] = 3000.0
    return x.to(torch.bfloat16)


@pytest.fixture
def vllm_block_cast():
    dg = pytest.importorskip("vllm.utils.deep_gemm")
    # the function without its torch.compile wrapper (a CPU run need not compile it)
    return getattr(dg.per_block_cast_to_fp8, "_torchdynamo_orig_callable", dg.per_block_cast_to_fp8)


@pytest.mark.parametrize("ue8m0", [False, True])
def test_the_checkpoint_writer_is_vllms_per_block_cast_to_fp8(vllm_block_cast, ue8m0):
    w = _w()
    want_q, want_s = vllm_block_cast(w, [128, 128], use_ue8m0=ue8m0)
    got_q, got_s = B.quant_weight_block_ref(w, (128, 128), ue8m0=ue8m0)
    assert got_q.dtype == torch.float8_e4m3fn and got_s.shape == (2, 3) == want_s.shape
    assert torch.equal(_u8(got_q), _u8(want_q)) and torch.equal(got_s, want_s.float())
    # the control: 64x64 blocks are another quantization (other scales, other bytes)
    q64, s64 = B.quant_weight_block_ref(w, (64, 64), ue8m0=ue8m0)
    assert s64.shape == (4, 6) and not torch.equal(_u8(q64), _u8(want_q))


def test_the_ue8m0_requant_is_vllms_requant_weight_ue8m0_inplace(vllm_block_cast, monkeypatch):
    dg = pytest.importorskip("vllm.utils.deep_gemm")
    fu = pytest.importorskip("vllm.model_executor.layers.quantization.utils.fp8_utils")
    monkeypatch.setattr(dg, "per_block_cast_to_fp8", vllm_block_cast)  # requant imports it at call time
    q, s = B.quant_weight_block_ref(_w(), (128, 128))
    vq, vs = q.clone(), s.clone()
    fu.requant_weight_ue8m0_inplace(vq, vs, block_size=(128, 128))
    rq, rs = B.requant_ue8m0_ref(q, s, (128, 128))
    assert torch.equal(_u8(rq), _u8(vq)) and torch.equal(rs, vs)
    assert torch.equal(torch.log2(rs), torch.log2(rs).round())  # powers of two
    assert not torch.equal(rs, s)  # the control: the checkpoint's own scales are not


@pytest.mark.parametrize("ue8m0", [False, True])
def test_the_activation_quant_is_quantfp8s_group_formula(ue8m0):
    qf = pytest.importorskip("vllm.model_executor.layers.quantization.input_quant_fp8")
    x = _acts(rows=5)
    x[2, 128:256] = torch.randn(128).to(torch.bfloat16) * 1e-3  # a small group beside the outliers
    op = SimpleNamespace(group_size=128, use_ue8m0=ue8m0, column_major_scales=False)
    want_q, want_s = qf.QuantFP8._quantize_group_native(op, x)
    got_q, got_s = B.quant_act_group_ref(x, 128, ue8m0=ue8m0)
    assert torch.equal(_u8(got_q), _u8(want_q)) and torch.equal(got_s, want_s.reshape(got_s.shape))
    # the control: 64-column groups give the columns beside each outlier their own scale
    q64, s64 = B.quant_act_group_ref(x, 64, ue8m0=ue8m0)
    deq = (got_q.float().view(5, 3, 128) * got_s.unsqueeze(-1)).view(5, -1)
    deq64 = (q64.float().view(5, 6, 64) * s64.unsqueeze(-1)).view(5, -1)
    assert s64.shape == (5, 6) and not torch.equal(deq, deq64)


def test_the_wrong_activation_group_changes_the_linears_output():
    w, x = _w(), _acts()
    right = B.fp8_block_linear_reference(x, w)
    wrong = B.fp8_block_linear_reference(x, w, group=64)
    assert right.shape == (6, 256) and int((right.view(torch.int16) != wrong.view(torch.int16)).sum()) > 0


def test_per_token_group_rows_do_not_move_with_the_batch_and_a_batch_wide_scale_does():
    """The property a block-FP8 cell rests on, and its negative control: a row's output alone equals
    its output among other rows (its scales are its own); with one activation scale per 128 columns
    over the whole batch, a large neighbour changes it."""
    w, x = _w(), _acts(rows=4)
    big = (torch.randn(1, 384, generator=torch.Generator().manual_seed(9)) * 1e4).to(torch.bfloat16)
    batch = torch.cat([x, big])
    alone = B.fp8_block_linear_reference(x[1:2], w)
    among = B.fp8_block_linear_reference(batch, w)[1:2]
    assert torch.equal(alone.view(torch.int16), among.view(torch.int16))

    def batch_wide(rows):
        wq, ws = B.requant_ue8m0_ref(*B.quant_weight_block_ref(w))
        g = rows.float().view(rows.shape[0], 3, 128)
        s = B._ue8m0(g.abs().amax(dim=(0, 2)).clamp(min=1e-10) / B.FP8_MAX)  # one scale per group, all rows
        q = (g / s.view(1, 3, 1)).clamp(-B.FP8_MAX, B.FP8_MAX).to(torch.float8_e4m3fn).view(rows.shape)
        return B.block_scaled_mm_ref(q, s.expand(rows.shape[0], 3), wq, ws)

    assert not torch.equal(batch_wide(x[1:2]).view(torch.int16), batch_wide(batch)[1:2].view(torch.int16))


def test_the_fused_weight_quantizes_as_its_shards_when_they_are_whole_blocks():
    """The trainer quantizes the fused q/k/v (gate/up) weight; vLLM loads each shard's blocks into the
    fused parameter. Equal where every shard is whole 128-row blocks; the control, a 64-row shard,
    makes a block straddle two shards, and unaligned_linears names such a shape."""
    g = torch.Generator().manual_seed(4)
    for rows, same in (((256, 128, 128), True), ((192, 64, 64), False)):
        parts = [(torch.randn(n, 256, generator=g) * 0.05 * (1 + 30 * i)).to(torch.bfloat16)
                 for i, n in enumerate(rows)]
        fq, fs = B.quant_weight_block_ref(torch.cat(parts))
        shards = [B.quant_weight_block_ref(p) for p in parts]
        eq = torch.equal(_u8(fq), _u8(torch.cat([q for q, _ in shards]))) and torch.equal(fs, torch.cat([s for _, s in shards]))
        assert eq == same, rows
    from tica.legs.vllm_kernels.seeded_model import model_config

    assert B.unaligned_linears(model_config("tiny_b128")) == [] and B.unaligned_linears(model_config("llama3.2-1b_l4")) == []
    assert B.unaligned_linears(model_config("tiny")) and B.unaligned_linears(model_config("smollm2-135m_l16"))


def _fake_ops(monkeypatch):
    """vLLM's functions the GPU class calls, replaced by their torch math (a CPU has none of them)."""
    import vllm.utils.deep_gemm as dg

    calls = []

    def per_token_group_quant_fp8(x, group_size, column_major_scales=False, tma_aligned_scales=False, use_ue8m0=None):
        calls.append(("quant", group_size, column_major_scales, tma_aligned_scales, use_ue8m0))
        return B.quant_act_group_ref(x, group_size, ue8m0=bool(use_ue8m0))

    def deepgemm_post_process_fp8_weight_block(wq, ws, quant_block_shape, use_e8m0, **_):
        calls.append(("post", tuple(quant_block_shape), use_e8m0))
        return B.requant_ue8m0_ref(wq, ws, quant_block_shape) if use_e8m0 else (wq, ws)

    def fp8_gemm_nt(a, b, out, is_deep_gemm_e8m0_used=None):
        calls.append(("gemm", is_deep_gemm_e8m0_used))
        out.copy_(B.block_scaled_mm_ref(a[0], a[1], b[0], b[1]))

    def w8a8_triton_block_scaled_mm(qx, w, xs, ws, block, out_dtype):
        calls.append(("triton", tuple(block)))
        return B.block_scaled_mm_ref(qx, xs, w, ws, block, out_dtype)

    monkeypatch.setattr(dg, "fp8_gemm_nt", fp8_gemm_nt)
    u = SimpleNamespace(per_token_group_quant_fp8=per_token_group_quant_fp8,
                        process_fp8_weight_block_strategy=lambda q, s: (q, s),
                        deepgemm_post_process_fp8_weight_block=deepgemm_post_process_fp8_weight_block,
                        w8a8_triton_block_scaled_mm=w8a8_triton_block_scaled_mm)
    return u, calls


@pytest.mark.parametrize("kernel", ["DeepGemmFp8BlockScaledMMKernel", "TritonFp8BlockScaledMMKernel"])
def test_the_gpu_linear_reduces_to_the_reference(monkeypatch, kernel):
    pytest.importorskip("vllm.utils.deep_gemm")
    u, calls = _fake_ops(monkeypatch)
    deep = kernel.startswith("DeepGemm")
    plan = dict(B.DRY_PLAN, kernel=kernel, deep_gemm_post_process=deep, use_ue8m0=deep, deep_gemm_e8m0=deep,
                column_major_scales=deep, tma_aligned_scales=deep)
    lin = B.Fp8BlockLinearGpu.__new__(B.Fp8BlockLinearGpu)
    lin.plan, lin.block, lin._u = plan, (128, 128), u
    w, x = _w(), _acts()
    b = (torch.randn(256, generator=torch.Generator().manual_seed(2)) * 0.1).to(torch.bfloat16)
    for bias in (None, b):
        got = lin(x.view(2, 3, 384), w, bias)
        want = B.fp8_block_linear_reference(x, w, bias, plan=plan).view(2, 3, 256)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (kernel, bias is None)
    assert ("quant", 128, deep, deep, deep) in calls
    assert (("post", (128, 128), True) in calls) == deep and (("gemm", True) in calls) == deep
    assert (("triton", (128, 128)) in calls) == (not deep)
    assert lin.describe()["kernel"] == kernel


def test_the_engine_reader_takes_the_kernel_and_its_flags_from_vllms_modules():
    """vllm_block_plan on a fake engine: the kernel class and its QuantFP8 flags as vLLM built them;
    one plan shared by every linear is the trainer's; the refusals say why (two kernels; a kernel the
    trainer does not call)."""
    def kernel(name, **attrs):
        cls = type(name, (), {})
        k = cls()
        k.__dict__.update(attrs)
        return k

    qf = SimpleNamespace(group_size=128, column_major_scales=True, tma_aligned_scales=True, use_ue8m0=True,
                         _forward_method=SimpleNamespace(__name__="forward_cuda"))

    def module(kern):
        return SimpleNamespace(weight_block_size=[128, 128],
                               quant_method=SimpleNamespace(block_quant=True, fp8_linear=kern))

    dg = kernel("DeepGemmFp8BlockScaledMMKernel", quant_fp8=qf, use_deep_gemm_e8m0=True, is_deep_gemm_supported=True,
                config=SimpleNamespace(out_dtype=torch.bfloat16))
    mods = {"model.layers.0.self_attn.qkv_proj": module(dg), "model.layers.0.mlp.down_proj": module(dg),
            "lm_head": SimpleNamespace(quant_method=SimpleNamespace())}
    llm = SimpleNamespace(apply_model=lambda fn: [fn(SimpleNamespace(named_modules=lambda: mods.items()))])
    rec = B.vllm_block_plan(llm)
    plan = rec["plan"]
    assert plan["kernel"] == "DeepGemmFp8BlockScaledMMKernel" and plan["deep_gemm_post_process"] is True
    assert (plan["group_size"], plan["tma_aligned_scales"], plan["use_ue8m0"], plan["quant_fp8_forward"]) == (
        128, True, True, "forward_cuda")
    assert rec["modules"] == ["model.layers.0.mlp.down_proj", "model.layers.0.self_attn.qkv_proj"]
    assert B.plan_refusal(plan, rec) is None
    # the controls
    triton_qf = SimpleNamespace(**dict(vars(qf), column_major_scales=False, tma_aligned_scales=False, use_ue8m0=False))
    mods["model.layers.0.mlp.down_proj"] = module(kernel("TritonFp8BlockScaledMMKernel", quant_fp8=triton_qf,
                                                         config=SimpleNamespace(out_dtype=torch.bfloat16)))
    two = B.vllm_block_plan(llm)
    assert two["plan"] is None and "2 different block-FP8 linear kernels" in B.plan_refusal(None, two)
    marlin = dict(plan, kernel="MarlinFP8ScaledMMLinearKernel")
    assert "the trainer follows" in B.plan_refusal(marlin, rec)
    assert "forward_native" in B.plan_refusal(dict(plan, quant_fp8_forward="forward_native"), rec)
    assert "packed-UE8M0" in B.plan_refusal(dict(plan, deep_gemm_scale_fmt="UE8M0"), rec)  # sm100's path
    assert B.plan_refusal(dict(plan, deep_gemm_scale_fmt="FLOAT32_CEIL_UE8M0"), rec) is None  # Hopper's


def test_the_weights_check_compares_vllms_bytes_and_scales_with_the_trainers():
    ref = B.Fp8BlockLinearReference()
    w = _w()
    q, s = ref.weight(w)
    model = SimpleNamespace(linear_weight=lambda n: w)
    good = SimpleNamespace(weight=q.clone(), weight_scale_inv=s.clone())
    off = SimpleNamespace(weight=q.clone(), weight_scale_inv=s * 2)  # the control: other scales
    mods = {"a": good, "b": off}
    llm = SimpleNamespace(apply_model=lambda fn: [fn(SimpleNamespace(get_submodule=mods.__getitem__))])
    assert B.vllm_block_weights_equal(llm, model, ["a", "b"], ref) == {"linears": 2, "equal": 1, "differ": ["b"]}


def test_the_checkpoint_is_the_deepseek_block_fp8_format(tmp_path):
    from safetensors.torch import load_file

    from tica.legs.vllm_kernels.model import load_safetensors_dir
    from tica.legs.vllm_kernels.seeded_model import make_model

    make_model(tmp_path / "m0", "tiny_b128", seed=7, device="cpu")
    state = load_safetensors_dir(tmp_path / "m0")
    info = B.write_block_checkpoint(state, tmp_path / "m0", tmp_path / "fp8b")
    sd = load_file(str(tmp_path / "fp8b" / "model.safetensors"))
    cfg = json.loads((tmp_path / "fp8b" / "config.json").read_text())
    assert cfg["quantization_config"] == {"quant_method": "fp8", "activation_scheme": "dynamic",
                                          "weight_block_size": [128, 128]}
    lin = [k for k in state if k.endswith(B.CHECKPOINT_LINEARS)]
    assert len(lin) == 14 and info["fp8_tensors"] == 14
    for k in lin:
        n, kk = state[k].shape
        assert sd[k].dtype == torch.float8_e4m3fn and sd[k].shape == (n, kk)
        s = sd[k[:-len("weight")] + "weight_scale_inv"]
        assert s.dtype == torch.float32 and s.shape == (-(-n // 128), -(-kk // 128))
    for k in state:
        if k not in lin:
            assert sd[k].dtype == torch.bfloat16 and torch.equal(sd[k], state[k])  # norms, embedding, lm_head
    fp8 = pytest.importorskip("vllm.model_executor.layers.quantization.fp8")
    qc = fp8.Fp8Config.from_config(cfg["quantization_config"])
    assert qc.is_checkpoint_fp8_serialized and qc.weight_block_size == [128, 128] and qc.activation_scheme == "dynamic"


def test_block_fp8_shapes_serve_their_base_shape_on_the_fp8_loads():
    from tica.legs.vllm_kernels.matrix import ENGINE_QUANTIZATION, cell_env

    assert shape_quantization("llama3.2-1b_l4_fp8b") == ("llama3.2-1b_l4", "fp8_block")
    assert shape_quantization("llama3.2-1b_l4_fp8bc") == ("llama3.2-1b_l4", "fp8_block")
    assert shape_quantization("llama3.2-1b_l4_fp8") == ("llama3.2-1b_l4", "fp8")
    assert ENGINE_QUANTIZATION["fp8_block"] == "fp8"  # vLLM's method; the checkpoint's config says block
    assert cell_loads("", moe=False, quant="fp8_block") == (["c1", "c64", "chunked"], "c64")
    # DeepGEMM off only in the `_fp8bc` cell's process, and the dry run's plan follows it
    assert cell_env("llama3.2-1b_l4_fp8bc") == {"VLLM_USE_DEEP_GEMM": "0"}
    assert cell_env("llama3.2-1b_l4_fp8b") == {} == cell_env("llama3.2-1b_l4_fp8")
    assert B.dry_plan({"VLLM_USE_DEEP_GEMM": "0"})["kernel"] == "CutlassFp8BlockScaledMMKernel"
    assert B.dry_plan({})["kernel"] == "DeepGemmFp8BlockScaledMMKernel"


def test_a_dry_run_of_block_fp8_cells(tmp_path):
    """The dense block-FP8 cell on the CPU: served from a block-FP8 checkpoint written from the seeded
    bf16 weights, every leg records it, the update's weights written as a block-FP8 checkpoint again
    (what vLLM reloads) and c64 judged after it; a MoE and an unaligned shape are written not run,
    each with its reason, no engine started."""
    work = tmp_path / "work"
    r = subprocess.run([sys.executable, "-m", "tica.legs.vllm_kernels.producers", "matrix", "--dry-run", "--cells",
                        "stock/tiny_b128_fp8b,overlay3/tiny_moe_fp8b,stock/tiny_fp8b", "--loads", "c1,c64",
                        "--out", str(tmp_path / "out"), "--work", str(work), "--budget", "800", "--min-cell-s", "1",
                        "--parallel", "1"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    legs = {p.name: p for p in (work / "legs").iterdir()}
    mine = sorted(n for n in legs if "tiny_b128_fp8b" in n)
    assert {"mx-stock-tiny_b128_fp8b-c64-prefill_post_update", "mx-stock-tiny_b128_fp8b-c1-decode"} <= set(mine)
    for name in mine:
        meta = json.loads((legs[name] / "leg.json").read_text())
        cfg = meta["resolved_config"]
        assert cfg["quantization"] == "fp8_block" and cfg["model"].endswith("m0-fp8b-stock-tiny_b128_fp8b")
        assert cfg["fp8"]["trainer"]["fp8_linears"] == 8 and cfg["fp8"]["trainer"]["weight_block_size"] == [128, 128]
        assert cfg["fp8"]["checkpoint"]["quantization_config"]["weight_block_size"] == [128, 128]
        row = json.loads((legs[name] / "metrics.jsonl").read_text())
        # the checkpoint each leg names is the block-FP8 one vLLM served (after the update: the reloaded one)
        want = cfg["update"]["hash"] if name.endswith("_post_update") else cfg["fp8"]["checkpoint"]["weights_hash"]
        assert row["checkpoint_version"] == cfg["weights_hash"] == want
    post = json.loads((legs["mx-stock-tiny_b128_fp8b-c64-prefill_post_update"] / "leg.json").read_text())
    upd = post["resolved_config"]["update"]
    assert upd["served_checkpoint"]["path"].endswith("m1-fp8b-stock-tiny_b128_fp8b") and upd["hash"] != upd["bf16_hash"]
    for shape, words in (("tiny_moe_fp8b", "block FP8 cells are dense"), ("tiny_fp8b", "multiple of 128")):
        cand = "overlay3" if "moe" in shape else "stock"
        summ = json.loads((work / "logs" / f"{cand}-{shape}.summary.json").read_text())
        assert words in summ["not_run"] and "No engine was started" in summ["not_run"]
        leg = json.loads((legs[f"mx-{cand}-{shape}-c1-prefill"] / "leg.json").read_text())
        assert leg["not_run_reason"] == summ["not_run"]


def test_a_dry_run_of_the_deepgemm_off_cell_records_the_cutlass_plan_and_the_env(tmp_path):
    work = tmp_path / "work"
    r = subprocess.run([sys.executable, "-m", "tica.legs.vllm_kernels.producers", "matrix", "--dry-run", "--cells",
                        "overlay3/tiny_b128_fp8bc", "--loads", "c1", "--out", str(tmp_path / "out"), "--work", str(work),
                        "--budget", "300", "--min-cell-s", "1", "--parallel", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    cfg = json.loads((work / "legs" / "mx-overlay3-tiny_b128_fp8bc-c1-prefill" / "leg.json").read_text())["resolved_config"]
    assert cfg["fp8"]["vllm"]["env"]["VLLM_USE_DEEP_GEMM"] == "0"
    assert cfg["fp8"]["trainer"]["kernel"] == "CutlassFp8BlockScaledMMKernel"


def test_the_linear_probe_compares_vllms_module_with_the_trainers_call_at_several_row_counts():
    """vllm_linear_probe on a fake engine whose module computes the reference: equal at every row count
    and vLLM's first row unmoved; the controls: a trainer that skips the UE8M0 requant differs, and an
    engine whose activation scale spans the batch moves its first row."""
    w = _w(256, 384)
    model = SimpleNamespace(linear_weight=lambda n: w)

    def engine(apply):
        mod = SimpleNamespace(quant_method=SimpleNamespace(apply=lambda m, x: apply(x)))
        return SimpleNamespace(apply_model=lambda fn: [fn(SimpleNamespace(get_submodule=lambda n: mod))])

    ref = B.Fp8BlockLinearReference()
    good = B.vllm_linear_probe(engine(lambda x: B.fp8_block_linear_reference(x, w)), model, ref, ["a"], rows=(1, 5, 9))
    assert good["all_equal"] and good["vllm_batch_invariant"]
    assert good["linears"]["a"]["elements"] == {"1": 256, "5": 1280, "9": 2304}

    # a trainer that skips the engine's UE8M0 requant of the weights (the checkpoint's scales as they are)
    no_requant = B.Fp8BlockLinearReference(dict(B.DRY_PLAN, deep_gemm_e8m0=False))
    bad = B.vllm_linear_probe(engine(lambda x: B.fp8_block_linear_reference(x, w)), model, no_requant, ["a"],
                              rows=(1, 5, 9))
    assert not bad["all_equal"] and bad["vllm_batch_invariant"]

    def batch_scaled(x):  # one scale over the batch: row 0 moves once a larger row joins
        return B.fp8_block_linear_reference(x * (1.0 / x.float().abs().max()).to(x.dtype), w)

    moved = B.vllm_linear_probe(engine(batch_scaled), model, ref, ["a"], rows=(1, 5, 9))
    assert not moved["vllm_batch_invariant"] and not moved["all_equal"]
