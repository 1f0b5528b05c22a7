"""A source overlay for vLLM 0.26 under VLLM_BATCH_INVARIANT=1: the residual RMSNorm through
vLLM's batch-invariant Triton norm.

Stock 0.26 routes ``RMSNorm(x, residual)`` to ``_C.fused_add_rms_norm`` even under batch
invariance (``batch_invariant.rms_norm_batch_invariant`` forwards a residual there), and that
CUDA kernel picks its block size from the number of tokens in the call (1024 threads below 256
tokens, 256 from there: upstream issue #48271). A row's bits then depend on how many tokens
shared its engine step. The overlay computes the residual add in bf16 (one rounding, as the CUDA
kernel stores it) and normalizes with the Triton ``_rms_norm_kernel`` (one program per row), so
no row depends on its neighbours.

Shipped the way a team ships such a patch: a vLLM general plugin (entry point group
``vllm.general_plugins``), which vLLM loads in every process it starts. ``write_plugin_dist``
writes the distribution metadata into a folder put on PYTHONPATH; nothing in vLLM's files changes.
The manifest's source component records this file (``overlay_record``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

NAME = "tica_rmsnorm_bi"
ENTRY_POINT = "tica.legs.vllm_kernels.overlay:register"
_ACTIVE = False


def rms_norm_batch_invariant_overlay(input, weight, eps=1e-6, residual=None):
    """``batch_invariant.rms_norm_batch_invariant`` with the residual path made row-local."""
    if residual is None:
        return _STOCK(input, weight, eps)
    new_residual = input + residual
    return _STOCK(new_residual, weight, eps), new_residual


_STOCK = None


def register() -> None:
    """The plugin's entry: swap the residual path of vLLM's batch-invariant norm (idempotent;
    vLLM may call it more than once per process)."""
    global _STOCK, _ACTIVE
    if _ACTIVE:
        return
    from vllm.model_executor.layers import batch_invariant as bi
    from vllm.model_executor.layers import layernorm

    _STOCK = bi.rms_norm_batch_invariant
    bi.rms_norm_batch_invariant = rms_norm_batch_invariant_overlay
    layernorm.rms_norm_batch_invariant = rms_norm_batch_invariant_overlay  # imported by name there
    _ACTIVE = True


def active() -> bool:
    """Whether vLLM's RMSNorm calls the overlay in this process (read from vLLM, not the flag)."""
    try:
        from vllm.model_executor.layers import layernorm
    except Exception:  # noqa: BLE001 - no vLLM here
        return False
    return getattr(layernorm, "rms_norm_batch_invariant", None) is rms_norm_batch_invariant_overlay


def write_plugin_dist(folder: Path) -> Path:
    """A distribution whose only content is the entry point, for PYTHONPATH: vLLM's plugin loader
    (importlib.metadata) finds it; the code stays in this package."""
    d = Path(folder) / "tica_vllm_overlay-0.1.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: tica-vllm-overlay\nVersion: 0.1\n")
    (d / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{NAME} = {ENTRY_POINT}\n")
    return d


def overlay_record() -> dict:
    """What the manifest's source component records: the overlay's file and its sha256."""
    src = Path(__file__)
    return {"name": NAME, "entry_point": ENTRY_POINT, "file": "tica/legs/vllm_kernels/overlay.py",
            "sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
            "replaces": "vllm.model_executor.layers.batch_invariant.rms_norm_batch_invariant (residual path)"}
