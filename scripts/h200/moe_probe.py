"""Does vLLM 0.26 serve a mixture-of-experts model batch-invariantly on the H200? (issue 33, a probe)

One process per arm (VLLM_BATCH_INVARIANT is read at import): a seeded random Qwen3-MoE-style
model (64 experts, top-8, 4 layers), built here with transformers, served by vLLM in process.
Two measurements, each counted as tokens whose logprob differs bitwise:

* batch: one 500-token prompt scored (prompt_logprobs=0) alone, and again among 31 other prompts;
* decode vs prefill: 64 tokens generated for it among the 31 (sampled-token logprobs), then the
  prompt + response scored by prefill.

Writes one JSON per arm under --out, with vLLM's own log lines about the MoE kernel it chose. A
measurement, not a leg: nothing here is judged.

    python3 scripts/h200/moe_probe.py --arm 1 --out "$OUT" [--dense] [--quant fp8] [--candidate overlay3]

``--quant fp8`` serves the same bf16 checkpoint with vLLM's online FP8 (``quantization="fp8"``:
weights cast to FP8 with per-tensor scales at load, activations scaled per token at run time), as a
team serving FP8 without an FP8 checkpoint would; vLLM's log lines name the FP8 kernels it chose.
``--candidate`` loads the overlay's parts as vLLM's general plugin, as the legs do.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path


def build(model_dir: Path, dense: bool = False) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    if dense:  # the control: the same attention and widths, one dense MLP per layer
        cfg = Qwen3Config(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
                          num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
                          rope_theta=1e6, tie_word_embeddings=False)
        torch.manual_seed(7)
        with torch.device("cuda"):
            model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
        model.save_pretrained(model_dir, safe_serialization=True)
        return {"architecture": "Qwen3ForCausalLM", "params": sum(p.numel() for p in model.parameters()),
                "hidden_size": 1024, "num_hidden_layers": 4, "intermediate_size": 3072, "vocab_size": 32000}
    cfg = Qwen3MoeConfig(vocab_size=32000, hidden_size=1024, intermediate_size=3072, moe_intermediate_size=256,
                         num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                         num_experts=64, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
                         mlp_only_layers=[], max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=False)
    torch.manual_seed(7)
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(model_dir, safe_serialization=True)
    return {"architecture": "Qwen3MoeForCausalLM", "params": sum(p.numel() for p in model.parameters()),
            **{k: getattr(cfg, k) for k in ("hidden_size", "num_hidden_layers", "num_experts", "num_experts_per_tok",
                                            "moe_intermediate_size", "vocab_size")}}


def nbits(a, b) -> int:
    import numpy as np

    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--arm", choices=["0", "1"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="/tmp/tica_moe/model")
    p.add_argument("--dense", action="store_true", help="the control: a dense Qwen3 of the same widths")
    p.add_argument("--quant", choices=["none", "fp8"], default="none")
    p.add_argument("--candidate", choices=["stock", "overlay3"], default=None,
                   help="set the overlay plugin's environment here (default: as the caller set it)")
    a = p.parse_args()
    os.environ["VLLM_BATCH_INVARIANT"] = a.arm
    out, model_dir = Path(a.out), Path(a.model)
    if a.candidate:
        from tica.legs.vllm_kernels.overlay import candidate_env, write_plugin_dist

        plugin = Path("/tmp/tica_probe_plugin")
        write_plugin_dist(plugin)
        os.environ.update(candidate_env(dict(os.environ), a.candidate, plugin))
        sys.path.insert(0, str(plugin))  # this process's plugin lookup; vLLM's children read PYTHONPATH
    quant = "" if a.quant == "none" else f"_{a.quant}"
    name = f"{'dense' if a.dense else 'moe'}{quant}_probe_bi{a.arm}"
    out.mkdir(parents=True, exist_ok=True)
    rec: dict = {"arm": f"bi{a.arm}", "quantization": a.quant, "candidate": a.candidate,
                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if not (model_dir / "config.json").exists():
        rec["model"] = build(model_dir, a.dense)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t = time.time()
    try:
        llm = LLM(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True,
                  attention_backend="FLASH_ATTN", enable_prefix_caching=False, gpu_memory_utilization=0.3,
                  max_model_len=4096, seed=0, quantization=None if a.quant == "none" else a.quant)
    except Exception as err:  # noqa: BLE001 - vLLM's own reason is the result
        rec["engine_error"] = f"{type(err).__name__}: {err}"[:2000]
        (out / f"{name}.json").write_text(json.dumps(rec, indent=1))
        print(json.dumps(rec, indent=1))
        return 0
    rec["engine_start_s"] = round(time.time() - t, 1)
    from tica.legs.vllm_kernels.overlay import active

    rec["overlay_parts"] = active()  # read from vLLM's modules in this process, not from a flag
    r = random.Random(20261204)
    anchor = [r.randrange(3, 32000) for _ in range(500)]
    others = [[r.randrange(3, 32000) for _ in range(r.randrange(32, 1500))] for _ in range(31)]
    score = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0, seed=1)

    def prompt_lp(outputs, toks):
        return [d[t].logprob for d, t in zip(outputs.prompt_logprobs[1:], toks[1:])]

    alone = prompt_lp(llm.generate([TokensPrompt(prompt_token_ids=anchor)], score, use_tqdm=False)[0], anchor)
    batch = llm.generate([TokensPrompt(prompt_token_ids=x) for x in [*others[:15], anchor, *others[15:]]], score,
                         use_tqdm=False)
    among = prompt_lp(batch[15], anchor)
    rec["batch_invariance"] = {"tokens": len(alone), "n_bitwise_diff": nbits(alone, among)}
    gen = SamplingParams(max_tokens=64, logprobs=0, ignore_eos=True, detokenize=False, temperature=1.0, seed=3)
    outs = llm.generate([TokensPrompt(prompt_token_ids=x) for x in [*others[:15], anchor, *others[15:]]],
                        [gen] * 32, use_tqdm=False)
    toks = list(outs[15].outputs[0].token_ids)
    dec = [d[t].logprob for d, t in zip(outs[15].outputs[0].logprobs, toks)]
    full = anchor + toks
    pre = prompt_lp(llm.generate([TokensPrompt(prompt_token_ids=full)], score, use_tqdm=False)[0], full)[-len(toks):]
    rec["decode_vs_prefill"] = {"tokens": len(toks), "n_bitwise_diff": nbits(dec, pre)}
    try:
        vc = llm.llm_engine.vllm_config
        rec["vllm"] = {"moe_backend_requested": str(getattr(getattr(vc, "kernel_config", None), "moe_backend", None)),
                       "all2all_backend": str(getattr(vc.parallel_config, "all2all_backend", None))}
    except Exception as err:  # noqa: BLE001
        rec["vllm"] = {"config_error": repr(err)[:300]}
    (out / f"{name}.json").write_text(json.dumps(rec, indent=1))
    print(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
