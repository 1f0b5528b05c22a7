"""A tiny Llama-shaped checkpoint with seeded random bf16 weights, for fast tests.

Written without transformers' model classes (safetensors + JSON + a `tokenizers` word-level
tokenizer), so the same seed gives the same bytes everywhere. The tokenizer maps `t<N>` to id N
so the throughput benchmark's random workload round-trips exactly through text.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
# Digits, a few words and the boxed marker, so a problem set renders to known tokens.
WORDS = tuple("0123456789") + ("\\boxed{", "}", "answer", "is", "the", "What", "?", "+", "-", "*", "=", ".")


@dataclass(frozen=True)
class TinyLlamaSpec:
    hidden_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 512
    vocab_size: int = 1024
    max_position_embeddings: int = 1024
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    seed: int = 0
    lm_head_std: float = 0.2  # logits with std ~3: peaked enough that probs and diffs mean something

    def hf_config(self) -> dict:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
            "initializer_range": 0.02,
        }


def _weights(spec: TinyLlamaSpec) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(spec.seed)

    def normal(shape, std):
        return (torch.randn(shape, generator=g, dtype=torch.float32) * std).to(torch.bfloat16)

    def linear(out_f, in_f):
        return normal((out_f, in_f), 1.0 / math.sqrt(in_f))

    def norm(n):
        return (1.0 + torch.randn(n, generator=g) * 0.05).to(torch.bfloat16)

    h, hd = spec.hidden_size, spec.head_dim
    q, kv = spec.num_attention_heads * hd, spec.num_key_value_heads * hd
    w = {"model.embed_tokens.weight": normal((spec.vocab_size, h), 1.0)}
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "self_attn.q_proj.weight"] = linear(q, h)
        w[p + "self_attn.k_proj.weight"] = linear(kv, h)
        w[p + "self_attn.v_proj.weight"] = linear(kv, h)
        w[p + "self_attn.o_proj.weight"] = linear(h, q)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = linear(spec.intermediate_size, h)
        w[p + "mlp.up_proj.weight"] = linear(spec.intermediate_size, h)
        w[p + "mlp.down_proj.weight"] = linear(h, spec.intermediate_size)
    w["model.norm.weight"] = norm(h)
    w["lm_head.weight"] = normal((spec.vocab_size, h), spec.lm_head_std)
    return w


def vocabulary(vocab_size: int) -> dict[str, int]:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for word in WORDS:
        vocab[word] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"t{len(vocab)}"] = len(vocab)
    return vocab


def _write_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=vocabulary(vocab_size), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<unk>",
                "model_max_length": 1024,
                "clean_up_tokenization_spaces": False,
                "add_bos_token": False,
            },
            indent=1,
        )
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"})
    )


def build_tiny_llama(out_dir: str | Path, spec: TinyLlamaSpec = TinyLlamaSpec(), *, overwrite: bool = False) -> Path:
    """Write the checkpoint; reuse an existing one built from the same spec."""
    out = Path(out_dir)
    stamp = out / "tica_model.json"
    if stamp.is_file() and not overwrite:
        prior = json.loads(stamp.read_text())
        if prior.get("spec") == asdict(spec) and (out / "model.safetensors").is_file():
            return out
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(spec.hf_config(), indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    save_file(_weights(spec), str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_tokenizer(out, spec.vocab_size)
    # Written last (it marks a complete build) and inside the folder, so it holds no digest of the
    # folder: `tica.models.hashing.weights_hash(out)` is that digest, the manifest's and the legs'.
    stamp.write_text(json.dumps({"kind": "tiny-llama", "spec": asdict(spec)}, indent=1))
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="build the tiny seeded Llama checkpoint")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(build_tiny_llama(a.out, TinyLlamaSpec(seed=a.seed)))
