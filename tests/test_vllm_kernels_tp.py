"""The trainer's tensor-parallel layout (KernelLlama.tp = 2), on the CPU with the torch reference
kernels: in float64 it computes the same function as HF transformers (the shards are the right
shards), with a planted error (an all-reduce that drops a rank) that must fail; in bf16 the
layout changes the bits, which is why the trainer must match the rollout's TP (on the GPU:
forward_bi1_tp2_trainer_tp1 in tests/fixtures/h200)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tica.legs.vllm_kernels.model import KernelLlama, pack  # noqa: E402
from tests.test_vllm_kernels_backward import _hf_pair  # noqa: E402


def _hf_logprobs(hf, seqs):
    out = []
    for s in seqs:
        x = torch.tensor([s])
        lg = hf(x).logits[0, :-1]
        out.append(torch.log_softmax(lg, -1).gather(-1, x[0, 1:, None])[:, 0])
    return torch.cat(out)


def _seqs():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 97, (n,), generator=g).tolist() for n in (9, 31, 17)]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tp2_layout_computes_the_model(arch):
    hf, km = _hf_pair(arch)
    km.tp = 2
    seqs = _seqs()
    lp = km.logprobs(*pack(seqs, "cpu"))
    ref = _hf_logprobs(hf, seqs)
    assert (lp - ref).abs().max().item() < 1e-6
    lp.sum().backward()
    assert all(km.p(n).grad is not None and torch.isfinite(km.p(n).grad).all() for n in km.names)


def test_tp2_with_a_dropped_rank_fails(monkeypatch):
    hf, km = _hf_pair("llama")
    km.tp = 2
    monkeypatch.setattr(KernelLlama, "_all_reduce", lambda self, parts: parts[0])
    seqs = _seqs()
    with torch.no_grad():
        lp = km.logprobs(*pack(seqs, "cpu"))
    assert (lp - _hf_logprobs(hf, seqs)).abs().max().item() > 1e-2


def test_tp_layout_changes_bf16_bits():
    _, km64 = _hf_pair("llama")
    km = KernelLlama(km64.config, {n: km64.p(n).detach().to(torch.bfloat16) for n in km64.names},
                     km64.kernels, compute_dtype=torch.bfloat16, device="cpu")
    seqs = _seqs()
    with torch.no_grad():
        one = km.logprobs(*pack(seqs, "cpu")).float()
        km.tp = 2
        two = km.logprobs(*pack(seqs, "cpu")).float()
    assert (one - two).abs().max().item() < 5e-2  # the same function ...
    assert torch.count_nonzero(one.view(torch.int32) != two.view(torch.int32)).item() > 0  # ... other bits


def test_tp_beyond_two_is_refused():
    _, km = _hf_pair("llama")
    km.tp = 4
    with pytest.raises(NotImplementedError, match="only 1 and 2"):
        km.logprobs(*pack(_seqs(), "cpu"))
