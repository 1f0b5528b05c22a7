"""Batch-invariance probe of each forward kernel, on the GPU.

For every op: run it over a big batch, then over the first n rows alone, and count the
elements whose bits differ (n = 1 .. 1000, across the 128-row matmul tile and the 256-token
boundaries some CUDA kernels switch launch shapes at). Attention: a sequence alone vs packed
with others, and a decode-style query (one token over its cached prefix, contiguous and paged
KV like vLLM's) vs the same row of the prefill. A nonzero count means that kernel's result
depends on what else is in the batch: a trainer calling it cannot be bitwise equal to a
rollout engine that batches differently.

``logprob_row_stride``: the V2 runner's logprob kernel on the same logits laid out with several row
strides (vLLM hands it a view whose rows keep the padded vocabulary's stride): a nonzero count
means the kernel's bits depend on the stride, so a trainer must pass vLLM's.
"""

from __future__ import annotations

import torch

SIZES = (1, 2, 7, 64, 129, 255, 256, 257, 1000)


def _ndiff(a: torch.Tensor, b: torch.Tensor) -> int:
    if a.shape != b.shape:
        return -1
    return int((a.contiguous().view(torch.int16) != b.contiguous().view(torch.int16)).sum())


def probe(K, *, hidden=2048, inter=5632, heads=16, kv_heads=8, head_dim=128, vocab=32000, device="cuda") -> dict:
    g = torch.Generator(device=device).manual_seed(0)
    T = 1200

    def rn(*s, std=1.0):
        return (torch.randn(*s, generator=g, device=device) * std).to(torch.bfloat16)

    out: dict = {"sizes": list(SIZES), "ops": {}}
    x = rn(T, hidden)
    res = rn(T, hidden)
    wn = (1 + rn(hidden, std=0.05).float()).to(torch.bfloat16)

    def rows(fn, *inputs):
        full = fn(*inputs)
        full = full if isinstance(full, tuple) else (full,)
        per = {}
        for n in SIZES:
            part = fn(*[t[:n].contiguous() if t.dim() > 0 and t.shape[0] == T else t for t in inputs])
            part = part if isinstance(part, tuple) else (part,)
            per[n] = sum(_ndiff(f[:n], p) for f, p in zip(full, part))
        return per

    out["ops"]["linear_qkv"] = rows(lambda a, w: K.linear(a, w), x, rn((heads + 2 * kv_heads) * head_dim, hidden, std=0.02))
    out["ops"]["linear_lm_head"] = rows(lambda a, w: K.linear(a, w), x, rn(vocab, hidden, std=0.02))
    out["ops"]["rms_norm"] = rows(lambda a, w: K.rms_norm(a, w, 1e-5), x, wn)
    out["ops"]["fused_add_rms_norm"] = rows(lambda a, r, w: K.fused_add_rms_norm(a, r, w, 1e-5), x, res, wn)
    out["ops"]["silu_and_mul"] = rows(lambda a: K.silu_and_mul(a), rn(T, 2 * inter))
    from .kernels import cos_sin_cache

    cache = cos_sin_cache(4096, head_dim, 10000.0, device, torch.bfloat16)
    pos = torch.arange(T, device=device)
    out["ops"]["rotary"] = rows(lambda p, q, k: K.rotary(p, q, k, head_dim, cache), pos,
                                rn(T, heads * head_dim), rn(T, kv_heads * head_dim))
    lg = rn(T, vocab, std=3.0)
    tg = torch.randint(0, vocab, (T,), generator=g, device=device)
    full = K.token_logprobs(lg, tg)
    out["ops"]["logprob"] = {n: int((full[:n].view(torch.int32) != K.token_logprobs(lg[:n].contiguous(), tg[:n]).view(torch.int32)).sum())
                             for n in SIZES}
    out["ops"]["logprob_row_stride"] = logprob_row_strides(K, lg, tg)
    out["ops"]["attention"] = _attention(K, rn, heads, kv_heads, head_dim, device)
    return out


def _up(n: int, m: int) -> int:
    return -(-n // m) * m


def logprob_row_strides(K, lg: torch.Tensor, tg: torch.Tensor) -> dict:
    """{row stride: logprobs whose bits differ from the same logits at vLLM's stride (the vocabulary
    padded to 64)}, over the vocabulary itself (dense), multiples of 16, and strides that are not."""
    T, V = lg.shape
    ref_stride = _up(V, 64)

    def at(stride: int) -> torch.Tensor:
        buf = torch.zeros(T, stride, dtype=lg.dtype, device=lg.device)
        buf[:, :V] = lg
        return K._lp(buf[:, :V], tg.reshape(-1, 1).contiguous())[:, 0]

    ref = at(ref_stride)
    strides = sorted({V, V + 1, _up(V, 16), _up(V + 1, 16), ref_stride, ref_stride + 64})
    return {"vocab": V, "reference_stride": ref_stride,
            "n_diff": {s: int((at(s).view(torch.int32) != ref.view(torch.int32)).sum()) for s in strides},
            "of": T}


def probe_model(K, cfg: dict) -> dict:
    """The probe at a model config's shapes; an error is recorded, not raised (a probe is evidence
    about a leg, never a reason to lose it)."""
    try:
        return probe(K, hidden=cfg["hidden_size"], inter=cfg["intermediate_size"], heads=cfg["num_attention_heads"],
                     kv_heads=cfg["num_key_value_heads"], head_dim=cfg.get("head_dim") or
                     cfg["hidden_size"] // cfg["num_attention_heads"], vocab=cfg["vocab_size"])
    except Exception as err:  # noqa: BLE001
        return {"error": repr(err)[:1000]}


def _attention(K, rn, H, KVH, D, device) -> dict:
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    lens = [183, 700, 1500, 40]
    T = sum(lens)
    q, k, v = rn(T, H, D), rn(T, KVH, D), rn(T, KVH, D)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=device)
    packed = K.attention(q, k, v, cu, max(lens), D ** -0.5)
    res = {"packed_vs_alone": {}, "decode_vs_prefill_contig": {}, "decode_vs_prefill_paged": {}}
    for i, L in enumerate(lens):
        s = int(cu[i])
        alone = K.attention(q[s:s + L].contiguous(), k[s:s + L].contiguous(), v[s:s + L].contiguous(),
                            torch.tensor([0, L], dtype=torch.int32, device=device), L, D ** -0.5)
        res["packed_vs_alone"][L] = _ndiff(packed[s:s + L], alone)
    # decode-style rows of the 1500-token sequence
    s, L = int(cu[2]), lens[2]
    qs, ks, vs = q[s:s + L], k[s:s + L], v[s:s + L]
    pre = packed[s:s + L]
    bs = 16
    for p in (0, 15, 16, 100, 511, 1023, 1499):
        o = torch.empty(1, H, D, dtype=q.dtype, device=device)
        flash_attn_varlen_func(q=qs[p:p + 1].contiguous(), k=ks[:p + 1].contiguous(), v=vs[:p + 1].contiguous(), out=o,
                               cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32, device=device),
                               cu_seqlens_k=torch.tensor([0, p + 1], dtype=torch.int32, device=device),
                               max_seqlen_q=1, max_seqlen_k=p + 1, softmax_scale=D ** -0.5, causal=True,
                               fa_version=3, num_splits=1)
        res["decode_vs_prefill_contig"][p] = _ndiff(o[0], pre[p])
        n = p + 1
        nb = (n + bs - 1) // bs
        kv = torch.zeros(nb + 1, KVH, bs, 2 * D, dtype=q.dtype, device=device)
        kc, vc = kv.transpose(1, 2).split(D, dim=-1)
        sl = torch.arange(n, device=device)
        kc[sl // bs, sl % bs] = ks[:n]
        vc[sl // bs, sl % bs] = vs[:n]
        bt = torch.arange(nb, dtype=torch.int32, device=device).reshape(1, nb)
        o2 = torch.empty(1, H, D, dtype=q.dtype, device=device)
        flash_attn_varlen_func(q=qs[p:p + 1].contiguous(), k=kc, v=vc, out=o2,
                               cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32, device=device), max_seqlen_q=1,
                               seqused_k=torch.tensor([n], dtype=torch.int32, device=device), max_seqlen_k=n,
                               softmax_scale=D ** -0.5, causal=True, block_table=bt, fa_version=3, num_splits=1)
        res["decode_vs_prefill_paged"][p] = _ndiff(o2[0], pre[p])
    return res
