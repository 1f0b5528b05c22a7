"""Issue 33, step 1 on the device: the MoE trainer forward (tica/legs/vllm_kernels/moe.py) against
vLLM 0.26 under VLLM_BATCH_INVARIANT=1, on the seeded Qwen3-MoE-style model of moe_probe.py.

One process per candidate (stock or overlay3), vLLM's engine core in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, as enter.sh sets it), so a wrapper around vLLM's
``FusedTopKRouter._compute_routing`` records the engine's routing (expert ids and gate weights)
while chosen calls run. Measured, each as a count of bitwise-differing values:

* vLLM generates 64 tokens for each of 32 prompts (the probe's anchor of 500 tokens at index 15
  among 31 of 32-1499 tokens), then scores the 32 prompt+response sequences in one prefill batch
  (prompt_logprobs=0, one engine step: max_num_batched_tokens 32768);
* the trainer packs the same 32 sequences into one varlen forward: its logprobs of the generated
  tokens against vLLM's decode logprobs, of every token against vLLM's prompt_logprobs;
* routing: the trainer's receipt of the anchor against vLLM's while it scored the anchor alone
  (564 rows in one step) and while it generated for the anchor alone (500 prompt rows, then one
  row a decode step); the whole pack against the scoring batch's step;
* controls: the trainer on the anchor alone (its own batch invariance); a trainer whose router is
  torch's softmax/topk (fp32) instead of ``_moe_C.topk_softmax``; the trainer's stacked expert
  weights against the w13/w2 tensors vLLM loaded.

    python3 scripts/h200/moe_trainer.py --candidate overlay3 --out "$OUT/overlay3"

Writes summary.json (counts, versions, conditions) and routing.json.gz (the anchor's receipts).
A measurement, not a leg: nothing here is judged.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts" / "h200")]
ANCHOR_AT = 15


def nbits(a, b) -> dict:
    import numpy as np

    x, y = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if x.shape != y.shape:
        return {"tokens": int(x.size), "shape_mismatch": [list(x.shape), list(y.shape)]}
    d = x.view(np.uint32) != y.view(np.uint32)
    out = {"tokens": int(x.size), "n_bitwise_diff": int(d.sum()),
           "max_abs_diff": float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max()) if x.size else 0.0}
    if d.any():
        out["first_diff_index"] = int(np.flatnonzero(d)[0])
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--candidate", choices=["stock", "overlay3"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="/tmp/tica_moe/model")
    p.add_argument("--diag", action="store_true",
                   help="hook vLLM's layers while it scores the anchor alone and compare every intermediate")
    a = p.parse_args()
    os.environ["VLLM_BATCH_INVARIANT"] = "1"
    from tica.legs.vllm_kernels.overlay import CANDIDATE_PARTS, active, candidate_env, write_plugin_dist

    plugin = Path("/tmp/tica_moe_plugin")
    write_plugin_dist(plugin)
    os.environ.update(candidate_env(dict(os.environ), a.candidate, plugin))
    sys.path.insert(0, str(plugin))
    out, model_dir = Path(a.out), Path(a.model)
    out.mkdir(parents=True, exist_ok=True)
    rec: dict = {"candidate": a.candidate, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "env": {k: os.environ.get(k) for k in ("VLLM_BATCH_INVARIANT", "VLLM_ENABLE_V1_MULTIPROCESSING",
                                                        "VLLM_PLUGINS", "TICA_OVERLAY_PARTS")}}
    t = time.time()
    if not (model_dir / "config.json").exists():
        from moe_probe import build

        rec["model_built"] = build(model_dir)
        rec["model_build_s"] = round(time.time() - t, 1)
    rec["model_config"] = json.loads((model_dir / "config.json").read_text())

    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.model_executor.layers.fused_moe.router.fused_topk_router import FusedTopKRouter

    cap: dict = {"on": False, "calls": []}
    stock_routing = FusedTopKRouter._compute_routing

    def capturing(self, hidden_states, router_logits, indices_type, *, input_ids=None):
        w, ids = stock_routing(self, hidden_states, router_logits, indices_type, input_ids=input_ids)
        if cap["on"]:
            cap["calls"].append((ids.detach().clone(), w.detach().clone(),
                                 {"indices_type": str(indices_type), "logits_dtype": str(router_logits.dtype),
                                  "ids_dtype": str(ids.dtype), "rows": int(ids.shape[0])}))
        return w, ids

    FusedTopKRouter._compute_routing = capturing
    cfg = dict(skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True, attention_backend="FLASH_ATTN",
               enable_prefix_caching=False, gpu_memory_utilization=0.3, max_model_len=4096, seed=0,
               max_num_batched_tokens=32768)
    t = time.time()
    llm = LLM(model=str(model_dir), **cfg)
    rec["engine_start_s"] = round(time.time() - t, 1)
    rec["engine_cfg"] = cfg
    parts = active()
    rec["overlay_parts"] = parts
    if parts != list(CANDIDATE_PARTS[a.candidate] or []):
        rec["error"] = f"vLLM runs overlay parts {parts}, not {a.candidate}'s"
        (out / "summary.json").write_text(json.dumps(rec, indent=1))
        return 3
    n_layers = int(rec["model_config"]["num_hidden_layers"])
    hooked: dict = {"on": False, "calls": []}
    if a.diag:
        rec["diag_hooks"] = llm.apply_model(lambda m: install_hooks(m, hooked))

    def captured() -> list:
        calls, cap["calls"] = cap["calls"], []
        return calls

    r = random.Random(20261204)  # the probe's prompts
    anchor = [r.randrange(3, 32000) for _ in range(500)]
    others = [[r.randrange(3, 32000) for _ in range(r.randrange(32, 1500))] for _ in range(31)]
    prompts = [*others[:ANCHOR_AT], anchor, *others[ANCHOR_AT:]]
    t = time.time()
    gens = [SamplingParams(max_tokens=64, logprobs=0, ignore_eos=True, detokenize=False, temperature=1.0, seed=3 + k)
            for k in range(len(prompts))]
    outs = llm.generate([TokensPrompt(prompt_token_ids=x) for x in prompts], gens, use_tqdm=False)
    toks = [list(o.outputs[0].token_ids) for o in outs]
    dec = [[d[tk].logprob for d, tk in zip(o.outputs[0].logprobs, tt)] for o, tt in zip(outs, toks)]
    fulls = [x + tt for x, tt in zip(prompts, toks)]
    rec["generate_s"] = round(time.time() - t, 1)

    # the anchor generated alone, its routing captured (step 0: the 500 prompt rows; then one row a step)
    cap["on"] = True
    alone = llm.generate([TokensPrompt(prompt_token_ids=anchor)], [gens[ANCHOR_AT]], use_tqdm=False)[0]
    gen_calls = captured()
    toks_alone = list(alone.outputs[0].token_ids)
    dec_alone = [d[tk].logprob for d, tk in zip(alone.outputs[0].logprobs, toks_alone)]
    score = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0, seed=1)

    def prompt_lp(o, seq):
        return [d[tk].logprob for d, tk in zip(o.prompt_logprobs[1:], seq[1:])]

    hooked["on"] = True
    scored_alone = llm.generate([TokensPrompt(prompt_token_ids=fulls[ANCHOR_AT])], score, use_tqdm=False)[0]
    hooked["on"] = False
    score_alone_calls = captured()
    t = time.time()
    scored = llm.generate([TokensPrompt(prompt_token_ids=x) for x in fulls], score, use_tqdm=False)
    batch_calls = captured()
    cap["on"] = False
    rec["score_s"] = round(time.time() - t, 1)
    pre = [prompt_lp(o, x) for o, x in zip(scored, fulls)]
    pre_alone = prompt_lp(scored_alone, fulls[ANCHOR_AT])
    rec["capture"] = {"generate_alone_calls": len(gen_calls), "score_alone_calls": len(score_alone_calls),
                      "score_batch_calls": len(batch_calls), "layers": n_layers,
                      "score_batch_rows": [c[2]["rows"] for c in batch_calls],
                      "meta": batch_calls[0][2] if batch_calls else None}

    # ------------------------------------------------------------------ the trainer
    from tica.legs.vllm_kernels.kernels import VllmKernels
    from tica.legs.vllm_kernels.model import pack
    from tica.legs.vllm_kernels.moe import TorchMoeReference, VllmMoeKernels, layer_routes, moe_from_dir
    from tica.legs.vllm_kernels.routing import compare, to_json

    vc = llm.llm_engine.vllm_config
    block = int(vc.cache_config.block_size)
    v2 = bool(vc.use_v2_model_runner)  # 0.26: False for Qwen3-MoE (not a default-V2 MoE architecture)
    rec["vllm_model_runner"] = "v2" if v2 else "v1"
    runner_lp, other_lp = ("v2_runner", "v1_sampler") if v2 else ("v1_sampler", "v2_runner")
    kernels = VllmKernels(linear="triton", norm="overlay" if "rmsnorm" in parts else "stock",
                          attention_layout="paged", block_size=block, logprob=runner_lp)
    moe_k = VllmMoeKernels()
    t = time.time()
    model = moe_from_dir(model_dir, kernels, moe_k, device="cuda")
    rec["trainer"] = {"kernels": kernels.describe(), "moe": moe_k.describe(), "load_s": round(time.time() - t, 1),
                      "sparse_layers": model.sparse_layers, "top_k": model.top_k, "renormalize": model.renormalize}
    ids, cu, mx = pack(fulls, "cuda")
    starts = [int(x) for x in cu.tolist()]
    t = time.time()
    with torch.no_grad():
        lp = model.logprobs(ids, cu, mx).float().cpu().tolist()
        torch.cuda.synchronize()
        rec["trainer"]["forward_s"] = round(time.time() - t, 2)
        rec["trainer"]["tokens"] = int(ids.numel())
        pack_routes = model.routing_receipt()
        a0, a1 = starts[ANCHOR_AT], starts[ANCHOR_AT + 1]
        anchor_routes = model.routing_receipt(a0, a1)
        # the anchor alone through the trainer: the trainer's own batch invariance
        ids1, cu1, mx1 = pack([fulls[ANCHOR_AT]], "cuda")
        model.trace = {} if a.diag else None
        lp1 = model.logprobs(ids1, cu1, mx1).float().cpu().tolist()
        trace, model.trace = model.trace, None
        alone_routes = model.routing_receipt()
        if a.diag:
            try:
                rec["diag"] = diagnose(hooked["calls"], trace, model, kernels, moe_k, ids1, pre_alone, n_layers)
            except Exception as err:  # noqa: BLE001 - recorded, not hidden
                import traceback

                rec["diag"] = {"error": traceback.format_exc()[-2000:]}
        # control: torch's router (fp32 softmax, topk, renormalise) instead of _moe_C.topk_softmax
        model.moe_kernels = type("TorchRouteVllmExperts", (), {
            "route": staticmethod(TorchMoeReference.route), "experts": staticmethod(moe_k.experts)})()
        lp_torch_route = model.logprobs(ids, cu, mx).float().cpu().tolist()
        torch_route_anchor = model.routing_receipt(a0, a1)
        model.moe_kernels = moe_k
        # control: the other runner's logprob op on the same forward
        kernels.logprob = other_lp
        lp_other = model.logprobs(ids, cu, mx).float().cpu().tolist()
        kernels.logprob = runner_lp
        # the trainer's stacked expert weights against the tensors vLLM loaded (layer 0)
        w13, w2 = model.expert_weights("model.layers.0.")

        def same_weights(m):
            got = {}
            for n, prm in m.named_parameters():
                if "layers.0." in n and ("w13" in n or "w2_weight" in n):
                    ref = w13 if "w13" in n else w2
                    got[n] = bool(prm.shape == ref.shape and torch.equal(prm.data, ref))
            return got

        try:
            rec["trainer"]["expert_weights_equal_vllm_layer0"] = llm.apply_model(same_weights)
        except Exception as err:  # noqa: BLE001 - a diagnostic only
            rec["trainer"]["expert_weights_equal_vllm_layer0"] = {"error": repr(err)[:300]}

    # ------------------------------------------------------------------ comparisons
    def split(flat):  # per sequence: logprobs of tokens 1..L-1
        res, o = [], 0
        for x in fulls:
            res.append(flat[o:o + len(x) - 1])
            o += len(x) - 1
        return res

    tr, tr_torch, tr_other = split(lp), split(lp_torch_route), split(lp_other)
    gen_of = [slice(len(x) - 1, len(x) - 1 + len(tt)) for x, tt in zip(prompts, toks)]
    cat = lambda xs: [v for x in xs for v in x]  # noqa: E731
    rec["logprobs"] = {
        "trainer_vs_vllm_decode": nbits(cat(t[g] for t, g in zip(tr, gen_of)), cat(dec)),
        "trainer_vs_vllm_prefill": nbits(cat(tr), cat(pre)),
        "vllm_decode_vs_vllm_prefill": nbits(cat(p[g] for p, g in zip(pre, gen_of)), cat(dec)),
        "trainer_anchor_alone_vs_in_pack": nbits(lp1, tr[ANCHOR_AT]),
        "vllm_anchor_prefill_alone_vs_in_batch": nbits(pre_alone, pre[ANCHOR_AT]),
        "torch_router_vs_vllm_prefill": nbits(cat(tr_torch), cat(pre)),
        "torch_router_vs_vllm_decode": nbits(cat(t[g] for t, g in zip(tr_torch, gen_of)), cat(dec)),
        f"{other_lp}_logprob_vs_vllm_prefill": nbits(cat(tr_other), cat(pre)),
        f"{other_lp}_logprob_vs_vllm_decode": nbits(cat(t[g] for t, g in zip(tr_other, gen_of)), cat(dec)),
    }
    rec["anchor_generated_alone_same_tokens"] = toks_alone == toks[ANCHOR_AT]
    rec["anchor_decode_alone_vs_in_batch"] = nbits(dec_alone, dec[ANCHOR_AT])

    def vllm_layers(calls, keep=None, total: int | None = None) -> list:
        """Group captured calls by layer (calls run layers 0..n-1 in order, step after step) and
        concatenate each layer's rows over the steps: ``keep(step)`` rows of each step (all when
        None), then the first ``total`` rows."""
        if len(calls) % n_layers:
            raise ValueError(f"{len(calls)} captured calls is not a multiple of {n_layers} layers")
        res = []
        for li in range(n_layers):
            mine = calls[li::n_layers]
            cut = [c[0].shape[0] if keep is None else keep(s) for s, c in enumerate(mine)]
            ids_ = torch.cat([c[0][:k] for c, k in zip(mine, cut)])[:total]
            ws_ = torch.cat([c[1][:k] for c, k in zip(mine, cut)])[:total]
            res.append(layer_routes(ids_, ws_))
        return res

    rec["capture"]["generate_alone_rows"] = sorted({c[2]["rows"] for c in gen_calls})
    rec["capture"]["score_alone_rows"] = sorted({c[2]["rows"] for c in score_alone_calls})
    routing: dict = {}
    receipts: dict = {"trainer_anchor": to_json(anchor_routes)}
    try:
        v_alone = vllm_layers(score_alone_calls, total=len(fulls[ANCHOR_AT]))
        routing["trainer_vs_vllm_score_alone"] = compare(anchor_routes, v_alone)
        receipts["vllm_score_alone"] = to_json(v_alone)
    except Exception as err:  # noqa: BLE001 - recorded, not hidden
        routing["trainer_vs_vllm_score_alone"] = {"error": repr(err)[:300]}
    try:
        v_gen = vllm_layers(gen_calls, keep=lambda s: 500 if s == 0 else 1)  # 500 prompt rows + 63 decode rows
        n = v_gen[0].tokens
        routing["vllm_generate_alone_rows"] = n
        if toks_alone == toks[ANCHOR_AT]:
            routing["trainer_vs_vllm_generate_alone"] = compare([x.rows(0, n) for x in anchor_routes], v_gen)
            routing["trainer_vs_vllm_decode_rows"] = compare([x.rows(500, n) for x in anchor_routes],
                                                             [x.rows(500, n) for x in v_gen])
            receipts["vllm_generate_alone"] = to_json(v_gen)
    except Exception as err:  # noqa: BLE001
        routing["trainer_vs_vllm_generate_alone"] = {"error": repr(err)[:300]}
    try:
        v_batch = vllm_layers(batch_calls, total=int(ids.numel()))
        if v_batch[0].tokens == pack_routes[0].tokens:
            c = compare(pack_routes, v_batch)
            c.pop("per_layer", None)
            routing["trainer_pack_vs_vllm_score_batch"] = c
        else:
            routing["trainer_pack_vs_vllm_score_batch"] = {"rows": [v_batch[0].tokens, pack_routes[0].tokens]}
    except Exception as err:  # noqa: BLE001
        routing["trainer_pack_vs_vllm_score_batch"] = {"error": repr(err)[:300]}
    routing["trainer_anchor_alone_vs_in_pack"] = compare(alone_routes, anchor_routes)
    routing["torch_router_vs_vllm_router_anchor"] = compare(torch_route_anchor, anchor_routes)
    for c in routing.values():
        if isinstance(c, dict) and c.get("first"):
            c["first"].pop("weight_bits", None)
    rec["routing"] = routing
    rec["versions"] = versions()
    rec["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (out / "summary.json").write_text(json.dumps(rec, indent=1))
    with gzip.open(out / "routing.json.gz", "wt") as f:
        json.dump({"anchor_index": ANCHOR_AT, "prompt_tokens": 500, "generated_tokens": len(toks[ANCHOR_AT]),
                   "receipts": receipts}, f)
    print(json.dumps({k: rec[k] for k in ("candidate", "overlay_parts", "logprobs")}, indent=1))
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "per_layer"} if isinstance(v, dict) else v
                      for k, v in routing.items()}, indent=1)[:6000])
    return 0


def install_hooks(m, store: dict) -> list[str]:
    """Forward hooks on vLLM's modules (in the engine's process): each decoder layer's self_attn
    and mlp, the final norm and the logits processor record (name, input hidden, output) while
    store["on"]."""
    import re

    import torch

    names = []
    for n, mod in m.named_modules():
        short = n.removeprefix("model.") if n.startswith("model.model.") else n
        if not (re.fullmatch(r"model\.layers\.\d+\.(self_attn|mlp)", short) or short in ("model.norm", "logits_processor")):
            continue

        def hook(mod, args, kwargs, out, name=short):
            if not store["on"]:
                return
            if name.endswith("self_attn"):
                x = kwargs.get("hidden_states", args[1] if len(args) > 1 else None)
            elif name == "logits_processor":
                x = args[1] if len(args) > 1 else kwargs.get("hidden_states")
            else:
                x = args[0] if args else kwargs.get("hidden_states")
            o = out[0] if isinstance(out, tuple) else out
            store["calls"].append((name, x.detach().clone() if isinstance(x, torch.Tensor) else None,
                                   o.detach().clone()))

        mod.register_forward_hook(hook, with_kwargs=True)
        names.append(short)
    return names


def rows_differ(a, b) -> dict:
    """Rows of two [T, ...] tensors whose bits differ anywhere (views as int16/int32 by dtype)."""
    import torch

    if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
        return {"shape": [None if a is None else [list(a.shape), str(a.dtype)],
                          None if b is None else [list(b.shape), str(b.dtype)]]}
    iv = {2: torch.int16, 4: torch.int32}[a.element_size()]
    d = (a.contiguous().view(iv) != b.contiguous().view(iv)).reshape(a.shape[0], -1)
    rows = d.any(-1)
    out = {"rows": int(a.shape[0]), "rows_differing": int(rows.sum()), "elements_differing": int(d.sum())}
    if rows.any():
        r = int(torch.nonzero(rows)[0])
        out["first_row"] = r
        out["max_abs_diff"] = float((a.float() - b.float()).abs().max())
    return out


def diagnose(calls, trace, model, kernels, moe_k, ids1, pre_alone, n_layers) -> dict:
    """The trainer's intermediates on the anchor alone against vLLM's while it scored the anchor
    alone (one engine step of the same 564 rows), and each op of the tail fed vLLM's own input."""
    import torch

    from tica.legs.vllm_kernels import autograd as A
    from tica.legs.vllm_kernels.model import scored_rows

    T = int(ids1.numel())
    seen: dict = {}
    for name, x, o in calls:
        seen.setdefault(name, []).append((x, o))
    res: dict = {"hook_calls": {k: [[None if x is None else list(x.shape), list(o.shape)] for x, o in v]
                                for k, v in seen.items()}}

    def full(name):  # the call of this module over all T rows
        for x, o in seen.get(name, []):
            if o.shape[0] == T:
                return x, o
        return None, None

    ops = {}
    for i in range(n_layers):
        ax, ao = full(f"model.layers.{i}.self_attn")
        mx, mo = full(f"model.layers.{i}.mlp")
        ops[f"{i}.attn_out"] = rows_differ(trace[f"{i}.attn_out"], ao)
        ops[f"{i}.mlp_in"] = rows_differ(trace[f"{i}.mlp_in"], mx)
        ops[f"{i}.mlp_out"] = rows_differ(trace[f"{i}.mlp_out"], mo)
        if mx is not None:  # the trainer's MoE block on vLLM's own input
            logits = A.linear(kernels, mx, model.w(f"model.layers.{i}.mlp.gate.weight"))
            w, ids = moe_k.route(mx, logits, model.top_k, model.renormalize)
            w13, w2 = model.expert_weights(f"model.layers.{i}.")
            ops[f"{i}.mlp_out_from_vllm_input"] = rows_differ(moe_k.experts(mx, w13, w2, w, ids), mo)
    _, no = full("model.norm")
    ops["final"] = rows_differ(trace["final"], no)
    res["ops"] = ops
    rows, tgt = scored_rows(ids1, torch.tensor([0, T], dtype=torch.int32, device=ids1.device))
    lw = model.lm_head_weight()
    if no is not None:  # the trainer's lm_head + logprob kernel on vLLM's final hidden states
        lp = A.lm_head_logprobs(kernels, no[rows], lw, tgt, model.vocab_pad).float().cpu().tolist()
        res["logprobs_from_vllm_final_hidden"] = nbits(lp, pre_alone)
    mine = A.lm_head_logprobs(kernels, trace["final"][rows], lw, tgt, model.vocab_pad).float().cpu().tolist()
    res["logprobs_from_trainer_final_hidden"] = nbits(mine, pre_alone)
    for x, o in seen.get("logits_processor", []):
        if x is not None and x.shape[0] >= T - 1:  # the prompt-logprob call(s)
            res.setdefault("logits_calls", []).append(list(o.shape))
            if o.shape[0] >= T - 1:
                my_logits = A.padded_logits(kernels, trace["final"][rows], lw, model.vocab_pad)
                res["logits_trainer_vs_vllm"] = rows_differ(my_logits, o[: T - 1, : my_logits.shape[1]])
                res["logits_input_trainer_vs_vllm"] = rows_differ(trace["final"][rows], x[: T - 1])
                keep = kernels.logprob
                for impl in ("v1_sampler", "v2_runner"):
                    kernels.logprob = impl
                    lpv = kernels.token_logprobs(o[: T - 1], tgt).float().cpu().tolist()
                    res[f"{impl}_logprob_on_vllm_logits"] = nbits(lpv, pre_alone)
                kernels.logprob = keep
    return res


def versions() -> dict:
    import importlib.metadata as m
    import subprocess

    v = {}
    for p in ("vllm", "torch", "triton", "transformers"):
        try:
            v[p] = m.version(p)
        except Exception:  # noqa: BLE001
            v[p] = None
    try:
        v["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,uuid", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as err:  # noqa: BLE001
        v["gpu"] = repr(err)
    return v


if __name__ == "__main__":
    sys.exit(main())
