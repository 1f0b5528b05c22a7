"""Routing receipts of a mixture-of-experts forward and their comparison (stdlib only: no torch,
no numpy, so the CPU tests replay the device's receipts with nothing else installed).

A receipt is, per MoE layer, the experts each token was sent to and its gate weights, in the
order the router returned them (vLLM's ``topk_softmax`` returns them by descending weight):
``ids`` int32 and ``weights`` float32, both row-major ``[tokens, top_k]``. Weights are compared
by their bits, as the logprobs are. JSON form: ``{"tokens", "top_k", "layers": [{"ids": b64,
"weights": b64}]}`` with the arrays as little-endian bytes in base64 (exact and compact).
"""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerRoutes:
    """One MoE layer's routes: ids[t * top_k + j] is token t's j-th expert, weights likewise."""

    ids: tuple[int, ...]
    weight_bits: tuple[int, ...]  # float32 bit patterns (uint32)
    top_k: int

    @property
    def tokens(self) -> int:
        return len(self.ids) // self.top_k

    def row(self, t: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        s = slice(t * self.top_k, (t + 1) * self.top_k)
        return self.ids[s], self.weight_bits[s]

    def rows(self, start: int, stop: int) -> "LayerRoutes":
        s = slice(start * self.top_k, stop * self.top_k)
        return LayerRoutes(self.ids[s], self.weight_bits[s], self.top_k)


def _pack(values: Sequence[int], code: str) -> str:
    a = array(code, values)
    if sys.byteorder != "little":
        a.byteswap()
    return base64.b64encode(a.tobytes()).decode()


def _unpack(text: str, code: str) -> tuple[int, ...]:
    a = array(code)
    a.frombytes(base64.b64decode(text))
    if sys.byteorder != "little":
        a.byteswap()
    return tuple(a)


def float_bits(values: Sequence[float]) -> tuple[int, ...]:
    """float32 bit patterns of `values` (rounded to float32 first, as torch stores them)."""
    a = array("f", values)
    b = array("I")
    b.frombytes(a.tobytes())
    return tuple(b)


def layer_from_lists(ids: Sequence[Sequence[int]], weights: Sequence[Sequence[float]]) -> LayerRoutes:
    k = len(ids[0]) if ids else 0
    flat_ids = [int(x) for row in ids for x in row]
    flat_w = [float(x) for row in weights for x in row]
    return LayerRoutes(tuple(flat_ids), float_bits(flat_w), k)


def to_json(layers: Sequence[LayerRoutes]) -> dict:
    tokens = layers[0].tokens if layers else 0
    top_k = layers[0].top_k if layers else 0
    return {"tokens": tokens, "top_k": top_k,
            "layers": [{"ids": _pack(x.ids, "i"), "weights": _pack(x.weight_bits, "I")} for x in layers]}


def from_json(d: dict) -> list[LayerRoutes]:
    k = int(d["top_k"])
    return [LayerRoutes(_unpack(x["ids"], "i"), _unpack(x["weights"], "I"), k) for x in d["layers"]]


def compare(a: Sequence[LayerRoutes], b: Sequence[LayerRoutes]) -> dict:
    """Token-by-token comparison of two receipts of the same tokens.

    Counts per layer the tokens whose expert ids differ in order (``ids_order``), whose sets of
    experts differ (``expert_set``: a real routing difference, not only a reordering of ties),
    and whose gate weights differ bitwise (``weights``); ``first`` is the first (layer, token)
    where anything differs, layers in order, then tokens. The totals (``ids_differing``,
    ``expert_set_differing``, ``weights_differing``) count (layer, token) pairs. Raises on
    receipts of other shapes.
    """
    if len(a) != len(b):
        raise ValueError(f"receipts of {len(a)} and {len(b)} layers")
    out: dict = {"layers": len(a), "tokens": a[0].tokens if a else 0, "top_k": a[0].top_k if a else 0,
                 "per_layer": [], "first": None}
    for li, (x, y) in enumerate(zip(a, b)):
        if (x.tokens, x.top_k) != (y.tokens, y.top_k):
            raise ValueError(f"layer {li}: {x.tokens}x{x.top_k} against {y.tokens}x{y.top_k}")
        n_order = n_set = n_w = 0
        for t in range(x.tokens):
            (xi, xw), (yi, yw) = x.row(t), y.row(t)
            d_order, d_set, d_w = xi != yi, set(xi) != set(yi), xw != yw
            n_order += d_order
            n_set += d_set
            n_w += d_w
            if (d_order or d_w) and out["first"] is None:
                out["first"] = {"layer": li, "token": t, "ids": [list(xi), list(yi)],
                                "weight_bits": [list(xw), list(yw)]}
        out["per_layer"].append({"ids_order": n_order, "expert_set": n_set, "weights": n_w})
    out["ids_differing"] = sum(p["ids_order"] for p in out["per_layer"])
    out["expert_set_differing"] = sum(p["expert_set"] for p in out["per_layer"])
    out["weights_differing"] = sum(p["weights"] for p in out["per_layer"])
    out["identical"] = out["first"] is None
    return out
