"""`megatron_token_logprobs`, the BI=0 arm's regular trainer path (megatron-core GPTModel), on the CPU:
close to HF transformers on the same checkpoint, far when the weight mapping is planted wrong."""

from __future__ import annotations

import random
from importlib import metadata

import numpy as np
import pytest
import torch

pytest.importorskip("megatron.core")

import tica.legs.megatron_trainer as mt  # noqa: E402
from tica.legs.megatron_trainer import megatron_token_logprobs  # noqa: E402

LENGTHS = (2, 100, 257, 600)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tica.legs.vllm_kernels.producers import make_model

    out = tmp_path_factory.mktemp("megatron-tiny") / "m"
    make_model(out, "tiny", seed=1, device="cpu")
    return out


@pytest.fixture(scope="module")
def seqs():
    r = random.Random(20261129)
    return [[r.randrange(3, 512) for _ in range(n)] for n in LENGTHS]


def hf_logprobs(model_dir, seqs, dtype) -> np.ndarray:
    """HF's layout: log_softmax(logits[:-1].float()).gather(next tokens), sequences concatenated."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="sdpa").eval()
    out = []
    with torch.no_grad():
        for s in seqs:
            x = torch.tensor([s])
            logits = hf(x).logits[0, :-1].float()
            out.append(torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])[:, 0].numpy())
    return np.concatenate(out)


@pytest.fixture(scope="module")
def hf_bf16(tiny, seqs):
    return hf_logprobs(tiny, seqs, torch.bfloat16)


def test_bf16_close_to_hf_and_describes_what_ran(tiny, seqs, hf_bf16):
    lp, info = megatron_token_logprobs(tiny, seqs, device="cpu")
    assert lp.dtype == np.float32 and lp.shape == hf_bf16.shape == (sum(n - 1 for n in LENGTHS),)
    d = np.abs(lp - hf_bf16)
    print(f"megatron bf16 vs HF bf16: max {d.max():.4g} mean {d.mean():.4g} over {d.size} tokens")
    # bf16 logits near -8 have a 0.03-0.06 ulp: close, not bitwise (measured max 0.05, mean 0.01)
    assert d.max() < 0.15 and d.mean() < 0.025
    assert info["megatron_core"] == metadata.version("megatron-core") and info["dtype"] == "bfloat16"
    assert info["device"] == "cpu" and info["cpu_workarounds"]
    assert info["class"].endswith("Float16Module")
    assert {info["parallel"][k] for k in ("tensor", "pipeline", "context", "expert", "data", "world_size")} == {1}
    assert info["parallel"]["backend"] == "gloo"
    assert info["batching"].startswith("one sequence at a time")
    assert not any(info["fusions"][k] for k in ("masked_softmax_fusion", "bias_activation_fusion",
                                                "apply_rope_fusion", "gradient_accumulation_fusion"))
    assert set(info["fused_extensions_importable"]) == set(mt.FUSED_MODULES)
    # the model is kept: a second call does not rebuild, and gives the same bits
    lp2, info2 = megatron_token_logprobs(tiny, seqs, device="cpu")
    assert not info2["model_built_this_call"] and np.array_equal(lp.view(np.uint32), lp2.view(np.uint32))
    # layout: the concatenation of each sequence's own scores
    one = np.concatenate([megatron_token_logprobs(tiny, [s], device="cpu")[0] for s in seqs])
    assert np.array_equal(one.view(np.uint32), lp.view(np.uint32))


def test_fp32_matches_hf_to_rounding(tiny, seqs):
    """In fp32 only summation order differs: the weight and config mapping is exact."""
    lp, info = megatron_token_logprobs(tiny, seqs, device="cpu", dtype=torch.float32)
    ref = hf_logprobs(tiny, seqs, torch.float32)
    d = np.abs(lp - ref)
    print(f"megatron fp32 vs HF fp32: max {d.max():.3g}")
    assert info["dtype"] == "float32" and d.max() < 1e-4


def _swap_gate_up(orig):
    def f(hf, cfg):
        out = orig(hf, cfg)
        for i in range(cfg["num_hidden_layers"]):
            k = f"decoder.layers.{i}.mlp.linear_fc1.weight"
            gate, up = out[k].chunk(2, dim=0)
            out[k] = torch.cat([up, gate], dim=0)
        return out
    return f


def _roll_q_heads(orig):
    def f(hf, cfg):
        hf = dict(hf)
        nq, hd, h = cfg["num_attention_heads"], cfg["head_dim"], cfg["hidden_size"]
        for i in range(cfg["num_hidden_layers"]):
            k = f"model.layers.{i}.self_attn.q_proj.weight"
            hf[k] = hf[k].view(nq, hd, h).roll(1, dims=0).reshape(-1, h)
        return orig(hf, cfg)
    return f


@pytest.mark.parametrize("plant", [_swap_gate_up, _roll_q_heads], ids=["swap_gate_up", "roll_q_heads"])
def test_planted_mapping_error_is_far_from_hf(tiny, seqs, hf_bf16, plant, monkeypatch):
    monkeypatch.setattr(mt, "hf_to_megatron", plant(mt.hf_to_megatron))
    monkeypatch.setattr(mt, "_CACHE", {})
    lp, _ = megatron_token_logprobs(tiny, seqs, device="cpu")
    d = np.abs(lp - hf_bf16)
    print(f"planted {plant.__name__}: max {d.max():.4g} mean {d.mean():.4g}")
    assert d.mean() > 0.08 and d.max() > 0.3  # the correct mapping: mean ~0.01, max ~0.05


def test_parallel_init_is_idempotent_and_cuda_is_refused_after_cpu_patches(tiny, seqs):
    import torch.distributed as dist
    from megatron.core import parallel_state

    megatron_token_logprobs(tiny, seqs[:1], device="cpu")
    world = dist.group.WORLD
    first = mt._init_parallel(torch.device("cpu"))
    assert mt._init_parallel(torch.device("cpu")) == first
    assert dist.group.WORLD is world and parallel_state.model_parallel_is_initialized()
    assert parallel_state.get_tensor_model_parallel_world_size() == 1
    assert mt._cpu_workarounds("cuda") == []  # a CUDA device gets no patch
    with pytest.raises(RuntimeError, match="patched for a CPU forward"):
        megatron_token_logprobs(tiny, seqs[:1], device="cuda")
