"""The megatron-core trainer forward: a `GPTModel` (local layer spec, world size 1) built from the
same safetensors as the rollout engine, Llama-shaped checkpoints only. Without CUDA it applies the
three workarounds measured in ENVIRONMENT.md: CPU initialisation, GlobalMemoryBuffer on the CPU,
and a null CUDA RNG fork. On a GPU none is applied.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch

from tica.legs.trainers import Trainer, _dtype, _gather_logprobs

_PATCHED: list[str] = []


def _cpu_workarounds() -> list[str]:
    if torch.cuda.is_available() or _PATCHED:
        return list(_PATCHED)
    import megatron.core.utils as mutils
    from megatron.core.tensor_parallel import random as mrandom

    def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
        n = 1
        for d in tensor_shape:
            n *= d
        buf = self.buffer.get((name, dtype))
        if buf is None or buf.numel() < n:
            self.buffer[(name, dtype)] = buf = torch.empty(n, dtype=dtype, device="cpu")
        return buf[0:n].view(*tensor_shape)

    mutils.GlobalMemoryBuffer.get_tensor = get_tensor

    from megatron.core.models.common.embeddings import rotary_pos_embedding as rope

    def get_emb(self, max_seq_len: int, offset: int = 0):
        # megatron's own get_emb, less its move of inv_freq to torch.cuda.current_device()
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        if not self.rotary_interleaved:
            emb = torch.cat((freqs, freqs), dim=-1)
        else:
            emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
        return emb[:, None, None, :]

    rope.RotaryEmbedding.get_emb = get_emb
    mrandom.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    _PATCHED.extend(["GlobalMemoryBuffer.get_tensor -> cpu", "CudaRNGStatesTracker.fork -> nullcontext",
                     "RotaryEmbedding.get_emb without the move of inv_freq to CUDA",
                     "TransformerConfig(use_cpu_initialization=True)"])
    return list(_PATCHED)


def _init_parallel() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def hf_to_megatron(hf: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    """Llama HF names -> megatron-core local-spec names (qkv interleaved per query group, fc1 = [gate; up])."""
    nq, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    h = cfg["hidden_size"]
    hd = cfg.get("head_dim") or h // nq
    out = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if "lm_head.weight" in hf:
        out["output_layer.weight"] = hf["lm_head.weight"]
    for i in range(cfg["num_hidden_layers"]):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = hf[p + "self_attn.q_proj.weight"].view(nkv, nq // nkv * hd, h)
        k = hf[p + "self_attn.k_proj.weight"].view(nkv, hd, h)
        v = hf[p + "self_attn.v_proj.weight"].view(nkv, hd, h)
        out[m + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, h)
        out[m + "self_attention.linear_proj.weight"] = hf[p + "self_attn.o_proj.weight"]
        out[m + "input_layernorm.weight"] = hf[p + "input_layernorm.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[p + "post_attention_layernorm.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]], dim=0)
        out[m + "mlp.linear_fc2.weight"] = hf[p + "mlp.down_proj.weight"]
    return out


def megatron_to_hf(mg: dict[str, torch.Tensor], cfg: dict, tied: bool) -> dict[str, torch.Tensor]:
    nq, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    h = cfg["hidden_size"]
    hd = cfg.get("head_dim") or h // nq
    out = {"model.embed_tokens.weight": mg["embedding.word_embeddings.weight"],
           "model.norm.weight": mg["decoder.final_layernorm.weight"]}
    if not tied:
        out["lm_head.weight"] = mg["output_layer.weight"]
    else:
        out["lm_head.weight"] = mg["embedding.word_embeddings.weight"]
    for i in range(cfg["num_hidden_layers"]):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        qkv = mg[m + "self_attention.linear_qkv.weight"].view(nkv, (nq // nkv + 2) * hd, h)
        qs = nq // nkv * hd
        out[p + "self_attn.q_proj.weight"] = qkv[:, :qs].reshape(-1, h)
        out[p + "self_attn.k_proj.weight"] = qkv[:, qs : qs + hd].reshape(-1, h)
        out[p + "self_attn.v_proj.weight"] = qkv[:, qs + hd :].reshape(-1, h)
        out[p + "self_attn.o_proj.weight"] = mg[m + "self_attention.linear_proj.weight"]
        out[p + "input_layernorm.weight"] = mg[m + "input_layernorm.weight"]
        out[p + "post_attention_layernorm.weight"] = mg[m + "pre_mlp_layernorm.weight"]
        gate, up = mg[m + "mlp.linear_fc1.weight"].chunk(2, dim=0)
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate, up
        out[p + "mlp.down_proj.weight"] = mg[m + "mlp.linear_fc2.weight"]
    return out


class MegatronTrainer(Trainer):
    name = "megatron"
    trainable = True

    def __init__(self, model_dir: str | Path, dtype: str = "bfloat16") -> None:
        import torch.nn.functional as F
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_config import TransformerConfig
        from safetensors.torch import load_file

        self.model_dir = Path(model_dir)
        self.dtype = dtype
        cfg = json.loads((self.model_dir / "config.json").read_text())
        if cfg.get("model_type") not in ("llama",) and "LlamaForCausalLM" not in cfg.get("architectures", []):
            raise SystemExit(f"megatron trainer supports Llama-shaped checkpoints, not {cfg.get('model_type')}")
        self.cfg = cfg
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        self.workarounds = _cpu_workarounds()
        _init_parallel()
        nq = cfg["num_attention_heads"]
        tc = TransformerConfig(
            num_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"], num_attention_heads=nq,
            num_query_groups=cfg.get("num_key_value_heads", nq), ffn_hidden_size=cfg["intermediate_size"],
            kv_channels=cfg.get("head_dim") or cfg["hidden_size"] // nq, normalization="RMSNorm",
            layernorm_epsilon=cfg.get("rms_norm_eps", 1e-6), gated_linear_unit=True, activation_func=F.silu,
            add_bias_linear=False, add_qkv_bias=False, bias_activation_fusion=False, bias_dropout_fusion=False,
            masked_softmax_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
            attention_dropout=0.0, hidden_dropout=0.0, params_dtype=_dtype(dtype), bf16=dtype == "bfloat16",
            attention_softmax_in_fp32=True, use_cpu_initialization=True, pipeline_dtype=torch.float32,
        )
        self.model = GPTModel(
            config=tc, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
            vocab_size=cfg["vocab_size"], max_sequence_length=cfg.get("max_position_embeddings", 2048),
            pre_process=True, post_process=True, share_embeddings_and_output_weights=self.tied,
            position_embedding_type="rope", rotary_base=int(cfg.get("rope_theta", 10000)), rotary_percent=1.0,
        )
        hf = {}
        for f in sorted(self.model_dir.glob("*.safetensors")):
            hf.update(load_file(str(f)))
        mg = hf_to_megatron(hf, cfg)
        missing, unexpected = self.model.load_state_dict({k: v.to(_dtype(dtype)) for k, v in mg.items()}, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if missing or unexpected:
            raise RuntimeError(f"megatron weight mapping: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.model.eval()

    def token_logprobs(self, seq: list[int]) -> torch.Tensor:
        ids = torch.tensor(seq, dtype=torch.long)
        n = ids.numel()
        pos = torch.arange(n, dtype=torch.long).unsqueeze(0)
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)[None, None]
        logits = self.model(input_ids=ids.unsqueeze(0), position_ids=pos, attention_mask=mask)
        return _gather_logprobs(logits[0], ids)

    def parameters(self):
        return self.model.named_parameters()

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        sd = {k: v.detach() for k, v in self.model.state_dict().items() if not k.endswith("_extra_state")}
        return {k: v.contiguous() for k, v in megatron_to_hf(sd, self.cfg, self.tied).items()}

    def describe(self) -> dict:
        from importlib import metadata

        return {"trainer": self.name, "class": "megatron.core.models.gpt.GPTModel (local layer spec)",
                "megatron_core": metadata.version("megatron-core"), "dtype": self.dtype,
                "attention": "megatron DotProductAttention (unfused torch softmax, fp32)",
                "logprob": "torch.log_softmax(fp32 logits)", "cpu_workarounds": self.workarounds}
