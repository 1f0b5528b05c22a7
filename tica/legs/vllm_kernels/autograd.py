"""autograd Functions: forward = a kernel set's op (vLLM's kernel on the GPU), backward = the
analytic gradient written here in torch, in fp32 (or float64 when the inputs are float64).

No vLLM kernel has a backward; FA3 in vLLM's wheel is forward-only. The attention backward is
a reference recompute: softmax(scale QK^T) is rebuilt in fp32 per sequence and head from the
saved bf16 q, k, v (not FA3's own statistics), then the standard formulas. Its gradient is
therefore the gradient of exact attention at the saved inputs, not of FA3's rounding.

``planted_backward_error(op)`` makes one op's backward deliberately wrong: the negative control
that proves the gradient check can fail.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

_WRONG: set[str] = set()
OPS = ("linear", "rms_norm", "fused_add_rms_norm", "rotary", "silu_and_mul", "attention", "logprob")


@contextmanager
def planted_backward_error(op: str):
    if op not in OPS:
        raise ValueError(op)
    _WRONG.add(op)
    try:
        yield
    finally:
        _WRONG.discard(op)


def _wide(dtype):
    return torch.promote_types(dtype, torch.float32)


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
        wd = _wide(x.dtype)
        g = gy.to(wd)
        dx = g @ w.to(wd)
        dw = g.t() @ x.to(wd)
        if "linear" in _WRONG:
            dw = dw * 1.5  # planted: weight gradient scaled
        db = g.sum(0).to(w.dtype) if ctx.has_bias else None
        return None, dx.to(x.dtype), dw.to(w.dtype), db


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


class AttentionFn(torch.autograd.Function):
    """Causal varlen attention; backward by fp32 reference recompute (see module docstring)."""

    @staticmethod
    def forward(ctx, kernels, q, k, v, cu_seqlens, max_seqlen, scale):
        ctx.save_for_backward(q, k, v, cu_seqlens)
        ctx.scale = scale
        return kernels.attention(q, k, v, cu_seqlens, max_seqlen, scale)

    @staticmethod
    def backward(ctx, go):
        q, k, v, cu_seqlens = ctx.saved_tensors
        scale = ctx.scale
        wd = _wide(q.dtype)
        hq, hk = q.shape[1], k.shape[1]
        rep = hq // hk
        dq = torch.zeros(q.shape, dtype=wd, device=q.device)
        dk = torch.zeros(k.shape, dtype=wd, device=q.device)
        dv = torch.zeros(v.shape, dtype=wd, device=q.device)
        cu = [int(c) for c in cu_seqlens.tolist()]
        for s, e in zip(cu[:-1], cu[1:]):
            L = e - s
            causal = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
            for h in range(hq):
                kh = h // rep
                qh = q[s:e, h].to(wd)
                khd = k[s:e, kh].to(wd)
                vh = v[s:e, kh].to(wd)
                gh = go[s:e, h].to(wd)
                sc = (qh @ khd.t()) * scale
                sc = sc.masked_fill(causal, float("-inf"))
                m = sc.amax(-1, keepdim=True)
                p = torch.exp(sc - m)
                p = p / p.sum(-1, keepdim=True)
                dp = gh @ vh.t()
                if "attention" in _WRONG:
                    ds = p * dp  # planted: drops the softmax normaliser term
                else:
                    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
                dv[s:e, kh] += p.t() @ gh
                dq[s:e, h] = (ds @ khd) * scale
                dk[s:e, kh] += (ds.t() @ qh) * scale
        return None, dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


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


def linear(kernels, x, w, b=None):
    return LinearFn.apply(kernels, x, w, b)


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
