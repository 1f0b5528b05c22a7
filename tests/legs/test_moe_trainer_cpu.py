"""The MoE trainer forward (tica/legs/vllm_kernels/moe.py) on the CPU: with the plain-torch kernel
sets in float64 it computes what HF transformers' Qwen3-MoE computes (a tiny seeded model), routes
as HF's router does, records one routing receipt per MoE layer, and refuses to run with grad on
(forward only). The GPU path (vLLM's kernels) is measured on the device: test_h200_moe_trainer.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tica.legs.vllm_kernels.kernels import TorchReference  # noqa: E402
from tica.legs.vllm_kernels.model import pack  # noqa: E402
from tica.legs.vllm_kernels.moe import (  # noqa: E402
    KernelQwen3Moe,
    TorchMoeReference,
    moe_from_dir,
    per_expert_state_dict,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=3,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1], max_position_embeddings=64,
        rope_theta=1e6, tie_word_embeddings=False)
    torch.manual_seed(11)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():  # weights large enough that routing and q/k norms matter
        for n, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
            elif "norm" in n:
                p.uniform_(0.5, 1.5)
    d = tmp_path_factory.mktemp("tiny_qwen3_moe")
    model.save_pretrained(d, safe_serialization=True)
    return d, model


def hf_logprobs(model, seq):
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0].double()
    return torch.log_softmax(logits, -1)[torch.arange(len(seq) - 1), torch.tensor(seq[1:])]


def test_the_forward_is_hf_qwen3_moe(tiny):
    d, hf = tiny
    trainer = moe_from_dir(d, TorchReference, TorchMoeReference, compute_dtype=torch.float64)
    assert trainer.sparse_layers == [0, 2]  # layer 1 is in mlp_only_layers: a dense MLP
    seqs = [[5, 17, 3, 88, 41, 9, 60, 2], [7, 7, 31, 64, 12], [90, 1, 44, 23, 56, 78, 11, 30, 4, 19]]
    ids, cu, mx = pack(seqs, "cpu")
    with torch.no_grad():
        got = trainer.logprobs(ids, cu, mx)
    want = torch.cat([hf_logprobs(hf, s) for s in seqs])
    assert got.shape == want.shape
    assert float((got - want).abs().max()) < 2e-4  # HF runs in float32, the trainer in float64


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


def test_forward_only(tiny):
    d, _ = tiny
    trainer = moe_from_dir(d, TorchReference, TorchMoeReference, compute_dtype=torch.float64)
    ids, cu, mx = pack([[1, 2, 3, 4]], "cpu")
    with pytest.raises(NotImplementedError, match="forward only"):
        trainer.logprobs(ids, cu, mx)


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
        KernelQwen3Moe({"architectures": ["Qwen3MoeForCausalLM"], "shared_expert_intermediate_size": 8,
                        "num_hidden_layers": 1}, {}, TorchReference, TorchMoeReference)
