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


# The most elements one call of a row-wise vLLM kernel is given. vLLM 0.26's `_C.silu_and_mul`
# computes a row's offset in 32 bits: in one call of width 2I, every row r with r * 2I >= 2^32 is
# wrong (measured on the H200: first bad row 155,345 at I = 13,824). vLLM never reaches it (a step
# holds at most max_num_batched_tokens rows); a trainer packing a whole batch into one forward does.
# The signed bound leaves room for a kernel that indexes with a signed int.
ROW_CALL_ELEMS = 2**31 - 1


def row_chunks(n_rows: int, width: int, limit: int | None = ROW_CALL_ELEMS) -> list[slice]:
    """Rows [0, n_rows) in as few calls as keep rows x width <= limit, the calls of near-equal size
    (never a small last call: some kernels pick their launch from the rows in the call).
    None: one call, however large (the control that shows the limit)."""
    per = n_rows if limit is None else max(1, limit // max(1, width))
    calls = max(1, -(-n_rows // per))
    bounds = [n_rows * i // calls for i in range(calls + 1)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


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
    """vLLM 0.26's kernels (GPU). Construct after VLLM_BATCH_INVARIANT is set in the env.

    Three choices are attributes, so one process can compare them on the same rollouts:

    * ``linear``: "triton" (batch_invariant.linear_batch_invariant, the Triton persistent matmul)
      or "dispatch" (what vLLM's UnquantizedLinearMethod calls on this GPU,
      ``dispatch_unquantized_gemm()``: torch's F.linear on cuBLASLt on Hopper, where vLLM's
      batch-invariant mode only turns split-k off);
    * ``norm``: "stock" (``_C.fused_add_rms_norm``, whose launch depends on the rows in the call)
      or "overlay" (the residual add in bf16, then the Triton rms_norm: overlay.py);
    * ``attention_layout``: "contiguous" (FA3 varlen over packed K/V) or "paged" (FA3 over a
      paged cache of ``block_size`` tokens per block with a block table and seqused_k, the way
      vLLM's FlashAttentionImpl calls it for prefill and decode alike);
    * ``logits_layout``: "vllm" (the logprob kernel reads the logits with the row stride it is
      given: the padded vocabulary's, as vLLM passes its sliced view) or "dense" (copied to a dense
      [T, V] tensor first: what this trainer did before matrix4, a probe of the stride's effect);
    * ``logprob``: "v2_runner" (``compute_token_logprobs``: the V2 model runner's
      ``_topk_log_softmax_kernel`` on the bf16 logits) or "v1_sampler" (the V1 runner's
      ``Sampler.compute_logprobs``: ``log_softmax(dtype=float32)``, which BI=1 routes to the Triton
      ``batch_invariant.log_softmax`` on the fp32 logits, then a gather). vLLM 0.26 runs dense
      models on the V2 runner and MoE models on V1 unless their architecture is in
      ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` (vllm/config/vllm.py): Qwen3-MoE runs on V1.
    """

    name = "vllm_kernels"
    vocab_pad = 64  # ParallelLMHead pads the vocabulary to a multiple of 64
    logprob = "v2_runner"

    def __init__(self, *, linear: str = "triton", norm: str = "stock", attention_layout: str = "contiguous",
                 block_size: int = 16, logits_layout: str = "vllm", logprob: str = "v2_runner") -> None:
        from .pin import check_symbols

        k = check_symbols()
        self._linear = k["linear"]
        self._rms = k["rms_norm"]
        self._fused_add = k["fused_add_rms_norm"]
        self._rotary = k["rotary"]
        self._silu_and_mul = k["silu_and_mul"]
        self._fa = k["attention"]
        self._lp = k["logprob"]
        self.linear_impl, self.norm, self.attention_layout, self.block_size = linear, norm, attention_layout, block_size
        self.logits_layout = logits_layout
        if logprob not in ("v2_runner", "v1_sampler"):
            raise ValueError(f"logprob {logprob!r}: v2_runner or v1_sampler")
        self.logprob = logprob
        self._dispatch = None
        # row-wise kernels are called on at most this many elements (None: one call; a control)
        self.row_limit: int | None = ROW_CALL_ELEMS
        self.largest_call: dict[str, int] = {}  # kernel -> the most rows one call was given
        # bool [T] or None: rows recomputed as vLLM computes a pure-decode step's rows (one query over
        # its paged prefix, max_seqlen_q 1, which FA3 runs non-causal); a probe of stock vLLM
        self.decode_query_rows = None

    def describe(self) -> dict:
        return {"linear": self.linear_impl, "norm": self.norm, "attention_layout": self.attention_layout,
                "block_size": self.block_size, "logits_layout": self.logits_layout,
                "row_call_elems": self.row_limit, "logprob": self.logprob}

    def linear(self, x, w, b=None):
        if self.linear_impl == "dispatch":
            if self._dispatch is None:
                from vllm.model_executor.layers.utils import dispatch_unquantized_gemm

                self._dispatch = dispatch_unquantized_gemm()
            return self._dispatch(None, x, w, b)
        return self._linear(x, w, b)

    def _calls(self, name: str, n_rows: int, width: int) -> list[slice]:
        calls = row_chunks(n_rows, width, self.row_limit)
        self.largest_call[name] = max(self.largest_call.get(name, 0), max(c.stop - c.start for c in calls))
        return calls

    def rms_norm(self, x, w, eps):
        calls = self._calls("rms_norm", x.shape[0], x.shape[-1])
        if len(calls) == 1:
            return self._rms(x, w, eps)
        return torch.cat([self._rms(x[c], w, eps) for c in calls])

    def fused_add_rms_norm(self, x, residual, w, eps):
        if self.norm == "overlay":
            new_res = x + residual  # bf16 + bf16: one rounding, as the overlay computes it
            return self.rms_norm(new_res, w, eps), new_res
        y = x.contiguous().clone()
        r = residual.contiguous().clone()
        for c in self._calls("fused_add_rms_norm", y.shape[0], y.shape[-1]):
            yc, rc = y[c], r[c]  # views of contiguous row ranges: the kernel writes them in place
            self._fused_add(yc, rc, w, eps)
        return y, r

    def rotary(self, pos, q, k, head_dim, cache):
        q2 = q.contiguous().clone()
        k2 = k.contiguous().clone()
        for c in self._calls("rotary", q2.shape[0], max(q2.shape[-1], k2.shape[-1])):
            self._rotary(pos[c], q2[c], k2[c], head_dim, cache, True)
        return q2, k2

    def silu_and_mul(self, x):
        x = x.contiguous()
        out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device=x.device)
        for c in self._calls("silu_and_mul", x.shape[0], x.shape[1]):
            self._silu_and_mul(out[c], x[c])
        return out

    def attention(self, q, k, v, cu_seqlens, max_seqlen, scale):
        out = torch.empty_like(q)
        if self.attention_layout == "paged":
            kc, vc, table, lens = paged_cache(k, v, cu_seqlens, self.block_size)
            self._fa(q=q.contiguous(), k=kc, v=vc, out=out, cu_seqlens_q=cu_seqlens, max_seqlen_q=max_seqlen,
                     seqused_k=lens, max_seqlen_k=max_seqlen, softmax_scale=scale, causal=True,
                     block_table=table, fa_version=3, num_splits=1)
            if self.decode_query_rows is not None:
                rows = torch.nonzero(self.decode_query_rows).squeeze(-1)
                seq = torch.searchsorted(cu_seqlens[1:].to(torch.long), rows, right=True)
                pos = rows - cu_seqlens[:-1].to(torch.long)[seq]
                od = torch.empty(rows.numel(), q.shape[1], q.shape[2], dtype=q.dtype, device=q.device)
                self._fa(q=q[rows].contiguous(), k=kc, v=vc, out=od,
                         cu_seqlens_q=torch.arange(rows.numel() + 1, dtype=torch.int32, device=q.device),
                         max_seqlen_q=1, seqused_k=(pos + 1).to(torch.int32), max_seqlen_k=max_seqlen,
                         softmax_scale=scale, causal=True, block_table=table[seq].contiguous(), fa_version=3,
                         num_splits=1)
                out[rows] = od
            return out
        self._fa(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), out=out,
                 cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
                 max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen,
                 softmax_scale=scale, causal=True, fa_version=3, num_splits=1)
        return out

    def token_logprobs(self, logits, targets):
        # The kernel takes the row stride as an argument and Triton specialises on it: keep the
        # caller's (vLLM's padded) stride unless the rows themselves are not contiguous.
        if self.logits_layout == "dense" or logits.stride(-1) != 1:
            logits = logits.contiguous()
        if self.logprob == "v1_sampler":
            from vllm.model_executor.layers.batch_invariant import log_softmax

            return log_softmax(logits.float(), dim=-1).gather(-1, targets.long().reshape(-1, 1))[:, 0]
        return self._lp(logits, targets.reshape(-1, 1).contiguous())[:, 0]


def paged_cache(k, v, cu_seqlens, block_size: int):
    """Packed K/V [T, Hk, D] laid out as vLLM's FlashAttention KV cache: [blocks, block_size, Hk, D]
    (each sequence from the start of a block of its own), its block table [n, max_blocks] and
    lengths (seqused_k)."""
    cu = [int(c) for c in cu_seqlens.tolist()]
    lens = [e - s for s, e in zip(cu[:-1], cu[1:])]
    nblk = [-(-n // block_size) for n in lens]
    first = [0]
    for b in nblk:
        first.append(first[-1] + b)
    dev = k.device
    shape = (first[-1], block_size) + tuple(k.shape[1:])
    kc = torch.zeros(shape, dtype=k.dtype, device=dev)
    vc = torch.zeros(shape, dtype=v.dtype, device=dev)
    table = torch.zeros(len(lens), max(nblk), dtype=torch.int32, device=dev)
    for i, (s, n) in enumerate(zip(cu[:-1], lens)):
        slots = torch.arange(n, device=dev)
        kc[first[i] + slots // block_size, slots % block_size] = k[s:s + n]
        vc[first[i] + slots // block_size, slots % block_size] = v[s:s + n]
        table[i, :nblk[i]] = torch.arange(first[i], first[i] + nblk[i], dtype=torch.int32, device=dev)
    return kc, vc, table, torch.tensor(lens, dtype=torch.int32, device=dev)
