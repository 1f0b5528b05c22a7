"""The trainer's attention backward (tica/legs/vllm_kernels/autograd.py, AttentionFn) is tiled:
many query and key tiles, packed sequences of mixed lengths, GQA, checked against torch's own
autograd of exact causal attention in float64. One invariant per test, with the planted error."""

from __future__ import annotations

import pytest
import torch

from tica.legs.vllm_kernels import autograd as A


class _Kernels:
    """Exact causal varlen attention (float64 on the CPU): the forward AttentionFn wraps."""

    @staticmethod
    def attention(q, k, v, cu_seqlens, max_seqlen, scale):
        return _reference(q, k, v, cu_seqlens, scale)


def _reference(q, k, v, cu_seqlens, scale):
    rep = q.shape[1] // k.shape[1]
    out = []
    cu = cu_seqlens.tolist()
    for s, e in zip(cu[:-1], cu[1:]):
        qh = q[s:e].transpose(0, 1)
        kh = k[s:e].repeat_interleave(rep, dim=1).transpose(0, 1)
        vh = v[s:e].repeat_interleave(rep, dim=1).transpose(0, 1)
        out.append(torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale).transpose(0, 1))
    return torch.cat(out)


def _inputs(lengths, hq=4, hk=2, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    q, k, v = (torch.randn(T, h, d, generator=g, dtype=torch.float64) for h in (hq, hk, hk))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    go = torch.randn(T, hq, d, generator=g, dtype=torch.float64)
    return q, k, v, cu, go


def _grads(fn, q, k, v, cu, go):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = fn(*leaves, cu)
    out.backward(go)
    return [t.grad for t in leaves]


@pytest.mark.parametrize("lengths", [[1], [7, 1, 30, 2], [64], [5, 40, 3, 19]])
@pytest.mark.parametrize("block", [4, 16, 256])
def test_tiled_backward_equals_autograd_of_exact_attention(monkeypatch, lengths, block):
    monkeypatch.setattr(A, "ATTN_BLOCK", block)
    q, k, v, cu, go = _inputs(lengths)
    scale = q.shape[-1] ** -0.5
    ours = _grads(lambda q, k, v, cu: A.attention(_Kernels, q, k, v, cu, max(lengths), scale), q, k, v, cu, go)
    ref = _grads(lambda q, k, v, cu: _reference(q, k, v, cu, scale), q, k, v, cu, go)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_a_tile_never_sees_another_sequence_or_a_later_token(monkeypatch):
    """Negative control for the mask: a key of sequence 2 changed leaves sequence 1's gradients
    unchanged, and a later token's value changes no earlier query's gradient."""
    monkeypatch.setattr(A, "ATTN_BLOCK", 4)
    q, k, v, cu, go = _inputs([6, 6])
    scale = q.shape[-1] ** -0.5
    run = lambda k, v: _grads(lambda q, k, v, cu: A.attention(_Kernels, q, k, v, cu, 6, scale), q, k, v, cu, go)  # noqa: E731
    base = run(k, v)
    k2 = k.clone()
    k2[8] += 1.0  # sequence 2's third key
    moved = run(k2, v)
    torch.testing.assert_close(moved[0][:6], base[0][:6], rtol=0, atol=0)
    assert not torch.equal(moved[0][6:], base[0][6:])


@pytest.mark.parametrize("block", [4, 256])
def test_the_planted_attention_backward_error_is_seen(monkeypatch, block):
    monkeypatch.setattr(A, "ATTN_BLOCK", block)
    q, k, v, cu, go = _inputs([5, 40, 3])
    scale = q.shape[-1] ** -0.5
    ref = _grads(lambda q, k, v, cu: _reference(q, k, v, cu, scale), q, k, v, cu, go)
    with A.planted_backward_error("attention"):
        bad = _grads(lambda q, k, v, cu: A.attention(_Kernels, q, k, v, cu, 40, scale), q, k, v, cu, go)
    assert not torch.allclose(bad[0], ref[0], rtol=1e-3, atol=1e-3)
