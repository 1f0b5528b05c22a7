"""The MoE trainer forward (tica/legs/vllm_kernels/moe.py) on the CPU: with the plain-torch kernel
sets in float64 it computes what HF transformers' Qwen3-MoE computes (a tiny seeded model), routes
as HF's router does, records one routing receipt per MoE layer, and its gradient (router and experts
included) is torch autograd's through HF's model. The GPU path (vLLM's kernels) is measured on the device: test_h200_moe_trainer.py."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tica.legs.vllm_kernels.autograd import planted_backward_error  # noqa: E402
from tica.legs.vllm_kernels.kernels import TorchReference  # noqa: E402
from tica.legs.vllm_kernels.model import pack  # noqa: E402
from tica.legs.vllm_kernels.moe import (  # noqa: E402
    KernelMoe,
    TorchMoeReference,
    moe_from_dir,
    per_expert_state_dict,
)
from tica.legs.vllm_kernels.moe_backward import moe_gradcheck, moe_gradcheck_with_control  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The Qwen3-MoE layout (layer 1 dense: mlp_only_layers)."""
    return _saved("qwen3_moe", tmp_path_factory)


def _saved(layout: str, tmp_path_factory):
    torch.manual_seed(11)
    model = LAYOUTS[layout]().eval()
    _randomise(model)
    d = tmp_path_factory.mktemp(layout)
    model.save_pretrained(d, safe_serialization=True)
    return d, model


def _randomise(model) -> None:
    with torch.no_grad():  # weights large enough that routing and q/k norms matter
        for n, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
            elif "norm" in n:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.1)  # biases


LAYOUTS = {
    "qwen3_moe": lambda: transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=3,
        norm_topk_prob=True, mlp_only_layers=[1], max_position_embeddings=64, rope_theta=1e6,
        tie_word_embeddings=False)),
    "mixtral": lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
        rope_theta=1e6, tie_word_embeddings=False)),
    "qwen2_moe": lambda: transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=6, num_experts_per_tok=2, norm_topk_prob=False, max_position_embeddings=64,
        tie_word_embeddings=False)),
}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def any_layout(request, tmp_path_factory):
    return _saved(request.param, tmp_path_factory)


def hf_logprobs(model, seq):
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0].double()
    return torch.log_softmax(logits, -1)[torch.arange(len(seq) - 1), torch.tensor(seq[1:])]


def test_mlp_only_layers_are_dense(tiny):
    d, _ = tiny
    trainer = moe_from_dir(d, TorchReference, TorchMoeReference, compute_dtype=torch.float64)
    assert trainer.sparse_layers == [0, 2]  # layer 1 is in mlp_only_layers: a dense MLP


def test_the_forward_is_hfs(any_layout):
    d, hf = any_layout
    trainer = moe_from_dir(d, TorchReference, TorchMoeReference, compute_dtype=torch.float64)
    seqs = [[5, 17, 3, 88, 41, 9, 60, 2], [7, 7, 31, 64, 12], [90, 1, 44, 23, 56, 78, 11, 30, 4, 19]]
    ids, cu, mx = pack(seqs, "cpu")
    with torch.no_grad():
        got = trainer.logprobs(ids, cu, mx)
    want = torch.cat([hf_logprobs(hf, s) for s in seqs])
    assert got.shape == want.shape
    assert float((got - want).abs().max()) < 2e-4  # HF runs in float32, the trainer in float64


def test_the_ep2_layout_is_hfs_forward_with_the_shared_expert_split_as_vllm_splits_it(any_layout, monkeypatch):
    """Expert parallelism at TP=2 (KernelMoe._ep_moe: whole experts per rank by vLLM's expert map,
    Qwen2-MoE's shared expert tensor-parallel, each rank's partial added before the all-reduce) computes
    HF's forward in every layout (the all-reduce's fp32 sum bounds it), both ranks' routes one; the
    control, a shared expert computed whole on both ranks, misses it."""
    d, hf = any_layout
    trainer = moe_from_dir(d, TorchReference, TorchMoeReference, compute_dtype=torch.float64)
    trainer.tp, trainer.ep = 2, True
    seqs = [[5, 17, 3, 88, 41, 9, 60, 2], [90, 1, 44, 23, 56, 78, 11, 30, 4, 19]]
    ids, cu, mx = pack(seqs, "cpu")
    with torch.no_grad():
        got = trainer.logprobs(ids, cu, mx)
    want = torch.cat([hf_logprobs(hf, s) for s in seqs])
    assert float((got - want).abs().max()) < 2e-4
    ranks = trainer.rank_routes_array()
    assert ranks.shape[0] == 2 and (ranks[0] == ranks[1]).all() and (ranks[0] == trainer.routes_array()).all()
    if trainer.layout.shared_expert:
        whole = lambda m, h: [trainer._dense_mlp(m, h)] * 2  # noqa: E731
        monkeypatch.setattr(trainer, "_tp_mlp_parts", whole)
        with torch.no_grad():
            bad = trainer.logprobs(ids, cu, mx)
        assert float((bad - want).abs().max()) > 1e-2


def test_routing_receipts_are_hf_routers_choice(tiny):
    d, hf = tiny
    trainer = moe_from_dir(d, TorchReference, TorchMoeReference, compute_dtype=torch.float64)
    seq = [5, 17, 3, 88, 41, 9, 60, 2, 13, 77]
    ids, cu, mx = pack([seq], "cpu")
    with torch.no_grad():
        trainer.logprobs(ids, cu, mx)
        hf_ids = {}
        hooks = [hf.model.layers[i].mlp.gate.register_forward_hook(
            lambda m, inp, out, i=i: hf_ids.__setitem__(i, out[2])) for i in (0, 2)]
        hf(torch.tensor([seq]))
        for h in hooks:
            h.remove()
    rec = trainer.routing_receipt()
    assert [r.tokens for r in rec] == [len(seq), len(seq)] and all(r.top_k == 3 for r in rec)
    for r, layer in zip(rec, (0, 2)):
        want = hf_ids[layer].reshape(len(seq), 3)
        for t in range(len(seq)):
            assert set(r.row(t)[0]) == set(want[t].tolist())
    part = trainer.routing_receipt(2, 5)
    assert part[0].tokens == 3 and part[0].row(0) == rec[0].row(2)


def _trainer_grads(trainer, seqs, coeffs):
    ids, cu, mx = pack(seqs, "cpu")
    trainer.zero_grad(set_to_none=True)
    (trainer.logprobs(ids, cu, mx) * coeffs).sum().backward()
    return {n: trainer.p(n).grad.double() for n in trainer.names}


def _hf_grads(hf, seqs, coeffs):
    m = copy.deepcopy(hf).double()
    m.config._experts_implementation = "eager"  # grouped_mm has no float64
    lp = torch.cat([torch.log_softmax(m(torch.tensor([s])).logits[0], -1)[torch.arange(len(s) - 1), torch.tensor(s[1:])]
                    for s in seqs])
    (lp * coeffs).sum().backward()
    return {n: p.grad for n, p in m.named_parameters()}


def test_the_gradient_is_hf_autograds(any_layout):
    """Every parameter's gradient of a policy-gradient-shaped loss, the router's, the experts' and a
    shared expert's included, equals torch autograd through HF's model (both in float64, at the
    same routes)."""
    d, hf = any_layout
    trainer = moe_from_dir(d, TorchReference, TorchMoeReference, compute_dtype=torch.float64)
    seqs = [[5, 17, 3, 88, 41, 9, 60, 2], [90, 1, 44, 23, 56, 78, 11, 30, 4, 19]]
    coeffs = torch.linspace(-1.0, 1.5, sum(len(s) - 1 for s in seqs), dtype=torch.float64)
    got, want = _trainer_grads(trainer, seqs, coeffs), _hf_grads(hf, seqs, coeffs)
    E, (gate, up, down), block = trainer.n_experts, trainer.layout.expert_names, trainer.layout.block
    for layer in trainer.sparse_layers:
        p, hp = f"model.layers.{layer}.{block}", f"model.layers.{layer}.mlp."  # HF's in-memory names
        got[hp + "experts.gate_up_proj"] = torch.stack(
            [torch.cat([got.pop(f"{p}experts.{e}.{gate}.weight"), got.pop(f"{p}experts.{e}.{up}.weight")])
             for e in range(E)])
        got[hp + "experts.down_proj"] = torch.stack([got.pop(f"{p}experts.{e}.{down}.weight") for e in range(E)])
        got[hp + "gate.weight"] = got.pop(p + "gate.weight")
    assert set(got) == set(want)
    for name, g in got.items():
        # float32 masters, and the rotary cache is built in float32 as vLLM builds it (HF's differs
        # in the last bits): 1e-5 here, where a wrong term of any gradient is off by far more
        err = float((g - want[name]).norm())
        assert err <= 1e-5 * float(want[name].norm()) + 1e-8, (name, err)
    assert float(want["model.layers.0.mlp.gate.weight"].norm()) > 0  # the router's gradient is exercised
    if trainer.layout.shared_expert:
        assert float(want["model.layers.0.mlp.shared_expert_gate.weight"].norm()) > 0
    # negative control: the router's gradient with the planted error is far from HF's
    with planted_backward_error("moe"):
        bad = _trainer_grads(trainer, seqs, coeffs)
    gate = f"model.layers.0.{block}gate.weight"
    wrong = want["model.layers.0.mlp.gate.weight"]
    assert float((bad[gate] - wrong).norm()) > 1e-2 * float(wrong.norm())


def test_a_rerun_gives_the_same_gradient_bits(tiny):
    d, _ = tiny
    seqs, coeffs = [[5, 17, 3, 88, 41, 9, 60, 2]], torch.linspace(-1, 1, 7, dtype=torch.float64)
    a = _trainer_grads(moe_from_dir(d, TorchReference, TorchMoeReference, compute_dtype=torch.float64), seqs, coeffs)
    b = _trainer_grads(moe_from_dir(d, TorchReference, TorchMoeReference, compute_dtype=torch.float64), seqs, coeffs)
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.bfloat16, 2e-2)])
def test_the_moe_backward_check_passes_and_its_planted_error_fails(renormalize, dtype, tol):
    ok = moe_gradcheck(TorchMoeReference, device="cpu", dtype=dtype, tol=tol, renormalize=renormalize)
    assert ok["pass"], ok
    with planted_backward_error("moe"):
        bad = moe_gradcheck(TorchMoeReference, device="cpu", dtype=dtype, tol=tol, renormalize=renormalize)
    assert not bad["pass"] and bad["rel_err"][1] > 10 * tol  # the router logits' gradient is the one broken
    assert bad["rel_err"][2] == ok["rel_err"][2]  # the experts' are not


def test_the_check_with_its_control_reports_the_control_caught():
    rep = moe_gradcheck_with_control(TorchMoeReference, device="cpu", dtype=torch.float64, tol=1e-10)
    assert rep["pass"] and rep["control_caught"] and not rep["control"]["pass"]


def test_fused_expert_checkpoints_split_per_expert():
    E, I, H = 4, 3, 5
    gu, down = torch.randn(E, 2 * I, H), torch.randn(E, H, I)
    sd = per_expert_state_dict({"model.layers.0.mlp.experts.gate_up_proj": gu,
                                "model.layers.0.mlp.experts.down_proj": down}, 1)
    assert torch.equal(sd["model.layers.0.mlp.experts.2.gate_proj.weight"], gu[2, :I])
    assert torch.equal(sd["model.layers.0.mlp.experts.2.up_proj.weight"], gu[2, I:])
    assert torch.equal(sd["model.layers.0.mlp.experts.3.down_proj.weight"], down[3])
    assert "model.layers.0.mlp.experts.gate_up_proj" not in sd


def test_shared_experts_are_refused():
    with pytest.raises(NotImplementedError, match="shared experts"):
        KernelMoe({"architectures": ["Qwen3MoeForCausalLM"], "shared_expert_intermediate_size": 8,
                        "num_hidden_layers": 1}, {}, TorchReference, TorchMoeReference)
