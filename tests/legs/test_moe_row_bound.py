"""The MoE trainer never hands vLLM's experts more rows than their 32-bit offsets hold.

vLLM 0.26's ``fused_experts`` does not split its tokens (0.26 has no fused-MoE chunk size): its
``silu_and_mul`` gets tokens x top_k rows of width 2I in one call, and a row's offset past 2^32 is
wrong (kernels.ROW_CALL_ELEMS). ``VllmMoeKernels.experts`` calls it on token ranges under the dense
kernel set's bound and records the largest call. On the CPU the experts are a stand-in for vLLM's
(its Triton kernels need a GPU): a row-wise stand-in keeps every bit under the split, and a stand-in
whose rows see their batch does not (the control that shows the comparison can fail)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from tica.legs.vllm_kernels.kernels import ROW_CALL_ELEMS, TorchReference  # noqa: E402
from tica.legs.vllm_kernels.model import pack  # noqa: E402
from tica.legs.vllm_kernels.moe import TorchMoeReference, VllmMoeKernels, moe_from_dir  # noqa: E402
from tests.legs.test_moe_trainer_cpu import _saved  # noqa: E402


def _rowwise(x, w13, w2, weights, ids):
    """Every token's rows from its own values alone, each dot product one reduction over the last
    dim (a BLAS matmul picks its kernel by the row count, so its bits are not a row's own)."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=x.dtype)
    for slot in range(ids.shape[1]):
        e = ids[:, slot].long()
        g, u = (x.unsqueeze(1) * w13[e]).sum(-1).chunk(2, dim=-1)
        out = out + ((torch.nn.functional.silu(g) * u).unsqueeze(1) * w2[e]).sum(-1) * weights[:, slot:slot + 1]
    return out


class StandIn(VllmMoeKernels):
    """VllmMoeKernels' own splitting around a CPU stand-in for vLLM's fused_topk / fused_experts."""

    def __init__(self, experts=_rowwise) -> None:
        self._topk, self._experts, self.limits = None, experts, None

    def route(self, x, logits, top_k: int, renormalize: bool):
        return TorchMoeReference.route(x, logits, top_k, renormalize)


def _batch_seeing(x, w13, w2, weights, ids):
    """Not row-wise: every row scaled by its call's mean (what a batch-wide scale does)."""
    return _rowwise(x, w13, w2, weights, ids) * x.mean()


def _block(T=300, H=16, I=8, E=6, k=2, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g, dtype=torch.float64)
    w13, w2 = torch.randn(E, 2 * I, H, generator=g, dtype=torch.float64), torch.randn(E, H, I, generator=g, dtype=torch.float64)
    w, ids = TorchMoeReference.route(x, torch.randn(T, E, generator=g, dtype=torch.float64), k, True)
    return x, w13, w2, w, ids


def test_experts_split_under_the_bound_keep_every_bit_and_record_the_largest_call():
    x, w13, w2, w, ids = _block()
    whole = StandIn()
    whole.limits = SimpleNamespace(row_limit=None, largest_call={})
    split = StandIn()
    split.limits = SimpleNamespace(row_limit=2 * 16 * 70, largest_call={})  # 70 tokens a call: 5 calls
    assert torch.equal(split.experts(x, w13, w2, w, ids), whole.experts(x, w13, w2, w, ids))
    assert whole.limits.largest_call == {"fused_experts": 300}
    assert split.limits.largest_call == {"fused_experts": 60}  # 300 tokens in 5 near-equal calls


def test_a_stand_in_whose_rows_see_their_batch_differs_when_split():
    x, w13, w2, w, ids = _block()
    whole, split = StandIn(_batch_seeing), StandIn(_batch_seeing)
    whole.limits = SimpleNamespace(row_limit=None, largest_call={})
    split.limits = SimpleNamespace(row_limit=2 * 16 * 70, largest_call={})
    assert not torch.equal(split.experts(x, w13, w2, w, ids), whole.experts(x, w13, w2, w, ids))


@pytest.mark.parametrize("shape, tokens", [
    ((14336, 4096, 2), 37449),  # mixtral-8x7b: 8 experts x 14336, top-2, hidden 4096
    ((768, 2048, 8), 131071),  # qwen3-30b-a3b: 128 x 768, top-8 (moe_sum's tokens x 8 x 2048 bind first)
    ((1408, 2048, 4), 190650),  # qwen1.5-moe-a2.7b: 60 x 1408, top-4
])
def test_a_call_of_the_matrix_moe_shapes_stays_under_the_32_bit_row_offset(shape, tokens):
    """The most tokens one experts call takes for each MoE matrix shape, as `VllmMoeKernels.experts`
    splits a packed batch (meta tensors: shapes only): that many go in one call, one more makes two.
    Its silu_and_mul rows (tokens x top_k of width 2I) and its moe_sum input (tokens x top_k x
    hidden) stay under 2^31 elements, and one token more would not."""
    inter, hidden, k = shape
    meta = dict(device="meta", dtype=torch.bfloat16)

    def largest_call(n: int) -> int:
        experts = StandIn(lambda x, w13, w2, weights, ids: x)
        experts.limits = SimpleNamespace(row_limit=ROW_CALL_ELEMS, largest_call={})
        out = experts.experts(torch.empty(n, hidden, **meta), torch.empty(2, 2 * inter, hidden, **meta),
                              torch.empty(2, hidden, inter, **meta), torch.empty(n, k, device="meta"),
                              torch.empty(n, k, device="meta", dtype=torch.int32))
        assert out.shape == (n, hidden)
        return experts.limits.largest_call["fused_experts"]

    assert largest_call(tokens) == tokens and largest_call(tokens + 1) < tokens + 1
    width = k * max(2 * inter, hidden)
    assert tokens * width <= 2**31 - 1 < (tokens + 1) * width


def test_the_moe_packed_load_crosses_mixtrals_unsigned_row_offset_and_the_trainer_splits_it():
    """The matrix's moe_packed load (asked by name for mixtral-8x7b_l1 on the device) packs more
    tokens than one fused_experts call computes right (tokens x top-2 rows of width 2 x 14336 past
    2^32 elements), so its one-call control must differ there; the product trainer's calls stay
    under the signed bound. Control: the default MoE loads stay under both, so they cannot show it."""
    from tica.legs.vllm_kernels.matrix import LOADS, MOE_LOADS, MOE_PACKED_LOAD, workload
    from tica.legs.vllm_kernels.moe import expert_calls

    def packed_tokens(load: str) -> int:
        prompts, gens, _ = workload(load, vocab=32000)
        return sum(len(p) + g for p, g in zip(prompts, gens))

    inter, k = 14336, 2
    first_wrong_token = -(-2**32 // (2 * inter)) // k  # its row r = token x k + slot wraps from 2^32
    n = packed_tokens(MOE_PACKED_LOAD)
    assert n > first_wrong_token > max(packed_tokens(x) for x in MOE_LOADS)
    limits = SimpleNamespace(row_limit=ROW_CALL_ELEMS, largest_call={})
    calls = expert_calls(limits, n, k * 2 * inter)
    assert len(calls) >= 2 and limits.largest_call["fused_experts"] * k * 2 * inter <= ROW_CALL_ELEMS
    assert LOADS[MOE_PACKED_LOAD].n * LOADS[MOE_PACKED_LOAD].prompt[1] < 2 * first_wrong_token  # a small receipt


def test_the_moe_trainer_binds_its_experts_to_the_dense_bound_and_keeps_its_logprobs(tmp_path_factory):
    """Through KernelMoe: a bound small enough to split every MoE layer's call gives the logprobs of
    the unsplit forward, bit for bit, and the receipt's largest call shows the split."""
    d, _ = _saved("mixtral", tmp_path_factory)
    seqs = [[(7 * i + j) % 96 for j in range(40)] for i in range(6)]
    ids, cu, mx = pack(seqs, "cpu")
    out = {}
    # top-2 x 2I = 192 elements a token: 120 tokens a call, 2 calls of 240; the lm_head's rows (width
    # 96) stay in one call, so any difference would be the experts'
    for name, limit in (("whole", None), ("split", 192 * 120)):
        kernels = TorchReference()
        kernels.row_limit, kernels.largest_call = limit, {}
        trainer = moe_from_dir(d, kernels, StandIn(), compute_dtype=torch.float64)
        with torch.no_grad():
            out[name] = (trainer.logprobs(ids, cu, mx), dict(kernels.largest_call))
    assert torch.equal(out["split"][0], out["whole"][0])
    assert out["whole"][1]["fused_experts"] == 240 and out["split"][1]["fused_experts"] == 120
