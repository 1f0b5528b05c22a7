"""autograd Functions: forward = a kernel set's op (vLLM's kernel on the GPU), backward = the
analytic gradient written here in torch.

Two precisions, chosen by the inputs' dtype:

* bf16 / fp16 inputs (the trainer on the GPU): the matmuls of the backward (linear, the lm_head's
  vocabulary chunks) run in the input dtype on cuBLAS with fp32 accumulation, as a bf16
  transformers or Megatron trainer computes them; the attention backward on CUDA is torch's
  FlashAttention-2 varlen backward after a FlashAttention-2 recompute of the forward statistics;
  norms, rotary, SiLU and softmax stay fp32 elementwise. The gradient is that of exact attention
  at the saved inputs, not of FA3's rounding (the forward's bits are vLLM's; the backward's need
  not be).
* fp32 / fp64 inputs (the CPU reference and the float64 tests): everything in that precision; the
  attention backward is a tiled recompute in torch (softmax(scale QK^T) rebuilt tile by tile).

No vLLM kernel has a backward; FA3 in vLLM's wheel is forward-only. ``backward_impls()`` says
which attention backward ran.

``planted_backward_error(op)`` makes one op's backward deliberately wrong: the negative control
that proves the gradient check can fail.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from .kernels import ROW_CALL_ELEMS, row_chunks

_WRONG: set[str] = set()
OPS = ("linear", "rms_norm", "fused_add_rms_norm", "rotary", "silu_and_mul", "attention", "logprob", "lm_head_logprob")
# the MoE block's backward (moe_backward.py) has its own check; its planted error is set here too
PLANTABLE = (*OPS, "moe")


@contextmanager
def planted_backward_error(op: str):
    if op not in PLANTABLE:
        raise ValueError(op)
    _WRONG.add(op)
    try:
        yield
    finally:
        _WRONG.discard(op)


def _wide(dtype):
    return torch.promote_types(dtype, torch.float32)


def _low(t: torch.Tensor) -> bool:
    """bf16/fp16: the backward's matmuls run in this dtype (fp32 accumulation), as trainers do."""
    return t.dtype in (torch.bfloat16, torch.float16)


_BACKWARD_USED: dict[str, str] = {}
# FA2's varlen backward accumulates dq with atomic adds unless asked not to: the same step can give
# different gradients on another run or machine. On (the default) it runs FA2's deterministic
# backward, which torch selects while deterministic algorithms are on.
_DETERMINISTIC = {"attention": True}


@contextmanager
def deterministic_attention_backward(on: bool):
    """Run the attention backward deterministically (FA2's deterministic dq) or not, inside."""
    was = _DETERMINISTIC["attention"]
    _DETERMINISTIC["attention"] = on
    try:
        yield
    finally:
        _DETERMINISTIC["attention"] = was


def backward_impls() -> dict[str, str]:
    """op -> the backward implementation that last ran for it in this process."""
    return dict(_BACKWARD_USED)


def _rms_backward(x, w, eps, gy):
    """Gradient of y = x * rsqrt(mean(x^2) + eps) * w w.r.t. x and w (wide precision)."""
    wd = _wide(x.dtype)
    xf, wf, g = x.to(wd), w.to(wd), gy.to(wd)
    n = x.shape[-1]
    r = torch.rsqrt((xf * xf).sum(-1, keepdim=True) / n + eps)
    xhat = xf * r
    dw = (g * xhat).sum(0)
    dxhat = g * wf
    if "rms_norm" in _WRONG:
        dx = r * (dxhat + xhat * (dxhat * xhat).sum(-1, keepdim=True) / n)  # planted: projection sign flipped
    else:
        dx = r * (dxhat - xhat * (dxhat * xhat).sum(-1, keepdim=True) / n)
    return dx, dw


class LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernels, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return kernels.linear(x, w, b)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        wd = x.dtype if _low(x) else _wide(x.dtype)
        g = gy.to(wd)
        dx = g @ w.to(wd)
        dw = g.t() @ x.to(wd)
        if "linear" in _WRONG:
            dw = dw * 1.5  # planted: weight gradient scaled
        db = g.to(_wide(g.dtype)).sum(0).to(w.dtype) if ctx.has_bias else None
        return None, dx.to(x.dtype), dw.to(w.dtype), db


class Fp8LinearFn(LinearFn):
    """vLLM's online FP8 linear forward (``fp8``: fp8.Fp8LinearGpu, or its torch reference on a CPU);
    the backward is the bf16 linear's at the unquantized x and w (straight-through: the gradient
    flows into the bf16 master as if the weight and activation had not been rounded to FP8)."""

    @staticmethod
    def forward(ctx, fp8, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return fp8(x, w, b)


class RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernels, x, w, eps):
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        return kernels.rms_norm(x, w, eps)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        dx, dw = _rms_backward(x, w, ctx.eps, gy)
        return None, dx.to(x.dtype), dw.to(w.dtype), None


class FusedAddRMSNormFn(torch.autograd.Function):
    """(x, residual) -> (rmsnorm(residual + x), residual + x), as vLLM's fused_add_rms_norm."""

    @staticmethod
    def forward(ctx, kernels, x, residual, w, eps):
        y, new_res = kernels.fused_add_rms_norm(x, residual, w, eps)
        ctx.save_for_backward(new_res, w)
        ctx.eps = eps
        return y, new_res

    @staticmethod
    def backward(ctx, gy, gres):
        new_res, w = ctx.saved_tensors
        wd = _wide(new_res.dtype)
        dx_norm, dw = _rms_backward(new_res, w, ctx.eps, gy)
        total = dx_norm
        if gres is not None and "fused_add_rms_norm" not in _WRONG:
            total = total + gres.to(wd)
        total = total.to(new_res.dtype)
        return None, total, total, dw.to(w.dtype), None


class RotaryFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernels, pos, q, k, head_dim, cache):
        ctx.save_for_backward(pos, cache)
        ctx.head_dim = head_dim
        return kernels.rotary(pos, q, k, head_dim, cache)

    @staticmethod
    def backward(ctx, gq, gk):
        pos, cache = ctx.saved_tensors
        D = ctx.head_dim
        half = D // 2
        wd = _wide(gq.dtype)
        cs = cache[pos].to(wd)
        cos, sin = cs[:, :half].unsqueeze(1), cs[:, half:].unsqueeze(1)
        if "rotary" in _WRONG:
            sin = -sin  # planted: the forward rotation instead of its transpose

        def back(g):
            if g is None:
                return None
            g3 = g.to(wd).reshape(g.shape[0], -1, D)
            g1, g2 = g3[..., :half], g3[..., half:]
            # y1 = x1 c - x2 s, y2 = x2 c + x1 s  =>  dx1 = g1 c + g2 s, dx2 = -g1 s + g2 c
            dx = torch.cat((g1 * cos + g2 * sin, -g1 * sin + g2 * cos), dim=-1)
            return dx.reshape(g.shape).to(g.dtype)

        return None, None, back(gq), back(gk), None, None


class SiluAndMulFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernels, x):
        ctx.save_for_backward(x)
        return kernels.silu_and_mul(x)

    @staticmethod
    def backward(ctx, ga):
        (x,) = ctx.saved_tensors
        wd = _wide(x.dtype)
        g, u = x.to(wd).chunk(2, dim=-1)
        a = ga.to(wd)
        s = torch.sigmoid(g)
        if "silu_and_mul" in _WRONG:
            dg = a * u * s  # planted: d silu / dg taken as sigmoid
        else:
            dg = a * u * s * (1 + g * (1 - s))
        du = a * g * s
        return None, torch.cat((dg, du), dim=-1).to(x.dtype)


ATTN_BLOCK = 256  # query/key tile of the attention backward: [Hq, ATTN_BLOCK, ATTN_BLOCK] wide scores at a time


def _tiles(cu_seqlens, total: int, block: int):
    """(q0, q1, [(k0, k1), ...]) over the packed tokens: for each query tile, the key tiles that
    hold a key some query of it attends to (same sequence, not later): the causal block diagonal."""
    cu = [int(c) for c in cu_seqlens.tolist()]
    seq_start = torch.empty(total, dtype=torch.long)
    for s, e in zip(cu[:-1], cu[1:]):
        seq_start[s:e] = s
    for q0 in range(0, total, block):
        q1 = min(total, q0 + block)
        first_key = int(seq_start[q0])  # the earliest key any query of this tile can see
        yield q0, q1, [(k0, min(q1, k0 + block)) for k0 in range(first_key - first_key % block, q1, block)]


def _tile_scores(qg, kb, pos_q, pos_k, seq_q, seq_k, scale):
    """Scaled scores of one tile, [Hk, rep, Bq, Bk], -inf where a query may not see a key."""
    s = torch.einsum("qgrd,kgd->grqk", qg, kb) * scale
    allowed = (seq_q[:, None] == seq_k[None, :]) & (pos_k[None, :] <= pos_q[:, None])
    return s.masked_fill(~allowed, float("-inf"))


class AttentionFn(torch.autograd.Function):
    """Causal varlen attention; backward by a tiled fp32 recompute (see module docstring): per
    query tile, the softmax statistics and the output are rebuilt online over its key tiles
    (as FlashAttention's backward does), then dq, dk, dv tile by tile. All heads at once (GQA
    groups as a tensor axis); no [L, L] matrix for a whole sequence is ever formed."""

    @staticmethod
    def forward(ctx, kernels, q, k, v, cu_seqlens, max_seqlen, scale):
        ctx.save_for_backward(q, k, v, cu_seqlens)
        ctx.scale, ctx.max_seqlen = scale, int(max_seqlen)
        return kernels.attention(q, k, v, cu_seqlens, max_seqlen, scale)

    @staticmethod
    def backward(ctx, go):
        q, k, v, cu_seqlens = ctx.saved_tensors
        if q.is_cuda and _low(q):
            grads = _flash_backward(q, k, v, go, cu_seqlens, ctx.max_seqlen, ctx.scale)
            if grads is not None:
                return (None, *grads, None, None, None)
        _BACKWARD_USED["attention"] = "tiled recompute (torch, fp32 or wider)"
        scale = ctx.scale
        wd = _wide(q.dtype)
        T, hq, D = q.shape
        hk = k.shape[1]
        rep = hq // hk
        qw = q.to(wd).view(T, hk, rep, D)
        kw, vw = k.to(wd), v.to(wd)
        gw = go.to(wd).view(T, hk, rep, D)
        dq = torch.zeros_like(qw)
        dk = torch.zeros_like(kw)
        dv = torch.zeros_like(vw)
        pos = torch.arange(T, device=q.device)
        seq = torch.zeros(T, dtype=torch.long, device=q.device)
        seq[cu_seqlens[1:-1].long()] = 1
        seq = seq.cumsum(0)  # which packed sequence each token belongs to
        for q0, q1, keys in _tiles(cu_seqlens.cpu(), T, ATTN_BLOCK):
            qg, gg, pos_q, seq_q = qw[q0:q1], gw[q0:q1], pos[q0:q1], seq[q0:q1]
            # pass 1: row max m, normaliser l and output o over the key tiles (online softmax)
            m = torch.full((hk, rep, q1 - q0), float("-inf"), dtype=wd, device=q.device)
            l = torch.zeros_like(m)
            o = torch.zeros((hk, rep, q1 - q0, D), dtype=wd, device=q.device)
            for k0, k1 in keys:
                s = _tile_scores(qg, kw[k0:k1], pos_q, pos[k0:k1], seq_q, seq[k0:k1], scale)
                m_new = torch.maximum(m, s.amax(-1))
                base = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                p = torch.exp(s - base[..., None])
                alpha = torch.exp(m - base)
                l = l * alpha + p.sum(-1)
                o = o * alpha[..., None] + torch.einsum("grqk,kgd->grqd", p, vw[k0:k1])
                m = m_new
            lse = m + torch.log(l)
            o = o / l[..., None]
            # D_i = dO_i . O_i = sum_j P_ij dP_ij: the softmax normaliser term of dS
            delta = torch.einsum("qgrd,grqd->grq", gg, o)
            # pass 2: the gradients, tile by tile
            for k0, k1 in keys:
                s = _tile_scores(qg, kw[k0:k1], pos_q, pos[k0:k1], seq_q, seq[k0:k1], scale)
                p = torch.exp(s - lse[..., None])
                dp = torch.einsum("qgrd,kgd->grqk", gg, vw[k0:k1])
                ds = p * dp if "attention" in _WRONG else p * (dp - delta[..., None])  # planted: drops the normaliser
                dv[k0:k1] += torch.einsum("grqk,qgrd->kgd", p, gg)
                dq[q0:q1] += torch.einsum("grqk,kgd->qgrd", ds, kw[k0:k1]) * scale
                dk[k0:k1] += torch.einsum("grqk,qgrd->kgd", ds, qg) * scale
        return None, dq.view(T, hq, D).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def _flash_backward(q, k, v, go, cu_seqlens, max_seqlen: int, scale: float):
    """dq, dk, dv by torch's FlashAttention-2 varlen kernels (CUDA, bf16/fp16, GQA native): the
    forward is recomputed for its output and log-sum-exp, then FA2's backward. None where this
    torch build has no such kernel for these inputs (the caller falls back to the tiled
    recompute, and backward_impls() says so)."""
    cu = cu_seqlens.to(device=q.device, dtype=torch.int32).contiguous()
    causal = "attention" not in _WRONG  # planted: the recompute and backward without the causal mask
    try:
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, max_seqlen, max_seqlen, 0.0, causal, False,
            scale=scale)
        deterministic = _DETERMINISTIC["attention"]
        was, was_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(deterministic)
        try:
            dq, dk, dv = torch.ops.aten._flash_attention_backward(
                go.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), out, lse, cu, cu, max_seqlen,
                max_seqlen, 0.0, causal, rng, unused, scale=scale)
        finally:
            torch.use_deterministic_algorithms(was, warn_only=was_warn)
    except (RuntimeError, NotImplementedError) as err:
        _BACKWARD_USED["attention_flash_error"] = str(err).splitlines()[0][:300]
        return None
    _BACKWARD_USED["attention"] = ("torch FlashAttention-2 varlen (recompute + backward"
                                   + (", deterministic dq" if deterministic else ", atomic dq") + "), " + str(q.dtype))
    return dq, dk, dv


class TokenLogprobFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernels, logits, targets):
        ctx.save_for_backward(logits, targets)
        return kernels.token_logprobs(logits, targets)

    @staticmethod
    def backward(ctx, g):
        logits, targets = ctx.saved_tensors
        wd = _wide(logits.dtype)
        T = logits.shape[0]
        # chunked so a [T, V] fp32 softmax never needs more than ~1 GiB at once
        step = max(1, (1 << 28) // max(1, logits.shape[1]))
        out = torch.empty_like(logits)
        for s in range(0, T, step):
            lf = logits[s:s + step].to(wd)
            p = torch.exp(lf - torch.logsumexp(lf, dim=-1, keepdim=True))
            gs = g[s:s + step].to(wd).unsqueeze(-1)
            d = -p * gs
            if "logprob" not in _WRONG:
                d.scatter_add_(-1, targets[s:s + step].long().reshape(-1, 1), gs)
            out[s:s + step] = d.to(logits.dtype)
        return None, out, None


LOGPROB_CHUNK_ELEMS = 1 << 26  # a vocabulary chunk of the fused backward holds at most this many wide logits


class LmHeadLogprobFn(torch.autograd.Function):
    """lm_head and the sampled-token logprob in one: forward is the kernels' linear then their
    logprob (as vLLM computes them); backward never forms the [T, V] gradient of the logits. It
    walks the vocabulary in chunks, recomputing each chunk's logits in wide precision: pass 1 the
    row log-sum-exp, pass 2 dlogits = g (onehot - softmax) chunk by chunk, folded at once into
    d(hidden) and that chunk's rows of d(weight)."""

    @staticmethod
    def forward(ctx, kernels, h, w, targets, pad_to=1):
        ctx.save_for_backward(h, w, targets)
        wp = padded_weight(w, pad_to)
        # in row ranges of at most ROW_CALL_ELEMS logits, as vLLM's steps are (the lm_head matmul
        # and the logprob kernel are row-wise: a row's bits do not depend on its neighbours)
        calls = row_chunks(h.shape[0], wp.shape[0], getattr(kernels, "row_limit", ROW_CALL_ELEMS) or ROW_CALL_ELEMS)
        if hasattr(kernels, "largest_call"):
            kernels.largest_call["lm_head_logprob"] = max(kernels.largest_call.get("lm_head_logprob", 0),
                                                          max(c.stop - c.start for c in calls))
        V = w.shape[0]
        return torch.cat([kernels.token_logprobs(kernels.linear(h[c], wp, None)[:, :V], targets[c]) for c in calls])

    @staticmethod
    def backward(ctx, g):
        h, w, targets = ctx.saved_tensors
        wide = _wide(h.dtype)
        mm = h.dtype if _low(h) else wide  # the chunk matmuls: bf16 with fp32 accumulation on the GPU
        T, V = h.shape[0], w.shape[0]
        hm, gw = h.to(mm), g.to(wide)
        step = max(1, LOGPROB_CHUNK_ELEMS // max(1, T))
        chunks = [(v0, min(V, v0 + step)) for v0 in range(0, V, step)]
        lse = torch.full((T,), float("-inf"), dtype=wide, device=h.device)
        for v0, v1 in chunks:
            lse = torch.logaddexp(lse, torch.logsumexp((hm @ w[v0:v1].to(mm).t()).to(wide), dim=-1))
        dh = torch.zeros(h.shape, dtype=wide, device=h.device)
        dw = torch.empty(w.shape, dtype=w.dtype, device=w.device)
        tgt = targets.long()
        for v0, v1 in chunks:
            wc = w[v0:v1].to(mm)
            dlogits = -torch.exp((hm @ wc.t()).to(wide) - lse[:, None]) * gw[:, None]
            if "lm_head_logprob" not in _WRONG:  # planted: the target's own term dropped
                inside = (tgt >= v0) & (tgt < v1)
                rows = inside.nonzero().squeeze(-1)
                dlogits[rows, tgt[rows] - v0] += gw[rows]
            dl = dlogits.to(mm)
            dh += dl @ wc
            dw[v0:v1] = (dl.t() @ hm).to(w.dtype)
        return None, dh.to(h.dtype), dw, None, None


def padded_logits(kernels, h, w, pad_to: int = 1) -> torch.Tensor:
    """The lm_head's logits laid out as vLLM 0.26 hands them to its logprob kernel: ParallelLMHead
    holds the vocabulary padded with zero rows to a multiple of ``pad_to`` (64), the matmul runs on
    that shape, and LogitsProcessor slices the columns back, a view whose rows keep the padded
    stride. The stride matters: the logprob kernel's bits depend on it (matrix4's stride probe),
    so the view is passed on as it is, never copied to a dense [T, V] tensor."""
    return kernels.linear(h, padded_weight(w, pad_to), None)[:, :w.shape[0]]


def padded_weight(w: torch.Tensor, pad_to: int = 1) -> torch.Tensor:
    """The lm_head weight with zero rows up to a multiple of ``pad_to``, as ParallelLMHead holds it."""
    V = w.shape[0]
    if pad_to > 1 and V % pad_to:
        return torch.cat([w, w.new_zeros(pad_to - V % pad_to, w.shape[1])])
    return w


def lm_head_logprobs(kernels, h, w, targets, pad_to=1):
    return LmHeadLogprobFn.apply(kernels, h, w, targets, pad_to)


def linear(kernels, x, w, b=None):
    return LinearFn.apply(kernels, x, w, b)


def fp8_linear(fp8, x, w, b=None):
    return Fp8LinearFn.apply(fp8, x, w, b)


def rms_norm(kernels, x, w, eps):
    return RMSNormFn.apply(kernels, x, w, eps)


def fused_add_rms_norm(kernels, x, residual, w, eps):
    return FusedAddRMSNormFn.apply(kernels, x, residual, w, eps)


def rotary(kernels, pos, q, k, head_dim, cache):
    return RotaryFn.apply(kernels, pos, q, k, head_dim, cache)


def silu_and_mul(kernels, x):
    return SiluAndMulFn.apply(kernels, x)


def attention(kernels, q, k, v, cu_seqlens, max_seqlen, scale):
    return AttentionFn.apply(kernels, q, k, v, cu_seqlens, max_seqlen, scale)


def token_logprobs(kernels, logits, targets):
    return TokenLogprobFn.apply(kernels, logits, targets)
