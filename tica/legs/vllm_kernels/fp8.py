"""vLLM 0.26's online FP8 linear (``quantization="fp8"`` on a bf16 checkpoint), as the trainer runs it.

vLLM's path, read from its 0.26 source:

* ``Fp8Config.get_quant_method`` gives every ``LinearBase`` of a checkpoint that is not FP8-serialized
  ``Fp8PerTensorOnlineLinearMethod`` (online/fp8.py); the embedding and the ``ParallelLMHead`` are no
  ``LinearBase`` and stay bf16 (``UnquantizedEmbeddingMethod``); routed experts get
  ``Fp8PerTensorOnlineMoEMethod``.
* at load, ``process_weights_after_loading``: ``ops.scaled_fp8_quant(layer.weight, scale=None)``, one
  dynamic per-tensor scale over the whole (fused: qkv, gate_up) bf16 weight [N, K]; the weight kept as
  ``qweight.t()`` (column-major [K, N]); then ``CutlassFP8ScaledMMLinearKernel.process_weights_after_loading``
  pads K and N up to multiples of 16 (a one-element scale is not padded).
* ``apply`` under VLLM_BATCH_INVARIANT with the Cutlass kernel: ``FP8ScaledMMLinearKernel.apply_weights``:
  ``QuantFP8(static=False, PER_TOKEN)`` (its CUDA op ``ops.scaled_fp8_quant(x, None,
  use_per_token_if_dynamic=True)`` where custom ops are on: eager), the activation padded to the
  weight's K, ``ops.cutlass_scaled_mm(A, B, out_dtype, scale_a, scale_b, bias)``, the padded columns
  sliced off.

``Fp8LinearGpu`` calls those same ops; ``fp8_linear_reference`` is their math in torch (vLLM's
``QuantFP8.forward_native`` formula), for the CPU dry run and the tests only: a CPU has no
``cutlass_scaled_mm``.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
FP8_MIN_SCALING_FACTOR = 1.0 / (FP8_MAX * 512.0)  # input_quant_fp8._FP8_MIN_SCALING_FACTOR
ALIGN = 16  # CutlassFP8ScaledMMLinearKernel pads K and N to this
QUANTIZATIONS = ("fp8",)
# the linears vLLM's online FP8 quantizes, as the trainer names them (its `_lin` names): every
# LinearBase vLLM builds with the quant config; the lm_head is not one. On the GPU the producer reads
# the set from the engine itself (`vllm_fp8_modules`) and this is only the dry run's stand-in.
FP8_LINEAR_SUFFIXES = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj", "mlp.gate")


def quant_per_token_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token FP8: scale[T, 1] = max(amax(|row|) / 448, 1 / (448 * 512)), q = clamp(x * (1 / scale))."""
    amax = x.abs().amax(dim=-1, keepdim=True).to(torch.float32)
    scale = (amax / FP8_MAX).clamp(min=FP8_MIN_SCALING_FACTOR)
    return _cast(x, scale), scale


def quant_per_tensor_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-tensor FP8 (the weight's, and the negative control for activations): one scale [1]."""
    amax = x.abs().amax().reshape(1).to(torch.float32)
    scale = (amax / FP8_MAX).clamp(min=FP8_MIN_SCALING_FACTOR)
    return _cast(x, scale), scale


def _cast(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.to(torch.float32) * scale.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def scaled_mm_reference(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                        out_dtype: torch.dtype, bias: torch.Tensor | None) -> torch.Tensor:
    """cutlass_scaled_mm's documented math: (scale_a * a) @ (scale_b * b) + bias, fp32 accumulate, then out_dtype."""
    acc = (a.to(torch.float32) @ b.to(torch.float32)) * scale_a.to(torch.float32) * scale_b.to(torch.float32)
    if bias is not None:
        acc = acc + bias.to(torch.float32)
    return acc.to(out_dtype)


def fp8_linear_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *,
                         act: str = "per_token") -> torch.Tensor:
    """The online FP8 linear in torch: w [N, K] quantized per tensor, x [T, K] per token (``act=per_tensor``:
    one scale over the batch, the negative control), fp32 matmul of the FP8 values, x's dtype out."""
    wq, ws = quant_per_tensor_ref(w)
    xq, xs = quant_per_token_ref(x) if act == "per_token" else quant_per_tensor_ref(x)
    return scaled_mm_reference(xq, wq.t(), xs, ws, x.dtype, b)


def _pad_cols(t: torch.Tensor, n: int) -> torch.Tensor:
    return t if n == 0 else F.pad(t, (0, n))


class Fp8LinearGpu:
    """The ops vLLM 0.26's online FP8 linear runs under BI=1 on Hopper (CutlassFP8ScaledMMLinearKernel),
    called on the trainer's deployed bf16 weight each forward: the weight is quantized by the op and
    over the same fused tensor vLLM quantizes at load, so a reloaded weight is quantized alike."""

    name = "vllm_online_fp8_cutlass"

    def __init__(self) -> None:
        from vllm import _custom_ops as ops

        self._ops = ops

    def weight(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B [K', N'] column-major FP8, its one scale) as vLLM holds them after loading."""
        qw, ws = self._ops.scaled_fp8_quant(w.contiguous(), scale=None)
        B = qw.t()
        pad_k, pad_n = (-B.shape[0]) % ALIGN, (-B.shape[1]) % ALIGN
        if pad_k or pad_n:
            B = F.pad(B.t().contiguous(), (0, pad_k, 0, pad_n)).t()
        return B, ws

    def __call__(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        N, K = w.shape
        B, ws = self.weight(w)
        x2 = x.reshape(-1, K).contiguous()
        xq, xs = self._ops.scaled_fp8_quant(x2, None, num_token_padding=None, scale_ub=None,
                                            use_per_token_if_dynamic=True, group_shape=None)
        xq = _pad_cols(xq, B.shape[0] - K)
        if b is not None:
            b = _pad_cols(b, B.shape[1] - N)
        out = self._ops.cutlass_scaled_mm(xq, B, scale_a=xs, scale_b=ws, out_dtype=x.dtype, bias=b)
        if B.shape[1] != N:
            out = out[..., :N].contiguous()
        return out.view(*x.shape[:-1], N)

    @staticmethod
    def describe() -> dict:
        return {"weights": "ops.scaled_fp8_quant per tensor over the fused bf16 weight, kept transposed, K and N "
                           "padded to 16 (Fp8PerTensorOnlineLinearMethod + CutlassFP8ScaledMMLinearKernel)",
                "activations": "ops.scaled_fp8_quant dynamic per token (QuantFP8 PER_TOKEN, forward_cuda)",
                "matmul": "ops.cutlass_scaled_mm, bf16 out, padded columns sliced off"}


class Fp8LinearReference:
    """The CPU dry run's stand-in for ``Fp8LinearGpu``: the same math in torch (not vLLM's bits)."""

    name = "torch_reference_fp8"

    def __call__(self, x, w, b=None):
        return fp8_linear_reference(x, w, b)

    @staticmethod
    def describe() -> dict:
        return {"emulated": "torch reference of vLLM's online FP8 linear (CPU dry run; no cutlass_scaled_mm)"}


def is_fp8_linear(name: str) -> bool:
    return name.endswith(FP8_LINEAR_SUFFIXES)


def vllm_fp8_modules(llm) -> dict:
    """What vLLM's engine quantized, read from its model: the FP8 linear modules by name, the kernel and
    out dtype each linear method chose, the experts' FP8 backend, and the lm_head's method."""
    def read(model):
        fp8, other, kernels, experts = [], {}, {}, {}
        for name, mod in model.named_modules():
            qm = getattr(mod, "quant_method", None)
            if qm is None:
                continue
            cls = type(qm).__name__
            lin = getattr(qm, "fp8_linear", None)
            if lin is not None:
                fp8.append(name)
                key = f"{cls}/{type(lin).__name__}/out {getattr(lin.config, 'out_dtype', '?')}"
                kernels[key] = kernels.get(key, 0) + 1
            elif hasattr(qm, "fp8_backend"):
                key = f"{cls}/{getattr(qm.fp8_backend, 'name', qm.fp8_backend)}"
                experts[key] = experts.get(key, 0) + 1
            else:
                other[cls] = other.get(cls, 0) + 1
        return {"fp8_linears": sorted(fp8), "linear_kernels": kernels, "experts": experts, "other_methods": other}

    return llm.apply_model(read)[0]


def vllm_fp8_weights_equal(llm, model, names: list[str]) -> dict:
    """vLLM's FP8 weight and scale of each named linear against the trainer's own quantization of its
    deployed bf16 weight (``Fp8LinearGpu.weight``), bitwise."""
    q = Fp8LinearGpu()
    want = {n: q.weight(model.linear_weight(n)) for n in names}

    def check(m):
        got = {}
        for n in names:
            mod = m.get_submodule(n)
            B, s = want[n]
            w = mod.weight
            got[n] = bool(w.shape == B.shape and torch.equal(w.view(torch.uint8), B.view(torch.uint8))
                          and torch.equal(mod.weight_scale.reshape(-1).float(), s.reshape(-1).float()))
        return got

    with torch.no_grad():
        got = llm.apply_model(check)[0]
    return {"linears": len(got), "equal": sum(got.values()), "differ": sorted(k for k, v in got.items() if not v)}


class VllmLogLines(logging.Handler):
    """Inside ``with``: vLLM's log lines that name a kernel, backend or quantization it chose, kept
    (its loggers are children of "vllm", which does not propagate to the root)."""

    WORDS = ("Selected ", "backend", "Fp8", "FP8", "fp8", "quantiz", "FlashAttention version")
    MAX = 60

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if len(self.lines) < self.MAX and any(w in msg for w in self.WORDS):
            self.lines.append(f"{record.levelname} [{record.filename}:{record.lineno}] {msg[:500]}")

    def __enter__(self) -> "VllmLogLines":
        import vllm.logger  # noqa: F401 - configures the "vllm" logger (dictConfig), which would drop a handler added before

        logging.getLogger("vllm").addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("vllm").removeHandler(self)
