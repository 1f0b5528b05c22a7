"""The backward check: analytic backward (autograd.py) vs float64 autograd of the reference.

For each op: random inputs in the kernel set's dtype, forward through the autograd Function
(the kernel: vLLM's on the GPU, the torch reference on the CPU), a random cotangent, the
analytic gradients; then the same inputs upcast to float64 **on the CPU** (so no
batch-invariant aten override can touch the reference) through ``TorchReference`` with torch's
own autograd. Per input, relative error = ||g - g_ref|| / ||g_ref||; the op passes when every
relative error is under ``tol``. ``check_all(..., planted=op)`` runs with that op's backward
deliberately wrong: the check must then fail (negative control).
"""

from __future__ import annotations

import torch

from . import autograd as A
from .kernels import TorchReference, cos_sin_cache


def _rel(a: torch.Tensor, r: torch.Tensor) -> float:
    a = a.detach().to("cpu", torch.float64)
    r = r.detach().to("cpu", torch.float64)
    den = r.norm().item()
    return float((a - r).norm().item() / (den if den > 0 else 1.0))


def _cases(device, dtype, gen, kernel_dtype=None):
    """op -> (fn(kernels, *inputs) -> output tensor or tuple, inputs, which inputs get grads)."""
    def rn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(device, dtype)

    T, Hd, V = 62, 256, 512
    Hq, Hk, D = 4, 2, 64
    cu = torch.tensor([0, 5, 22, 62], dtype=torch.int32, device=device)
    pos = torch.cat([torch.arange(5), torch.arange(17), torch.arange(40)]).to(device)
    # the kernel side's cache (bf16 on the GPU), upcast for the reference: same values
    cache = cos_sin_cache(4096, D, 10000.0, "cpu", kernel_dtype or dtype).to(device, dtype)
    tg = torch.randint(0, V, (T,), generator=gen).to(device)
    return {
        "linear": (lambda K, x, w, b: A.linear(K, x, w, b), [rn(T, Hd), rn(3 * Hd // 2, Hd, scale=0.05), rn(3 * Hd // 2, scale=0.1)], [0, 1, 2]),
        "rms_norm": (lambda K, x, w: A.rms_norm(K, x, w, 1e-5), [rn(T, Hd), 1 + rn(Hd, scale=0.1)], [0, 1]),
        "fused_add_rms_norm": (lambda K, x, r, w: A.fused_add_rms_norm(K, x, r, w, 1e-5), [rn(T, Hd), rn(T, Hd), 1 + rn(Hd, scale=0.1)], [0, 1, 2]),
        "rotary": (lambda K, q, k: A.rotary(K, pos, q, k, D, cache), [rn(T, Hq * D), rn(T, Hk * D)], [0, 1]),
        "silu_and_mul": (lambda K, x: A.silu_and_mul(K, x), [rn(T, 2 * Hd)], [0]),
        "attention": (lambda K, q, k, v: A.attention(K, q, k, v, cu, 40, D ** -0.5), [rn(T, Hq, D), rn(T, Hk, D), rn(T, Hk, D)], [0, 1, 2]),
        "logprob": (lambda K, lg: A.token_logprobs(K, lg, tg), [rn(T, V, scale=2.0)], [0]),
        "lm_head_logprob": (lambda K, h, w: A.lm_head_logprobs(K, h, w, tg), [rn(T, Hd), rn(V, Hd, scale=0.1)], [0, 1]),
    }, {"pos": pos, "cache": cache, "cu": cu, "tg": tg}


def _as_tuple(o):
    return o if isinstance(o, tuple) else (o,)


def check_op(op: str, kernels, *, device, dtype, tol: float, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    cases, _ = _cases(device, dtype, gen)
    fn, inputs, wrt = cases[op]
    # analytic backward through the kernel
    xs = [t.clone().requires_grad_(i in wrt) for i, t in enumerate(inputs)]
    outs = _as_tuple(fn(kernels, *xs))
    cot = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs]
    loss = sum((o.to(torch.float64) * c.to(o.device)).sum() for o, c in zip(outs, cot))
    loss.backward()
    got = [xs[i].grad for i in wrt]
    # float64 reference on the CPU, torch autograd
    rs = [t.detach().to("cpu", torch.float64).requires_grad_(i in wrt) for i, t in enumerate(inputs)]
    gen2 = torch.Generator().manual_seed(seed)
    cases64, _ = _cases("cpu", torch.float64, gen2, kernel_dtype=dtype)
    fn64 = cases64[op][0]
    routs = _as_tuple(fn64(_RefNoGrad(), *rs))
    rloss = sum((o * c).sum() for o, c in zip(routs, cot))
    rloss.backward()
    ref = [rs[i].grad for i in wrt]
    rels = [_rel(g, r) for g, r in zip(got, ref)]
    fwd_rel = max(_rel(o, r) for o, r in zip(outs, routs))
    finite = all(bool(torch.isfinite(g).all()) for g in got)
    return {"op": op, "rel_err": rels, "max_rel_err": max(rels), "forward_rel_err": fwd_rel,
            "finite": finite, "tol": tol, "pass": finite and max(rels) < tol}


class _RefNoGrad(TorchReference):
    """The float64 reference, run with torch's own autograd: the autograd Functions are
    bypassed by calling the reference op directly."""


def _direct(op):
    R = TorchReference
    return {
        "linear": lambda K, x, w, b: R.linear(x, w, b),
        "rms_norm": lambda K, x, w, eps: R.rms_norm(x, w, eps),
        "fused_add_rms_norm": lambda K, x, r, w, eps: R.fused_add_rms_norm(x, r, w, eps),
        "rotary": lambda K, pos, q, k, D, cache: R.rotary(pos, q, k, D, cache),
        "silu_and_mul": lambda K, x: R.silu_and_mul(x),
        "attention": lambda K, q, k, v, cu, m, s: R.attention(q, k, v, cu, m, s),
        "logprob": lambda K, lg, tg: R.token_logprobs(lg, tg),
        "lm_head_logprob": lambda K, h, w, tg: R.token_logprobs(R.linear(h, w, None), tg),
    }[op]


class _Patched:
    """Routes autograd.<op>(kernels, ...) to the plain reference when kernels is _RefNoGrad."""

    def __enter__(self):
        self.saved = {}
        for name, op in (("linear", "linear"), ("rms_norm", "rms_norm"), ("fused_add_rms_norm", "fused_add_rms_norm"),
                         ("rotary", "rotary"), ("silu_and_mul", "silu_and_mul"), ("attention", "attention"),
                         ("token_logprobs", "logprob"), ("lm_head_logprobs", "lm_head_logprob")):
            orig = getattr(A, name)
            self.saved[name] = orig

            def wrapped(K, *args, _orig=orig, _op=op):
                if isinstance(K, _RefNoGrad):
                    return _direct(_op)(K, *args)
                return _orig(K, *args)

            setattr(A, name, wrapped)
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(A, name, fn)


def check_all(kernels, *, device, dtype, tol: float, planted: str | None = None, seed: int = 0) -> dict:
    rows = []
    with _Patched():
        for op in A.OPS:
            if planted is not None and op != planted:
                continue
            if planted is not None:
                with A.planted_backward_error(planted):
                    rows.append(check_op(op, kernels, device=device, dtype=dtype, tol=tol, seed=seed))
            else:
                rows.append(check_op(op, kernels, device=device, dtype=dtype, tol=tol, seed=seed))
    return {"kernels": getattr(kernels, "name", str(kernels)), "device": str(device), "dtype": str(dtype),
            "planted": planted, "tol": tol, "ops": rows, "pass": all(r["pass"] for r in rows)}


def check_with_controls(kernels, *, device, dtype, tol: float) -> dict:
    """All ops, then each op with its planted backward error (each must fail)."""
    main = check_all(kernels, device=device, dtype=dtype, tol=tol)
    controls = [check_all(kernels, device=device, dtype=dtype, tol=tol, planted=op) for op in A.OPS]
    caught = {c["planted"]: (not c["pass"]) for c in controls}
    return {"check": main, "controls": controls, "controls_caught": caught,
            "pass": main["pass"] and all(caught.values())}
