"""The megatron-core trainer forward: a `GPTModel` (local layer spec, world size 1) built from the
same safetensors as the rollout engine, Llama-shaped checkpoints only.

On CUDA it is Megatron's regular bf16 path as far as it goes without TransformerEngine and apex:
parameters created on the GPU (`use_cpu_initialization=False`), Megatron's CUDA RNG tracker seeded,
the model wrapped in `Float16Module`, torch.distributed (NCCL) and `parallel_state` initialised
with every parallel size 1. On the CPU (tests, dry runs) it applies the workarounds measured in
ENVIRONMENT.md instead: CPU initialisation, GlobalMemoryBuffer on the CPU, a null CUDA RNG fork and
RoPE frequencies left on the CPU. The two never mix in one process: a CUDA model after the CPU
patches is refused.

`megatron_token_logprobs` is the entry point for the GPU producer's BI=0 arm.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tica.legs.trainer_base import Trainer, _dtype, _gather_logprobs

_PATCHED: list[str] = []
_DIST: dict = {}  # what _init_parallel did, once per process
RNG_SEED = 1234  # Megatron's CUDA RNG tracker seed; only dropout would draw from it, and dropout is 0

# Extensions Megatron's fused paths load; none is required by the configuration below.
FUSED_MODULES = {
    "transformer_engine": "TE layer spec, fused RoPE, TE attention (not used: local spec)",
    "apex": "FusedLayerNorm / fused Adam (not used: torch RMSNorm, no optimizer)",
    "flash_attn": "flash attention through TE (not used: DotProductAttention)",
    "scaled_upper_triang_masked_softmax_cuda": "masked_softmax_fusion=True (left False)",
    "scaled_masked_softmax_cuda": "masked_softmax_fusion=True with a mask (left False)",
    "fused_weight_gradient_mlp_cuda": "gradient_accumulation_fusion=True (left False)",
}


def _as_device(device) -> torch.device:
    d = torch.device(device)
    if d.type == "cuda" and d.index is None and torch.cuda.is_available():
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def _cpu_workarounds(device: torch.device | str | None = None) -> list[str]:
    """Patch megatron-core for a CPU forward; a no-op (returning []) for a CUDA device."""
    d = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if d.type != "cpu":
        return []
    if _PATCHED:
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


def _init_parallel(device: torch.device) -> dict:
    """torch.distributed (world size 1) and megatron `parallel_state` (all sizes 1), once per process.

    A default process group that already exists (vLLM's engine core in this process, or an earlier
    call) is reused; otherwise one is made here on a file store (a free localhost TCP port if the
    file store fails): gloo on the CPU, NCCL on CUDA (gloo if NCCL fails, recorded). On CUDA, Megatron's CUDA RNG tracker is seeded (the GPU default generator's
    state is put back afterwards). Returns what was done."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    if _DIST and (not dist.is_initialized() or _DIST.get("_world") is not dist.group.WORLD):
        # the world megatron's groups were built on is gone (destroyed and maybe remade): rebuild them
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        _DIST.clear()
    failed: list[str] = []
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # NCCL is Megatron's backend on GPUs; at world size 1 no collective runs in a forward, so
        # gloo is a working fallback should NCCL refuse to start (recorded, not hidden)
        how = None
        for backend in (("nccl", "gloo") if device.type == "cuda" else ("gloo",)):
            for store in ("file", "tcp"):
                if store == "file":
                    init = f"file://{Path(tempfile.mkdtemp(prefix='tica-megatron-pg-')) / 'store'}"
                else:
                    import socket

                    with socket.socket() as sk:
                        sk.bind(("127.0.0.1", 0))
                        init = f"tcp://127.0.0.1:{sk.getsockname()[1]}"
                try:
                    dist.init_process_group(backend, init_method=init, rank=0, world_size=1)
                except Exception as err:  # noqa: BLE001 - recorded in the receipt
                    failed.append(f"{backend} on a {store} store: {type(err).__name__}: {str(err)[:300]}")
                    continue
                how = f"init_process_group({backend!r}, {store} store, rank 0, world size 1) by tica"
                break
            if how:
                break
        if how is None:
            raise RuntimeError("torch.distributed would not start: " + " | ".join(failed))
    else:
        how = "reused this process's default group (made before tica's call)"
    if dist.get_world_size() != 1:
        raise RuntimeError(f"megatron trainer forward runs at world size 1, not {dist.get_world_size()}")
    if not _DIST:
        _DIST.update({"torch_distributed": how, "backend": str(dist.get_backend()), "world_size": 1,
                      "_world": dist.group.WORLD})
        if failed:
            _DIST["init_attempts_failed"] = failed
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
            expert_model_parallel_size=1, create_gloo_process_groups=device.type == "cpu")
        _DIST["parallel_state"] = ("initialize_model_parallel(tp=1, pp=1, cp=1, ep=1; dp=1), "
                                   f"gloo side groups {'on' if device.type == 'cpu' else 'off'}")
    _DIST.setdefault("parallel_state", "already initialised before tica's call")
    if device.type == "cuda" and not _DIST.get("cuda_rng"):
        with torch.cuda.device(device):
            state = torch.cuda.get_rng_state()
            tensor_parallel.model_parallel_cuda_manual_seed(RNG_SEED)
            torch.cuda.set_rng_state(state)
        _DIST["cuda_rng"] = f"model_parallel_cuda_manual_seed({RNG_SEED}) (default CUDA generator state restored)"
    return {k: v for k, v in _DIST.items() if not k.startswith("_")}


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


def _fused_availability() -> dict[str, bool]:
    out = {}
    for mod in FUSED_MODULES:
        try:
            out[mod] = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            out[mod] = False
    return out


def _torch_flags() -> dict:
    """Process-wide torch settings the forward runs under (another library in this process, such as
    vLLM's engine core, may have set them)."""
    m = torch.backends.cuda.matmul
    return {"cuda_matmul_allow_tf32": m.allow_tf32,
            "cuda_matmul_allow_bf16_reduced_precision_reduction": m.allow_bf16_reduced_precision_reduction,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


class MegatronTrainer(Trainer):
    name = "megatron"
    trainable = True

    def __init__(self, model_dir: str | Path, dtype: str = "bfloat16", device: str | torch.device | None = None) -> None:
        import torch.nn.functional as F
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_config import TransformerConfig
        from safetensors.torch import load_file

        self.model_dir = Path(model_dir)
        self.dtype = dtype
        self.device = _as_device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        cfg = json.loads((self.model_dir / "config.json").read_text())
        if cfg.get("model_type") not in ("llama",) and "LlamaForCausalLM" not in cfg.get("architectures", []):
            raise SystemExit(f"megatron trainer supports Llama-shaped checkpoints, not {cfg.get('model_type')}")
        for k in ("attention_bias", "mlp_bias"):
            if cfg.get(k):
                raise ValueError(f"megatron trainer maps bias-free Llama checkpoints only ({k}=true)")
        if cfg.get("rope_scaling"):
            raise ValueError(f"megatron trainer maps plain RoPE only, not rope_scaling={cfg['rope_scaling']}")
        self.cfg = cfg
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        on_cpu = self.device.type == "cpu"
        if not on_cpu and _PATCHED:
            raise RuntimeError("megatron-core was patched for a CPU forward in this process; "
                               "a CUDA model here would not be the regular path")
        if not on_cpu and not torch.cuda.is_available():
            raise RuntimeError(f"megatron trainer on {self.device}, but torch {torch.__version__} sees no CUDA device")
        self.workarounds = _cpu_workarounds(self.device)
        if not on_cpu:
            torch.cuda.set_device(self.device)
        self.parallel = _init_parallel(self.device)
        nq = cfg["num_attention_heads"]
        half = dtype in ("bfloat16", "float16")
        self.config = TransformerConfig(
            num_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"], num_attention_heads=nq,
            num_query_groups=cfg.get("num_key_value_heads", nq), ffn_hidden_size=cfg["intermediate_size"],
            kv_channels=cfg.get("head_dim") or cfg["hidden_size"] // nq, normalization="RMSNorm",
            layernorm_epsilon=cfg.get("rms_norm_eps", 1e-6), gated_linear_unit=True, activation_func=F.silu,
            add_bias_linear=False, add_qkv_bias=False, bias_activation_fusion=False, bias_dropout_fusion=False,
            masked_softmax_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
            gradient_accumulation_fusion=False,
            attention_dropout=0.0, hidden_dropout=0.0, params_dtype=_dtype(dtype), bf16=dtype == "bfloat16",
            fp16=dtype == "float16", attention_softmax_in_fp32=True,
            use_cpu_initialization=on_cpu, perform_initialization=False,  # the checkpoint is loaded right after
            pipeline_dtype=_dtype(dtype) if half else torch.float32,
        )
        self.model = GPTModel(
            config=self.config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
            vocab_size=cfg["vocab_size"], max_sequence_length=cfg.get("max_position_embeddings", 2048),
            pre_process=True, post_process=True, share_embeddings_and_output_weights=self.tied,
            position_embedding_type="rope", rotary_base=int(cfg.get("rope_theta", 10000)), rotary_percent=1.0,
        )
        if not on_cpu:
            # as Megatron-LM's get_model: module.cuda(current device), then Float16Module. The local
            # spec's torch.nn.RMSNorm is made on the default device (the CPU) whatever the config says
            self.model.cuda(self.device)
        hf = {}
        for f in sorted(self.model_dir.glob("*.safetensors")):
            hf.update(load_file(str(f)))
        mg = hf_to_megatron(hf, cfg)
        missing, unexpected = self.model.load_state_dict({k: v.to(_dtype(dtype)) for k, v in mg.items()}, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if missing or unexpected:
            raise RuntimeError(f"megatron weight mapping: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.model.eval()
        # Megatron's training loop wraps a half-precision model in Float16Module: it casts every
        # parameter to bf16/fp16 (the torch norms too) and returns fp32 logits
        if half:
            from megatron.core.transformer.module import Float16Module

            self.forward_module = Float16Module(self.config, self.model).eval()
        else:
            self.forward_module = self.model
        wrong = sorted({(str(p.device), str(p.dtype)) for p in self.model.parameters()}
                       - {(str(self.device), str(_dtype(dtype)))})
        if wrong:
            raise RuntimeError(f"megatron parameters on/in {wrong}, not {self.device}/{dtype}")

    def token_logprobs(self, seq: list[int]) -> torch.Tensor:
        ids = torch.tensor(seq, dtype=torch.long, device=self.device)
        n = ids.numel()
        pos = torch.arange(n, dtype=torch.long, device=self.device).unsqueeze(0)
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=self.device), diagonal=1)[None, None]
        logits = self.forward_module(input_ids=ids.unsqueeze(0), position_ids=pos, attention_mask=mask)
        return _gather_logprobs(logits[0], ids)

    def logprobs(self, seqs: list[list[int]]) -> list[np.ndarray]:
        with torch.no_grad():
            return [self.token_logprobs(s).float().cpu().numpy().astype(np.float32) for s in seqs]

    def parameters(self):
        return self.model.named_parameters()

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        sd = {k: v.detach().cpu() for k, v in self.model.state_dict().items() if not k.endswith("_extra_state")}
        return {k: v.contiguous() for k, v in megatron_to_hf(sd, self.cfg, self.tied).items()}

    def describe(self) -> dict:
        from importlib import metadata

        c = self.config
        dev = str(self.device)
        if self.device.type == "cuda":
            dev += f" ({torch.cuda.get_device_name(self.device)})"
        return {
            "trainer": self.name,
            "class": "megatron.core.models.gpt.GPTModel"
                     + (" wrapped in megatron.core.transformer.module.Float16Module" if self.forward_module is not self.model else ""),
            "megatron_core": metadata.version("megatron-core"),
            "megatron_core_path": str(Path(__import__("megatron.core").core.__file__).parent),
            "torch": torch.__version__, "device": dev, "dtype": self.dtype,
            "spec": "get_gpt_layer_local_spec(normalization='RMSNorm'): ColumnParallelLinear/RowParallelLinear "
                    "(torch matmul), WrappedTorchNorm -> torch.nn.RMSNorm, no TransformerEngine",
            "attention": "megatron DotProductAttention: baddbmm QK^T in the model dtype, FusedScaleMaskSoftmax's "
                         "unfused torch softmax in fp32 with a causal bool mask, bmm PV",
            "rope": "megatron unfused _apply_rotary_pos_emb_bshd (apply_rope_fusion=False)",
            "mlp": "linear_fc1 = [gate; up], silu(gate) * up (bias_activation_fusion=False), linear_fc2",
            "logprob": "torch.log_softmax(fp32 logits)",
            "parallel": {"tensor": 1, "pipeline": 1, "context": 1, "expert": 1, "data": 1, **self.parallel},
            "init": "parameters made on the CPU (use_cpu_initialization=True)" if self.device.type == "cpu"
                    else "parameters made on the GPU (use_cpu_initialization=False, perform_initialization=False), "
                         "then the checkpoint loaded",
            "fusions": {k: getattr(c, k) for k in ("masked_softmax_fusion", "bias_activation_fusion",
                                                    "bias_dropout_fusion", "apply_rope_fusion", "persist_layer_norm",
                                                    "gradient_accumulation_fusion", "attention_softmax_in_fp32")},
            "fused_extensions_importable": _fused_availability(),
            "fused_extensions_role": dict(FUSED_MODULES),
            "cpu_workarounds": list(self.workarounds),
            "torch_flags": _torch_flags(),
        }


_CACHE: dict[tuple, MegatronTrainer] = {}


def _model_key(model_dir: Path, device: torch.device, dtype: str) -> tuple:
    files = sorted(Path(model_dir).glob("*.safetensors")) + [Path(model_dir) / "config.json"]
    return (str(Path(model_dir).resolve()), str(device), dtype,
            tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files))


def megatron_token_logprobs(model_dir: Path, sequences: list[list[int]], device: str = "cuda",
                            dtype=torch.bfloat16) -> tuple[np.ndarray, dict]:
    """Logprobs of tokens 1..n-1 of each sequence under megatron-core's GPTModel, concatenated
    (float32), in the layout of HF's `log_softmax(logits[:-1].float()).gather(ids[1:])`.

    One sequence at a time (batch 1, no padding). The model is built once per (model dir, its
    files' size and mtime, device, dtype) and kept for later calls. Returns the array and a dict
    saying what ran."""
    names = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
    dname = names[dtype] if isinstance(dtype, torch.dtype) else str(dtype)
    dev = _as_device(device)
    key = _model_key(Path(model_dir), dev, dname)
    t0 = time.time()
    built = key not in _CACHE
    if built:
        for k in [k for k in _CACHE if k[:3] == key[:3]]:
            del _CACHE[k]  # same dir rewritten: drop the old model
        _CACHE[key] = MegatronTrainer(model_dir, dtype=dname, device=dev)
    tr = _CACHE[key]
    t1 = time.time()
    parts = tr.logprobs(sequences)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t2 = time.time()
    want = sum(max(len(s) - 1, 0) for s in sequences)
    flat = np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
    if flat.shape != (want,):
        raise RuntimeError(f"megatron logprobs: {flat.shape[0]} values for {want} scored tokens")
    info = tr.describe()
    info.update({"batching": "one sequence at a time (batch 1, no padding), full causal mask, position ids 0..n-1",
                 "n_sequences": len(sequences), "n_tokens_scored": want,
                 "model_built_this_call": built, "build_seconds": round(t1 - t0, 3),
                 "forward_seconds": round(t2 - t1, 3)})
    return flat, info
