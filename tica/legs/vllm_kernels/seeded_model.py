"""Seeded random Llama checkpoints for the H200 legs (``producers make-model``): bf16 safetensors,
config.json, a stamp (tica_model.json) and, for `vllm bench serve`, a word-level tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

# the core fingerprint of a model folder, as the manifest's checkpoint.path hashes (no cache file)
from tica.models.hashing import weights_hash

SHAPES = {
    # the kit's "mid" widened to 4 layers; lm_head scaled so sampled tokens carry real probability
    "mid4": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=4096,
                 std=0.02, lm_head_std=0.08),
    # throughput: big enough that prefill/decode of 8192/1024 at c>=32 load the GPU
    "tput": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=8, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=10240,
                 std=0.02, lm_head_std=0.02),
    # the shape/load matrix (issue 14): real models' widths, head dims, GQA ratios, vocabularies
    # and architectures, with fewer layers (named model_layers), random weights
    "llama3.2-1b_l4": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=32,
                           num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=4096,
                           std=0.02, lm_head_std=0.08),
    "qwen2.5-0.5b_l4": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=4, num_attention_heads=14,
                            num_key_value_heads=2, head_dim=64, vocab_size=151936, max_position_embeddings=4096,
                            std=0.02, lm_head_std=0.08, arch="qwen2", tie=True),
    "smollm2-135m_l16": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=16, num_attention_heads=9,
                             num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=4096,
                             std=0.02, lm_head_std=0.08, tie=True),
    "qwen2.5-1.5b_l8": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=8, num_attention_heads=12,
                            num_key_value_heads=2, head_dim=128, vocab_size=151936, max_position_embeddings=4096,
                            std=0.02, lm_head_std=0.08, arch="qwen2"),
    "gpt2vocab-mha_l2": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=2, num_attention_heads=16,
                             num_key_value_heads=16, head_dim=128, vocab_size=50257, max_position_embeddings=4096,
                             std=0.02, lm_head_std=0.08),
    "gqa8-v32001_l4": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32,
                           num_key_value_heads=4, head_dim=128, vocab_size=32001, max_position_embeddings=4096,
                           std=0.02, lm_head_std=0.08),
    # controls for the two vocabularies above that are not multiples of 64: the same shapes, padded
    "gpt2vocab64-mha_l2": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=2, num_attention_heads=16,
                               num_key_value_heads=16, head_dim=128, vocab_size=50304, max_position_embeddings=4096,
                               std=0.02, lm_head_std=0.08),
    "gqa8-v32064_l4": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32,
                           num_key_value_heads=4, head_dim=128, vocab_size=32064, max_position_embeddings=4096,
                           std=0.02, lm_head_std=0.08),
    # mixture-of-experts geometries (issue 33), fewer layers so the trainer's AdamW step fits one GPU
    # beside the engine: Qwen3-30B-A3B's (many small experts, top-8, q/k norms), Mixtral-8x7B's
    # (8 wide experts, top-2) and Qwen1.5-MoE-A2.7B's (60 experts, top-4, a shared expert with a
    # sigmoid gate, q/k/v biases, routes not renormalised)
    "qwen3-30b-a3b_l2": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=2, num_attention_heads=32,
                             num_key_value_heads=4, head_dim=128, vocab_size=151936, max_position_embeddings=4096,
                             std=0.02, lm_head_std=0.08, arch="qwen3_moe",
                             moe=dict(experts=128, top_k=8, width=768, renormalize=True)),
    "mixtral-8x7b_l1": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=1, num_attention_heads=32,
                            num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=4096,
                            std=0.02, lm_head_std=0.08, arch="mixtral", moe=dict(experts=8, top_k=2, width=14336)),
    "qwen1.5-moe-a2.7b_l2": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=2, num_attention_heads=16,
                                 num_key_value_heads=16, head_dim=128, vocab_size=151936, max_position_embeddings=4096,
                                 std=0.02, lm_head_std=0.08, arch="qwen2_moe",
                                 moe=dict(experts=60, top_k=4, width=1408, shared=5632, renormalize=False)),
    # CPU dry runs
    "tiny_moe": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=4096,
                     std=0.05, lm_head_std=0.2, arch="qwen3_moe", moe=dict(experts=8, top_k=2, width=32, renormalize=True)),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=4096,
                 std=0.05, lm_head_std=0.2),
    # every linear's N and K a multiple of 128: the block-FP8 (128x128) dry run's shape
    "tiny_b128": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, vocab_size=512, max_position_embeddings=4096,
                      std=0.05, lm_head_std=0.2),
    "tiny_qwen": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=1, head_dim=16, vocab_size=500, max_position_embeddings=4096,
                      std=0.05, lm_head_std=0.2, arch="qwen2", tie=True),
}


MOE_ARCHES = {"qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}


def is_moe(shape: str) -> bool:
    return "moe" in SHAPES[shape]


def moe_config(shape: str) -> dict:
    """config.json of a MoE shape, under the keys vLLM 0.26's model reads for that architecture."""
    s, m = SHAPES[shape], SHAPES[shape]["moe"]
    arch = s["arch"]
    cfg = {"architectures": [MOE_ARCHES[arch]], "model_type": arch, "hidden_size": s["hidden_size"],
           "num_hidden_layers": s["num_hidden_layers"], "num_attention_heads": s["num_attention_heads"],
           "num_key_value_heads": s["num_key_value_heads"], "head_dim": s["head_dim"], "vocab_size": s["vocab_size"],
           "max_position_embeddings": s["max_position_embeddings"], "rms_norm_eps": 1e-6, "rope_theta": 1e6,
           "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "initializer_range": s["std"], "bos_token_id": 1, "eos_token_id": 2, "num_experts_per_tok": m["top_k"]}
    if arch == "mixtral":
        cfg.update(num_local_experts=m["experts"], intermediate_size=m["width"], sliding_window=None)
    else:
        cfg.update(num_experts=m["experts"], moe_intermediate_size=m["width"], intermediate_size=s["intermediate_size"],
                   norm_topk_prob=m["renormalize"], decoder_sparse_step=1, mlp_only_layers=[],
                   attention_bias=False)
    if arch == "qwen2_moe":
        cfg.update(shared_expert_intermediate_size=m["shared"], qkv_bias=True)
    return cfg


def model_config(shape: str) -> dict:
    s = SHAPES[shape]
    if "moe" in s:
        return moe_config(shape)
    qwen = s.get("arch") == "qwen2"
    return {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"], "model_type": "qwen2" if qwen else "llama",
        "hidden_size": s["hidden_size"], "intermediate_size": s["intermediate_size"],
        "num_hidden_layers": s["num_hidden_layers"], "num_attention_heads": s["num_attention_heads"],
        "num_key_value_heads": s["num_key_value_heads"], "head_dim": s["head_dim"],
        "vocab_size": s["vocab_size"], "max_position_embeddings": s["max_position_embeddings"],
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": bool(s.get("tie")),
        "attention_bias": qwen, "mlp_bias": False, "torch_dtype": "bfloat16", "initializer_range": s["std"],
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    }


def make_model(out: Path, shape: str, seed: int, device: str, tokenizer: bool = False) -> dict:
    import torch
    from safetensors.torch import save_file

    s = SHAPES[shape]
    cfg = model_config(shape)
    H, I, L = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
    nq, nkv, D, V = s["num_attention_heads"], s["num_key_value_heads"], s["head_dim"], s["vocab_size"]
    g = torch.Generator(device=device).manual_seed(seed)

    def rn(*shp, std):
        return (torch.randn(*shp, generator=g, device=device, dtype=torch.float32) * std).to(torch.bfloat16)

    def norm(n):
        return (1.0 + torch.randn(n, generator=g, device=device, dtype=torch.float32) * 0.05).to(torch.bfloat16)

    sd = {"model.embed_tokens.weight": rn(V, H, std=s["std"])}
    moe = s.get("moe")
    for i in range(L):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = norm(H)
        sd[p + "self_attn.q_proj.weight"] = rn(nq * D, H, std=s["std"])
        sd[p + "self_attn.k_proj.weight"] = rn(nkv * D, H, std=s["std"])
        sd[p + "self_attn.v_proj.weight"] = rn(nkv * D, H, std=s["std"])
        if cfg.get("attention_bias") or cfg.get("qkv_bias"):  # Qwen2, Qwen2-MoE: q/k/v biases
            for x, n in (("q", nq), ("k", nkv), ("v", nkv)):
                sd[p + f"self_attn.{x}_proj.bias"] = rn(n * D, std=0.1)
        if s.get("arch") == "qwen3_moe":  # per-head q/k norms
            sd[p + "self_attn.q_norm.weight"] = norm(D)
            sd[p + "self_attn.k_norm.weight"] = norm(D)
        sd[p + "self_attn.o_proj.weight"] = rn(H, nq * D, std=s["std"])
        sd[p + "post_attention_layernorm.weight"] = norm(H)
        if moe:
            sd.update(_moe_layer(p, s, rn))
            continue
        sd[p + "mlp.gate_proj.weight"] = rn(I, H, std=s["std"])
        sd[p + "mlp.up_proj.weight"] = rn(I, H, std=s["std"])
        sd[p + "mlp.down_proj.weight"] = rn(H, I, std=s["std"])
    sd["model.norm.weight"] = norm(H)
    if cfg["tie_word_embeddings"]:  # the embedding is the lm_head: scaled so sampled tokens carry probability
        sd["model.embed_tokens.weight"] = rn(V, H, std=s["lm_head_std"])
    else:
        sd["lm_head.weight"] = rn(V, H, std=s["lm_head_std"])
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().cpu() for k, v in sd.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    if tokenizer:
        write_word_tokenizer(out, V, cfg["max_position_embeddings"])
    # the stamp is part of the folder, so it holds no digest of the folder (nor its path): the
    # returned info does, taken after the stamp is written
    info = {"shape": shape, "seed": seed, "built_on": device, "params": int(sum(v.numel() for v in sd.values()))}
    (out / "tica_model.json").write_text(json.dumps(info, indent=1))
    return dict(info, dir=str(out), weights_hash=weights_hash(out))


def _moe_layer(p: str, s: dict, rn) -> dict:
    """One layer's MoE weights under the checkpoint names vLLM loads: the router at a larger scale
    than the experts, so routes are decided by clear margins and a route flip means a real change."""
    m, H = s["moe"], s["hidden_size"]
    mixtral = s["arch"] == "mixtral"
    b = p + ("block_sparse_moe." if mixtral else "mlp.")
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out = {b + "gate.weight": rn(m["experts"], H, std=0.1)}
    for e in range(m["experts"]):
        out[f"{b}experts.{e}.{gate}.weight"] = rn(m["width"], H, std=s["std"])
        out[f"{b}experts.{e}.{up}.weight"] = rn(m["width"], H, std=s["std"])
        out[f"{b}experts.{e}.{down}.weight"] = rn(H, m["width"], std=s["std"])
    if m.get("shared"):
        out[b + "shared_expert.gate_proj.weight"] = rn(m["shared"], H, std=s["std"])
        out[b + "shared_expert.up_proj.weight"] = rn(m["shared"], H, std=s["std"])
        out[b + "shared_expert.down_proj.weight"] = rn(H, m["shared"], std=s["std"])
        out[b + "shared_expert_gate.weight"] = rn(1, H, std=0.1)
    return out


def write_word_tokenizer(out: Path, vocab: int, max_len: int) -> None:
    """A word-level tokenizer whose tokens are base-36 words split on whitespace: decode then encode
    gives back exactly the same ids, so `bench serve --dataset-name random` sends exactly the
    requested number of input tokens. Special: <unk>=0, <s>=1, </s>=2."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    def word(i: int) -> str:  # base 36, at most 3 characters for 32000 ids: vLLM refuses prompts
        d = "0123456789abcdefghijklmnopqrstuvwxyz"  # longer than 5 characters per allowed token
        w = ""
        while True:
            w = d[i % 36] + w
            i //= 36
            if i == 0:
                return w

    vocab_map = {word(i): i for i in range(3, vocab)}
    for i, name in enumerate(("<unk>", "<s>", "</s>")):
        vocab_map[name] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab_map, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
        "eos_token": "</s>", "model_max_length": max_len, "clean_up_tokenization_spaces": False}))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}))

