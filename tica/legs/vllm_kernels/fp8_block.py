"""vLLM 0.26's block-wise FP8 linear (a checkpoint serialized in FP8 with 128x128 weight blocks, the
DeepSeek-V3 / Qwen3-FP8 format), as the trainer runs it.

The checkpoint: ``config.json`` carries ``quantization_config = {"quant_method": "fp8",
"activation_scheme": "dynamic", "weight_block_size": [128, 128]}``; each linear's weight is
float8_e4m3fn [N, K] beside ``weight_scale_inv`` fp32 [ceil(N/128), ceil(K/128)] (one dequantization
scale per block); embeddings, norms, biases and the lm_head stay bf16. ``write_block_checkpoint``
writes it from the seeded bf16 weights with ``quant_weight_block_ref`` (the math of vLLM's
``utils/deep_gemm.per_block_cast_to_fp8`` without UE8M0: amax per block clamped at 1e-4, scale amax /
448, x * (1 / scale) cast to FP8).

vLLM's path, read from its 0.26.0 source (the wheel the staging kit carries):

* ``quantization/fp8.py``: ``Fp8Config.from_config`` (quant_method "fp8" => FP8-serialized, the block
  size kept; block quantization needs the dynamic activation scheme); ``get_quant_method`` gives every
  ``LinearBase`` ``Fp8LinearMethod`` (the lm_head and embedding are no LinearBase: bf16).
  ``Fp8LinearMethod.__init__``: activation key dynamic per group ``GroupShape(1, 128)``, weight key
  static ``GroupShape(128, 128)``; ``create_weights`` registers ``weight`` (FP8 [N, K]) and
  ``weight_scale_inv`` (``BlockQuantScaleParameter``; ``validate_fp8_block_shape`` requires a fused
  module's shards but the last to be multiples of 128) and picks the kernel with
  ``kernels/linear/__init__.init_fp8_linear_kernel`` -> ``choose_scaled_mm_linear_kernel`` over
  ``_POSSIBLE_FP8_BLOCK_KERNELS[CUDA]``, the first whose ``is_supported`` and ``can_implement`` pass:
  ``FlashInferFp8DeepGEMMDynamicBlockScaledKernel`` (needs FlashInfer's block-scale GEMM),
  ``DeepGemmFp8BlockScaledMMKernel`` (``utils/deep_gemm.is_deep_gemm_supported``: VLLM_USE_DEEP_GEMM,
  default 1, the vendored ``vllm.third_party.deep_gemm`` importable, Hopper/Blackwell; bf16 out;
  ``should_use_deepgemm_for_fp8_linear``: N % 64 == 0 and K % 128 == 0), ``CutlassFp8BlockScaledMMKernel``,
  (Marlin: refused under VLLM_BATCH_INVARIANT), ``TritonFp8BlockScaledMMKernel``. The engine logs
  "Selected <kernel> for Fp8LinearMethod"; the session-18 device logs show the vendored DeepGEMM
  imported with "DeepGEMM E8M0 enabled on current platform" (VLLM_USE_DEEP_GEMM_E8M0 default 1), so on
  an H100/H200 the dense linears of a shape whose N and K divide (llama3.2-1b_l4's all do) are
  expected on ``DeepGemmFp8BlockScaledMMKernel``; the producer reads the choice from the engine.
* at load, ``Fp8LinearMethod.process_weights_after_loading`` (block): ``input_scale = None``, then the
  kernel's ``process_weights_after_loading``: ``fp8_utils.process_fp8_weight_block_strategy`` (a no-op
  on CUDA), and for DeepGEMM ``fp8_utils.deepgemm_post_process_fp8_weight_block``: with E8M0 on,
  ``requant_weight_ue8m0_inplace`` (dequantize with the checkpoint's scales, quantize again with
  ``per_block_cast_to_fp8(use_ue8m0=True)``: power-of-two scales), then
  ``transform_sf_into_required_layout`` (DeepGEMM's scale layout, recipe (1, 128, 128)).
* ``Fp8LinearMethod.apply`` under VLLM_BATCH_INVARIANT with block quantization goes straight to
  ``self.fp8_linear.apply_weights`` (no bf16 dequantize fallback, unlike per-tensor). That is
  ``BlockScaledMMLinearKernel.Fp8BlockScaledMMLinearKernel.apply_weights``: x viewed [M, K], the
  kernel's ``QuantFP8(static=False, GroupShape(1, 128))`` (DeepGEMM's: ``column_major_scales=True``,
  ``tma_aligned_scales=VLLM_USE_DEEP_GEMM_TMA_ALIGNED_SCALES``, ``use_ue8m0`` = E8M0 on); its
  ``forward_cuda`` on Hopper (scale format FLOAT32_CEIL_UE8M0, not the packed UE8M0 of sm100) is
  ``fp8_utils.per_token_group_quant_fp8`` -> ``torch.ops._C.per_token_group_fp8_quant``: one scale per
  token per 128 columns (amax / 448, rounded up to a power of two with UE8M0); then
  ``apply_block_scaled_mm``: DeepGEMM ``torch.ops.vllm.fp8_gemm_nt_op`` -> ``utils/deep_gemm.fp8_gemm_nt``
  (bf16 out); Cutlass ``ops.cutlass_scaled_mm(A, B.T, scale_a=As, scale_b=Bs.T)``; Triton
  ``w8a8_triton_block_scaled_mm`` (its tile config chosen from M: batch-size-dependent, recorded);
  FlashInfer's dynamic kernel under BI=1 runs its DeepGEMM branch only
  (``_dynamic_flashinfer_deepgemm_blockscale_gemm_impl``: the M < 32 swapAB branch is skipped, vLLM
  PR 37718). The bias, if any, is added to the bf16 output after the GEMM.

No per-step choice is batch-dependent on the DeepGEMM path: the activation scales are per token,
the weight scales fixed at load, the kernel fixed at engine start (DeepGEMM picks its own tiles from M
inside the call; whether its bits move with M is the device call's to show: vLLM's alone-vs-batch
count and the trainer's packed batch both test it).

``Fp8BlockLinearGpu`` calls those same vLLM functions, with the activation-quant flags and the E8M0
setting read from the kernel object vLLM built (``vllm_block_plan``); ``fp8_block_linear_reference``
is their math in torch (the CUDA per-token-group quant's formula, DeepGEMM's per-128-K-block fp32
promotion), for the CPU dry run and the tests only: a CPU has neither DeepGEMM nor the CUDA op.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .fp8 import FP8_DTYPE, FP8_MAX

BLOCK = (128, 128)
QUANT_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(BLOCK)}
PER_BLOCK_AMAX_MIN = 1e-4  # per_block_cast_to_fp8's clamp
GROUP_EPS = 1e-10  # per_token_group_quant_fp8's eps
# the checkpoint tensors vLLM builds as LinearBase modules of a dense Llama/Qwen2 (quantized); the
# trainer's `_lin` names of the same modules (q/k/v fused as qkv_proj, gate/up as gate_up_proj)
CHECKPOINT_LINEARS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                      "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
BLOCK_LINEAR_SUFFIXES = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
# the kernels whose calls the trainer makes (the class names vLLM 0.26 gives them)
DEEP_GEMM_KERNELS = ("DeepGemmFp8BlockScaledMMKernel", "FlashInferFp8DeepGEMMDynamicBlockScaledKernel")
FOLLOWED_KERNELS = DEEP_GEMM_KERNELS + ("CutlassFp8BlockScaledMMKernel", "TritonFp8BlockScaledMMKernel")
# the CPU dry run's plan: what vLLM 0.26 is expected to build on sm90 (DeepGEMM, E8M0 on)
DRY_PLAN = {"kernel": "DeepGemmFp8BlockScaledMMKernel", "weight_block": list(BLOCK), "group_size": BLOCK[1],
            "column_major_scales": True, "tma_aligned_scales": True, "use_ue8m0": True, "deep_gemm_e8m0": True,
            "deep_gemm_post_process": True, "source": "dry run: the plan expected on sm90, not read from an engine"}
# with VLLM_USE_DEEP_GEMM=0 (the `_fp8bc` cells): CutlassFp8BlockScaledMMKernel's QuantFP8 (use_ue8m0=False,
# column-major scales, not TMA-aligned) and no DeepGEMM post-process
DRY_PLAN_CUTLASS = dict(DRY_PLAN, kernel="CutlassFp8BlockScaledMMKernel", tma_aligned_scales=False, use_ue8m0=False,
                        deep_gemm_e8m0=False, deep_gemm_post_process=False)
ENGINE_ENV = ("VLLM_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_E8M0", "VLLM_USE_DEEP_GEMM_TMA_ALIGNED_SCALES",
              "VLLM_DISABLED_KERNELS")


def dry_plan(environ) -> dict:
    """The dry run's plan for this process's environment (DeepGEMM on unless VLLM_USE_DEEP_GEMM=0)."""
    return DRY_PLAN_CUTLASS if environ.get("VLLM_USE_DEEP_GEMM") == "0" else DRY_PLAN


def engine_env(environ) -> dict:
    """The variables vLLM 0.26 reads to choose and configure its block-FP8 kernel, as this process has them."""
    return {k: environ.get(k) for k in ENGINE_ENV}


def _ue8m0(s: torch.Tensor) -> torch.Tensor:
    """Round a positive scale up to a power of two (UE8M0), as vLLM's _ceil_to_ue8m0 and the Triton
    quant kernels do: 2 ** ceil(log2(s))."""
    return torch.exp2(torch.ceil(torch.log2(s)))


def quant_weight_block_ref(w: torch.Tensor, block=BLOCK, *, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Block FP8 of a weight [N, K] (per_block_cast_to_fp8's math): the matrix zero-padded to whole
    blocks, amax per block (fp32, clamped at 1e-4), scale = amax / 448 (UE8M0: up to a power of two),
    q = x * (1 / scale) cast to FP8 and cropped back. Returns (q [N, K], scale_inv [ceil(N/bn), ceil(K/bk)])."""
    bn, bk = int(block[0]), int(block[1])
    n, k = w.shape
    pn, pk = -(-n // bn) * bn, -(-k // bk) * bk
    xp = torch.zeros((pn, pk), dtype=w.dtype, device=w.device)
    xp[:n, :k] = w
    xv = xp.view(pn // bn, bn, pk // bk, bk)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(PER_BLOCK_AMAX_MIN)
    sf = amax / FP8_MAX
    if ue8m0:
        sf = _ue8m0(sf)
    q = (xv * (1.0 / sf)).to(FP8_DTYPE)
    return q.view(pn, pk)[:n, :k].contiguous(), sf.view(pn // bn, pk // bk)


def dequant_weight_block_ref(q: torch.Tensor, s: torch.Tensor, block=BLOCK) -> torch.Tensor:
    bn, bk = int(block[0]), int(block[1])
    n, k = q.shape
    full = s.float().repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:n, :k]
    return q.float() * full


def requant_ue8m0_ref(q: torch.Tensor, s: torch.Tensor, block=BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's requant_weight_ue8m0_inplace in torch: dequantize with the checkpoint's scales, quantize
    again per block with power-of-two scales."""
    return quant_weight_block_ref(dequant_weight_block_ref(q, s, block), block, ue8m0=True)


def quant_act_group_ref(x: torch.Tensor, group: int = BLOCK[1], *, ue8m0: bool = True
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token-group FP8 of activations [M, K], the formula of the CUDA op
    ``_C.per_token_group_fp8_quant`` (csrc/quantization/w8a8/fp8/per_token_group_quant.cu): per row and
    group of `group` columns, scale = max(amax, 1e-10) / 448 (UE8M0: up to a power of two), q =
    clamp(x / scale, -448, 448). Returns (q [M, K], scales [M, K / group])."""
    m, k = x.shape
    if k % group:
        raise ValueError(f"the last dimension {k} is not a multiple of the group size {group}")
    xg = x.float().view(m, k // group, group)
    amax = xg.abs().amax(dim=-1, keepdim=True).clamp(min=GROUP_EPS)
    s = amax / FP8_MAX
    if ue8m0:
        s = _ue8m0(s)
    q = (xg / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(m, k), s.view(m, k // group)


def block_scaled_mm_ref(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor, block=BLOCK,
                        out_dtype=torch.bfloat16) -> torch.Tensor:
    """DeepGEMM's math in torch: per 128-column K block an fp32 partial product of the FP8 values,
    scaled by the token's group scale times the weight block's scale, summed over the K blocks in order."""
    bn, bk = int(block[0]), int(block[1])
    m, k = xq.shape
    n = wq.shape[0]
    acc = torch.zeros((m, n), dtype=torch.float32, device=xq.device)
    xf, wf = xq.float(), wq.float()
    g = k // xs.shape[1]
    if g != bk:
        raise ValueError(f"activation group {g} does not match the weight block's K {bk}")
    for kb in range(-(-k // bk)):
        cols = slice(kb * bk, min(k, (kb + 1) * bk))
        part = xf[:, cols] @ wf[:, cols].t()
        wsc = ws[:, kb].float().repeat_interleave(bn)[:n]
        acc += part * xs[:, kb:kb + 1].float() * wsc.unsqueeze(0)
    return acc.to(out_dtype)


def fp8_block_linear_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *,
                               plan: dict | None = None, group: int | None = None) -> torch.Tensor:
    """The block FP8 linear in torch: the checkpoint's block quantization of w, vLLM's UE8M0 requant
    where the plan's DeepGEMM post-process does it, x per token per `group` columns (default the
    block's K: vLLM's; another group is the negative control), the block-scaled product, bias added
    to the output in x's dtype."""
    plan = plan or DRY_PLAN
    block = tuple(plan["weight_block"])
    N, K = w.shape
    wq, ws = quant_weight_block_ref(w, block)
    if plan.get("deep_gemm_post_process") and plan.get("deep_gemm_e8m0"):
        wq, ws = requant_ue8m0_ref(wq, ws, block)
    x2 = x.reshape(-1, K)
    g = group or int(plan["group_size"])
    xq, xs = quant_act_group_ref(x2, g, ue8m0=bool(plan["use_ue8m0"]))
    if g != block[1]:  # the negative control: scales per `g` columns, spread over the block's K
        xq, xs = _regroup(x2, g, block[1], bool(plan["use_ue8m0"]))
    out = block_scaled_mm_ref(xq, xs, wq, ws, block, out_dtype=torch.bfloat16)
    if b is not None:
        out = out + b.to(out.dtype)
    return out.to(x.dtype).view(*x.shape[:-1], N)


def _regroup(x: torch.Tensor, g: int, bk: int, ue8m0: bool):
    """Activations quantized per `g` columns, then expressed per bk-column block (the values
    dequantized, so the product keeps each small group's own scale): the wrong-group control."""
    q, s = quant_act_group_ref(x, g, ue8m0=ue8m0)
    deq = (q.float().view(x.shape[0], -1, g) * s.unsqueeze(-1)).view(x.shape[0], -1)
    ones = torch.ones((x.shape[0], x.shape[1] // bk), dtype=torch.float32, device=x.device)
    return deq, ones


class Fp8BlockLinearGpu:
    """The ops vLLM 0.26's block FP8 linear runs under BI=1 (``plan``: the kernel vLLM chose and the
    flags of its activation quantizer, read from the engine), called on the trainer's deployed bf16
    weight each forward: the checkpoint writer's block quantization, then the kernel's own
    after-load processing, so the trainer's FP8 weight is the bytes vLLM holds."""

    name = "vllm_block_fp8"

    def __init__(self, plan: dict) -> None:
        if plan["kernel"] not in FOLLOWED_KERNELS:
            raise ValueError(f"the trainer does not follow {plan['kernel']}")
        from vllm.model_executor.layers.quantization.utils import fp8_utils

        self.plan = dict(plan)
        self.block = tuple(plan["weight_block"])
        self._u = fp8_utils

    def weight(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(FP8 weight [N, K], its scales) as vLLM holds them after loading the checkpoint this
        weight is written to."""
        q, s = quant_weight_block_ref(w.contiguous(), self.block)
        q, s = self._u.process_fp8_weight_block_strategy(q, s)
        if self.plan.get("deep_gemm_post_process"):
            q, s = self._u.deepgemm_post_process_fp8_weight_block(
                wq=q, ws=s, quant_block_shape=self.block, use_e8m0=bool(self.plan["deep_gemm_e8m0"]))
        return q, s

    def __call__(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        p = self.plan
        N, K = w.shape
        wq, ws = self.weight(w)
        # apply_weights: x.view(-1, K); vLLM's linear inputs are contiguous (norm, attention and SiluAndMul
        # outputs), which sends per_token_group_quant_fp8 to the CUDA op, not its Triton fallback
        x2 = x.reshape(-1, K).contiguous()
        xq, xs = self._u.per_token_group_quant_fp8(
            x2, int(p["group_size"]), column_major_scales=bool(p["column_major_scales"]),
            tma_aligned_scales=bool(p["tma_aligned_scales"]), use_ue8m0=bool(p["use_ue8m0"]))
        kern = p["kernel"]
        od = getattr(torch, str(p.get("out_dtype", "torch.bfloat16")).replace("torch.", ""), torch.bfloat16)
        if kern in DEEP_GEMM_KERNELS:
            from vllm.utils.deep_gemm import fp8_gemm_nt

            out = torch.empty((xq.shape[0], N), dtype=od, device=xq.device)
            fp8_gemm_nt((xq, xs), (wq, ws), out, is_deep_gemm_e8m0_used=bool(p["deep_gemm_e8m0"]))
        elif kern == "CutlassFp8BlockScaledMMKernel":
            from vllm import _custom_ops as ops

            out = ops.cutlass_scaled_mm(xq, wq.T, out_dtype=od, scale_a=xs, scale_b=ws.T)
        else:
            out = self._u.w8a8_triton_block_scaled_mm(xq, wq, xs, ws, list(self.block), od)
        if b is not None:
            out = out + b
        return out.to(x.dtype).view(*x.shape[:-1], N)

    def describe(self) -> dict:
        return {"kernel": self.plan["kernel"], "plan": self.plan,
                "weights": f"block FP8 {list(self.block)} as written to the checkpoint (per_block_cast_to_fp8 math), "
                           "then the kernel's process_weights_after_loading functions"
                           + (" (DeepGEMM post-process: UE8M0 requant + scale layout)"
                              if self.plan.get("deep_gemm_post_process") else ""),
                "activations": f"fp8_utils.per_token_group_quant_fp8, group {self.plan['group_size']}, "
                               f"ue8m0={self.plan['use_ue8m0']}",
                "matmul": {"DeepGemmFp8BlockScaledMMKernel": "DeepGEMM fp8_gemm_nt",
                           "FlashInferFp8DeepGEMMDynamicBlockScaledKernel": "DeepGEMM fp8_gemm_nt (BI=1 branch)",
                           "CutlassFp8BlockScaledMMKernel": "ops.cutlass_scaled_mm (block scales)",
                           "TritonFp8BlockScaledMMKernel": "w8a8_triton_block_scaled_mm"}[self.plan["kernel"]]}


class Fp8BlockLinearReference:
    """The CPU dry run's stand-in for ``Fp8BlockLinearGpu``: the same math in torch (not vLLM's bits)."""

    name = "torch_reference_block_fp8"

    def __init__(self, plan: dict | None = None) -> None:
        self.plan = dict(plan or DRY_PLAN)

    def __call__(self, x, w, b=None):
        return fp8_block_linear_reference(x, w, b, plan=self.plan)

    def weight(self, w):
        q, s = quant_weight_block_ref(w, tuple(self.plan["weight_block"]))
        if self.plan.get("deep_gemm_post_process") and self.plan.get("deep_gemm_e8m0"):
            q, s = requant_ue8m0_ref(q, s, tuple(self.plan["weight_block"]))
        return q, s

    def describe(self) -> dict:
        return {"emulated": "torch reference of vLLM's block FP8 linear (CPU dry run; no DeepGEMM)", "plan": self.plan}


def is_block_linear(name: str) -> bool:
    return name.endswith(BLOCK_LINEAR_SUFFIXES)


def unaligned_linears(cfg: dict, block=BLOCK) -> list[str]:
    """The dense model's checkpoint linears whose N or K is not a multiple of the block: their fused
    module's blocks would straddle two shards (the trainer quantizes the fused weight), and vLLM's
    validate_fp8_block_shape refuses most of them. Empty where the cell can run."""
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    D = cfg.get("head_dim") or H // cfg["num_attention_heads"]
    shapes = {"q_proj": (cfg["num_attention_heads"] * D, H), "k_proj": (cfg["num_key_value_heads"] * D, H),
              "v_proj": (cfg["num_key_value_heads"] * D, H), "o_proj": (H, cfg["num_attention_heads"] * D),
              "gate_proj": (I, H), "up_proj": (I, H), "down_proj": (H, I)}
    return [f"{k} {list(v)}" for k, v in shapes.items() if v[0] % block[0] or v[1] % block[1]]


def block_quantize_state(state: dict, quant=quant_weight_block_ref, block=BLOCK) -> dict:
    """The checkpoint's tensors: every dense linear weight as FP8 + weight_scale_inv, the rest as is."""
    out = {}
    for name, t in state.items():
        if name.endswith(CHECKPOINT_LINEARS) and t.dim() == 2:
            q, s = quant(t, block)
            out[name] = q
            out[name[:-len("weight")] + "weight_scale_inv"] = s.float().contiguous()
        else:
            out[name] = t
    return out


def write_block_checkpoint(state: dict, config_dir: Path, out: Path, block=BLOCK) -> dict:
    """Write the block-FP8 checkpoint of `state` (the deployed bf16 weights) to `out`: config.json from
    config_dir with the quantization_config added, one model.safetensors. Returns what it wrote."""
    import shutil

    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    sd = block_quantize_state(state, block=block)
    save_file({k: v.detach().contiguous().cpu() for k, v in sd.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    cfg = json.loads((Path(config_dir) / "config.json").read_text())
    cfg["quantization_config"] = dict(QUANT_CONFIG, weight_block_size=list(block))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    gen = Path(config_dir) / "generation_config.json"
    if gen.exists() and gen.resolve() != (out / "generation_config.json").resolve():
        shutil.copy(gen, out / "generation_config.json")
    n_fp8 = sum(1 for v in sd.values() if v.dtype == FP8_DTYPE)
    return {"path": str(out), "fp8_tensors": n_fp8, "scale_tensors": n_fp8, "other_tensors": len(sd) - 2 * n_fp8,
            "quantization_config": cfg["quantization_config"],
            "writer": "tica fp8_block.quant_weight_block_ref (per_block_cast_to_fp8 math, no UE8M0)"}


def vllm_block_plan(llm) -> dict:
    """The kernel vLLM built for each block-FP8 linear and its activation quantizer's flags, read from
    the engine's modules; ``plan`` is the one kernel all of them share (None where they differ)."""
    def read(model):
        plans: dict[str, list] = {}
        for name, mod in model.named_modules():
            qm = getattr(mod, "quant_method", None)
            lin = getattr(qm, "fp8_linear", None)
            if lin is None or not getattr(qm, "block_quant", False):
                continue
            kern = type(lin).__name__
            qf = getattr(lin, "quant_fp8", None)
            fallback = getattr(lin, "fallback", None)
            e8m0 = getattr(lin, "use_deep_gemm_e8m0", getattr(fallback, "use_deep_gemm_e8m0", False))
            if kern == "FlashInferFp8DeepGEMMDynamicBlockScaledKernel":
                # under BI=1 its DeepGEMM branch quantizes with these flags itself (not its QuantFP8)
                act = {"group_size": int(lin.weight_group_shape.col), "column_major_scales": True,
                       "tma_aligned_scales": False, "use_ue8m0": bool(e8m0)}
            else:
                act = {"group_size": int(getattr(qf, "group_size", 0) or 0),
                       "column_major_scales": bool(getattr(qf, "column_major_scales", False)),
                       "tma_aligned_scales": bool(getattr(qf, "tma_aligned_scales", False)),
                       "use_ue8m0": bool(getattr(qf, "use_ue8m0", False))}
            fwd = getattr(getattr(qf, "_forward_method", None), "__name__", None)
            plan = {"kernel": kern, "weight_block": [int(x) for x in getattr(mod, "weight_block_size", BLOCK)],
                    **act, "deep_gemm_e8m0": bool(e8m0),
                    "deep_gemm_post_process": kern in DEEP_GEMM_KERNELS and bool(getattr(
                        lin, "is_deep_gemm_supported", getattr(fallback, "is_deep_gemm_supported", False))),
                    "quant_fp8_forward": fwd, "out_dtype": str(getattr(lin.config, "out_dtype", "?"))}
            plans.setdefault(json.dumps(plan, sort_keys=True), []).append(name)
        return plans

    plans = llm.apply_model(read)[0]
    rec = {"plans": [dict(json.loads(k), modules=len(v), first=v[0]) for k, v in plans.items()],
           "modules": sorted(n for v in plans.values() for n in v), "deep_gemm_scale_fmt": _scale_fmt()}
    rec["plan"] = (dict(json.loads(next(iter(plans))), deep_gemm_scale_fmt=rec["deep_gemm_scale_fmt"],
                        source="read from the engine's modules") if len(plans) == 1 else None)
    return rec


def _scale_fmt() -> str | None:
    """DeepGEMM's activation-scale format as vLLM decided it (FLOAT32_CEIL_UE8M0 on Hopper with E8M0 on;
    UE8M0, packed scales from another quant op, on sm100/sm120); None where DeepGEMM is off."""
    try:
        from vllm.utils.deep_gemm import DeepGemmQuantScaleFMT, is_deep_gemm_supported

        return DeepGemmQuantScaleFMT.from_oracle().name if is_deep_gemm_supported() else None
    except Exception as err:  # noqa: BLE001 - recorded: the oracle is initialized by vLLM's first DeepGEMM use
        return f"unread: {type(err).__name__}: {str(err)[:200]}"


def plan_refusal(plan: dict | None, rec: dict) -> str | None:
    """Why the trainer cannot follow the engine's block FP8 linears, or None."""
    if plan is None:
        kinds = [p["kernel"] for p in rec.get("plans", [])]
        return f"vLLM built {len(kinds)} different block-FP8 linear kernels ({kinds}); the trainer follows one"
    if plan["kernel"] not in FOLLOWED_KERNELS:
        return f"vLLM chose {plan['kernel']} for the block-FP8 linears; the trainer follows {list(FOLLOWED_KERNELS)}"
    if plan.get("quant_fp8_forward") not in (None, "forward_cuda") and plan["kernel"] != DEEP_GEMM_KERNELS[1]:
        return f"vLLM's activation quantizer dispatches to {plan['quant_fp8_forward']}; the trainer calls the CUDA op"
    if (plan["kernel"] == DEEP_GEMM_KERNELS[0] and plan.get("use_ue8m0")
            and plan.get("deep_gemm_scale_fmt") == "UE8M0"):
        return ("vLLM's activation quantizer takes its packed-UE8M0 path here (per_token_group_quant_fp8_packed_for_"
                "deepgemm, sm100/sm120); the trainer calls per_token_group_quant_fp8")
    if plan["group_size"] != plan["weight_block"][1]:
        return f"activation group {plan['group_size']} is not the weight block's K {plan['weight_block'][1]}"
    return None


def vllm_block_weights_equal(llm, model, names: list[str], lin) -> dict:
    """vLLM's FP8 weight and scales of each named linear against the trainer's (``lin.weight`` of its
    deployed bf16 weight), bitwise: the weight's bytes and shape, the scales' values and shape."""
    want = {n: lin.weight(model.linear_weight(n)) for n in names}

    def check(m):
        got = {}
        for n in names:
            mod = m.get_submodule(n)
            q, s = want[n]
            w, ws = mod.weight, getattr(mod, "weight_scale_inv", None)
            got[n] = bool(ws is not None and w.shape == q.shape and ws.shape == s.shape
                          and torch.equal(w.contiguous().view(torch.uint8), q.contiguous().view(torch.uint8))
                          and torch.equal(ws.float(), s.float()))
        return got

    with torch.no_grad():
        got = llm.apply_model(check)[0]
    return {"linears": len(got), "equal": sum(got.values()), "differ": sorted(k for k, v in got.items() if not v)}


PROBE_ROWS = (1, 7, 64, 300)


def vllm_linear_probe(llm, model, lin, names: list[str], rows=PROBE_ROWS, seed: int = 0) -> dict:
    """One-op evidence beside the cells: seeded activations through vLLM's own module
    (``quant_method.apply``, the engine's kernel on its loaded weights) and through the trainer's
    ``lin`` on its deployed bf16 weight, at several row counts. Per linear: whether the two are
    bitwise equal at each count, and whether vLLM's first row keeps its bits as rows are added (the
    kernel's batch invariance, which the cells rest on)."""
    out = {}
    for name in names:
        w = model.linear_weight(name)
        g = torch.Generator(device=w.device).manual_seed(seed)
        x = torch.randn(max(rows), w.shape[1], generator=g, device=w.device, dtype=torch.float32).to(w.dtype)

        def run(m, name=name, x=x):
            mod = m.get_submodule(name)
            with torch.no_grad():
                return {r: mod.quant_method.apply(mod, x[:r]).clone() for r in rows}

        theirs = llm.apply_model(run)[0]
        with torch.no_grad():
            mine = {r: lin(x[:r], w) for r in rows}
        bits = lambda t: t.contiguous().view(torch.int16)  # noqa: E731
        out[name] = {
            "trainer_vs_vllm_differ": {str(r): int((bits(mine[r]) != bits(theirs[r])).sum()) for r in rows},
            "vllm_row0_vs_alone_differ": {str(r): int((bits(theirs[r][:1]) != bits(theirs[rows[0]][:1])).sum())
                                          for r in rows[1:]},
            "elements": {str(r): int(theirs[r].numel()) for r in rows}}
    return {"rows": list(rows), "seed": seed, "linears": out,
            "all_equal": all(v == 0 for o in out.values() for v in o["trainer_vs_vllm_differ"].values()),
            "vllm_batch_invariant": all(v == 0 for o in out.values() for v in o["vllm_row0_vs_alone_differ"].values())}
