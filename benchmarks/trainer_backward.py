"""The vllm_kernels trainer's forward+backward (KernelLlama) against HF transformers' LlamaForCausalLM,
side by side, on the same seeded weights, device and dtype.

    .venv/bin/python benchmarks/trainer_backward.py                         # CPU, small shape
    .venv/bin/python benchmarks/trainer_backward.py --device cuda --shape 1b

One step = forward of a sequence-packed batch, loss = sum of the scored tokens' logprobs (every
token but each sequence's first, as the trainer's update scores them), backward to every weight.
No optimizer step.

* ours: ``KernelLlama.logprobs`` on the packed varlen batch (cu_seqlens), fp32 master weights cast
  to the run dtype in the forward, attention backward = the tiled recompute, lm_head + logprob fused
  with the vocabulary-chunked backward. Kernel set: on CUDA vLLM's (``VllmKernels``, with
  VLLM_BATCH_INVARIANT=1 and the pin.py checks) when they load and the dtype is bfloat16, else
  ``TorchReference`` (plain torch, which is all there is on a CPU); the table says which ran.
* HF: ``LlamaForCausalLM`` with ``attn_implementation="sdpa"``, weights in the run dtype. By default
  the same sequences as ONE right-padded batch with an attention mask (``--hf padded``: the usual
  way a transformers trainer is fed), or one sequence at a time with gradients accumulated
  (``--hf each``: no padding waste). Logprobs as a transformers trainer takes them: fp32
  ``log_softmax`` of the full ``[B, L, V]`` logits, gathered at the next token, masked to real tokens.

tokens/s counts the real (packed) tokens for both sides, so HF's padding is its own cost. Time: the
median of the timed steps, ``--repeats`` after one warm-up step in each of ``--rounds`` fresh
subprocesses per side, run one at a time in the order ours, hf, hf, ours, ... (so a busy neighbour
slows both alike), so neither allocator nor peak sees the other. Peak memory of a step:
CUDA ``torch.cuda.max_memory_allocated`` minus what was allocated before the first step (weights);
CPU the peak RSS (VmHWM, reset through /proc/self/clear_refs after the model is built) minus the RSS
before the first step. "resident" is what the model holds before the first step.

Before the timed steps each side computes the logprobs and a few weights' gradients of a small
packed input, and so does a third process: the same model in fp32 on the torch reference kernels
(``ref``, the exact function both sides approximate in the run dtype). The parent prints each
side's deviation from it (max |logprob diff|, the gradients' relative difference) and exits 1 after
the tables when ours deviates more than ``SAME_FUNCTION_SLACK`` times HF's deviation (plus a floor):
ours would then not be the function HF computes, only something near it, and the timings would
compare different things. The loss of the timed batch is printed for both as well.

A second table: one sequence of length ``--attn-len`` through three attention backwards with the
same forward (torch sdpa, causal, a memory-light stand-in for FA3): the new ``AttentionFn`` (tiled
recompute), the old one (commit 9085005: fp32 recompute per sequence and head, an [L, L] matrix per
head) and plain torch autograd through an explicit fp32 softmax(scale QK^T) V over all heads (the
[H, L, L] peer). Backward time (median) and peak memory of forward+backward, each in its own process.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

SHAPES = {
    # CPU default: small enough that the default run takes well under 3 minutes on 2 cores
    "small": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=32, vocab_size=8000, rope_theta=10000.0),
    # Llama-3.2-1B-like (plain rope, untied lm_head): meant for a GPU
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64, vocab_size=128256, rope_theta=500000.0),
}
DEFAULT_SEQS = {"cpu": "256,512,128,1024", "cuda": "512,1024,256,2048"}
DEFAULT_DTYPE = {"cpu": "float32", "cuda": "bfloat16"}
CHECK_SEQS = (7, 30, 19)  # the small packed input both sides must agree on before timing
# ours may deviate from the fp32 reference this many times as much as HF does (each of: max |logprob
# diff|, max relative gradient difference), plus the dtype's floor, and still count as the same function
SAME_FUNCTION_SLACK = 2.0
FLOOR = {"float32": (1e-5, 1e-5), "float64": (1e-10, 1e-10), "bfloat16": (1e-2, 1e-3), "float16": (2e-3, 2e-4)}
MARK = "TRAINER_BACKWARD_RESULT "
MiB = 2**20


# ---------------------------------------------------------------- shared helpers (parent and children)
def model_config(shape: str, dtype: str, max_len: int) -> dict:
    s = dict(SHAPES[shape])
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **s,
            "max_position_embeddings": max(4096, max_len), "rms_norm_eps": 1e-5, "hidden_act": "silu",
            "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "torch_dtype": dtype,
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def seeded_weights(cfg: dict, dtype, seed: int):
    """HF-named weights, generated on the CPU in a fixed order (identical in every process), rounded
    to bf16 (the values a deployed checkpoint holds), then held in the run dtype."""
    import torch

    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nq, nkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    g = torch.Generator().manual_seed(seed)

    def rn(*shape, std):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16).to(dtype)

    def norm(n):
        return (1.0 + torch.randn(n, generator=g) * 0.05).to(torch.bfloat16).to(dtype)

    sd = {"model.embed_tokens.weight": rn(V, H, std=0.02)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = norm(H)
        sd[p + "self_attn.q_proj.weight"] = rn(nq * D, H, std=0.02)
        sd[p + "self_attn.k_proj.weight"] = rn(nkv * D, H, std=0.02)
        sd[p + "self_attn.v_proj.weight"] = rn(nkv * D, H, std=0.02)
        sd[p + "self_attn.o_proj.weight"] = rn(H, nq * D, std=0.02)
        sd[p + "post_attention_layernorm.weight"] = norm(H)
        sd[p + "mlp.gate_proj.weight"] = rn(I, H, std=0.02)
        sd[p + "mlp.up_proj.weight"] = rn(I, H, std=0.02)
        sd[p + "mlp.down_proj.weight"] = rn(H, I, std=0.02)
    sd["model.norm.weight"] = norm(H)
    sd["lm_head.weight"] = rn(V, H, std=0.08)  # wider, so logprobs are not all ~ -log V
    return sd


def seeded_tokens(lengths, vocab: int, seed: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (and getrusage's ru_maxrss) to the current RSS
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _Mem:
    """Peak memory of what runs between start() and peak(), above what was held at start()."""

    def __init__(self, device: str):
        self.device = device

    def held(self) -> int:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        return rss_bytes()

    def start(self) -> None:
        import torch

        gc.collect()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self.reset_ok = reset_peak_rss()
        self.base = self.held()

    def peak(self) -> int:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self.base
        return peak_rss_bytes() - self.base


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# ---------------------------------------------------------------- child: one side of the model benchmark
def pick_kernels(spec: dict):
    """(kernel set, its description) for KernelLlama: vLLM's on CUDA in bf16 when they load."""
    from tica.legs.vllm_kernels.kernels import TorchReference

    want = spec["kernels"]
    if spec["device"] != "cuda" or want == "torch":
        why = "CPU: vLLM's kernels are GPU only" if spec["device"] != "cuda" else "--kernels torch"
        return TorchReference, f"TorchReference ({why})"
    if spec["dtype"] != "bfloat16":
        if want == "vllm":
            raise SystemExit("--kernels vllm needs --dtype bfloat16 (vLLM's kernels are bf16)")
        return TorchReference, f"TorchReference (vLLM's kernels are bf16, not {spec['dtype']})"
    try:
        from tica.legs.vllm_kernels.kernels import VllmKernels
        from tica.legs.vllm_kernels.pin import check_vllm

        check_vllm()  # the pinned version, vLLM's routing and every kernel entry point
        return VllmKernels(), "VllmKernels (vLLM's kernels, VLLM_BATCH_INVARIANT=1)"
    except Exception as err:  # noqa: BLE001
        if want == "vllm":
            raise
        return TorchReference, f"TorchReference (vLLM's kernels unavailable: {str(err)[:160]})"


def child_model(spec: dict) -> dict:
    import torch

    dev, dtype = spec["device"], getattr(torch, spec["dtype"])
    if spec["side"] == "ref":
        dtype = torch.float32 if dtype != torch.float64 else dtype
    torch.manual_seed(0)
    cfg = model_config(spec["shape"], spec["dtype"], max(spec["seqs"]))
    out: dict = {"side": spec["side"]}
    if spec["side"] in ("ours", "ref"):
        from tica.legs.vllm_kernels.model import KernelLlama, pack
    else:
        from transformers import LlamaConfig, LlamaForCausalLM
    rss_imports = rss_bytes()  # after the imports: "resident" is the model's
    mem = _Mem(dev)
    held0 = mem.held()
    sd = seeded_weights(cfg, dtype, spec["seed"])
    if spec["side"] in ("ours", "ref"):
        if spec["side"] == "ref":
            from tica.legs.vllm_kernels.kernels import TorchReference

            kernels, out["kernels"] = TorchReference, f"TorchReference in {dtype} (the exact function, for the check)"
        else:
            kernels, out["kernels"] = pick_kernels(spec)
        model = KernelLlama(cfg, sd, kernels, compute_dtype=dtype, device=dev)
        params = {n: model.p(n) for n in model.names}

        def logprobs(seqs):
            ids, cu, mx = pack(seqs, dev)
            return model.logprobs(ids, cu, mx)

        def forward(seqs):
            return logprobs(seqs).float().sum()
    else:
        hcfg = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")})
        with torch.device(dev):
            model = LlamaForCausalLM._from_config(hcfg, attn_implementation="sdpa")
        model.to(dtype).train()
        model.load_state_dict({k: v.to(dev) for k, v in sd.items()}, strict=True)
        out["kernels"] = (f"transformers LlamaForCausalLM, attn={model.config._attn_implementation}, "
                          f"{'one right-padded batch + attention mask' if spec['hf'] == 'padded' else 'one sequence at a time'}"
                          ", fp32 log_softmax over [B, L, V] logits")
        params = dict(model.named_parameters())

        def batch_logprobs(seqs):
            B, Lm = len(seqs), max(len(s) for s in seqs)
            ids = torch.zeros(B, Lm, dtype=torch.long)
            att = torch.zeros(B, Lm, dtype=torch.long)
            for i, s in enumerate(seqs):
                ids[i, :len(s)] = torch.tensor(s)
                att[i, :len(s)] = 1
            ids, att = ids.to(dev), att.to(dev)
            logits = model(input_ids=ids, attention_mask=att).logits
            lp = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
            return lp, att[:, 1:].bool()

        def logprobs(seqs):
            lp, keep = batch_logprobs(seqs)
            return lp[keep]  # row-major: sequence by sequence, in order, as the packed side

        def forward(seqs):
            if spec["hf"] == "padded":
                lp, keep = batch_logprobs(seqs)
                return (lp * keep).sum()
            total = 0.0
            for s in seqs:  # one sequence at a time, gradients accumulated: forward and backward interleave
                lp, _ = batch_logprobs([s])
                loss = lp.sum()
                loss.backward()
                total += loss.detach()
            return total
    del sd
    gc.collect()
    out["resident_bytes"] = (mem.held() - held0) if dev == "cuda" else rss_bytes() - rss_imports
    out["n_params"] = sum(p.numel() for p in params.values())

    # the check: logprobs and a few gradients of a small packed input
    check = seeded_tokens(CHECK_SEQS, cfg["vocab_size"], spec["seed"] + 1)
    lp = logprobs(check)
    lp.float().sum().backward()
    L = cfg["num_hidden_layers"]
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.0.self_attn.k_proj.weight", f"model.layers.{L - 1}.mlp.down_proj.weight",
             f"model.layers.{L - 1}.input_layernorm.weight", "model.norm.weight", "lm_head.weight"]
    out["check_logprobs"] = lp.detach().double().cpu().tolist()
    grads = {n: params[n].grad.detach().to("cpu", torch.float64) for n in names}
    torch.save(grads, spec["grads_path"])
    for p in params.values():
        p.grad = None
    del lp, grads
    if spec["side"] == "ref":
        return out
    if spec["side"] == "ours":
        from tica.legs.vllm_kernels.autograd import backward_impls

        out["backward_impls"] = backward_impls()
    # the timed steps
    seqs = seeded_tokens(spec["seqs"], cfg["vocab_size"], spec["seed"] + 2)
    mem.start()
    out["peak_rss_reset"] = getattr(mem, "reset_ok", None)
    times, fwd_times, losses = [], [], []
    for _ in range(1 + spec["repeats"]):
        for p in params.values():
            p.grad = None
        _sync(dev)
        t0 = time.perf_counter()
        loss = forward(seqs)
        _sync(dev)
        fwd_times.append(time.perf_counter() - t0)
        if loss.requires_grad:
            loss.backward()
        _sync(dev)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    out["peak_bytes"] = mem.peak()
    out["warmup_s"], out["times_s"], out["fwd_times_s"] = times[0], times[1:], fwd_times[1:]
    out["loss"] = losses[-1]
    out["tokens"] = sum(spec["seqs"])
    return out


# ---------------------------------------------------------------- child: one attention backward
def _sdpa_forward(q, k, v, cu_seqlens, max_seqlen, scale):
    """One causal sequence through torch's sdpa: the stand-in for FA3's forward (memory-light)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    assert cu_seqlens.numel() == 2, "one sequence"
    rep = q.shape[1] // k.shape[1]
    # [1, H, L, D] with k, v repeated to every query head: the shape torch's flash kernel takes (on the
    # CPU a [H, L, D] or enable_gqa call falls back to the math kernel, which forms [H, L, L])
    qb, kb, vb = (t.transpose(0, 1).unsqueeze(0) for t in (q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)))
    backends = [SDPBackend.FLASH_ATTENTION] + ([SDPBackend.EFFICIENT_ATTENTION] if q.is_cuda else [])
    with sdpa_kernel(backends):
        o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale)
    return o[0].transpose(0, 1).contiguous()


class SdpaForward:
    name = "sdpa_stand_in"
    attention = staticmethod(_sdpa_forward)


def _old_attention_fn():
    """The attention Function as it was at commit 9085005: the same forward, backward recomputed in
    fp32 per sequence and per head (one [L, L] score/probability matrix per head at a time)."""
    import torch

    class OldAttentionFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, kernels, q, k, v, cu_seqlens, max_seqlen, scale):
            ctx.save_for_backward(q, k, v, cu_seqlens)
            ctx.scale = scale
            return kernels.attention(q, k, v, cu_seqlens, max_seqlen, scale)

        @staticmethod
        def backward(ctx, go):
            q, k, v, cu_seqlens = ctx.saved_tensors
            scale = ctx.scale
            wd = torch.promote_types(q.dtype, torch.float32)
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
                    qh, khd, vh, gh = q[s:e, h].to(wd), k[s:e, kh].to(wd), v[s:e, kh].to(wd), go[s:e, h].to(wd)
                    sc = ((qh @ khd.t()) * scale).masked_fill(causal, float("-inf"))
                    p = torch.exp(sc - sc.amax(-1, keepdim=True))
                    p = p / p.sum(-1, keepdim=True)
                    dp = gh @ vh.t()
                    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
                    dv[s:e, kh] += p.t() @ gh
                    dq[s:e, h] = (ds @ khd) * scale
                    dk[s:e, kh] += (ds.t() @ qh) * scale
            return None, dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None

    return OldAttentionFn


def attention_impl(name: str):
    """fn(q, k, v [L, H, D], scale) -> o, with the named backward."""
    import torch

    from tica.legs.vllm_kernels import autograd as A

    def cu_of(q):
        return torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)

    if name == "new":
        return lambda q, k, v, sc: A.attention(SdpaForward, q, k, v, cu_of(q), q.shape[0], sc)
    if name == "old":
        Old = _old_attention_fn()
        return lambda q, k, v, sc: Old.apply(SdpaForward, q, k, v, cu_of(q), q.shape[0], sc)

    def plain(q, k, v, sc):  # explicit fp32 softmax(scale QK^T) V under torch autograd
        L, hq, D = q.shape
        rep = hq // k.shape[1]
        wd = torch.promote_types(q.dtype, torch.float32)
        qh = q.to(wd).transpose(0, 1)
        kh = k.to(wd).transpose(0, 1).repeat_interleave(rep, 0)
        vh = v.to(wd).transpose(0, 1).repeat_interleave(rep, 0)
        s = (qh @ kh.transpose(1, 2)) * sc
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        return (torch.softmax(s, -1) @ vh).transpose(0, 1).to(q.dtype)

    return plain


def attention_inputs(L, H, KVH, D, dtype, device, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    q, k, v, go = (torch.randn(L, h, D, generator=g).to(device, dtype) for h in (H, KVH, KVH, H))
    for t in (q, k, v):
        t.requires_grad_(True)
    return q, k, v, go


def child_attention(spec: dict) -> dict:
    import torch

    dev = spec["device"]
    fn = attention_impl(spec["impl"])
    q, k, v, go = attention_inputs(spec["L"], spec["H"], spec["KVH"], spec["D"], getattr(torch, spec["dtype"]), dev)
    scale = spec["D"] ** -0.5
    mem = _Mem(dev)
    mem.start()
    fwd, bwd = [], []
    peak, bwd_peak = 0, 0
    for _ in range(1 + spec["repeats"]):
        q.grad = k.grad = v.grad = None
        _sync(dev)
        t0 = time.perf_counter()
        o = fn(q, k, v, scale)
        _sync(dev)
        t1 = time.perf_counter()
        peak = max(peak, mem.peak())  # forward so far, above the inputs
        mb = _Mem(dev)
        mb.start()  # the backward alone, above what the forward left (output, saved tensors)
        o.backward(go)
        _sync(dev)
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
        bwd_peak = max(bwd_peak, mb.peak())
        peak = max(peak, mb.peak() + mb.base - mem.base)
        del o
    return {"impl": spec["impl"], "peak_bytes": peak, "bwd_peak_bytes": bwd_peak, "fwd_s": fwd[1:], "bwd_s": bwd[1:]}


# ---------------------------------------------------------------- parent
def run_child(spec: dict, env: dict | None = None) -> dict:
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", json.dumps(spec)],
                       capture_output=True, text=True, env=dict(os.environ, **(env or {})))
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    sys.stderr.write(p.stdout[-4000:] + p.stderr[-8000:])
    raise SystemExit(f"child {spec.get('side') or spec.get('impl')} failed (rc={p.returncode})")


def attention_grad_agreement(L, H, KVH, D, dtype, device) -> dict[str, float]:
    """max |d(q, k, v)| difference of the new and old backwards from the plain autograd one."""
    import torch

    q, k, v, go = attention_inputs(L, H, KVH, D, getattr(torch, dtype), device, seed=1)
    grads = {}
    for name in ("plain", "new", "old"):
        q.grad = k.grad = v.grad = None
        attention_impl(name)(q, k, v, D ** -0.5).backward(go)
        grads[name] = torch.cat([t.grad.flatten().double() for t in (q, k, v)])
    return {n: float((grads[n] - grads["plain"]).abs().max()) for n in ("new", "old")}


def med(xs) -> float:
    return statistics.median(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="small")
    ap.add_argument("--seqs", help=f"packed sequence lengths (default cpu {DEFAULT_SEQS['cpu']}, "
                                   f"cuda {DEFAULT_SEQS['cuda']})")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16", "float64"),
                    help="default float32 on cpu, bfloat16 on cuda")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per side, after one warm-up step")
    ap.add_argument("--rounds", type=int, default=2,
                    help="processes per side, interleaved ours,hf,hf,ours,... (timed steps pooled)")
    ap.add_argument("--hf", choices=("padded", "each"), default="padded",
                    help="HF input: one right-padded batch with attention mask, or one sequence at a time")
    ap.add_argument("--kernels", choices=("auto", "vllm", "torch"), default="auto",
                    help="KernelLlama's kernel set on CUDA (auto: vLLM's if they load, else TorchReference)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn-len", type=int, default=2048, help="sequence length of the attention table (0: skip it)")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._child:
        spec = json.loads(a._child)
        res = child_model(spec) if spec["mode"] == "model" else child_attention(spec)
        print(MARK + json.dumps(res), flush=True)
        return 0

    import tempfile

    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU")
    dtype = a.dtype or DEFAULT_DTYPE[a.device]
    seqs = [int(x) for x in (a.seqs or DEFAULT_SEQS[a.device]).split(",")]
    shp = SHAPES[a.shape]
    where = (torch.cuda.get_device_name() if a.device == "cuda"
             else f"CPU, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}")
    order = [side for r in range(a.rounds) for side in (("ours", "hf") if r % 2 == 0 else ("hf", "ours"))]
    print(f"trainer forward+backward: shape {a.shape} (hidden {shp['hidden_size']}, {shp['num_hidden_layers']} layers, "
          f"heads {shp['num_attention_heads']}/{shp['num_key_value_heads']}, head_dim {shp['head_dim']}, "
          f"intermediate {shp['intermediate_size']}, vocab {shp['vocab_size']}), {dtype}, {where}")
    print(f"batch: {len(seqs)} packed sequences {seqs} = {sum(seqs)} tokens ({sum(s - 1 for s in seqs)} scored); "
          f"loss = sum of scored logprobs; median of {a.repeats} steps after 1 warm-up in each of {a.rounds} processes per side, "
          f"run one at a time in the order {','.join(order)}")

    res: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, side in enumerate(["ref"] + order):
            spec = {"mode": "model", "side": side, "device": a.device, "dtype": dtype, "shape": a.shape, "seqs": seqs,
                    "repeats": a.repeats, "hf": a.hf, "kernels": a.kernels, "seed": a.seed,
                    "grads_path": os.path.join(tmp, f"{side}{i}.pt")}
            env = {"VLLM_BATCH_INVARIANT": "1"} if side == "ours" and a.device == "cuda" else {}
            r = run_child(spec, env)
            if side == "ref":
                res[side] = dict(r, grads=torch.load(spec["grads_path"]))
            elif side not in res:
                res[side] = r
                res[side]["grads"] = torch.load(spec["grads_path"])
                res[side]["peaks"] = [r["peak_bytes"]]
                res[side]["warmups"] = [r["warmup_s"]]
            else:  # pool the timed steps of every round; the peak is the largest of the processes'
                res[side]["times_s"] += r["times_s"]
                res[side]["fwd_times_s"] += r["fwd_times_s"]
                res[side]["peaks"].append(r["peak_bytes"])
                res[side]["warmups"].append(r["warmup_s"])
                res[side]["peak_bytes"] = max(res[side]["peak_bytes"], r["peak_bytes"])

    # the check: the same function? Each side against the fp32 reference of the same weights.
    ref_lp, ref_g = torch.tensor(res["ref"]["check_logprobs"]), res["ref"]["grads"]

    def deviation(side: str) -> tuple[float, dict[str, float]]:
        lp = torch.tensor(res[side]["check_logprobs"])
        d = float((lp - ref_lp).abs().max()) if lp.shape == ref_lp.shape else float("inf")
        g = res[side]["grads"]
        return d, {n: float((g[n] - ref_g[n]).norm() / ref_g[n].norm()) for n in ref_g}

    (d_ours, g_ours), (d_hf, g_hf) = deviation("ours"), deviation("hf")
    floor_lp, floor_g = FLOOR[dtype]
    ok_lp = d_ours <= SAME_FUNCTION_SLACK * d_hf + floor_lp
    ok_g = max(g_ours.values()) <= SAME_FUNCTION_SLACK * max(g_hf.values()) + floor_g
    same = ok_lp and ok_g
    print(f"\ncheck on {len(CHECK_SEQS)} packed sequences {list(CHECK_SEQS)} ({ref_lp.numel()} logprobs), before timing, "
          f"each side against the same model in {res['ref']['kernels']}:")
    print(f"  max |logprob - ref|: ours {d_ours:.3g}, HF {d_hf:.3g} ({'ok' if ok_lp else 'ours too far'}: "
          f"ours <= {SAME_FUNCTION_SLACK:g} x HF + {floor_lp:g})")
    print(f"  gradient ||g - ref|| / ||ref||, max over {len(ref_g)} weights: ours {max(g_ours.values()):.3g}, HF "
          f"{max(g_hf.values()):.3g} ({'ok' if ok_g else 'ours too far'}); per weight ours/HF: " + ", ".join(
              f"{n.replace('model.', '').replace('.weight', '')} {g_ours[n]:.2g}/{g_hf[n]:.2g}" for n in ref_g))
    print(f"  -> {'same function' if same else 'NOT THE SAME FUNCTION: the timings below compare different things'}")
    if "backward_impls" in res["ours"]:
        print(f"  ours' backward: {res['ours']['backward_impls']}")
    lo_, lh_ = res["ours"]["loss"], res["hf"]["loss"]
    print(f"  loss of the timed batch: ours {lo_:.8g}, HF {lh_:.8g} (relative diff {abs(lo_ - lh_) / abs(lh_):.2g})")

    mem_what = "max_memory_allocated" if a.device == "cuda" else "peak RSS"
    print(f"\n{'side':6s} {'step s':>8s} {'fwd s':>7s} {'tokens/s':>10s} {'peak MiB':>9s} {'resident MiB':>12s} "
          f"{'warm-up s':>9s}  kernels (warm-up: the slowest process's)")
    for side in ("ours", "hf"):
        r = res[side]
        t = med(r["times_s"])
        fwd = f"{med(r['fwd_times_s']):7.3f}" if a.hf == "padded" or side == "ours" else f"{'-':>7s}"
        print(f"{side:6s} {t:8.3f} {fwd} {r['tokens'] / t:10.0f} {r['peak_bytes'] / MiB:9.1f} "
              f"{r['resident_bytes'] / MiB:12.1f} {max(r['warmups']):9.3f}  {r['kernels']}")
    to, th = med(res["ours"]["times_s"]), med(res["hf"]["times_s"])
    print(f"ratio ours/HF: tokens/s {th / to:.2f}x, step peak memory {res['ours']['peak_bytes'] / res['hf']['peak_bytes']:.2f}x"
          f"\n  step times (s) ours {' '.join(f'{x:.2f}' for x in res['ours']['times_s'])};"
          f" HF {' '.join(f'{x:.2f}' for x in res['hf']['times_s'])}; peaks (MiB) ours "
          f"{' '.join(f'{x / MiB:.0f}' for x in res['ours']['peaks'])}, HF {' '.join(f'{x / MiB:.0f}' for x in res['hf']['peaks'])}")
    print(f"peak MiB: the largest process's {mem_what} during warm-up + timed steps, above what was held before them (the model: "
          f"'resident'; ours holds fp32 masters + grads, HF its weights in {dtype} + grads)")
    if a.device == "cpu" and not all(res[s].get("peak_rss_reset") for s in res):
        print("  (could not reset the peak RSS: it includes model construction)")

    if a.attn_len:
        H, KVH, D = shp["num_attention_heads"], shp["num_key_value_heads"], shp["head_dim"]
        agree = attention_grad_agreement(min(a.attn_len, 300), H, KVH, D, "float64", "cpu")
        rows = {impl: run_child({"mode": "attn", "impl": impl, "L": a.attn_len, "H": H, "KVH": KVH, "D": D,
                                 "dtype": dtype, "device": a.device, "repeats": a.repeats})
                for impl in ("new", "old", "plain")}
        print(f"\nattention backward, one sequence L={a.attn_len}, heads {H}/{KVH}, head_dim {D}, {dtype}; forward "
              f"torch sdpa (causal) for new/old; median of {a.repeats} after 1 warm-up; each in its own process")
        print(f"{'backward':42s} {'bwd ms':>9s} {'fwd ms':>8s} {'peak MiB':>9s} {'bwd MiB':>8s}  vs plain (bwd time, peak)")
        label = {"new": "new AttentionFn (tiled recompute)", "old": "old AttentionFn (per head, [L,L] each)",
                 "plain": "plain autograd, fp32 softmax(QK^T) [H,L,L]"}
        pb, pm = med(rows["plain"]["bwd_s"]), rows["plain"]["peak_bytes"]
        for impl, r in rows.items():
            b = med(r["bwd_s"])
            print(f"{label[impl]:42s} {b * 1e3:9.1f} {med(r['fwd_s']) * 1e3:8.1f} {r['peak_bytes'] / MiB:9.1f} "
                  f"{r['bwd_peak_bytes'] / MiB:8.1f}  {b / pb:.2f}x, {r['peak_bytes'] / max(pm, 1):.2f}x")
        print(f"peak MiB: {mem_what} of forward+backward above the inputs; bwd MiB: of the backward alone, above what the "
              f"forward left held (for plain that excludes its saved [H,L,L] probabilities).\nGradient check (float64, "
              f"L=300): max |d(q,k,v) - plain's| new {agree['new']:.2g}, old {agree['old']:.2g}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
