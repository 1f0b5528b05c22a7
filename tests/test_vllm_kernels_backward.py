"""CPU checks of tica.legs.vllm_kernels: the backward of every autograd Function against float64
autograd of the torch reference (with a planted wrong backward per op that must fail), the
model assembly against HF transformers, and the vLLM pin/routing check.

On the GPU the same check runs with vLLM's kernels as the forward (producers.py, bi1 leg:
backward_bi1/gradcheck.json in tests/fixtures/h200/run2)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from tica.legs.vllm_kernels import autograd as A  # noqa: E402
from tica.legs.vllm_kernels.gradcheck import check_all, check_with_controls  # noqa: E402
from tica.legs.vllm_kernels.kernels import TorchReference  # noqa: E402
from tica.legs.vllm_kernels.model import KernelLlama, pack  # noqa: E402
from tica.legs.vllm_kernels.pin import (  # noqa: E402
    ROUTING_NEEDLES,
    VllmInternalsMoved,
    check_routing,
    check_version,
)


@pytest.fixture(scope="module")
def float64_report():
    return check_with_controls(TorchReference, device="cpu", dtype=torch.float64, tol=1e-8)


def test_every_backward_matches_float64_reference(float64_report):
    rows = {r["op"]: r for r in float64_report["check"]["ops"]}
    assert set(rows) == set(A.OPS)
    for op, r in rows.items():
        assert r["finite"], op
        assert r["max_rel_err"] < 1e-10, (op, r["rel_err"])
    assert float64_report["check"]["pass"]


def test_planted_wrong_backward_fails_for_every_op(float64_report):
    # negative control: each op's deliberately wrong backward must fail the same check
    assert float64_report["controls_caught"] == {op: True for op in A.OPS}
    for c in float64_report["controls"]:
        assert not c["pass"]
        assert c["ops"][0]["max_rel_err"] > 1e-3
    assert float64_report["pass"]


def test_bf16_backward_within_bf16_tolerance():
    rep = check_all(TorchReference, device="cpu", dtype=torch.bfloat16, tol=2e-2)
    assert rep["pass"], [(r["op"], r["max_rel_err"]) for r in rep["ops"]]
    with A.planted_backward_error("attention"):
        bad = check_all(TorchReference, device="cpu", dtype=torch.bfloat16, tol=2e-2, planted="attention")
    assert not bad["pass"]


def _hf_pair(arch: str):
    transformers = pytest.importorskip("transformers")
    Cfg = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[arch]
    M = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[arch]
    torch.manual_seed(0)
    cfg = Cfg(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, vocab_size=97, max_position_embeddings=256,
              tie_word_embeddings=False, rms_norm_eps=1e-5)
    m = M(cfg).to(torch.float64)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
            if "bias" in n:
                p.normal_(0, 0.1)
    sd = {k: v.to(torch.bfloat16) for k, v in m.state_dict().items()}
    m.load_state_dict({k: v.to(torch.float64) for k, v in sd.items()})  # HF on the deployed (bf16) values
    c = json.loads(cfg.to_json_string())
    c["architectures"] = [M.__name__]
    c["torch_dtype"] = "bfloat16"
    km = KernelLlama(c, sd, TorchReference, compute_dtype=torch.float64, device="cpu")
    return m, km


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_model_matches_hf_forward_and_gradients(arch):
    hf, km = _hf_pair(arch)
    seqs = [torch.randint(0, 97, (n,)).tolist() for n in (7, 30, 19)]
    ids, cu, mx = pack(seqs, "cpu")
    lp = km.logprobs(ids, cu, mx)  # packed varlen
    ref = []
    for s in seqs:
        x = torch.tensor([s])
        lg = hf(x).logits[0, :-1]
        ref.append(torch.log_softmax(lg, -1).gather(-1, x[0, 1:, None])[:, 0])
    ref = torch.cat(ref)
    assert lp.shape == ref.shape
    assert (lp - ref).abs().max().item() < 1e-6
    cot = torch.randn(lp.shape, dtype=torch.float64)
    (lp * cot).sum().backward()
    (ref * cot).sum().backward()
    hfp = dict(hf.named_parameters())
    for name in km.names:
        g = km.p(name).grad  # fp32 master gradient, through the bf16 cast of the deployed bytes
        assert g is not None and torch.isfinite(g).all(), name
        r = hfp[name].grad.to(torch.bfloat16).double()  # the cast rounds the gradient to bf16
        rel = ((g.double() - r).norm() / r.norm()).item()
        assert rel < 1e-3, (name, rel)


def test_model_fuses_like_vllm_and_deploys_master_bytes():
    _, km = _hf_pair("llama")
    dep = km.deployed_state_dict()
    assert all(v.dtype == torch.bfloat16 for v in dep.values())
    qkv = km.fused("model.layers.0.self_attn.", ("q_proj", "k_proj", "v_proj"))
    want = torch.cat([dep[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv"]).double()
    assert torch.equal(qkv, want)


def test_pin_refuses_other_versions(monkeypatch):
    check_version("0.26.0")
    monkeypatch.delenv("TICA_VLLM_KERNELS_ALLOW_VERSION", raising=False)
    with pytest.raises(VllmInternalsMoved, match="pinned to vLLM 0.26.0"):
        check_version("0.32.0")


def test_routing_check_sees_moved_internals(tmp_path):
    for rel, needles in ROUTING_NEEDLES.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("\n".join(needles))
    assert check_routing(tmp_path) == []
    (tmp_path / "model_executor/layers/linear.py").write_text("return dispatch_unquantized_gemm()(layer, x)")
    (tmp_path / "v1/worker/gpu/sample/logprob.py").unlink()
    problems = check_routing(tmp_path)
    assert any("linear.py no longer contains" in p for p in problems)
    assert any("logprob.py is gone" in p for p in problems)
