"""What this backend depends on inside vLLM, pinned, and the check that it is still there.

The kernels are vLLM's internals, not its API: a release may move or re-route them without
notice, and then a "bitwise" trainer silently stops being one. So the backend refuses to run on
anything but the pinned version (``TICA_VLLM_KERNELS_ALLOW_VERSION=1`` skips only the version
string check, never the others) and verifies, before its first forward:

* every kernel entry point exists with the signature used here (``check_symbols``);
* vLLM's own layers still route to those kernels under ``VLLM_BATCH_INVARIANT=1``
  (``check_routing``: the source of the dispatching methods still names the kernel; this is
  a text check over vLLM's installed files, so it also runs where vLLM cannot be imported).

Measured basis: a lab run of vllm_kernel_forward + compute_token_logprobs against vLLM itself
matched vLLM 0.26.0 bitwise on an H200 (0/1563 prefill, 0/64 decode tokens, mid model).
"""

from __future__ import annotations

import inspect
from pathlib import Path

from tica import leg_settings

from . import VLLM_PINNED


class VllmInternalsMoved(RuntimeError):
    """vLLM is not the version, or no longer has the internals, this backend was built on."""


# op -> (module, attribute, what vLLM routes there under VLLM_BATCH_INVARIANT=1)
KERNELS: dict[str, dict[str, str]] = {
    "linear": {
        "entry": "vllm.model_executor.layers.batch_invariant.linear_batch_invariant",
        "impl": "Triton persistent matmul (batch_invariant.matmul_persistent), bf16 config "
                "BLOCK 128x128x64, GROUP_SIZE_M 8, 3 stages, 8 warps; bias added in bf16",
        "routed_by": "UnquantizedLinearMethod.apply and the lm_head (UnquantizedEmbeddingMethod.apply)",
    },
    "rms_norm": {
        "entry": "vllm.model_executor.layers.batch_invariant.rms_norm_batch_invariant",
        "impl": "Triton _rms_norm_kernel (one program per row, fp32 sum of squares)",
        "routed_by": "RMSNorm.forward_cuda with residual=None",
    },
    "fused_add_rms_norm": {
        "entry": "vllm._custom_ops.fused_add_rms_norm",
        "impl": "torch.ops._C.fused_add_rms_norm (in place: residual += x; x = rmsnorm(residual))",
        "routed_by": "RMSNorm.forward_cuda with a residual (rms_norm_batch_invariant forwards to it)",
    },
    "rotary": {
        "entry": "vllm._custom_ops.rotary_embedding",
        "impl": "torch.ops._C.rotary_embedding, neox style, bf16 cos/sin cache built on the GPU",
        "routed_by": "RotaryEmbedding.forward_cuda",
    },
    "silu_and_mul": {
        "entry": "torch.ops._C.silu_and_mul",
        "impl": "vLLM CUDA kernel",
        "routed_by": "SiluAndMul.forward_cuda",
    },
    "attention": {
        "entry": "vllm.vllm_flash_attn.flash_attn_varlen_func",
        "impl": "FlashAttention 3 varlen, causal, num_splits=1 (forward only: no FA3 backward here)",
        "routed_by": "FlashAttentionImpl (attention_backend=FLASH_ATTN) with batch_invariant_enabled",
    },
    "logprob": {
        "entry": "vllm.v1.worker.gpu.sample.logprob.compute_token_logprobs",
        "impl": "Triton _topk_log_softmax_kernel on bf16 logits (the V2 model runner's logprobs)",
        "routed_by": "vllm.v1.worker.gpu (Model Runner V2) sampler / prompt logprobs",
    },
}

# Backward of each op: written in torch in autograd.py, never a vLLM kernel. Matmuls in the inputs'
# dtype (bf16 on the GPU: cuBLAS, fp32 accumulation), elementwise math in fp32.
BACKWARD = {
    "linear": "dX = dY W, dW = dY^T X (torch matmul in the input dtype, fp32 accumulation), db = sum dY in fp32",
    "rms_norm": "analytic RMSNorm backward in fp32 on the saved bf16 input",
    "fused_add_rms_norm": "residual-sum gradient + analytic RMSNorm backward on the saved new residual",
    "rotary": "transpose of the rotation (cos, -sin) with the same bf16 cache",
    "silu_and_mul": "d gate = dA u s (1 + g (1 - s)), d up = dA silu(g), fp32",
    "attention": "CUDA bf16: torch's FlashAttention-2 varlen backward after an FA2 recompute of the output and "
                 "log-sum-exp (FA3 has no backward in vLLM's wheel); elsewhere a tiled recompute in fp32 or wider: "
                 "P = softmax(scale QK^T + causal mask); dV = P^T dO; dS = P (dO V^T - rowsum(dO*O)); "
                 "dQ = scale dS K; dK = scale dS^T Q",
    "logprob": "d logits = g (onehot(target) - softmax(logits)), fp32 softmax of the bf16 logits",
    "lm_head_logprob": "vocabulary chunks: logits recomputed (matmul in the input dtype), fp32 log-sum-exp, "
                       "d logits = g (onehot - softmax) folded at once into dH and the chunk's rows of dW",
}

# Text that must still be in vLLM's dispatching code (relative path -> needles).
ROUTING_NEEDLES: dict[str, tuple[str, ...]] = {
    "model_executor/layers/linear.py": ("if envs.VLLM_BATCH_INVARIANT and current_platform.is_cuda_alike():",
                                        "return linear_batch_invariant(x, layer.weight, bias)"),
    "model_executor/layers/vocab_parallel_embedding.py": ("return linear_batch_invariant(x, layer.weight, bias)",),
    "model_executor/layers/layernorm.py": ("return rms_norm_batch_invariant(",),
    "model_executor/layers/batch_invariant.py": ("ops.fused_add_rms_norm(input, residual, weight, eps)",
                                                 "def matmul_persistent(",
                                                 "def linear_batch_invariant(input, weight, bias=None):"),
    "v1/attention/backends/flash_attn.py": ("num_splits=1 if self.batch_invariant_enabled else 0",),
    "v1/worker/gpu/sample/logprob.py": ("def compute_token_logprobs(",),
    "model_executor/layers/rotary_embedding/base.py": ("ops.rotary_embedding(",),
}


def vllm_root() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def installed_version(root: Path | None = None) -> str | None:
    root = root or vllm_root()
    if root is None:
        return None
    for name in ("_version.py",):
        p = root / name
        if p.is_file():
            for line in p.read_text().splitlines():
                if line.strip().startswith("__version__") and "=" in line:
                    val = line.rsplit("=", 1)[1].strip().strip("'\"")
                    if val and val[0].isdigit():
                        return val
    try:
        from importlib import metadata

        return metadata.version("vllm")
    except Exception:  # noqa: BLE001
        return None


def check_version(version: str | None) -> None:
    if version == VLLM_PINNED:
        return
    if leg_settings.allow_vllm_version():
        return
    raise VllmInternalsMoved(
        f"tica.legs.vllm_kernels is pinned to vLLM {VLLM_PINNED} and found vLLM {version!r}. "
        "The trainer forward is bitwise only while it calls the very kernels vLLM serves with; "
        "re-measure on the new version (scripts/h200) before changing VLLM_PINNED, or set "
        "TICA_VLLM_KERNELS_ALLOW_VERSION=1 to try anyway (routing and symbol checks still run).")


def check_routing(root: Path | None = None) -> list[str]:
    """Problems with vLLM's dispatch code (empty = still routed as pinned). Text only."""
    root = root or vllm_root()
    if root is None:
        return ["vllm is not installed"]
    problems = []
    for rel, needles in ROUTING_NEEDLES.items():
        p = root / rel
        if not p.is_file():
            problems.append(f"vllm/{rel} is gone")
            continue
        text = p.read_text()
        for needle in needles:
            if needle not in text:
                problems.append(f"vllm/{rel} no longer contains {needle!r}")
    return problems


def check_symbols() -> dict[str, object]:
    """Import every kernel entry point (needs vLLM importable, i.e. a GPU node). Returns them."""
    import importlib

    import torch

    found: dict[str, object] = {}
    problems = []
    for op, info in KERNELS.items():
        entry = info["entry"]
        if entry.startswith("torch.ops._C."):
            import vllm._custom_ops  # noqa: F401  (loads the _C library)

            name = entry.rsplit(".", 1)[1]
            fn = getattr(torch.ops._C, name, None)
        else:
            mod, attr = entry.rsplit(".", 1)
            try:
                fn = getattr(importlib.import_module(mod), attr, None)
            except Exception as err:  # noqa: BLE001
                problems.append(f"{entry}: import failed ({err!r})")
                continue
        if fn is None:
            problems.append(f"{entry}: missing")
            continue
        found[op] = fn
    fa = found.get("attention")
    if fa is not None:
        params = inspect.signature(fa).parameters
        for p in ("num_splits", "fa_version", "cu_seqlens_k", "out"):
            if p not in params:
                problems.append(f"flash_attn_varlen_func lost its {p!r} parameter")
    if problems:
        raise VllmInternalsMoved("vLLM internals moved: " + "; ".join(problems))
    return found


def check_vllm(*, import_symbols: bool = True) -> dict:
    """The full check; returns what to record in leg.json's kernels."""
    root = vllm_root()
    version = installed_version(root)
    check_version(version)
    problems = check_routing(root)
    if problems:
        raise VllmInternalsMoved("vLLM internals moved: " + "; ".join(problems))
    if import_symbols:
        check_symbols()
    return {"vllm_pinned": VLLM_PINNED, "vllm_found": version,
            "forward": {k: v["entry"] + " — " + v["impl"] for k, v in KERNELS.items()},
            "backward": dict(BACKWARD)}
