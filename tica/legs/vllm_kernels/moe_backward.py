"""The sparse MoE block's gradient: forward = the MoE kernel set's routing and experts (vLLM's
``fused_topk`` + ``fused_experts`` on the GPU), backward = the analytic gradient written here.

vLLM's MoE kernels have no backward, so the gradient is that of the block's math at the route
the forward chose (a route is piecewise constant in its inputs: the top-k choice has no gradient,
the chosen experts' gate weights do):

* router: p = softmax(logits) in fp32, w = p[chosen], renormalised (w / sum w) when the model says
  ``norm_topk_prob``; the gradient runs back through the renormalisation and the softmax Jacobian
  to every expert's logit (the gate's own matmul is the linear's Function);
* experts: for each chosen (token, slot), y = down(silu(gate x) * up x) and out = sum_slots w * y;
  the expert matmuls run per expert in the input dtype with fp32 accumulation (bf16 on the GPU,
  as a bf16 trainer's grouped GEMMs do), SiLU and the products in fp32. Each (token, slot)
  writes its own row of the input gradient and the slots are summed in a fixed order: no atomic
  adds, so a rerun gives the same bits.

``moe_gradcheck`` checks this gradient against torch's autograd of the plain-torch block in
float64 on the CPU at the same route; with the planted error (``planted_backward_error("moe")``,
the route gradient's centring term dropped: the renormalisation's, or the softmax's where the route
is not renormalised) it must fail.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import autograd as A

MOE_OP = "moe"


class MoeBlockFn(torch.autograd.Function):
    """(x [T, H], router logits [T, E], w13 [E, 2I, H], w2 [E, H, I]) -> (out [T, H], gate weights
    [T, k] fp32, expert ids [T, k] int32); the last two are the route, not differentiable."""

    @staticmethod
    def forward(ctx, moe_kernels, x, logits, w13, w2, top_k: int, renormalize: bool, expert_map=None):
        weights, ids = moe_kernels.route(x, logits, top_k, renormalize)
        out = (moe_kernels.experts(x, w13, w2, weights, ids) if expert_map is None
               else moe_kernels.experts(x, w13, w2, weights, ids, expert_map))
        ctx.save_for_backward(x, logits, w13, w2, ids)
        ctx.renormalize, ctx.expert_map = renormalize, expert_map
        ctx.mark_non_differentiable(weights, ids)
        return out, weights, ids

    @staticmethod
    def backward(ctx, gy, _gw, _gids):
        x, logits, w13, w2, ids = ctx.saved_tensors
        A._BACKWARD_USED[MOE_OP] = "analytic at the forward's route (moe_backward.py), per-expert matmuls"
        dx, dlogits, dw13, dw2 = moe_block_grads(x, logits, w13, w2, ids, ctx.renormalize, gy, ctx.expert_map)
        return None, dx, dlogits, dw13, dw2, None, None, None


def route_weights(logits: torch.Tensor, ids: torch.Tensor, renormalize: bool) -> tuple[torch.Tensor, ...]:
    """(p, chosen weights, their sum or None) in the logits' wide dtype, at the given route."""
    p = torch.softmax(logits.to(A._wide(logits.dtype)), dim=-1)
    sel = p.gather(1, ids.long())
    if not renormalize:
        return p, sel, None
    s = sel.sum(-1, keepdim=True)
    return p, sel / s, s


def moe_block_grads(x, logits, w13, w2, ids, renormalize: bool, gy, expert_map=None):
    """The analytic gradient of the block at the route ``ids`` (see the module's docstring). With an
    expert map (EP: one rank's local experts in w13/w2) the slots of other ranks' experts are zero in
    the forward, so they get no gradient here: the ranks' gradients add up to the whole block's."""
    wd = A._wide(x.dtype)
    md = x.dtype if A._low(x) else wd  # the expert matmuls' dtype
    T, k = ids.shape
    p, wn, s = route_weights(logits, ids, renormalize)
    gyw = gy.to(wd)
    d_wn = torch.zeros(T, k, dtype=wd, device=x.device)
    dx_slots = torch.zeros(T, k, x.shape[1], dtype=wd, device=x.device)
    dw13 = torch.zeros(w13.shape, dtype=wd, device=x.device)
    dw2 = torch.zeros(w2.shape, dtype=wd, device=x.device)
    ids_l = ids.long()
    for e in torch.unique(ids_l).tolist():
        j = e if expert_map is None else int(expert_map[e])
        if j < 0:
            continue
        tok, slot = torch.nonzero(ids_l == e, as_tuple=True)
        xe = x[tok].to(md)
        we13, we2 = w13[j].to(md), w2[j].to(md)
        g, u = (xe @ we13.t()).to(wd).chunk(2, dim=-1)
        sg = torch.sigmoid(g)
        act = g * sg * u
        ye = (act.to(md) @ we2.t()).to(wd)
        ge = gyw[tok]
        d_wn[tok, slot] = (ge * ye).sum(-1)
        dye = (ge * wn[tok, slot].unsqueeze(-1)).to(md)
        dw2[j] = (dye.t() @ act.to(md)).to(wd)
        dact = (dye @ we2).to(wd)
        dgu = torch.cat((dact * u * sg * (1 + g * (1 - sg)), dact * g * sg), dim=-1).to(md)
        dw13[j] = (dgu.t() @ xe).to(wd)
        dx_slots[tok, slot] = (dgu @ we13).to(wd)
    dx = dx_slots.sum(1)
    planted = MOE_OP in A._WRONG  # the route's gradient without its centring term (renormalisation's or softmax's)
    if renormalize:
        d_sel = (d_wn if planted else d_wn - (d_wn * wn).sum(-1, keepdim=True)) / s
    else:
        d_sel = d_wn
    dp = torch.zeros_like(p).scatter(1, ids_l, d_sel)
    # with renormalisation the softmax's centring term is exactly 0 (the route's weights do not see
    # the softmax's normaliser); it stays, for the unrenormalised route
    dlogits = p * dp if planted and not renormalize else p * (dp - (dp * p).sum(-1, keepdim=True))
    return dx.to(x.dtype), dlogits.to(logits.dtype), dw13.to(w13.dtype), dw2.to(w2.dtype)


def moe_block(moe_kernels, x, logits, w13, w2, top_k: int, renormalize: bool, expert_map=None):
    """The block's output and its route (weights fp32, ids int32), differentiable in x, logits,
    w13 and w2; with ``expert_map`` one EP rank's partial over its local experts (ep.py)."""
    return MoeBlockFn.apply(moe_kernels, x, logits, w13, w2, top_k, renormalize, expert_map)


def reference_block(x, logits, w13, w2, ids, renormalize: bool):
    """The same block in plain torch at a given route (torch's autograd differentiates it)."""
    _, wn, _ = route_weights(logits, ids, renormalize)
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=x.dtype, device=x.device)
    for e in torch.unique(ids.long()).tolist():
        tok, slot = torch.nonzero(ids.long() == e, as_tuple=True)
        g, u = (x[tok] @ w13[e].t()).chunk(2, dim=-1)
        y = (F.silu(g) * u) @ w2[e].t()
        out = out.index_add(0, tok, y * wn[tok, slot].unsqueeze(-1).to(x.dtype))
    return out


def moe_gradcheck(moe_kernels, *, device, dtype, tol: float, renormalize: bool = True, seed: int = 0,
                  shape: tuple[int, int, int, int, int] = (62, 64, 16, 32, 4)) -> dict:
    """The analytic gradient (through ``moe_kernels``' forward) against float64 autograd on the
    CPU at the same route. shape: (tokens, hidden, experts, expert width, top-k)."""
    T, H, E, I, k = shape
    gen = torch.Generator().manual_seed(seed)

    def rn(*s, scale=1.0):
        return (torch.randn(*s, generator=gen, dtype=torch.float64) * scale).to(device, dtype)

    inputs = [rn(T, H), rn(T, E, scale=2.0), rn(E, 2 * I, H, scale=0.1), rn(E, H, I, scale=0.1)]
    xs = [t.clone().requires_grad_(True) for t in inputs]
    out, weights, ids = moe_block(moe_kernels, *xs, k, renormalize)
    cot = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    (out.to(torch.float64) * cot.to(out.device)).sum().backward()
    rs = [t.detach().to("cpu", torch.float64).requires_grad_(True) for t in inputs]
    ref_out = reference_block(*rs, ids.cpu(), renormalize)
    (ref_out * cot).sum().backward()

    def rel(a, r):
        a, r = a.detach().to("cpu", torch.float64), r.detach().to("cpu", torch.float64)
        return float((a - r).norm() / max(float(r.norm()), 1e-300))

    rels = [rel(g.grad, r.grad) for g, r in zip(xs, rs)]
    finite = all(bool(torch.isfinite(g.grad).all()) for g in xs)
    return {"op": MOE_OP, "inputs": ["x", "router_logits", "w13", "w2"], "rel_err": rels, "max_rel_err": max(rels),
            "forward_rel_err": rel(out, ref_out), "finite": finite, "tol": tol, "renormalize": renormalize,
            "shape": {"tokens": T, "hidden": H, "experts": E, "expert_width": I, "top_k": k},
            "pass": finite and max(rels) < tol}


def moe_gradcheck_with_control(moe_kernels, *, device, dtype, tol: float) -> dict:
    """The check, then the same with the planted error: the control must fail."""
    main = moe_gradcheck(moe_kernels, device=device, dtype=dtype, tol=tol)
    with A.planted_backward_error(MOE_OP):
        control = moe_gradcheck(moe_kernels, device=device, dtype=dtype, tol=tol)
    return {"check": main, "control": control, "control_caught": not control["pass"],
            "pass": main["pass"] and not control["pass"]}
