"""The shape and load matrix (issue 14): for each model shape and candidate (stock vLLM 0.26, or
0.26 with the RMSNorm overlay), one process holds vLLM BI=1 and the trainer and runs every load:

* loads: ``c1`` (one sequence), ``c64`` and ``c320`` (that many sequences at once, of mixed prompt
  and response lengths: engine steps that mix decode rows with prefill chunks, and decode steps of
  256 rows or more), ``chunked`` (a prompt longer than ``max_num_batched_tokens``, split over
  steps, beside two short ones);
* per load two cells, each a sealed leg of one step: ``decode`` (the trainer on the generated
  tokens vs vLLM's sampled-token logprobs, verl's rollout_log_probs) and ``prefill`` (the trainer
  vs vLLM's prompt_logprobs scoring of prompt + response);
* the trainer is one batched forward over the packed sequences, with no knowledge of the steps
  the engine ran (the product trainer: vLLM's batch-invariant Triton matmul, its paged FA3 layout, its padded
  lm_head); beside it, on the same rollouts, variants that each change one thing (the Triton
  matmul, contiguous K/V, an unpadded lm_head, the old rule that computes decode rows in calls of
  at most 255), whose counts name the cause of a failing cell;
* planted faults (torch log_softmax, HF's final norm) on the decode rows, judged beside their
  control (tica.judges.planted);
* then one AdamW step on the c64 batch, reloaded into vLLM, and c64 again on the new weights.

Suffixed shapes serve a seeded shape's weights another way: ``_fp8`` (vLLM's online FP8), ``_fp8b``
(a block-FP8 checkpoint written from them, 128x128 blocks; ``_fp8bc`` the same with DeepGEMM off), ``_tp2``
(vLLM at tensor-parallel 2, the trainer in its TP=2 layout with a ``trainer_tp1`` control variant)
and ``_ep2`` (a MoE at TP=2 with vLLM's expert parallelism, the trainer in its EP layout, ep.py, with
``trainer_tp1`` and ``trainer_no_ep`` controls and the routes of both ranks).

The orchestrator (``matrix``) builds the models, runs the (candidate, shape) processes two at a
time on the one GPU (engine starts one at a time: a file lock), seals every leg with its
process's exit and packs the receipts.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tica.legs.common import process_identity
from tica.models.hashing import weights_hash

from .ep import DRY_EP, TRAINER_EP_LAYOUT, engine_expert_digests, engine_expert_maps, engine_maps_differ
from .ep import reloaded_experts_equal as ep_reloaded_experts_equal
from .legio import log
from .overlay import CANDIDATE_PARTS, candidate_env, write_plugin_dist
from .rollout import FORWARD_CFG
from .tp import DRY_TP, TRAINER_TP_LAYOUT

CANDIDATES = ("stock", "overlay3")
MATRIX_SHAPES = ("llama3.2-1b_l4", "qwen2.5-0.5b_l4", "smollm2-135m_l16", "qwen2.5-1.5b_l8", "gpt2vocab-mha_l2",
                 "gqa8-v32001_l4")
MATRIX_CFG = dict(FORWARD_CFG, max_num_batched_tokens=2048, max_num_seqs=512, gpu_memory_utilization=0.12)
# a MoE cell: vLLM returns each request's routed experts (the rollout side of the routing receipt);
# room for the larger bf16 weights beside the trainer's
MATRIX_MOE_CFG = dict(MATRIX_CFG, enable_return_routed_experts=True, gpu_memory_utilization=0.15)
SEED = 20261201
VARIANTS = {  # name: (what it changes from the product trainer, kernel attributes, model attributes)
    "product": ("nothing", {}, {}),
    "dispatch_linear": ("every linear through vLLM's dispatch_unquantized_gemm (torch F.linear, cuBLASLt) "
                        "instead of the Triton persistent matmul", {"linear_impl": "dispatch"}, {}),
    "contiguous_kv": ("FA3 over packed contiguous K/V instead of vLLM's paged cache", {"attention_layout": "contiguous"}, {}),
    "unpadded_lm_head": ("lm_head on the vocabulary as is, not padded to 64 rows (dense logits)", {}, {"vocab_pad": 1}),
    "dense_logits": ("the logits copied to a dense [T, V] tensor before the logprob kernel, instead of vLLM's view "
                     "with the padded vocabulary's row stride (the product trainer before matrix4)",
                     {"logits_layout": "dense"}, {}),
    "decode_rows_255": ("generated-token rows through fused_add_rms_norm in calls of <= 255 rows", {}, {"decode255": True}),
    "vllm_decode_rows": ("generated-token rows as a pure-decode step computes them: fused_add_rms_norm in calls of "
                         "<= 255 rows and attention as one query over its paged prefix (max_seqlen_q 1)",
                         {}, {"decode255": True, "decode_query": True}),
    "unchunked": ("every row-wise kernel given all the packed rows in one call (no ROW_CALL_ELEMS bound): the "
                  "control that shows the 32-bit row offset limit", {"row_limit": None}, {}),
    "trainer_tp1": ("the trainer in the TP=1 layout against a TP=2 rollout (one matmul per linear, no partial "
                    "sums): a control, the layout mismatch must show", {}, {"tp": 1}),
    "trainer_no_ep": ("the trainer's MoE in the TP=2 layout (every expert's rows split over the ranks) against an "
                      "EP=2 rollout (whole experts per rank): a control, the layout mismatch must show", {}, {"ep": False}),
}
PACKED_LOAD = "packed_limit"  # a dense shape's load past the row bound
MOE_PACKED_LOAD = "moe_packed"  # a MoE shape's
PACKED_LOADS = (PACKED_LOAD, MOE_PACKED_LOAD)  # the only loads where "unchunked" differs from the product trainer
STOCK_ONLY = ("decode_rows_255", "vllm_decode_rows")  # probes of the step-dependent kernels the overlay removes
FAULTS = (("fault_log_softmax", "logprob:torch.log_softmax",
           "torch.log_softmax on fp32 logits instead of the V2 runner's logprob kernel"),
          ("fault_hf_final_norm", "model.norm:hf_rmsnorm",
           "HF transformers' LlamaRMSNorm for the final norm instead of vLLM's"))


@dataclass(frozen=True)
class Load:
    n: int
    prompt: tuple[int, int]  # length range [lo, hi)
    gen: tuple[int, int]
    fixed_prompts: tuple[int, ...] = ()  # lengths, in order, instead of the range


LOADS = {
    "c1": Load(1, (600, 601), (64, 65)),
    "c64": Load(64, (32, 256), (16, 64)),
    "c320": Load(320, (8, 32), (4, 32)),
    # short prompts first, so the long one's second chunk shares a step with their decode rows
    "chunked": Load(3, (0, 0), (32, 64), fixed_prompts=(150, 120, 2300)),
    # ~273k tokens in the trainer's one packed forward: past 2^32 / (2 x 8192) = 262,144 rows, where one
    # _C.silu_and_mul call of llama3.2-1b's width goes wrong (the trainer calls it in bounded ranges)
    PACKED_LOAD: Load(136, (1990, 2000), (8, 16)),
}
# A MoE cell's loads: the same kinds (one long sequence, mixed prefill chunks and decode rows,
# decode steps of 256 rows and more, a chunked long prompt) at fewer tokens, since each token also
# carries its routes (layers x top-k expert ids a side) and the committed receipts must stay small.
LOADS.update({
    "c16": Load(16, (32, 256), (16, 64)),
    "c256s": Load(256, (4, 12), (6, 12)),
    # ~80k tokens in one packed forward: past 2^32 / (2 x 14336) / 2 = 74,898 tokens, where one call of
    # vLLM's fused_experts (Mixtral's 8 x 14336, top-2; its silu_and_mul sees tokens x top_k rows) goes
    # wrong; the trainer calls it on token ranges under the bound (moe.expert_calls)
    MOE_PACKED_LOAD: Load(40, (1990, 2000), (8, 16)),
})
MOE_LOADS = ("c1", "c16", "c256s", "chunked")
# packed_limit costs two ~273k-token vLLM passes per cell (moe_packed two of ~80k): asked for by name
# (--loads), never by default
DEFAULT_LOADS = ("c1", "c64", "c320", "chunked")
UPDATE_LOAD = "c64"
FAULT_LOAD = "c64"
MOE_UPDATE_LOAD = "c16"  # a MoE cell's update batch and planted faults'


# An FP8 cell (issue 33): the seeded bf16 shape served with vLLM's online FP8 (`<shape>_fp8`), on
# fewer loads (one long sequence, a mixed batch that holds the update, a chunked prompt)
QUANT_SUFFIXES = {"_fp8": "fp8", "_fp8b": "fp8_block", "_fp8bc": "fp8_block"}
# `<shape>_fp8b` (issue 33, block-wise FP8): <shape>'s bf16 weights written as a block-FP8 checkpoint
# (DeepSeek-V3 / Qwen3-FP8 format, 128x128 weight blocks: fp8_block.py), served by vLLM from that
# checkpoint; the trainer computes each linear on vLLM's block-FP8 kernel. The engine's quantization
# argument is "fp8" for both (the checkpoint's quantization_config says block).
ENGINE_QUANTIZATION = {"fp8": "fp8", "fp8_block": "fp8"}
# `<shape>_fp8bc`: the same block-FP8 cell with vLLM's DeepGEMM switched off (VLLM_USE_DEEP_GEMM=0 in the
# cell's environment, before vLLM is imported), so vLLM 0.26 picks its next block kernel on sm90,
# CutlassFp8BlockScaledMMKernel: the cell that runs where DeepGEMM's JIT cannot build its kernels
SUFFIX_ENV = {"_fp8bc": {"VLLM_USE_DEEP_GEMM": "0"}}


def cell_env(shape: str) -> dict:
    """Environment variables a cell's shape suffix sets for its process (vLLM reads them at import)."""
    return next((env for suffix, env in SUFFIX_ENV.items() if shape.endswith(suffix)), {})
FP8B_MOE_NOT_RUN = ("a block-FP8 MoE cell is not written: the trainer does not follow vLLM's FP8 experts (per-tensor "
                    "FP8 cells record why); block FP8 cells are dense. No engine was started")
FP8_LOADS = ("c1", "c64", "chunked")
FP8_MOE_LOADS = ("c1", "c16", "chunked")


def shape_quantization(shape: str) -> tuple[str, str | None]:
    """(the seeded shape whose bf16 weights the cell serves, the quantization vLLM serves them with)."""
    for suffix, quant in QUANT_SUFFIXES.items():
        if shape.endswith(suffix):
            return shape[:-len(suffix)], quant
    return shape, None


# A TP=2 cell (issue 34): `<shape>_tp2` serves <shape> with vLLM over two GPUs (tensor_parallel_size=2)
# and the trainer in vLLM's TP=2 layout (KernelLlama.tp, as `producers bi1-tp` runs it), at the
# matrix's loads. Not combined with another suffix yet.
PARALLEL_SUFFIXES = {"_tp2": 2, "_ep2": 2}
# `<moe_shape>_ep2`: TP=2 with vLLM's enable_expert_parallel=True, the trainer in its EP layout
# (KernelMoe.ep: whole experts per rank by vLLM's expert map, ep.py); a dense shape is written not run
EXPERT_PARALLEL_SUFFIX = "_ep2"
EP_DENSE = "expert parallelism needs a MoE shape; this one is dense. No engine was started"


def shape_tensor_parallel(shape: str) -> tuple[str, int]:
    """(the shape without its parallel suffix, the tensor-parallel size the cell serves it at)."""
    for suffix, tp in PARALLEL_SUFFIXES.items():
        if shape.endswith(suffix):
            return shape[:-len(suffix)], tp
    return shape, 1


def base_shape(shape: str) -> str:
    """The seeded shape whose weights a cell serves (its one suffix removed); refused for two suffixes."""
    no_tp, tp = shape_tensor_parallel(shape)
    base, quant = shape_quantization(no_tp)
    if (tp > 1 and quant) or shape_tensor_parallel(base)[1] > 1:
        raise ValueError(f"{shape}: a parallel suffix combines with no other suffix yet")
    return base


def cell_loads(requested: str, moe: bool, quant: str | None = None) -> tuple[list[str], str]:
    """(loads, the update's load) of one cell: the requested ones, else its kind's defaults."""
    default = (FP8_MOE_LOADS if moe else FP8_LOADS) if quant else (MOE_LOADS if moe else DEFAULT_LOADS)
    loads = [x for x in requested.split(",") if x] or list(default)
    return loads, MOE_UPDATE_LOAD if moe else UPDATE_LOAD


LR = 5e-3


def leg_name(candidate: str, shape: str, load: str, kind: str) -> str:
    return f"mx-{candidate}-{shape}-{load}-{kind}"


def workload(load: str, vocab: int, salt: int = 0) -> tuple[list[list[int]], list[int], list[int]]:
    """(prompts, generated lengths, sampling seeds) of one load: fixed by the load's name."""
    spec = LOADS[load]
    r = random.Random(f"{SEED}-{load}-{salt}")
    lens = list(spec.fixed_prompts) or [r.randrange(*spec.prompt) for _ in range(spec.n)]
    prompts = [[r.randrange(3, vocab) for _ in range(n)] for n in lens]
    gens = [r.randrange(*spec.gen) for _ in lens]
    return prompts, gens, [SEED % 100000 + 1000 * salt + i for i in range(len(lens))]


# ------------------------------------------------------------------------------- the rollout side
def vllm_rollout(llm, prompts, gens, seeds) -> dict:
    """Generate (all sequences submitted at once), then score prompt + response with
    prompt_logprobs=0 in one batch, the sequences reversed."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sps = [SamplingParams(temperature=1.0, seed=s, logprobs=0, max_tokens=g, ignore_eos=True, detokenize=False)
           for s, g in zip(seeds, gens)]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sps, use_tqdm=False)
    gen_tok = [list(o.outputs[0].token_ids) for o in outs]
    dec = [[d[t].logprob for d, t in zip(o.outputs[0].logprobs, toks)] for o, toks in zip(outs, gen_tok)]
    fulls = [p + g for p, g in zip(prompts, gen_tok)]
    order = list(reversed(range(len(fulls))))
    sp = SamplingParams(temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False, seed=7)
    pouts = llm.generate([TokensPrompt(prompt_token_ids=fulls[j]) for j in order], sp, use_tqdm=False)
    prefill: list = [None] * len(fulls)
    pre_routes: list = [None] * len(fulls)
    for j, o in zip(order, pouts):
        prefill[j] = [pl[t].logprob for pl, t in zip(o.prompt_logprobs[1:], fulls[j][1:])]
        pre_routes[j] = o.outputs[0].routed_experts
    alone = None
    if len(fulls) > 1:  # the first sequence scored again by itself: vLLM against its own batch
        o = llm.generate([TokensPrompt(prompt_token_ids=fulls[0])], sp, use_tqdm=False)[0]
        alone = [pl[t].logprob for pl, t in zip(o.prompt_logprobs[1:], fulls[0][1:])]
    # vLLM's routed experts (enable_return_routed_experts, the engine's rollout routing record):
    # [rows the model ran for the request, MoE layers, top-k]; None where the engine returns none
    return {"fulls": fulls, "gens": gen_tok, "decode": dec, "prefill": prefill, "prefill_alone": alone,
            "routes": {"decode": [o.outputs[0].routed_experts for o in outs], "prefill": pre_routes,
                       "source": "vLLM's routed experts (enable_return_routed_experts)"}}


def fake_rollout(model, prompts, gens, seeds) -> dict:
    """CPU dry run: tokens drawn at random, both logprob kinds from the reference model."""
    import torch

    from .forward_leg import trainer_logprobs

    g = torch.Generator().manual_seed(seeds[0])
    V = model.config["vocab_size"]
    gen_tok = [[int(x) for x in torch.randint(3, V, (n,), generator=g)] for n in gens]
    fulls = [p + t for p, t in zip(prompts, gen_tok)]
    lp = trainer_logprobs(model, fulls, "cpu")
    prefill, dec, o = [], [], 0
    for f, t in zip(fulls, gen_tok):
        n = len(f) - 1
        prefill.append([float(x) for x in lp[o:o + n]])
        dec.append([float(x) for x in lp[o + n - len(t):o + n]])
        o += n
    ro = {"fulls": fulls, "gens": gen_tok, "decode": dec, "prefill": prefill}
    if hasattr(model, "routes_array"):  # a MoE: the routes of the forward that gave the logprobs
        routes, per, o = model.routes_array(), [], 0
        for f in fulls:
            per.append(routes[o:o + len(f) - 1])  # the rows the engine runs: all but the last token
            o += len(f)
        ro["routes"] = {"decode": per, "prefill": per, "source": "the reference model's own routes (CPU dry run)"}
    if len(fulls) > 1:  # after the routes: this forward replaces the model's last routes
        ro["prefill_alone"] = [float(x) for x in trainer_logprobs(model, fulls[:1], "cpu")]
    return ro


# ------------------------------------------------------------------------------- the trainer side
def trainer_rows(model, ro: dict, device, *, decode255: bool = False, decode_query: bool = False):
    """The trainer's logprob of every scored token (packed, one forward) and the decode mask."""
    import numpy as np
    import torch

    from .model import pack

    ids, cu, mx = pack(ro["fulls"], device)
    mask = torch.zeros(ids.numel(), dtype=torch.bool, device=device)
    for s, f, g in zip(cu[:-1].tolist(), ro["fulls"], ro["gens"]):
        # the rows whose input is a generated token ran in decode steps (the last prompt row, which
        # scores the first generated token, ran in the prefill)
        mask[s + len(f) - len(g): s + len(f)] = True
    if decode255:
        model.decode_rows = mask
    if decode_query:
        model.kernels.decode_query_rows = mask
    try:
        with torch.no_grad():
            lp = model.logprobs(ids, cu, mx).float().cpu().numpy()
    finally:
        model.decode_rows = None
        if decode_query:
            model.kernels.decode_query_rows = None
    dmask = np.concatenate([[False] * (len(f) - 1 - len(g)) + [True] * len(g) for f, g in zip(ro["fulls"], ro["gens"])])
    return lp.astype(np.float32), dmask.astype(bool)


def with_variant(model, kernels, name: str):
    """Set one variant's attributes; returns the undo."""
    _, kattrs, mattrs = VARIANTS[name]
    saved_k = {k: getattr(kernels, k) for k in kattrs if hasattr(kernels, k)}
    saved_m = {k: getattr(model, k) for k in mattrs if k not in ("decode255", "decode_query")}
    for k, v in kattrs.items():
        if hasattr(kernels, k):
            setattr(kernels, k, v)
    for k, v in mattrs.items():
        if k not in ("decode255", "decode_query"):
            setattr(model, k, v)

    def undo():
        for k, v in saved_k.items():
            setattr(kernels, k, v)
        for k, v in saved_m.items():
            setattr(model, k, v)
    return undo


def nbits(a, b) -> int:
    import numpy as np

    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))


MOE_FAULTS = (("fault_torch_router", "router:torch_softmax_topk",
               "torch's fp32 softmax and top-k choose each route instead of vLLM's topk_softmax"),)
# Where the engine ran the V1 sampler, torch.log_softmax on fp32 logits IS its op (under BI=1 the
# batch-invariant Triton log_softmax): the planted logprob fault is then the other runner's kernel.
V1_LOGPROB_FAULT = ("fault_other_runner_logprob", "logprob:v2_runner",
                    "the V2 runner's logprob kernel instead of the V1 sampler's log_softmax, the op this engine ran")


def planted_faults(kernels, moe: bool) -> tuple:
    faults = tuple(V1_LOGPROB_FAULT if f[0] == "fault_log_softmax" and getattr(kernels, "logprob", None) == "v1_sampler"
                   else f for f in FAULTS)
    return faults + (MOE_FAULTS if moe else ())


def plant(model, target: str):
    """Plant one fault in the product trainer; returns the undo."""
    if target == V1_LOGPROB_FAULT[1]:
        was = model.kernels.logprob
        model.kernels.logprob = "v2_runner"
        return lambda: setattr(model.kernels, "logprob", was)
    if target == MOE_FAULTS[0][1]:
        from .moe import TorchRouterFault

        inner = model.moe_kernels
        model.moe_kernels = TorchRouterFault(inner)
        return lambda: setattr(model, "moe_kernels", inner)
    model.fault = target
    return lambda: setattr(model, "fault", None)


def cell_routes(ro: dict, kind: str, trainer_routes):
    """(rollout experts, trainer experts, where they came from) per scored token of one cell: the
    route of the row whose output scores the token (token j's logprob is row j-1's). Prefill cells
    score tokens 1..L-1 (rows 0..L-2); decode cells the generated tokens (the last G rows of those).
    Arrays are None, with the reason, where vLLM returned no routes or fewer rows than scored."""
    import numpy as np

    if trainer_routes is None:
        return None, None, "not a MoE"
    got = (ro.get("routes") or {}).get(kind)
    r_parts, t_parts, o = [], [], 0
    for i, (f, g) in enumerate(zip(ro["fulls"], ro["gens"])):
        lo = len(f) - 1 - len(g) if kind == "decode" else 0
        hi = len(f) - 1
        rr = None if got is None else got[i]
        if rr is None or np.asarray(rr).ndim != 3 or len(rr) < hi:
            have = None if rr is None else np.asarray(rr).shape
            return None, None, (f"vLLM returned no routed experts for sequence {i}" if rr is None else
                                f"vLLM returned routed experts of shape {have} for sequence {i}, {hi} rows needed")
        r_parts.append(np.asarray(rr)[lo:hi])
        t_parts.append(trainer_routes[o + lo:o + hi])
        o += len(f)
    r, t = np.concatenate(r_parts), np.concatenate(t_parts)
    if r.shape != t.shape:
        return None, None, f"vLLM's routes are {list(r.shape[1:])} per token, the trainer's {list(t.shape[1:])}"
    return r, t, f"{ro['routes']['source']}, " + ("generate call" if kind == "decode" else "prompt_logprobs scoring call")


def run_load(legs: Path, cand: str, shape: str, load: str, ro: dict, model, kernels, dev: str, ck: str,
             common: dict, started: str, *, kind_suffix: str = "", probe: dict | None = None) -> dict:
    """Every variant on this load's rollouts; writes the decode and prefill legs (the product
    trainer's arrays) and the planted-fault legs. Returns the summary row."""
    import numpy as np

    from . import legio

    dec_roll = np.asarray([x for d in ro["decode"] for x in d], np.float32)
    pre_roll = np.asarray([x for p in ro["prefill"] for x in p], np.float32)
    variants: dict[str, dict] = {}
    product = None
    for name, (what, _, mattrs) in VARIANTS.items():
        if name in STOCK_ONLY and kernels_norm(kernels) == "overlay":
            continue  # the overlay removed the step-dependent kernels these probe
        if mattrs.get("decode_query") and getattr(kernels, "attention_layout", None) != "paged":
            continue  # the decode query runs on vLLM's kernels only
        if name == "unchunked" and load not in PACKED_LOADS:
            continue  # below the bound, one call is what the product trainer makes anyway
        if name == "trainer_tp1" and getattr(model, "tp", 1) == 1:
            continue  # the layout control of a TP=2 cell only
        if name == "trainer_no_ep" and not getattr(model, "ep", False):
            continue  # the layout control of an EP=2 cell only
        if hasattr(kernels, "largest_call"):
            kernels.largest_call = {}
        undo = with_variant(model, kernels, name)
        try:
            lp, dmask = trainer_rows(model, ro, dev, decode255=bool(mattrs.get("decode255")),
                                     decode_query=bool(mattrs.get("decode_query")))
        finally:
            undo()
        variants[name] = {"changes": what, "decode_n_diff": nbits(lp[dmask], dec_roll),
                          "prefill_n_diff": nbits(lp, pre_roll),
                          "largest_call_rows": dict(getattr(kernels, "largest_call", {}))}
        if name == "product":
            product = (lp, dmask, model.routes_array() if hasattr(model, "routes_array") else None,
                       model.rank_routes_array() if getattr(model, "ep", False) else None)
    lp, dmask, trainer_routes, rank_routes = product
    routes = {kind: cell_routes(ro, kind, trainer_routes) for kind in ("decode", "prefill")}
    # an EP cell: the route each rank's replicated router chose, per scored token ([ranks, tokens, layers, k])
    ranks = {kind: None if rank_routes is None or routes[kind][0] is None else
             np.stack([cell_routes(ro, kind, r)[1] for r in rank_routes]) for kind in ("decode", "prefill")}
    vllm_self = nbits(dec_roll, pre_roll[dmask])
    shape_rec = {"tica/load": load, "tica/load_spec": LOADS[load].__dict__ | {"n_sequences": len(ro["fulls"])},
                 "tica/variants": variants, "tica/vllm_decode_vs_prefill_n_bitwise_diff": vllm_self,
                 "tica/seq_len_max": max(len(f) for f in ro["fulls"]), "tica/n_generated": int(dmask.sum()),
                 "tica/packed_rows": int(sum(len(f) for f in ro["fulls"])),
                 "tica/row_call_elems": getattr(kernels, "row_limit", None),
                 "tica/largest_kernel_call_rows": variants["product"]["largest_call_rows"]}
    if trainer_routes is not None:  # a MoE: where each side's routes came from, or why a cell has none
        shape_rec["tica/routes"] = {kind: r[2] for kind, r in routes.items()}
    if rank_routes is not None:
        shape_rec["tica/ep_rank_routes"] = ep_rank_record(rank_routes)
    if ro.get("prefill_alone") is not None:
        # vLLM against itself: the first sequence's prompt_logprobs alone vs in this load's batch (a
        # batch-variant engine, e.g. FP8 experts scaled over the whole batch, differs here)
        shape_rec["tica/vllm_alone_vs_batch_n_bitwise_diff"] = nbits(ro["prefill_alone"], ro["prefill"][0])
        shape_rec["tica/vllm_alone_vs_batch_n_tokens"] = len(ro["prefill"][0])
    kern = {"trainer": kernels_describe(kernels), "rollout": common["rollout_kernels"]}
    if getattr(model, "fp8_linears", None):
        kern["trainer"] = dict(kern["trainer"], linear_fp8={"linears": len(model.fp8_linears), **model.fp8.describe()})
    for kind, tr, roll, tok, lens in (
            ("decode", lp[dmask], dec_roll, [t for g in ro["gens"] for t in g], [len(g) for g in ro["gens"]]),
            ("prefill", lp, pre_roll, [t for f in ro["fulls"] for t in f[1:]], [len(f) - 1 for f in ro["fulls"]])):
        d = legs / leg_name(cand, shape, load, kind + kind_suffix)
        r_ex, t_ex, _ = routes[kind]
        legio.write_step_arrays(d, 1, token_ids=tok, seq_lens=lens, trainer_logprobs=tr, rollout_logprobs=roll,
                                rollout_experts=r_ex, trainer_experts=t_ex, trainer_experts_ranks=ranks[kind])
        row = legio.step_row(1, ck, tr, roll, dict(shape_rec, **{"tica/scored": kind}))
        legio.write_jsonl(d / "metrics.jsonl", [row])
        if probe is not None and kind == "prefill":
            (d / "kernel_probe.json").write_text(json.dumps(probe, indent=1))
        meta = legio.new_meta("forward", legio.kernels_arm(), trainer="vllm_kernels", started_at=started)
        meta["ended_at"] = legio.now()
        meta["kernels"] = kern
        meta["resolved_config"] = dict(common["config"], load=load, scored=kind, weights_hash=ck,
                                       rollout_logprobs="vLLM sampled-token logprobs (SamplingParams.logprobs=0)"
                                       if kind == "decode" else "vLLM prompt_logprobs=0 over prompt + response")
        legio.write_meta(d, meta)
    if load == (FAULT_LOAD if trainer_routes is None else MOE_UPDATE_LOAD) and not kind_suffix:
        # per shape, beside its control (tica.judges.planted)
        for fname, target, what in planted_faults(kernels, trainer_routes is not None):
            undo = plant(model, target)
            try:
                flp, fmask = trainer_rows(model, ro, dev)
                f_routes = cell_routes(ro, "decode", model.routes_array()) if trainer_routes is not None else (None, None, "")
            finally:
                undo()
            d = legs / leg_name(cand, shape, load, fname)
            legio.write_step_arrays(d, 1, token_ids=[t for g in ro["gens"] for t in g], seq_lens=[len(g) for g in ro["gens"]],
                                    trainer_logprobs=flp[fmask], rollout_logprobs=dec_roll,
                                    rollout_experts=f_routes[0], trainer_experts=f_routes[1])
            legio.write_jsonl(d / "metrics.jsonl", [legio.step_row(1, ck, flp[fmask], dec_roll, {"tica/planted_fault": target})])
            meta = legio.new_meta("forward", legio.kernels_arm(), trainer="vllm_kernels", started_at=started)
            meta["ended_at"] = legio.now()
            meta["kernels"] = dict(kern, planted_fault={target: what})
            meta["resolved_config"] = dict(common["config"], load=load, scored="decode", weights_hash=ck, canary=True,
                                           control=leg_name(cand, shape, load, "decode"),
                                           planted_fault={"target": target, "replacement": what,
                                                          "expect": "nonzero diff: the criterion must fail"})
            legio.write_meta(d, meta)
    log(f"{cand} {shape} {load}{kind_suffix}: " + " ".join(
        f"{k}={v['decode_n_diff']}/{v['prefill_n_diff']}" for k, v in variants.items())
        + f" (of {int(dmask.sum())}/{lp.size}); vLLM decode vs prefill {vllm_self}")
    return {"load": load + kind_suffix, "variants": variants, "vllm_decode_vs_prefill": vllm_self,
            "n_decode": int(dmask.sum()), "n_prefill": int(lp.size)}


def ep_rank_record(rank_routes) -> dict:
    """The EP ranks' routes of the packed forward against rank 0's (the replicated router: equal)."""
    import numpy as np

    differ = (np.sort(rank_routes, -1) != np.sort(rank_routes[:1], -1)).any(-1)  # ranks x tokens x layers
    return {"ranks": int(rank_routes.shape[0]), "token_layer_routes": int(differ[0].size),
            "differing_from_rank0": [int(x) for x in differ.reshape(differ.shape[0], -1).sum(1)],
            "source": "each emulated rank's router (KernelMoe.rank_routes)"}


def kernels_norm(kernels) -> str:
    return getattr(kernels, "norm", "reference")


# The op each VllmKernels.logprob setting runs, as a leg records it (kernels.py says why there are two).
LOGPROB_OPS = {"v2_runner": "V2 runner compute_token_logprobs",
               "v1_sampler": "V1 sampler log_softmax(dtype=float32) (batch-invariant Triton under BI=1)"}


def kernels_describe(kernels) -> dict:
    d = kernels.describe() if hasattr(kernels, "describe") else {"kernels": getattr(kernels, "name", "?")}
    pad = getattr(kernels, "vocab_pad", 1)
    # the op the trainer ran, read from it: a kernel set that does not say records it as unknown
    return dict(d, lm_head=f"padded to a multiple of {pad} rows (vLLM's ParallelLMHead)" if pad > 1 else "not padded",
                logprob=LOGPROB_OPS.get(getattr(kernels, "logprob", None), "unknown"))


def trainer_model(m0: Path, kernels, dev: str, moe: bool):
    """The product trainer's model: KernelLlama, or KernelMoe on vLLM's MoE kernels (the torch
    reference's on a CPU dry run)."""
    from .model import from_dir

    if not moe:
        return from_dir(m0, kernels, device=dev)
    from .moe import TorchMoeReference, VllmMoeKernels, moe_from_dir

    return moe_from_dir(m0, kernels, TorchMoeReference if dev == "cpu" else VllmMoeKernels(), device=dev)


def moe_shape(model) -> dict:
    return {"architecture": model.arch, "experts": model.n_experts, "top_k": model.top_k,
            "renormalize": model.renormalize, "moe_layers": model.sparse_layers,
            "shared_expert": model.layout.shared_expert, "kernels": model.moe_kernels.describe()
            if hasattr(model.moe_kernels, "describe") else getattr(model.moe_kernels, "name", "?")}


def recorded(check) -> dict:
    """A diagnostic's result, or the error it raised, recorded (the cell goes on to its next legs)."""
    try:
        return check()
    except Exception as err:  # noqa: BLE001 - recorded in the receipt, not hidden
        return {"error": f"{type(err).__name__}: {str(err)[:400]}"}


def reloaded_experts_equal(llm, model) -> dict:
    """After the reload: each MoE layer's w13/w2 in vLLM against the trainer's stacked deployed bytes."""
    import torch

    want = {i: model.expert_weights(f"model.layers.{i}.") for i in model.sparse_layers}

    def check(m):
        got = {}
        for n, prm in m.named_parameters():
            parts = n.split(".")
            if ("w13_weight" in n or "w2_weight" in n) and "layers" in parts:
                i = int(parts[parts.index("layers") + 1])
                ref = want[i][0 if "w13" in n else 1]
                got[n] = bool(prm.shape == ref.shape and torch.equal(prm.data, ref.to(prm.dtype)))
        return got

    with torch.no_grad():
        got = llm.apply_model(check)[0]
    return {"tensors": len(got), "equal": sum(got.values()), "differ": sorted(k for k, v in got.items() if not v)}


def product_trainer(candidate: str, rollout) -> tuple:
    """The product trainer for `candidate` beside its running engine: vLLM's Triton matmul, its paged
    FA3 layout and block size, the candidate's norm; refused when the overlay parts vLLM runs in this
    process are not the candidate's. Returns (kernels, what the rollout ran, the parts)."""
    from . import overlay
    from .kernels import VllmKernels

    parts = overlay.active()
    if parts != list(CANDIDATE_PARTS[candidate] or []):
        raise SystemExit(f"candidate {candidate} wants overlay parts {CANDIDATE_PARTS[candidate]} but vLLM "
                         f"runs {parts}: refusing to record it")
    vc = rollout.llm.llm_engine.vllm_config
    block = int(vc.cache_config.block_size)
    # the logprob op of the model runner vLLM chose (0.26 runs MoE models on V1 unless listed for V2,
    # and V1 whenever routed experts are returned)
    v2 = bool(getattr(vc, "use_v2_model_runner", True))
    kernels = VllmKernels(linear="triton", norm="overlay" if "rmsnorm" in parts else "stock", attention_layout="paged",
                          block_size=block, logprob="v2_runner" if v2 else "v1_sampler")
    rollout_kernels = {"attention": "FLASH_ATTN", **rollout.selected(), "block_size": block,
                       "rms_norm_residual": "overlay: bf16 add + Triton rms_norm" if "rmsnorm" in parts
                       else "_C.fused_add_rms_norm (stock 0.26)",
                       "attention_tile": "overlay: every step on FA3's two-warpgroup causal tile (max_seqlen_q >= 65)"
                       if "fa_pin_tile" in parts else "FA3 as vLLM calls it (tile from the step's max_seqlen_q)"}
    return kernels, rollout_kernels, parts


# ------------------------------------------------------------------------------- one process
def cmd_matrix_cell(a) -> int:
    """One (candidate, shape): vLLM BI=1 in this process, every load, the update, c64 again."""
    import torch

    from . import legio

    dry = a.dry_run
    if not dry and os.environ.get("VLLM_BATCH_INVARIANT") != "1":
        raise SystemExit("matrix-cell needs VLLM_BATCH_INVARIANT=1 in its environment")
    legs, m0 = Path(a.legs), Path(a.model)
    cfg = json.loads((m0 / "config.json").read_text())
    ck0 = weights_hash(m0)
    dev = "cpu" if dry else "cuda"
    started = legio.now()
    from .moe import MOE_ARCHITECTURES

    moe = cfg["architectures"][0] in MOE_ARCHITECTURES
    base_shape(a.shape)  # refuses a shape of two suffixes
    no_tp, tp = shape_tensor_parallel(a.shape)
    _, quant = shape_quantization(no_tp)
    engine_cfg = dict(MATRIX_MOE_CFG if moe else MATRIX_CFG,
                      **({"quantization": ENGINE_QUANTIZATION[quant]} if quant else {}),
                      **({"tensor_parallel_size": tp} if tp > 1 else {}))
    ep = a.shape.endswith(EXPERT_PARALLEL_SUFFIX)
    if ep:
        engine_cfg["enable_expert_parallel"] = True
    if ep and not moe:  # before any engine starts
        cell_not_run(a, {"model": str(m0), "model_shape": a.shape, "candidate": a.candidate, **engine_cfg},
                     cell_loads(getattr(a, "loads", None) or "", moe, quant)[0], EP_DENSE)
        return 0
    serve = m0  # the checkpoint vLLM serves: m0, or for a block-FP8 cell its FP8 checkpoint written here
    block_ckpt = None
    if quant == "fp8_block":
        from .fp8_block import unaligned_linears, write_block_checkpoint
        from .model import load_safetensors_dir

        odd = [] if moe else unaligned_linears(cfg)
        if moe or odd:
            reason = FP8B_MOE_NOT_RUN if moe else (
                f"block FP8 needs every linear's N and K a multiple of 128 here: {odd} are not (the trainer "
                "quantizes the fused q/k/v and gate/up weights, whose blocks would straddle shards, and vLLM's "
                "validate_fp8_block_shape refuses most such shapes). No engine was started")
            cell_not_run(a, {"model": str(m0), "model_shape": a.shape, "candidate": a.candidate, **engine_cfg,
                             "quantization": quant}, cell_loads(getattr(a, "loads", None) or "", moe, quant)[0], reason)
            return 0
        serve = Path(a.work) / f"m0-fp8b-{a.candidate}-{a.shape}"
        block_ckpt = write_block_checkpoint(load_safetensors_dir(m0, device=dev), m0, serve)
        ck0 = weights_hash(serve)
        block_ckpt.update(weights_hash=ck0, written_on=dev, from_bf16_weights_hash=weights_hash(m0))
    fp8_rec = None
    if dry:
        from .kernels import TorchReference

        kernels = TorchReference
        model = trainer_model(m0, kernels, dev, moe)
        roll = lambda p, g, s: fake_rollout(model, p, g, s)  # noqa: E731
        rollout_kernels = {"fake": "CPU dry run: the reference model"}
        parts = list(CANDIDATE_PARTS[a.candidate] or [])
        pin = {"dry_run": True}
        llm = None
        all_reduce = [{"dry_run": DRY_EP if ep else DRY_TP} for _ in range(tp)] if tp > 1 else None
        engine_maps = None
        if quant:
            fp8_rec = fp8_setup(model, None, moe, quant)
    else:
        from .rollout import VllmRollout

        from .fp8 import VllmLogLines

        with engine_start_lock(Path(a.lock)), VllmLogLines() as vllm_lines:
            t = time.time()
            try:
                # the overlay, if any, came in as vLLM's general plugin
                rollout = VllmRollout(serve, **engine_cfg)
            except Exception as err:  # noqa: BLE001 - a quantized engine vLLM refuses: its cells not run, its reason kept
                if not quant:
                    raise
                refused_engine(a, serve, engine_cfg, quant, moe, f"{type(err).__name__}: {str(err)[:1500]}",
                               vllm_lines.lines)
                return 0
            log(f"{a.candidate} {a.shape}: engine up in {time.time() - t:.1f}s")
        # registered after vLLM's own exit handlers, so it runs before them (atexit is last in, first out)
        atexit.register(hold_start_lock_until_exit, Path(a.lock))
        llm = rollout.llm
        from .pin import check_vllm

        pin = check_vllm()
        kernels, rollout_kernels, parts = product_trainer(a.candidate, rollout)
        model = trainer_model(m0, kernels, dev, moe)  # the lm_head padded to 64 rows: VllmKernels.vocab_pad
        all_reduce = None
        if tp > 1:
            from .tp import _all_reduce_record

            # each worker's TP group: its all-reduce (custom, pynccl, symmetric memory: which are on) and
            # the NCCL variables vLLM set under BI=1 (batch_invariant.override_envs_for_invariance)
            all_reduce = recorded(lambda: llm.collective_rpc(_all_reduce_record))
            rollout_kernels["all_reduce"] = all_reduce
        engine_maps = recorded(lambda: llm.apply_model(engine_expert_maps)) if ep else None
        roll = lambda p, g, s: vllm_rollout(llm, p, g, s)  # noqa: E731
        rollout_kernels["vllm_log"] = vllm_lines.lines  # vLLM's own lines about the kernels it chose
        if quant:
            fp8_rec = fp8_setup(model, llm, moe, quant)
            rollout_kernels["quantization"] = {"method": quant, **fp8_rec["vllm"],
                                               "kv_cache_dtype": str(llm.llm_engine.vllm_config.cache_config.cache_dtype)}
            if fp8_rec.get("not_followed_reason"):  # the engine's block-FP8 kernel is one the trainer does not call
                cell_not_run(a, {"model": str(serve), "model_shape": a.shape, "candidate": a.candidate, **engine_cfg,
                                 "quantization": quant, "fp8": fp8_rec, "vllm_log": vllm_lines.lines},
                             cell_loads(getattr(a, "loads", None) or "", moe, quant)[0], fp8_rec["not_followed_reason"])
                return 0
    if fp8_rec is not None and block_ckpt is not None:
        fp8_rec["checkpoint"] = block_ckpt
    model.tp = tp  # the dry run's fake rollout scores with this same model: its TP=2 layout too
    ep_rec = None
    if ep:
        model.ep = True
        maps = model.expert_maps()
        ep_rec = {"ep_size": tp, "placement": model.ep_placement, "trainer": TRAINER_EP_LAYOUT,
                  "expert_maps": [[int(x) for x in m.tolist()] for m in maps],
                  "engine_expert_maps": engine_maps if engine_maps is not None else "dry run: no engine"}
        if isinstance(engine_maps, dict):  # recorded() kept the error: where the experts are is not known
            why = f"the engine's expert maps could not be read ({engine_maps.get('error')}), so the trainer's are unchecked"
        else:
            why = None if engine_maps is None else engine_maps_differ(engine_maps, maps)
        if why:  # the engine's experts are not where the trainer computes them: nothing to judge
            cell_not_run(a, {"model": str(m0), "model_shape": a.shape, "candidate": a.candidate, **engine_cfg,
                             "expert_parallel": ep_rec}, cell_loads(getattr(a, "loads", None) or "", moe, quant)[0],
                         f"the trainer does not follow this engine's expert parallelism: {why}")
            return 0
    from .overlay import overlay_record

    common = {"rollout_kernels": rollout_kernels,
              "config": {"model": str(serve), **({"trainer_bf16_model": str(m0)} if serve != m0 else {}),
                         "model_shape": a.shape, "architecture": cfg["architectures"][0],
                         "hidden_size": cfg["hidden_size"], "num_hidden_layers": cfg["num_hidden_layers"],
                         "num_attention_heads": cfg["num_attention_heads"],
                         "num_key_value_heads": cfg["num_key_value_heads"], "head_dim": cfg["head_dim"],
                         "vocab_size": cfg["vocab_size"], "tie_word_embeddings": cfg["tie_word_embeddings"],
                         "attention_bias": cfg.get("attention_bias", cfg.get("qkv_bias")),
                         **({"moe": moe_shape(model)} if moe else {}),
                         "weights": "random, seeded, built on the device",
                         "candidate": a.candidate, "source_overlay": overlay_record(parts) if parts else None,
                         **engine_cfg, "quantization": quant, **({"fp8": fp8_rec} if fp8_rec else {}),
                         "matrix_seed": SEED, "vllm_check": pin, "tensor_parallel_size": tp,
                         **({"all_reduce": all_reduce, "trainer_tensor_parallel": TRAINER_TP_LAYOUT} if tp > 1 else {}),
                         **({"expert_parallel": ep_rec} if ep_rec else {}),
                         "trainer_packing": "all sequences of a load in one varlen batch; no knowledge of engine steps"}}
    probe = None
    if not dry:
        from .probe import probe_model

        probe = probe_model(kernels, cfg)
    summary = {"candidate": a.candidate, "shape": a.shape, "loads": []}
    kept = {}
    loads, update_load = cell_loads(getattr(a, "loads", None) or "", moe, quant)
    for load in loads:
        t = time.time()
        prompts, gens, seeds = workload(load, cfg["vocab_size"])
        ro = roll(prompts, gens, seeds)
        kept[load] = ro
        summary["loads"].append(run_load(legs, a.candidate, a.shape, load, ro, model, kernels, dev, ck0, common,
                                         started, probe=probe if load == "c1" else None))
        log(f"  {load} in {time.time() - t:.1f}s")
    if update_load not in kept:  # a partial run (--loads): no update, said in the summary
        summary["update"] = f"not run: {update_load} was not among the loads"
        Path(a.summary).write_text(json.dumps(summary, indent=1, default=str))
        return 0
    if quant and moe:
        summary["update"] = f"not run: {FP8_MOE_NO_UPDATE}"
        Path(a.summary).write_text(json.dumps(summary, indent=1, default=str))
        return 0
    # one update on the update load's batch, reloaded into vLLM, then that load again (new prompts) on
    # the new weights
    ro = kept[update_load]
    upd = update_step(model, ro, dev, Path(a.work) / f"m1-{a.candidate}-{a.shape}", m0)
    if quant == "fp8_block":
        # what vLLM reloads: the new bf16 weights written as a block-FP8 checkpoint, as the first was
        from .fp8_block import write_block_checkpoint

        fp8b = Path(a.work) / f"m1-fp8b-{a.candidate}-{a.shape}"
        upd["bf16_hash"] = upd["hash"]
        upd["served_checkpoint"] = write_block_checkpoint(model.deployed_state_dict(), m0, fp8b)
        upd["path"], upd["hash"] = fp8b, weights_hash(fp8b)
    if moe:
        from .moe_backward import moe_gradcheck_with_control

        # the MoE block's backward on this device's kernels against float64 autograd, with its control
        upd["moe_backward_check"] = recorded(lambda: moe_gradcheck_with_control(
            model.moe_kernels, device=dev, dtype=model.compute_dtype, tol=2e-2))
    if llm is not None:
        try:
            # online FP8: vLLM's reload_weights, which quantizes the reloaded bf16 weights again
            upd["reloaded_params"] = rollout.reload(upd["path"] / "model.safetensors", layerwise=bool(quant))
            if tp > 1:  # the reload is a collective_rpc: every rank loads the full tensors, keeps its shard
                upd["reloaded_params_per_rank"] = rollout.reload_ranks
        except Exception as err:  # noqa: BLE001 - the post-update cells are written as not run, with vLLM's reason
            if not quant:
                raise
            what = "block-FP8" if quant == "fp8_block" else "online-FP8"
            reason = f"vLLM 0.26's reload_weights on the {what} engine failed: {type(err).__name__}: {str(err)[:600]}"
            for kind in ("decode", "prefill"):
                write_not_run_leg(legs / leg_name(a.candidate, a.shape, update_load, kind + "_post_update"),
                                  dict(common["config"], load=update_load, scored=kind, weights_hash=upd["hash"],
                                       update={k: v for k, v in upd.items() if k != "path"}), reason)
            summary["update"] = {"not_run": reason, **{k: v for k, v in upd.items() if k != "path"}}
            Path(a.summary).write_text(json.dumps(summary, indent=1, default=str))
            return 0
        if moe and ep:  # each rank's whole local experts, compared by digest (ep.reloaded_experts_equal)
            upd["reloaded_experts_equal"] = recorded(
                lambda: ep_reloaded_experts_equal(llm.apply_model(engine_expert_digests), model))
        elif moe and tp > 1:
            upd["reloaded_experts_equal"] = {"not_checked": "at TP=2 each rank holds a slice of every expert; the "
                                                             "check compares whole stacked tensors (TP=1 and EP only)"}
        elif moe:
            upd["reloaded_experts_equal"] = recorded(lambda: reloaded_experts_equal(llm, model))
        if quant == "fp8_block":
            from .fp8_block import vllm_block_weights_equal

            upd["fp8_weights_equal_after_reload"] = recorded(
                lambda: vllm_block_weights_equal(llm, model, sorted(model.fp8_linears), model.fp8))
        elif quant:
            from .fp8 import vllm_fp8_weights_equal

            upd["fp8_weights_equal_after_reload"] = recorded(
                lambda: vllm_fp8_weights_equal(llm, model, sorted(model.fp8_linears)))
    prompts, gens, seeds = workload(update_load, cfg["vocab_size"], salt=1)
    ro2 = roll(prompts, gens, seeds)
    common["config"] = dict(common["config"], update={k: v for k, v in upd.items() if k != "path"})
    summary["loads"].append(run_load(legs, a.candidate, a.shape, update_load, ro2, model, kernels, dev, upd["hash"],
                                     common, started, kind_suffix="_post_update"))
    summary["update"] = {k: v for k, v in upd.items() if k != "path"}
    Path(a.summary).write_text(json.dumps(summary, indent=1, default=str))
    return 0


FP8_MOE_NO_UPDATE = ("the trainer does not follow vLLM's FP8 experts (they quantize their input with one dynamic "
                     "scale over the step's whole batch, vLLM issue 57016), so its forward cells already differ; "
                     "an update would be judged against a trainer that does not compute what vLLM computes")
TRAINER_FP8_EXPERTS = ("bf16 experts (vLLM's fused_experts on the deployed bf16 weights): vLLM's FP8 experts are not "
                       "followed: they quantize their input with one dynamic scale over the step's whole batch (vLLM "
                       "issue 57016), which no trainer's packed batch reproduces")


def trainer_linear_names(model) -> list[str]:
    """The names of the trainer's linears that vLLM builds as LinearBase modules (its `_lin` names)."""
    names = []
    for i in range(model.n_layers):
        p = f"model.layers.{i}."
        names += [p + "self_attn.qkv_proj", p + "self_attn.o_proj"]
        if i in getattr(model, "sparse_layers", ()):
            names.append(p + "mlp.gate")
        else:
            names += [p + "mlp.gate_up_proj", p + "mlp.down_proj"]
    return names


def fp8_setup(model, llm, moe: bool, quant: str = "fp8") -> dict:
    """Make the trainer compute, in FP8, the linears vLLM's engine quantized (read from the engine; on a
    CPU dry run, chosen by name and emulated in torch). Returns the record for the legs."""
    if quant == "fp8_block":
        return fp8_block_setup(model, llm)
    from .fp8 import Fp8LinearGpu, Fp8LinearReference, is_fp8_linear, vllm_fp8_modules, vllm_fp8_weights_equal

    names = trainer_linear_names(model)
    if llm is None:
        model.fp8, model.fp8_linears = Fp8LinearReference(), frozenset(n for n in names if is_fp8_linear(n))
        rec: dict = {"vllm": {"dry_run": "no engine: the trainer's FP8 linears chosen by name, emulated in torch"}}
    else:
        got = recorded(lambda: vllm_fp8_modules(llm))
        theirs = got.get("fp8_linears") or []
        model.fp8, model.fp8_linears = Fp8LinearGpu(), frozenset(theirs) & frozenset(names)
        rec = {"vllm": got, "not_followed": sorted(set(theirs) - set(names)),
               "weights_equal": recorded(lambda: vllm_fp8_weights_equal(llm, model, sorted(model.fp8_linears)))}
    rec["trainer"] = {"fp8_linears": len(model.fp8_linears), "ops": model.fp8.describe(),
                      "backward": "straight-through: the bf16 linear's gradient at the unquantized x and w, "
                                  "into the bf16 master weights",
                      **({"experts": TRAINER_FP8_EXPERTS} if moe else {})}
    return rec


def fp8_block_setup(model, llm) -> dict:
    """The block-FP8 cell's trainer: each linear vLLM built with Fp8LinearMethod (block) computed with
    the kernel vLLM chose, its flags read from the engine (on a CPU dry run: the sm90 plan, emulated in
    torch). ``not_followed_reason`` is set where the trainer cannot make the engine's calls."""
    from .fp8 import vllm_fp8_modules
    from .fp8_block import (Fp8BlockLinearGpu, Fp8BlockLinearReference, dry_plan, engine_env, is_block_linear,
                            plan_refusal, vllm_block_plan, vllm_block_weights_equal, vllm_linear_probe)

    names = trainer_linear_names(model)
    if llm is None:
        plan = dry_plan(os.environ)
        model.fp8, model.fp8_linears = Fp8BlockLinearReference(plan), frozenset(n for n in names if is_block_linear(n))
        rec: dict = {"vllm": {"dry_run": "no engine: the trainer's block-FP8 linears chosen by name, emulated in torch",
                              "plan": plan, "env": engine_env(os.environ)}}
    else:
        got = recorded(lambda: vllm_fp8_modules(llm))
        blk = recorded(lambda: vllm_block_plan(llm))
        theirs = got.get("fp8_linears") or []
        rec = {"vllm": dict(got, block=blk, env=engine_env(os.environ)), "not_followed": sorted(set(theirs) - set(names))}
        plan = blk.get("plan") if "error" not in blk else None
        why = plan_refusal(plan, blk) if "error" not in blk else f"the engine's block-FP8 kernels were not read: {blk['error']}"
        if why:
            rec["not_followed_reason"] = why
            return rec
        model.fp8, model.fp8_linears = Fp8BlockLinearGpu(plan), frozenset(theirs) & frozenset(names)
        rec["weights_equal"] = recorded(lambda: vllm_block_weights_equal(llm, model, sorted(model.fp8_linears), model.fp8))
        # the first layer's linears, one op at a time: vLLM's module against the trainer's call, 1 to 300 rows
        first = sorted(n for n in model.fp8_linears if n.startswith("model.layers.0."))
        rec["linear_probe"] = recorded(lambda: vllm_linear_probe(llm, model, model.fp8, first))
    rec["trainer"] = {"fp8_linears": len(model.fp8_linears), "ops": model.fp8.describe(),
                      "weight_block_size": list(model.fp8.plan["weight_block"]), "kernel": model.fp8.plan["kernel"],
                      "backward": "straight-through: the bf16 linear's gradient at the unquantized x and w, "
                                  "into the bf16 master weights; the update's weights written as a block-FP8 "
                                  "checkpoint and reloaded (layerwise reload_weights)"}
    return rec


def refused_engine(a, m0: Path, engine_cfg: dict, quant: str, moe: bool, err: str, vllm_log: list[str]) -> None:
    """vLLM did not start the quantized engine: every cell of this (candidate, shape) written as not run
    with vLLM's own error, and the summary says so."""
    reason = f"vLLM 0.26 did not start the engine with quantization={quant!r}: {err}"
    loads, _ = cell_loads(getattr(a, "loads", None) or "", moe, quant)
    config = {"model": str(m0), "model_shape": a.shape, "candidate": a.candidate, "quantization": quant, **engine_cfg,
              "vllm_log": vllm_log}
    cell_not_run(a, config, loads, reason)


def cell_not_run(a, config: dict, loads: list[str], reason: str) -> None:
    """Every cell of this (candidate, shape) written as not run with `reason`; the summary says so."""
    for load in loads:
        for kind in ("decode", "prefill"):
            write_not_run_leg(Path(a.legs) / leg_name(a.candidate, a.shape, load, kind),
                              dict(config, load=load, scored=kind), reason)
    Path(a.summary).write_text(json.dumps({"candidate": a.candidate, "shape": a.shape, "not_run": reason}, indent=1))
    log(f"{a.candidate} {a.shape}: {reason}")


def write_not_run_leg(d: Path, config: dict, reason: str) -> None:
    """A cell that did not run: leg.json with its reason and no measurement (every judge reads it as not run)."""
    from . import legio

    meta = legio.new_meta("forward", legio.kernels_arm(), trainer="vllm_kernels", started_at=None)
    meta["not_run_reason"] = reason
    meta["resolved_config"] = config
    legio.write_meta(d, meta)


def update_step(model, ro: dict, dev: str, out: Path, m0: Path) -> dict:
    """A GRPO-style policy-gradient step through the product trainer, AdamW, the new bf16 weights
    written as safetensors (what vLLM reloads)."""
    import torch

    from .model import pack

    from .autograd import backward_impls
    from .backward_update import adamw, grad_norm, group_advantages, write_weights

    _, adv = group_advantages(len(ro["fulls"]), SEED + 5)
    ids, cu, mx = pack(ro["fulls"], dev)
    model.zero_grad(set_to_none=True)
    lp = model.logprobs(ids, cu, mx)
    w = torch.zeros_like(lp, dtype=torch.float32)
    o = 0
    for f, g, av in zip(ro["fulls"], ro["gens"], adv):
        n = len(f) - 1
        w[o + n - len(g):o + n] = av
        o += n
    n_resp = sum(len(g) for g in ro["gens"])
    loss = -(lp.float() * w).sum() / n_resp
    t = time.time()
    loss.backward()
    t_bwd = time.time() - t
    grads = [p.grad for p in model.master]
    finite = all(bool(torch.isfinite(g).all()) for g in grads if g is not None)
    gnorm = grad_norm(model.master)
    before = {k: v.clone() for k, v in model.deployed_state_dict().items()}
    adamw(model.parameters(), lr=LR).step()
    after = model.deployed_state_dict()
    changed = sum(not torch.equal(before[k].view(torch.int16), after[k].view(torch.int16)) for k in after)
    write_weights(after, m0, out)
    return {"path": out, "hash": weights_hash(out), "loss": float(loss.detach()), "grad_norm": gnorm, "grad_finite": finite,
            "backward_seconds": round(t_bwd, 2), "backward_impls": backward_impls(),
            "changed_tensors": changed, "total_tensors": len(after),
            "optimizer": {"name": "adamw", "lr": LR, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
            "n_response_tokens": n_resp}


class engine_start_lock:
    """One engine starts at a time on the GPU: vLLM sizes its KV cache from the memory it sees
    free while it profiles, which a neighbour's start would disturb."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


_HELD: list = []


def hold_start_lock_until_exit(path: Path) -> None:
    """An engine's exit frees its memory too: a neighbour profiling meanwhile sized its KV cache
    on memory that then moved (a cell was lost that way). The lock taken here is released by the
    kernel when this process ends, after the engine and its CUDA context are gone."""
    f = open(path, "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    _HELD.append(f)


def retry_cell(rc: int, sealed: int, attempts: int) -> bool:
    """Run a cell again once when its process failed before sealing any leg (an engine that died
    at start, as a neighbour's can make it); a cell that sealed legs, or failed twice, stands."""
    return rc != 0 and sealed == 0 and attempts < 2


# ------------------------------------------------------------------------------- the orchestrator
def cmd_matrix(a) -> int:
    from . import legio
    from .seeded_model import make_model

    t0 = time.time()
    deadline = t0 + a.budget
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    legs, logs = work / "legs", work / "logs"
    legs.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)
    shapes = [s for s in a.shapes.split(",") if s]
    cands = [c for c in a.candidates.split(",") if c]
    # --cells candidate/shape,...: these cells in this order (what matters most first, under a deadline)
    order = [tuple(x.split("/", 1)) for x in (getattr(a, "cells", "") or "").split(",") if x]
    if order:
        shapes = list(dict.fromkeys(s for _, s in order))
    dev = "cpu" if a.dry_run else "cuda"
    status: dict = {"started": legio.now(), "budget_s": a.budget, "cells": {}, "models": {}}
    plugin = work / "overlay_plugin"
    write_plugin_dist(plugin)

    def pack_out() -> None:
        legio.pack_out(out, legs, logs, status)

    for base in dict.fromkeys(base_shape(s) for s in shapes):  # an FP8 or TP=2 cell serves its base's weights
        md = work / "models" / base
        if not (md / "config.json").exists():
            status["models"][base] = make_model(md, base, seed=7, device=dev)
            log(f"model {base}: {status['models'][base]}")
    queue = order or [(c, s) for s in shapes for c in cands]
    attempts: dict[str, int] = {}
    running: list[tuple] = []
    me = [sys.executable, "-m", "tica.legs.vllm_kernels.producers", "matrix-cell"]
    while queue or running:
        while queue and len(running) < a.parallel and time.time() < deadline - a.min_cell_s:
            c, s = queue.pop(0)
            env = candidate_env(dict(os.environ, VLLM_BATCH_INVARIANT="0" if a.dry_run else "1",
                                     VLLM_ENABLE_V1_MULTIPROCESSING="0", **cell_env(s)), c, plugin)
            name = f"{c}-{s}"
            attempts[name] = attempts.get(name, 0) + 1
            lf = logs / (f"{name}.log" if attempts[name] == 1 else f"{name}.try{attempts[name]}.log")
            args = ["--loads", a.loads, "--candidate", c, "--shape", s,
                    "--model", str(work / "models" / base_shape(s)), "--legs", str(legs),
                    "--work", str(work), "--summary", str(logs / f"{name}.summary.json"),
                    "--lock", str(work / "engine_start.lock")] + (["--dry-run"] if a.dry_run else [])
            p = subprocess.Popen(me + args, env=env, stdout=open(lf, "wb"), stderr=subprocess.STDOUT)
            running.append((p, name, c, s, time.time(), env, lf, process_identity(p.pid)))
            log(f"started {name} (pid {p.pid})")
        if not queue and not running:
            break
        time.sleep(1)
        for item in list(running):
            p, name, c, s, t, env, lf, identity = item
            rc = p.poll()
            if rc is None and time.time() > deadline:
                p.kill()
                rc = p.wait()
            if rc is None:
                continue
            running.remove(item)
            procs = legio.launcher_records(name, p.pid, rc, lf.read_text(errors="replace"), env, identity)
            mine = [d for d in legs.glob(f"mx-{c}-{s}-*") if (d / "leg.json").exists() and not (d / "seal.json").exists()]
            for d in mine:
                legio.finalize_leg(d, procs)
            tries = status["cells"].setdefault(name, {"tries": []})["tries"]
            tries.append({"rc": rc, "seconds": round(time.time() - t, 1), "legs": len(mine)})
            status["cells"][name].update(tries[-1])
            log(f"{name}: rc={rc} in {time.time() - t:.1f}s, {len(mine)} legs sealed")
            if retry_cell(rc, len(mine), attempts[name]):
                queue.insert(0, (c, s))
                log(f"{name}: no leg sealed, run again once")
            pack_out()
    status["not_started"] = [f"{c}-{s}" for c, s in queue]
    status["total_s"] = round(time.time() - t0, 1)
    for f in logs.glob("*.summary.json"):
        status.setdefault("summaries", {})[f.name] = json.loads(f.read_text())
    pack_out()
    log(f"matrix done in {time.time() - t0:.1f}s; not started: {status['not_started']}")
    return 0
