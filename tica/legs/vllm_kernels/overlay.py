"""A source overlay for vLLM 0.26 under VLLM_BATCH_INVARIANT=1, in two parts (``PARTS``), each
removing one way a row's bits depend on the engine step it was computed in:

* ``rmsnorm``: stock 0.26 routes ``RMSNorm(x, residual)`` to ``_C.fused_add_rms_norm`` even under
  batch invariance (``batch_invariant.rms_norm_batch_invariant`` forwards a residual there), and
  that CUDA kernel picks its block size from the number of tokens in the call (1024 threads below
  256 tokens, 256 from there: upstream issue #48271). The overlay adds the residual in bf16 (one
  rounding, as the CUDA kernel stores it) and normalizes with the Triton ``_rms_norm_kernel`` (one
  program per row).
* ``fa_pin_tile``: vLLM's FlashAttention 3 picks its key tile from the step's ``max_seqlen_q``:
  a step whose packed query rows per KV head (``max_seqlen_q`` x the GQA ratio) are at most 64
  runs on one MMA warpgroup with 192-key tiles at head_dim 64, a bigger step on two with the
  causal 128-key tiles (its heuristics.h ``use_one_mma_wg``; tile_size.h), and a row's softmax sums
  follow the tiles. So a decode row of a small step differs from the same row in a prefill or a
  big step. The overlay passes ``max_seqlen_q`` of at least 65 (the sequences' real query lengths
  stay in ``cu_seqlens_q``; causal masking is per sequence, the grid gains no tiles) and drops
  vLLM's ahead-of-time scheduler metadata (made for the old value): every step keeps one tiling.
  (Run 2's ``fa_decode_causal`` raised it to 2 only, which kept the one-warpgroup tile: no effect.)

Shipped the way a team ships such a patch: a vLLM general plugin (entry point group
``vllm.general_plugins``) that vLLM loads in every process it starts; ``TICA_OVERLAY_PARTS``
chooses the parts (default: all). ``write_plugin_dist`` writes the distribution metadata into a
folder put on PYTHONPATH; nothing in vLLM's files changes. The manifest's source component
records this file and the parts (``overlay_record``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from tica import leg_settings

NAME = "tica_rmsnorm_bi"
ENTRY_POINT = "tica.legs.vllm_kernels.overlay:register"
def rms_norm_batch_invariant_overlay(input, weight, eps=1e-6, residual=None):
    """``batch_invariant.rms_norm_batch_invariant`` with the residual path made row-local."""
    if residual is None:
        return _STOCK(input, weight, eps)
    new_residual = input + residual
    return _STOCK(new_residual, weight, eps), new_residual


_STOCK = None
_STOCK_FA = None
PARTS = ("rmsnorm", "fa_pin_tile")
_ACTIVE: set[str] = set()


FA_MIN_SEQLEN_Q = 65  # above 64 packed rows per KV head even at a GQA ratio of 1: the two-warpgroup tile


def fa_pin_tile(*args, **kw):
    """vLLM's FlashAttentionImpl's call with max_seqlen_q raised to FA_MIN_SEQLEN_Q."""
    if kw.get("block_table") is not None and int(kw.get("max_seqlen_q") or 0) < FA_MIN_SEQLEN_Q:
        kw = dict(kw, max_seqlen_q=FA_MIN_SEQLEN_Q, scheduler_metadata=None)
    return _STOCK_FA(*args, **kw)


def parts_wanted() -> tuple[str, ...]:
    named = leg_settings.overlay_parts()
    want = PARTS if named is None else named
    unknown = sorted(set(want) - set(PARTS))
    if unknown:
        raise ValueError(f"TICA_OVERLAY_PARTS: unknown part(s) {unknown}; known: {list(PARTS)}")
    return want


def register() -> None:
    """The plugin's entry: apply the wanted parts (idempotent; vLLM may call it more than once
    per process)."""
    global _STOCK, _STOCK_FA
    want = parts_wanted()
    if "rmsnorm" in want and "rmsnorm" not in _ACTIVE:
        from vllm.model_executor.layers import batch_invariant as bi
        from vllm.model_executor.layers import layernorm

        _STOCK = bi.rms_norm_batch_invariant
        bi.rms_norm_batch_invariant = rms_norm_batch_invariant_overlay
        layernorm.rms_norm_batch_invariant = rms_norm_batch_invariant_overlay  # imported by name there
        _ACTIVE.add("rmsnorm")
    if "fa_pin_tile" in want and "fa_pin_tile" not in _ACTIVE:
        from vllm.v1.attention.backends import flash_attn as fa_backend

        _STOCK_FA = fa_backend.flash_attn_varlen_func
        fa_backend.flash_attn_varlen_func = fa_pin_tile  # imported by name there
        _ACTIVE.add("fa_pin_tile")


def active() -> list[str]:
    """The parts vLLM calls in this process (read from vLLM's modules, not from a flag)."""
    on = []
    try:
        from vllm.model_executor.layers import layernorm
        from vllm.v1.attention.backends import flash_attn as fa_backend
    except Exception:  # noqa: BLE001 - no vLLM here
        return on
    if getattr(layernorm, "rms_norm_batch_invariant", None) is rms_norm_batch_invariant_overlay:
        on.append("rmsnorm")
    if getattr(fa_backend, "flash_attn_varlen_func", None) is fa_pin_tile:
        on.append("fa_pin_tile")
    return on


def env_parts(env: Mapping[str, str]) -> tuple[str, ...]:
    """The parts a process started with `env` loads: none unless VLLM_PLUGINS names this plugin
    (candidate_env always sets it), then the parts TICA_OVERLAY_PARTS names (unset: all)."""
    if NAME not in (env.get("VLLM_PLUGINS") or "").split(","):
        return ()
    raw = env.get("TICA_OVERLAY_PARTS")
    return tuple(x for x in (raw.split(",") if raw is not None else PARTS) if x)


def digest(parts: Sequence[str]) -> str | None:
    """A leg's `source.overlay_digest`: sha256 over this file's bytes and the parts loaded, so
    overlay and overlay3 (one file, other parts) are other candidates; None where no part is."""
    if not parts:
        return None
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(("\0" + ",".join(sorted(parts))).encode())
    return "sha256:" + h.hexdigest()


def write_plugin_dist(folder: Path) -> Path:
    """A distribution whose only content is the entry point, for PYTHONPATH: vLLM's plugin loader
    (importlib.metadata) finds it; the code stays in this package."""
    d = Path(folder) / "tica_vllm_overlay-0.1.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: tica-vllm-overlay\nVersion: 0.1\n")
    (d / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{NAME} = {ENTRY_POINT}\n")
    return d


# the candidates the H200 runs compare: stock vLLM 0.26, or 0.26 with these overlay parts
# (overlay, run 1, and overlay2, run 2, commit 4a68fff, whose attention part had no effect, are in the receipts)
CANDIDATE_PARTS: dict[str, tuple[str, ...] | None] = {"stock": None, "overlay": ("rmsnorm",),
                                                      "overlay3": ("rmsnorm", "fa_pin_tile")}


def candidate_env(env: dict, candidate: str, plugin: Path) -> dict:
    """`env` for a process that runs `candidate`: the overlay as vLLM's general plugin (its dist in
    `plugin`, written by write_plugin_dist) with its parts named, or, for stock, no plugin at all."""
    env = dict(env)
    parts = CANDIDATE_PARTS[candidate]
    if parts:
        env["PYTHONPATH"] = f"{plugin}:{env.get('PYTHONPATH', '')}"
        env["VLLM_PLUGINS"] = NAME
        env["TICA_OVERLAY_PARTS"] = ",".join(parts)
    else:
        env["VLLM_PLUGINS"] = ""
        env.pop("TICA_OVERLAY_PARTS", None)
    return env


def overlay_record(parts: list[str] | tuple[str, ...]) -> dict:
    """What the manifest's source component records: the overlay's file, its sha256, its parts."""
    src = Path(__file__)
    replaces = {"rmsnorm": "vllm.model_executor.layers.batch_invariant.rms_norm_batch_invariant (residual path)",
                "fa_pin_tile": "vllm.v1.attention.backends.flash_attn.flash_attn_varlen_func (max_seqlen_q >= 65)"}
    return {"name": NAME, "entry_point": ENTRY_POINT, "file": "tica/legs/vllm_kernels/overlay.py",
            "sha256": hashlib.sha256(src.read_bytes()).hexdigest(), "parts": list(parts),
            "replaces": [replaces[x] for x in parts]}
