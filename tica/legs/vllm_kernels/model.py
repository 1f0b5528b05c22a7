"""``KernelLlama``: a Llama/Qwen2-family dense decoder whose forward is vLLM's kernels.

* reads the safetensors vLLM serves (HF names) into fp32 **master** parameters;
* the forward casts each master to the deployed dtype (bf16: the bytes vLLM loads) and fuses
  q/k/v and gate/up by concatenation exactly as vLLM's QKVParallelLinear /
  MergedColumnParallelLinear load them, so every matmul sees the deployed bytes;
* layer order and norms as vLLM's LlamaDecoderLayer (first input norm unfused, then
  fused_add_rms_norm), rotary neox style with vLLM's cos/sin cache, varlen causal attention
  over packed sequences, lm_head on the scored rows only (the matmul is batch invariant),
  logprobs with the V2 runner's kernel;
* gradients flow through the casts and concatenations to the masters.

Packed input: ``ids`` [T] (sequences concatenated), ``cu_seqlens`` int32 [n+1]. Output: the
logprob of every token but each sequence's first, in order (sum(L_i - 1) values).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from . import autograd as A

DECODE_CHUNK = 255  # rows per fused_add_rms_norm call for decode rows (< 256: vLLM's decode launch shape)
FAULT_LOGPROB = "logprob:torch.log_softmax"
FAULT_FINAL_NORM = "model.norm:hf_rmsnorm"
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def load_safetensors_dir(model_dir: str | Path, device="cpu") -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    d = Path(model_dir)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {d}")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f), device=str(device)))
    return sd


class KernelLlama(torch.nn.Module):
    supported_architectures: tuple[str, ...] = SUPPORTED_ARCHITECTURES

    def __init__(self, config: dict, state_dict: dict[str, torch.Tensor], kernels, *,
                 compute_dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        arch = (config.get("architectures") or ["?"])[0]
        if arch not in self.supported_architectures:
            raise NotImplementedError(f"{type(self).__name__} supports {self.supported_architectures}, not {arch}")
        rs = config.get("rope_scaling") or (config.get("rope_parameters") or {})
        rtype = rs.get("rope_type", rs.get("type", "default")) if isinstance(rs, dict) else "default"
        if rtype not in (None, "default"):
            raise NotImplementedError(f"rope scaling {rtype!r} is not implemented (vLLM builds a different cache)")
        if config.get("mlp_bias"):
            raise NotImplementedError("mlp_bias is not implemented")
        self.config = config
        self.kernels = kernels
        self.arch = arch
        self.H = config["num_attention_heads"]
        self.KVH = config.get("num_key_value_heads") or self.H
        self.D = config.get("head_dim") or config["hidden_size"] // self.H
        self.n_layers = config["num_hidden_layers"]
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.tie = bool(config.get("tie_word_embeddings", False))
        theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta", 10000.0))
        self.theta = float(theta)
        self.max_pos = int(config.get("max_position_embeddings", 4096))
        self.deployed_dtype = _DTYPES[str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")]
        self.compute_dtype = compute_dtype or self.deployed_dtype
        dev = torch.device(device) if device is not None else next(iter(state_dict.values())).device
        self.device_ = dev
        self.names = sorted(state_dict)
        self.master = torch.nn.ParameterList(
            [torch.nn.Parameter(state_dict[n].to(device=dev, dtype=torch.float32)) for n in self.names])
        self._idx = {n: i for i, n in enumerate(self.names)}
        # planted faults (canaries): a linear's name (computed with torch's default F.linear),
        # FAULT_LOGPROB or FAULT_FINAL_NORM
        self.fault: str | None = None
        # bool [T] per packed token: True where the rollout computed that row in a decode step
        self.decode_rows: torch.Tensor | None = None
        # False for the product trainer, which knows nothing of the engine's steps: decode rows are
        # never recomputed as a decode step computes them (trainer_decode_logprobs)
        self.engine_step_rows: bool = True
        # tensor-parallel layout the rollout engine ran (see _tp_layer): 1, or 2 sharded as vLLM shards
        self.tp: int = 1
        # lm_head rows padded to a multiple of this before the matmul, and the logits handed on as the
        # padded-stride view (vLLM's ParallelLMHead + LogitsProcessor: 64 for vLLM's kernel set)
        self.vocab_pad: int = int(getattr(kernels, "vocab_pad", 1))
        # vLLM's online FP8 (quantization="fp8"): the linears it quantized, by name, computed with
        # `fp8` (fp8.Fp8LinearGpu: vLLM's ops; fp8.Fp8LinearReference on a CPU); none for bf16 serving
        self.fp8 = None
        self.fp8_linears: frozenset[str] = frozenset()
        # rotary cache as vLLM builds it (fp32 math on the device, cast to the model dtype)
        self.register_buffer("cos_sin", _cache(self.max_pos, self.D, self.theta, dev, self.compute_dtype),
                             persistent=False)

    # ---------------------------------------------------------------- weights
    def p(self, name: str) -> torch.Tensor:
        return self.master[self._idx[name]]

    def has(self, name: str) -> bool:
        return name in self._idx

    def w(self, name: str) -> torch.Tensor:
        """The weight as the forward sees it: master cast to the deployed dtype (the deployed
        bytes), then to the compute dtype (a no-op on the GPU; float64 in CPU tests)."""
        return self.p(name).to(self.deployed_dtype).to(self.compute_dtype)

    def deployed_state_dict(self) -> dict[str, torch.Tensor]:
        return {n: self.p(n).detach().to(self.deployed_dtype).contiguous() for n in self.names}

    def linear_weight(self, name: str) -> torch.Tensor:
        """The deployed weight of one of vLLM's linear modules by its name (qkv_proj and gate_up_proj fused)."""
        for fused, parts in (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj"))):
            if name.endswith(fused):
                return self.fused(name[:-len(fused)], parts)
        return self.w(name + ".weight")

    def fused(self, prefix: str, parts: tuple[str, ...], suffix: str = "weight") -> torch.Tensor | None:
        names = [f"{prefix}{x}.{suffix}" for x in parts]
        if not all(self.has(n) for n in names):
            if suffix == "bias" and not any(self.has(n) for n in names):
                return None
            raise KeyError(f"missing {names}")
        return torch.cat([self.w(n) for n in names], 0)

    # ---------------------------------------------------------------- forward
    def _lin(self, name: str, x, w, b=None):
        if self.fault == name:
            return F.linear(x, w, b)  # torch's default (cuBLAS) matmul: the planted fault
        if name in self.fp8_linears:
            return A.fp8_linear(self.fp8, x, w, b)
        return A.linear(self.kernels, x, w, b)

    def _fused_add(self, h, residual, w):
        """fused_add_rms_norm as the rollout engine ran it for each row. vLLM 0.26's
        _C.fused_add_rms_norm picks its launch shape from the number of tokens in the call
        (>= 256 or not), and the bits of some rows depend on it (kernel_probe.json). With
        ``self.decode_rows`` set, prompt rows go through one call (>= 256 rows, as in a prefill
        step) and decode rows through calls of at most 255 rows (as in a decode step)."""
        K = self.kernels
        dr = self.decode_rows
        if dr is None:
            return A.fused_add_rms_norm(K, h, residual, w, self.eps)
        idx_p = torch.nonzero(~dr).squeeze(-1)
        idx_d = torch.nonzero(dr).squeeze(-1)
        ys, rs, order = [], [], []
        if idx_p.numel():
            y, r = A.fused_add_rms_norm(K, h[idx_p], residual[idx_p], w, self.eps)
            ys.append(y), rs.append(r), order.append(idx_p)
        for c in range(0, idx_d.numel(), DECODE_CHUNK):
            ic = idx_d[c:c + DECODE_CHUNK]
            y, r = A.fused_add_rms_norm(K, h[ic], residual[ic], w, self.eps)
            ys.append(y), rs.append(r), order.append(ic)
        inv = torch.argsort(torch.cat(order))
        return torch.cat(ys)[inv], torch.cat(rs)[inv]

    def hidden(self, ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        K = self.kernels
        H, KVH, D = self.H, self.KVH, self.D
        T = ids.numel()
        pos = torch.cat([torch.arange(int(e - s), device=ids.device)
                         for s, e in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())])
        h = F.embedding(ids, self.w("model.embed_tokens.weight"))
        residual = None
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            if residual is None:
                residual = h
                h = A.rms_norm(K, h, self.w(p + "input_layernorm.weight"), self.eps)
            else:
                h, residual = self._fused_add(h, residual, self.w(p + "input_layernorm.weight"))
            if self.tp > 1:
                h = self._tp_attention(p, h, pos, cu_seqlens, max_seqlen)
                h, residual = self._fused_add(h, residual, self.w(p + "post_attention_layernorm.weight"))
                h = self._tp_mlp(p, h)
                continue
            wqkv = self.fused(p + "self_attn.", ("q_proj", "k_proj", "v_proj"))
            bqkv = self.fused(p + "self_attn.", ("q_proj", "k_proj", "v_proj"), "bias")
            qkv = self._lin(p + "self_attn.qkv_proj", h, wqkv, bqkv)
            q, k, v = qkv.split([H * D, KVH * D, KVH * D], dim=-1)
            q, k = A.rotary(K, pos, q, k, D, self.cos_sin)
            o = A.attention(K, q.reshape(T, H, D), k.reshape(T, KVH, D), v.reshape(T, KVH, D),
                            cu_seqlens, max_seqlen, D ** -0.5)
            h = self._lin(p + "self_attn.o_proj", o.reshape(T, H * D), self.w(p + "self_attn.o_proj.weight"))
            h, residual = self._fused_add(h, residual, self.w(p + "post_attention_layernorm.weight"))
            gu = self._lin(p + "mlp.gate_up_proj", h, self.fused(p + "mlp.", ("gate_proj", "up_proj")))
            a = A.silu_and_mul(K, gu)
            h = self._lin(p + "mlp.down_proj", a, self.w(p + "mlp.down_proj.weight"))
        return self._final_norm(h, residual)

    def _final_norm(self, h, residual):
        if self.fault == FAULT_FINAL_NORM:
            # planted fault: HF transformers' LlamaRMSNorm (bf16 residual add, fp32 variance, weight * x.to(bf16))
            r = residual + h
            x32 = r.float()
            x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.w("model.norm.weight") * x32.to(r.dtype)
        h, _ = self._fused_add(h, residual, self.w("model.norm.weight"))
        return h

    # ---------------------------------------------------------------- tensor parallel
    # vLLM at TP=n: QKVParallelLinear / MergedColumnParallelLinear give rank r its heads / its slice
    # of the intermediate rows, RowParallelLinear (o_proj, down_proj) its slice of the input
    # columns, and the ranks' partial outputs are summed by an all-reduce; ParallelLMHead gives
    # rank r a slice of the vocabulary and the logits are gathered. Only the all-reduce does
    # arithmetic across ranks, so a trainer reproduces TP=n's bits by computing each rank's
    # matmul on its own shard with the same kernel and summing the partials as the all-reduce
    # does. With two ranks every all-reduce (NCCL tree or ring, vLLM's custom all-reduce) computes
    # one rounded sum a + b per element, whatever the order; more ranks would need the
    # collective's reduction order, so only 2 is implemented.
    def _check_tp(self) -> None:
        if self.tp != 2:
            raise NotImplementedError(f"tp={self.tp}: only 1 and 2 are implemented (2 partial sums are "
                                      "order-free; more need the all-reduce's reduction order)")
        if self.H % self.tp or self.KVH % self.tp:
            raise ValueError(f"heads {self.H}/{self.KVH} not divisible by tp={self.tp}")

    def _all_reduce(self, parts: list[torch.Tensor]) -> torch.Tensor:
        acc = parts[0].float()
        for x in parts[1:]:
            acc = acc + x.float()
        return acc.to(parts[0].dtype)

    def _tp_attention(self, p: str, h, pos, cu_seqlens, max_seqlen):
        self._check_tp()
        K, D, T, tp = self.kernels, self.D, h.shape[0], self.tp
        Hr, KVr = self.H // tp, self.KVH // tp
        wq, wk, wv = (self.w(f"{p}self_attn.{x}_proj.weight") for x in "qkv")
        biases = [f"{p}self_attn.{x}_proj.bias" for x in "qkv"]
        bq, bk, bv = (self.w(n) for n in biases) if all(self.has(n) for n in biases) else (None, None, None)
        wo = self.w(p + "self_attn.o_proj.weight")
        parts = []
        for r in range(tp):
            qs, ks = slice(r * Hr * D, (r + 1) * Hr * D), slice(r * KVr * D, (r + 1) * KVr * D)
            w_r = torch.cat([wq[qs], wk[ks], wv[ks]], 0)
            b_r = torch.cat([bq[qs], bk[ks], bv[ks]], 0) if bq is not None else None
            qkv = self._lin(p + "self_attn.qkv_proj", h, w_r, b_r)
            q, k, v = qkv.split([Hr * D, KVr * D, KVr * D], dim=-1)
            q, k = self._qk_norm(p, q, k)
            q, k = A.rotary(K, pos, q, k, D, self.cos_sin)
            o = A.attention(K, q.reshape(T, Hr, D), k.reshape(T, KVr, D), v.reshape(T, KVr, D),
                            cu_seqlens, max_seqlen, D ** -0.5)
            parts.append(self._lin(p + "self_attn.o_proj", o.reshape(T, Hr * D), wo[:, qs].contiguous()))
        return self._all_reduce(parts)

    def _qk_norm(self, p: str, q, k):
        """A per-head norm of q and k before the rotary (none here; Qwen3's in KernelMoe)."""
        return q, k

    def _tp_mlp(self, p: str, h):
        self._check_tp()
        return self._all_reduce(self._tp_mlp_parts(p + "mlp.", h))

    def _tp_mlp_parts(self, m: str, h) -> list[torch.Tensor]:
        """Each rank's partial output of the dense MLP under prefix m (MergedColumnParallelLinear's
        gate/up rows of its slice, RowParallelLinear's down columns), before the all-reduce."""
        tp = self.tp
        wg, wu = self.w(m + "gate_proj.weight"), self.w(m + "up_proj.weight")
        wd = self.w(m + "down_proj.weight")
        if wg.shape[0] % tp:
            raise ValueError(f"{m}: intermediate size {wg.shape[0]} not divisible by tp={tp}")
        Ir = wg.shape[0] // tp
        parts = []
        for r in range(tp):
            rs = slice(r * Ir, (r + 1) * Ir)
            gu = self._lin(m + "gate_up_proj", h, torch.cat([wg[rs], wu[rs]], 0))
            a = A.silu_and_mul(self.kernels, gu)
            parts.append(self._lin(m + "down_proj", a, wd[:, rs].contiguous()))
        return parts

    def _tp_lm_head(self, h):
        # vLLM pads the vocabulary to a multiple of 64, gives each rank an equal slice, gathers the
        # logits and slices the padding off (a view with the padded row stride, as at TP=1)
        w = self.lm_head_weight()
        V = w.shape[0]
        wp = torch.cat([w, w.new_zeros((-V) % 64, w.shape[1])]) if V % 64 else w
        per = wp.shape[0] // self.tp
        return torch.cat([self._lin("lm_head", h, wp[r * per:(r + 1) * per]) for r in range(self.tp)], -1)[:, :V]

    def lm_head_weight(self) -> torch.Tensor:
        if self.tie or not self.has("lm_head.weight"):
            return self.w("model.embed_tokens.weight")
        return self.w("lm_head.weight")

    def logprobs(self, ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int | None = None) -> torch.Tensor:
        """logprob of ids[s+1:e] given their prefix, for every sequence [s, e), concatenated."""
        cu = cu_seqlens.to(device=ids.device, dtype=torch.int32)
        if max_seqlen is None:
            max_seqlen = int((cu[1:] - cu[:-1]).max())
        h = self.hidden(ids, cu, max_seqlen)
        rows, tgt = scored_rows(ids, cu)
        if self.tp == 1 and self.fault not in ("lm_head", FAULT_LOGPROB):
            # forward: the kernels' lm_head then logprob; backward chunked over the vocabulary
            return A.lm_head_logprobs(self.kernels, h[rows], self.lm_head_weight(), tgt, self.vocab_pad)
        if self.tp > 1:
            logits = self._tp_lm_head(h[rows])
        else:
            logits = self._lin("lm_head", h[rows], self.lm_head_weight())
        if self.fault == FAULT_LOGPROB:
            # planted fault: torch's log_softmax on fp32 logits instead of the V2 runner's logprob kernel
            return torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt.reshape(-1, 1)).squeeze(-1)
        return A.token_logprobs(self.kernels, logits, tgt)


def _cache(max_pos, D, theta, dev, dtype):
    from .kernels import cos_sin_cache

    return cos_sin_cache(max_pos, D, theta, dev, dtype)


def scored_rows(ids: torch.Tensor, cu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows whose logits score the next token, those next tokens), sequence by sequence."""
    rows = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        rows.append(torch.arange(s, e - 1, device=ids.device))
    r = torch.cat(rows)
    return r, ids[r + 1]


def pack(seqs: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor, int]:
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long, device=device)
    lens = [len(s) for s in seqs]
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    return ids, cu.to(device), max(lens)


def from_dir(model_dir: str | Path, kernels, *, device="cpu", compute_dtype=None) -> KernelLlama:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    sd = load_safetensors_dir(model_dir, device=device)
    return KernelLlama(cfg, sd, kernels, compute_dtype=compute_dtype, device=device)
