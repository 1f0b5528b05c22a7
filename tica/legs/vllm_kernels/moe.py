"""``KernelMoe``: a mixture-of-experts decoder whose forward is vLLM 0.26's own kernels, for the
three layouts of ``MOE_LAYOUTS`` (Qwen3-MoE, Mixtral, Qwen2-MoE with its shared expert).

The layer order is vLLM's decoder layer: input norm, attention (Qwen3: a per-head RMSNorm of q and
k before the rotary, ``q_norm`` / ``k_norm``: vLLM's RMSNorm over [tokens, heads, head_dim], one
row per head; Qwen2-MoE: q/k/v biases), post-attention norm, then the sparse MoE block (or a dense
MLP on ``mlp_only_layers``); Qwen2-MoE adds its shared expert as vLLM's ``Qwen2MoeMLP`` computes
it, ``sigmoid(shared_expert_gate(x)) * mlp(x)`` in bf16, to the routed experts' output. The
dense ops are ``KernelLlama``'s (model.py: the Triton matmul, the
candidate's norm, rotary, paged FA3, the logprob op of the model runner vLLM used: 0.26 serves
Qwen3-MoE on its V1 runner, so ``VllmKernels(logprob="v1_sampler")``). The MoE block is what vLLM's
``FusedMoE`` runs for an unquantized model on its TRITON backend under ``VLLM_BATCH_INVARIANT=1``:

* router logits: the gate (a ``ReplicatedLinear``: the batch-invariant Triton matmul, bf16 out);
* routing: ``fused_topk`` (``_moe_C.topk_softmax``: softmax over the experts in fp32, top-k by
  weight, renormalised when ``norm_topk_prob``), as ``FusedTopKRouter`` calls it;
* experts: ``fused_experts`` (the Triton ``fused_moe_kernel`` for gate_up, ``silu_and_mul``, the
  kernel again for down with the gate weight applied to its fp32 accumulator, ``_moe_C.moe_sum``
  over the top-k), with the expert weights stacked as vLLM's ``w13`` [E, 2I, H] (gate rows, then
  up) and ``w2`` [E, H, I]. Under BI=1 vLLM's MoE config is fixed (get_default_config: 64x64x32
  tiles, no tuned table), which is what lets a row's bits not depend on the other rows.

Every forward records **routing receipts** (``routes``: per MoE layer the expert ids and gate
weights of each packed token, as routing.py compares them). ``TorchMoeReference`` is the same
math in plain torch (any device and dtype) for CPU tests. The backward: the dense ops' autograd
Functions (autograd.py) and the MoE block's (moe_backward.py: router and experts, analytic, at the
forward's route).

Measured on an H100 (tests/fixtures/h200/calls/moe_trainer, run2): with overlay3 the packed forward's
logprobs equal vLLM's bitwise (2048 decode, 19602 prefill), and so do its routes on every row; in
the MoE matrix (tests/fixtures/h200/matrix_moe.tar.xz) all three layouts, before and after an update.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from . import autograd as A
from .ep import check_expert_maps, expert_map, local_experts, placement
from .kernels import ROW_CALL_ELEMS, row_chunks
from .model import KernelLlama, load_safetensors_dir
from .moe_backward import moe_block
from .routing import LayerRoutes



@dataclass(frozen=True)
class MoeLayout:
    """Where an architecture keeps its MoE block's weights, as vLLM 0.26's model loads them."""

    block: str  # the sparse block's prefix inside a layer
    expert_names: tuple[str, str, str]  # the checkpoint's gate, up and down projections of one expert
    qk_norm: bool  # a per-head RMSNorm of q and k before the rotary (Qwen3)
    shared_expert: bool  # a dense expert every token goes through, gated by sigmoid(x . g) (Qwen2-MoE)
    renormalize: bool | None  # None: the config's norm_topk_prob decides


MOE_LAYOUTS = {
    "Qwen3MoeForCausalLM": MoeLayout("mlp.", ("gate_proj", "up_proj", "down_proj"), True, False, None),
    "MixtralForCausalLM": MoeLayout("block_sparse_moe.", ("w1", "w3", "w2"), False, False, True),
    "Qwen2MoeForCausalLM": MoeLayout("mlp.", ("gate_proj", "up_proj", "down_proj"), False, True, None),
}
MOE_ARCHITECTURES = tuple(MOE_LAYOUTS)


class TorchMoeReference:
    """Routing and experts in plain torch (any device/dtype; float64 in CPU tests)."""

    name = "torch_moe_reference"

    @staticmethod
    def route(x: torch.Tensor, logits: torch.Tensor, top_k: int, renormalize: bool):
        wide = torch.promote_types(logits.dtype, torch.float32)
        p = torch.softmax(logits.to(wide), dim=-1)
        w, ids = torch.topk(p, top_k, dim=-1)  # descending, as topk_softmax returns them
        if renormalize:
            w = w / w.sum(-1, keepdim=True)
        return w, ids.to(torch.int32)

    @staticmethod
    def experts(x, w13, w2, weights, ids, expert_map=None):
        """expert_map (EP, ep.expert_map): w13/w2 hold this rank's experts; a slot routed to an
        expert mapped to -1 contributes nothing, as vLLM's fused_experts zeroes its row."""
        wide = torch.promote_types(x.dtype, torch.float32)
        out = torch.zeros(x.shape[0], w2.shape[1], dtype=wide, device=x.device)
        for e in torch.unique(ids).tolist():
            j = e if expert_map is None else int(expert_map[e])
            if j < 0:
                continue
            tok, slot = torch.nonzero(ids == e, as_tuple=True)
            g, u = (x[tok].to(wide) @ w13[j].to(wide).t()).chunk(2, dim=-1)
            y = (F.silu(g) * u) @ w2[j].to(wide).t()
            out.index_add_(0, tok, y * weights[tok, slot].to(wide).unsqueeze(-1))
        return out.to(x.dtype)

    @staticmethod
    def describe() -> dict:
        return {"route": "torch softmax/topk", "experts": "torch per-expert matmuls"}


class VllmMoeKernels:
    """vLLM 0.26's MoE kernels (GPU, needs vLLM's ``_moe_C``). Construct after
    VLLM_BATCH_INVARIANT is set: the experts' Triton config is read from it per call."""

    name = "vllm_moe_kernels"
    ROUTE = "vllm.model_executor.layers.fused_moe.router.fused_topk_router.fused_topk"
    EXPERTS = "vllm.model_executor.layers.fused_moe.fused_moe.fused_experts"

    def __init__(self) -> None:
        from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts
        from vllm.model_executor.layers.fused_moe.router.fused_topk_router import fused_topk

        self._topk, self._experts = fused_topk, fused_experts
        # the dense kernel set whose row bound this follows and whose largest_call it records into
        # (KernelMoe binds it; a variant that lifts the bound lifts it here too)
        self.limits = None

    def route(self, x, logits, top_k: int, renormalize: bool):
        w, ids, _ = self._topk(hidden_states=x, gating_output=logits, topk=top_k, renormalize=renormalize)
        return w, ids

    def experts(self, x, w13, w2, weights, ids, expert_map=None):
        # vLLM 0.26's fused_experts does not split its tokens: its silu_and_mul is given tokens x top_k
        # rows of width 2I in one call, wrong past the 32-bit row offset (kernels.ROW_CALL_ELEMS), which
        # a packed trainer batch reaches (Mixtral's 8 x 14336 top-2: 37,449 tokens a call). Under BI=1
        # the experts' Triton config is fixed and every token's rows are its own, so calls of fewer
        # tokens give each token the same bits.
        calls = expert_calls(self.limits, x.shape[0], ids.shape[1] * max(w13.shape[1], x.shape[1]))
        x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
        # EP: the rank's local experts, the global count and the map, as UnquantizedFusedMoEMethod passes them
        ep = {} if expert_map is None else {"global_num_experts": int(expert_map.numel()),
                                            "expert_map": expert_map.to(x.device)}
        outs = [self._experts(x[c], w13, w2, weights[c], ids[c], **ep) for c in calls]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def describe(self) -> dict:
        return {"route": self.ROUTE + " (_moe_C.topk_softmax)",
                "experts": self.EXPERTS + " (Triton fused_moe_kernel x2, silu_and_mul, _moe_C.moe_sum)"}


def expert_calls(limits, n_tokens: int, width: int) -> list[slice]:
    """The token ranges of the experts' calls under ``limits``' row bound (None: no kernel set bound,
    the default bound), each call's size recorded in its ``largest_call`` as ``fused_experts``."""
    calls = row_chunks(n_tokens, width, getattr(limits, "row_limit", ROW_CALL_ELEMS))
    if limits is not None and hasattr(limits, "largest_call"):
        limits.largest_call["fused_experts"] = max(limits.largest_call.get("fused_experts", 0),
                                                   max(c.stop - c.start for c in calls))
    return calls


class TorchRouterFault:
    """A planted fault: torch's fp32 softmax and top-k choose the route in place of the kernel set's
    ``topk_softmax``; the experts are the kernel set's."""

    name = "torch_router_fault"
    route = staticmethod(TorchMoeReference.route)

    def __init__(self, inner) -> None:
        self.inner = inner

    def experts(self, x, w13, w2, weights, ids, expert_map=None):
        return self.inner.experts(x, w13, w2, weights, ids, expert_map)


def per_expert_state_dict(sd: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """HF names with one tensor per expert: a checkpoint that stores a layer's experts fused
    (``mlp.experts.gate_up_proj`` [E, 2I, H], ``mlp.experts.down_proj`` [E, H, I]: transformers
    5's in-memory layout) is split; per-expert checkpoints pass unchanged."""
    out = dict(sd)
    for i in range(n_layers):
        p = f"model.layers.{i}.mlp.experts."
        if p + "gate_up_proj" not in out:
            continue
        gu, down = out.pop(p + "gate_up_proj"), out.pop(p + "down_proj")
        half = gu.shape[1] // 2
        for e in range(gu.shape[0]):
            out[f"{p}{e}.gate_proj.weight"] = gu[e, :half]
            out[f"{p}{e}.up_proj.weight"] = gu[e, half:]
            out[f"{p}{e}.down_proj.weight"] = down[e]
    return out


def num_experts(config: dict) -> int:
    """The routed experts, under whichever name the config uses (vLLM's get_num_experts order:
    transformers 5 writes Qwen3-MoE's as ``num_local_experts``)."""
    for key in ("num_experts", "n_routed_experts", "num_local_experts"):
        if config.get(key) is not None:
            return int(config[key])
    raise KeyError("no num_experts, n_routed_experts or num_local_experts in the config")


def layer_routes(ids: torch.Tensor, weights: torch.Tensor) -> LayerRoutes:
    """One layer's receipt from the router's tensors: ids as int, weights as float32 bits."""
    bits = weights.detach().to(torch.float32).contiguous().cpu().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return LayerRoutes(tuple(ids.detach().cpu().to(torch.int64).flatten().tolist()), tuple(bits.flatten().tolist()),
                       int(ids.shape[-1]))


class KernelMoe(KernelLlama):
    """A MoE decoder (Qwen3-MoE, Mixtral, Qwen2-MoE: ``MOE_LAYOUTS``) on vLLM's kernels."""

    supported_architectures = MOE_ARCHITECTURES

    def __init__(self, config: dict, state_dict: dict[str, torch.Tensor], kernels, moe_kernels, *,
                 compute_dtype: torch.dtype | None = None, device=None) -> None:
        arch = (config.get("architectures") or ["?"])[0]
        if arch not in MOE_LAYOUTS:
            raise NotImplementedError(f"KernelMoe supports {MOE_ARCHITECTURES}, not {arch}")
        self.layout = MOE_LAYOUTS[arch]
        if config.get("shared_expert_intermediate_size") and not self.layout.shared_expert:
            raise NotImplementedError(f"shared experts in a {arch} checkpoint: vLLM's {arch} has none")
        if config.get("hidden_act", "silu") != "silu":
            raise NotImplementedError(f"activation {config.get('hidden_act')!r}: only silu (vLLM's too)")
        n_layers = int(config["num_hidden_layers"])
        super().__init__(config, per_expert_state_dict(state_dict, n_layers), kernels,
                         compute_dtype=compute_dtype, device=device)
        self.moe_kernels = moe_kernels
        bound = getattr(moe_kernels, "inner", moe_kernels)  # a planted router fault wraps the kernel set
        if hasattr(bound, "limits"):
            bound.limits = kernels
        self.n_experts = num_experts(config)
        self.top_k = int(config["num_experts_per_tok"])
        fixed = self.layout.renormalize
        self.renormalize = bool(config.get("norm_topk_prob", False)) if fixed is None else fixed
        dense = set(config.get("mlp_only_layers") or [])
        step = int(config.get("decoder_sparse_step") or 1)
        self.sparse_layers = [i for i in range(n_layers)
                              if i not in dense and self.n_experts > 0 and (i + 1) % step == 0]
        # per MoE layer: (ids int32 [T, k], weights float32 [T, k]) of the last forward, packed order
        self.routes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # expert parallelism over the tp ranks (vLLM's enable_expert_parallel; ep.py): whole experts
        # per rank by vLLM's expert map; then every rank's route is recorded, rank order
        self.ep: bool = False
        self.ep_placement = placement("linear", config.get("num_expert_group"))
        self.rank_routes: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        # a dict to record the forward's intermediates in ("{layer}.attn_out", "{layer}.mlp_in",
        # "{layer}.mlp_out", "final"): a probe that finds the first op whose bits differ from vLLM's
        self.trace: dict[str, torch.Tensor] | None = None

    # ---------------------------------------------------------------- the blocks
    def _attention(self, p: str, h, pos, cu_seqlens, max_seqlen: int):
        K, H, KVH, D, T = self.kernels, self.H, self.KVH, self.D, h.shape[0]
        wqkv = self.fused(p + "self_attn.", ("q_proj", "k_proj", "v_proj"))
        bqkv = self.fused(p + "self_attn.", ("q_proj", "k_proj", "v_proj"), "bias")
        qkv = self._lin(p + "self_attn.qkv_proj", h, wqkv, bqkv)
        q, k, v = qkv.split([H * D, KVH * D, KVH * D], dim=-1)
        q, k = self._qk_norm(p, q, k)
        q, k = A.rotary(K, pos, q, k, D, self.cos_sin)
        o = A.attention(K, q.reshape(T, H, D), k.reshape(T, KVH, D), v.reshape(T, KVH, D),
                        cu_seqlens, max_seqlen, D ** -0.5)
        return self._lin(p + "self_attn.o_proj", o.reshape(T, H * D), self.w(p + "self_attn.o_proj.weight"))

    def _qk_norm(self, p: str, q, k):
        if not self.layout.qk_norm:
            return q, k
        # vLLM: q.view(T, heads, D) -> RMSNorm (rms_norm_batch_invariant flattens to rows of D); at TP=n
        # a rank's q and k hold its heads only
        K, D, T = self.kernels, self.D, q.shape[0]
        q = A.rms_norm(K, q.reshape(-1, D), self.w(p + "self_attn.q_norm.weight"), self.eps).reshape(T, -1)
        k = A.rms_norm(K, k.reshape(-1, D), self.w(p + "self_attn.k_norm.weight"), self.eps).reshape(T, -1)
        return q, k

    def expert_weights(self, p: str) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's stacked expert weights of one layer: w13 [E, 2I, H] (gate rows, then up), w2 [E, H, I]."""
        g, u, d = self.layout.expert_names
        b = p + self.layout.block + "experts."
        e = range(self.n_experts)
        w13 = torch.stack([torch.cat([self.w(f"{b}{j}.{g}.weight"), self.w(f"{b}{j}.{u}.weight")], 0) for j in e])
        w2 = torch.stack([self.w(f"{b}{j}.{d}.weight") for j in e])
        return w13, w2

    def _tp_moe(self, i: int, p: str, h):
        """vLLM's FusedMoE at TP=n (no expert parallelism): the router replicated, each rank's experts
        hold its slice of every expert's intermediate rows (w13: its gate rows then its up rows; w2: its
        columns), a shared expert's partial (sigmoid gate times the rank's down_proj partial) added to
        the rank's routed output, and that sum all-reduced (moe_runner's late all-reduce)."""
        self._check_tp()
        b, tp = p + self.layout.block, self.tp
        logits = self._lin(b + "gate", h, self.w(b + "gate.weight"))
        w13, w2 = self.expert_weights(p)
        inter = w2.shape[2]
        if inter % tp:
            raise ValueError(f"expert intermediate size {inter} not divisible by tp={tp}")
        Ir = inter // tp
        shared = self._tp_mlp_parts(b + "shared_expert.", h) if self.layout.shared_expert else None
        gate = (torch.sigmoid(self._lin(b + "shared_expert_gate", h, self.w(b + "shared_expert_gate.weight")))
                if shared is not None else None)
        parts = []
        for r in range(tp):
            rs = slice(r * Ir, (r + 1) * Ir)
            w13_r = torch.cat([w13[:, rs], w13[:, inter + r * Ir:inter + (r + 1) * Ir]], 1)
            out, weights, ids = moe_block(self.moe_kernels, h, logits, w13_r, w2[:, :, rs], self.top_k,
                                          self.renormalize)
            if r == 0:  # the router is replicated: every rank's route is this one
                self.routes[i] = (ids.detach(), weights.detach())
            parts.append(gate * shared[r] + out if shared is not None else out)
        return self._all_reduce(parts)

    def expert_maps(self) -> list[torch.Tensor]:
        """vLLM's expert map of each EP rank (the EP size is the TP size: FusedMoEParallelConfig.make)."""
        maps = [expert_map(self.tp, r, self.n_experts, self.ep_placement) for r in range(self.tp)]
        check_expert_maps(maps, self.n_experts)
        return maps

    def _ep_moe(self, i: int, p: str, h):
        """vLLM's FusedMoE at TP=2 with enable_expert_parallel (ep.py): the router replicated, each
        rank's fused_experts over its whole local experts with the expert map (another rank's slots
        zero), a shared expert's TP partial added, and the sum all-reduced (the late all-reduce)."""
        self._check_tp()
        b = p + self.layout.block
        w13, w2 = self.expert_weights(p)
        shared = self._tp_mlp_parts(b + "shared_expert.", h) if self.layout.shared_expert else None
        gate = (torch.sigmoid(self._lin(b + "shared_expert_gate", h, self.w(b + "shared_expert_gate.weight")))
                if shared is not None else None)
        parts, self.rank_routes[i] = [], []
        for r, m in enumerate(self.expert_maps()):
            # each rank computes the replicated gate itself, as each vLLM worker does: its route is its own receipt
            logits = self._lin(b + "gate", h, self.w(b + "gate.weight"))
            held = local_experts(m).to(w13.device)
            out, weights, ids = moe_block(self.moe_kernels, h, logits, w13[held], w2[held], self.top_k,
                                          self.renormalize, m.to(h.device))
            self.rank_routes[i].append((ids.detach(), weights.detach()))
            parts.append(gate * shared[r] + out if shared is not None else out)
        self.routes[i] = self.rank_routes[i][0]
        return self._all_reduce(parts)

    def _moe(self, i: int, p: str, h):
        if self.tp > 1 and self.ep:
            return self._ep_moe(i, p, h)
        if self.tp > 1:
            return self._tp_moe(i, p, h)
        b = p + self.layout.block
        logits = self._lin(b + "gate", h, self.w(b + "gate.weight"))
        w13, w2 = self.expert_weights(p)
        out, weights, ids = moe_block(self.moe_kernels, h, logits, w13, w2, self.top_k, self.renormalize)
        self.routes[i] = (ids.detach(), weights.detach())
        if self.layout.shared_expert:
            # vLLM's Qwen2MoeMLP with its expert_gate, then FusedMoE's shared_output + fused_output
            shared = self._dense_mlp(b + "shared_expert.", h)
            gate = self._lin(b + "shared_expert_gate", h, self.w(b + "shared_expert_gate.weight"))
            out = torch.sigmoid(gate) * shared + out
        return out

    def _dense_mlp(self, p: str, h):
        """A dense MLP under prefix p (``<layer>.mlp.`` or a shared expert's)."""
        gu = self._lin(p + "gate_up_proj", h, self.fused(p, ("gate_proj", "up_proj")))
        return self._lin(p + "down_proj", A.silu_and_mul(self.kernels, gu), self.w(p + "down_proj.weight"))

    def hidden(self, ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        K = self.kernels
        pos = torch.cat([torch.arange(int(e - s), device=ids.device)
                         for s, e in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())])
        h = F.embedding(ids, self.w("model.embed_tokens.weight"))
        residual = None
        self.routes, self.rank_routes = {}, {}
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            if residual is None:
                residual = h
                h = A.rms_norm(K, h, self.w(p + "input_layernorm.weight"), self.eps)
            else:
                h, residual = self._fused_add(h, residual, self.w(p + "input_layernorm.weight"))
            if self.tp > 1:
                h = self._tp_attention(p, h, pos, cu_seqlens, max_seqlen)
            else:
                h = self._attention(p, h, pos, cu_seqlens, max_seqlen)
            self._record(f"{i}.attn_out", h)
            h, residual = self._fused_add(h, residual, self.w(p + "post_attention_layernorm.weight"))
            self._record(f"{i}.mlp_in", h)
            if i in self.sparse_layers:
                h = self._moe(i, p, h)
            else:
                h = self._tp_mlp(p, h) if self.tp > 1 else self._dense_mlp(p + "mlp.", h)
            self._record(f"{i}.mlp_out", h)
        h = self._final_norm(h, residual)
        self._record("final", h)
        return h

    def _record(self, name: str, x: torch.Tensor) -> None:
        if self.trace is not None:
            self.trace[name] = x.detach().clone()

    def routes_array(self):
        """The last forward's expert ids as int32 [packed tokens, MoE layers, top-k] (numpy)."""
        import numpy as np

        return np.stack([self.routes[i][0].cpu().numpy() for i in self.sparse_layers], axis=1).astype(np.int32)

    def rank_routes_array(self):
        """The last forward's expert ids of every EP rank, int32 [ranks, packed tokens, MoE layers,
        top-k] (numpy); None where the forward ran no expert parallelism."""
        import numpy as np

        if not self.rank_routes:
            return None
        ranks = len(self.rank_routes[self.sparse_layers[0]])
        return np.stack([np.stack([self.rank_routes[i][r][0].cpu().numpy() for i in self.sparse_layers], axis=1)
                         for r in range(ranks)]).astype(np.int32)

    def routing_receipt(self, start: int = 0, stop: int | None = None) -> list[LayerRoutes]:
        """The last forward's routes of packed tokens [start, stop), one entry per MoE layer in order."""
        out = []
        for i in self.sparse_layers:
            ids, w = self.routes[i]
            out.append(layer_routes(ids[start:stop], w[start:stop]))
        return out


def moe_from_dir(model_dir: str | Path, kernels, moe_kernels, *, device="cpu",
                 compute_dtype: torch.dtype | None = None) -> KernelMoe:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    sd = load_safetensors_dir(model_dir, device=device)
    return KernelMoe(cfg, sd, kernels, moe_kernels, compute_dtype=compute_dtype, device=device)
