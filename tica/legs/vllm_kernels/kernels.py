"""Two kernel sets with one interface (every op out of place, tokens on the first axis).

* ``VllmKernels``: the kernels vLLM 0.26 runs under VLLM_BATCH_INVARIANT=1 (see pin.py), GPU
  only, bf16. Ops that vLLM runs in place (fused_add_rms_norm, rotary) run on clones, which
  keeps their bits.
* ``TorchReference``: the same math in plain torch, any device and dtype (float64 in the
  tests). Not bitwise equal to the vLLM kernels: it is the reference the backward is
  checked against and the stand-in that lets the model and its gradients run on a CPU.

Interface:
  linear(x[T,K], w[N,K], b[N]|None) -> [T,N]
  rms_norm(x[T,H], w[H], eps) -> [T,H]
  fused_add_rms_norm(x, residual, w, eps) -> (y, residual + x)
  rotary(pos[T], q[T,Hq*D], k[T,Hk*D], head_dim, cos_sin[P,D]) -> (q', k')   neox style
  silu_and_mul(x[T,2I]) -> [T,I]
  attention(q[T,Hq,D], k[T,Hk,D], v[T,Hk,D], cu_seqlens[int32], max_seqlen, scale) -> [T,Hq,D]
  token_logprobs(logits[T,V], targets[T]) -> float32 [T] (float64 for float64 logits)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cos_sin_cache(max_position: int, head_dim: int, theta: float, device, dtype) -> torch.Tensor:
    """As vLLM's RotaryEmbeddingBase._compute_cos_sin_cache (fp32 math on `device`, then cast)."""
    with torch.device(device):
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        t = torch.arange(max_position, dtype=torch.float)
        freqs = torch.einsum("i,j -> ij", t, inv)
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    return cache.to(dtype)


class TorchReference:
    name = "torch_reference"

    @staticmethod
    def linear(x, w, b=None):
        y = x @ w.t()
        return y + b if b is not None else y

    @staticmethod
    def rms_norm(x, w, eps):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        r = torch.rsqrt((xf * xf).sum(-1, keepdim=True) / x.shape[-1] + eps)
        return (xf * r * w.to(xf.dtype)).to(x.dtype)

    @classmethod
    def fused_add_rms_norm(cls, x, residual, w, eps):
        wide = torch.promote_types(x.dtype, torch.float32)
        new_res = (x.to(wide) + residual.to(wide)).to(x.dtype)
        return cls.rms_norm(new_res, w, eps), new_res

    @staticmethod
    def rotary(pos, q, k, head_dim, cache):
        cs = cache[pos]
        half = head_dim // 2
        cos = cs[:, :half].unsqueeze(1)
        sin = cs[:, half:].unsqueeze(1)

        def rot(t):
            t3 = t.reshape(t.shape[0], -1, head_dim)
            wide = torch.promote_types(t.dtype, torch.float32)
            x1, x2 = t3[..., :half].to(wide), t3[..., half:].to(wide)
            c, s = cos.to(wide), sin.to(wide)
            out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
            return out.to(t.dtype).reshape(t.shape)

        return rot(q), rot(k)

    @staticmethod
    def silu_and_mul(x):
        wide = torch.promote_types(x.dtype, torch.float32)
        g, u = x.to(wide).chunk(2, dim=-1)
        return (F.silu(g) * u).to(x.dtype)

    @staticmethod
    def attention(q, k, v, cu_seqlens, max_seqlen, scale):
        wide = torch.promote_types(q.dtype, torch.float32)
        out = torch.empty_like(q)
        hq, hk = q.shape[1], k.shape[1]
        rep = hq // hk
        cu = [int(c) for c in cu_seqlens.tolist()]
        for s, e in zip(cu[:-1], cu[1:]):
            L = e - s
            qs = q[s:e].to(wide).transpose(0, 1)  # [Hq, L, D]
            ks = k[s:e].to(wide).transpose(0, 1).repeat_interleave(rep, 0)
            vs = v[s:e].to(wide).transpose(0, 1).repeat_interleave(rep, 0)
            sc = (qs @ ks.transpose(1, 2)) * scale
            mask = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
            sc = sc.masked_fill(mask, float("-inf"))
            p = torch.softmax(sc, dim=-1)
            out[s:e] = (p @ vs).transpose(0, 1).to(q.dtype)
        return out

    @staticmethod
    def token_logprobs(logits, targets):
        wide = torch.promote_types(logits.dtype, torch.float32)
        lf = logits.to(wide)
        lse = torch.logsumexp(lf, dim=-1)
        return lf.gather(-1, targets.long().reshape(-1, 1)).squeeze(-1) - lse


class VllmKernels:
    """vLLM 0.26's kernels (GPU). Construct after VLLM_BATCH_INVARIANT is set in the env."""

    name = "vllm_kernels"

    def __init__(self) -> None:
        from .pin import check_symbols

        k = check_symbols()
        self._linear = k["linear"]
        self._rms = k["rms_norm"]
        self._fused_add = k["fused_add_rms_norm"]
        self._rotary = k["rotary"]
        self._silu_and_mul = k["silu_and_mul"]
        self._fa = k["attention"]
        self._lp = k["logprob"]

    def linear(self, x, w, b=None):
        return self._linear(x, w, b)

    def rms_norm(self, x, w, eps):
        return self._rms(x, w, eps)

    def fused_add_rms_norm(self, x, residual, w, eps):
        y = x.contiguous().clone()
        r = residual.contiguous().clone()
        self._fused_add(y, r, w, eps)
        return y, r

    def rotary(self, pos, q, k, head_dim, cache):
        q2 = q.contiguous().clone()
        k2 = k.contiguous().clone()
        self._rotary(pos, q2, k2, head_dim, cache, True)
        return q2, k2

    def silu_and_mul(self, x):
        x = x.contiguous()
        out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device=x.device)
        self._silu_and_mul(out, x)
        return out

    def attention(self, q, k, v, cu_seqlens, max_seqlen, scale):
        out = torch.empty_like(q)
        self._fa(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), out=out,
                 cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
                 max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen,
                 softmax_scale=scale, causal=True, fa_version=3, num_splits=1)
        return out

    def token_logprobs(self, logits, targets):
        return self._lp(logits.contiguous(), targets.reshape(-1, 1).contiguous())[:, 0]
