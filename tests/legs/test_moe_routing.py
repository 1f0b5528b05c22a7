"""Routing receipts (tica/legs/vllm_kernels/routing.py): the comparison finds what differs, a
flipped route is caught (the negative control), and the JSON form is exact. Pure CPU, stdlib."""

from __future__ import annotations

import random

import pytest

from tica.legs.vllm_kernels.routing import compare, float_bits, from_json, layer_from_lists, to_json


def receipt(seed: int = 0, tokens: int = 40, layers: int = 3, experts: int = 16, k: int = 4):
    r = random.Random(seed)
    out = []
    for _ in range(layers):
        ids, ws = [], []
        for _ in range(tokens):
            chosen = r.sample(range(experts), k)
            w = sorted((r.random() for _ in range(k)), reverse=True)
            s = sum(w)
            ids.append(chosen)
            ws.append([x / s for x in w])
        out.append(layer_from_lists(ids, ws))
    return out


def test_identical_receipts_compare_identical():
    a, b = receipt(), receipt()
    c = compare(a, b)
    assert c["identical"] and c["first"] is None
    assert (c["ids_differing"], c["expert_set_differing"], c["weights_differing"]) == (0, 0, 0)
    assert (c["layers"], c["tokens"], c["top_k"]) == (3, 40, 4)


def flipped(layers, layer: int, token: int, new_expert: int):
    from tica.legs.vllm_kernels.routing import LayerRoutes

    x = layers[layer]
    ids = list(x.ids)
    ids[token * x.top_k + x.top_k - 1] = new_expert  # the token's last (lightest) expert replaced
    return [*layers[:layer], LayerRoutes(tuple(ids), x.weight_bits, x.top_k), *layers[layer + 1:]]


def test_one_flipped_route_is_caught_where_it_is():
    """The negative control: one expert of one token of one layer changed, nothing else."""
    a = receipt()
    used = set(a[1].row(17)[0])
    new = next(e for e in range(16) if e not in used)
    c = compare(a, flipped(a, 1, 17, new))
    assert not c["identical"]
    assert c["first"]["layer"] == 1 and c["first"]["token"] == 17
    assert c["ids_differing"] == 1 and c["expert_set_differing"] == 1 and c["weights_differing"] == 0
    assert [p["ids_order"] for p in c["per_layer"]] == [0, 1, 0]


def test_a_reordering_is_an_ids_difference_but_not_an_expert_set_difference():
    from tica.legs.vllm_kernels.routing import LayerRoutes

    a = receipt()
    x = a[0]
    ids = list(x.ids)
    ids[0], ids[1] = ids[1], ids[0]
    c = compare(a, [LayerRoutes(tuple(ids), x.weight_bits, x.top_k), *a[1:]])
    assert c["ids_differing"] == 1 and c["expert_set_differing"] == 0 and c["first"]["token"] == 0


def test_one_ulp_of_one_gate_weight_is_caught():
    from tica.legs.vllm_kernels.routing import LayerRoutes

    a = receipt()
    x = a[2]
    bits = list(x.weight_bits)
    bits[5 * x.top_k] += 1
    c = compare(a, [*a[:2], LayerRoutes(x.ids, tuple(bits), x.top_k)])
    assert c["weights_differing"] == 1 and c["ids_differing"] == 0
    assert c["first"]["layer"] == 2 and c["first"]["token"] == 5


def test_json_round_trip_is_exact():
    a = receipt(seed=3)
    assert from_json(to_json(a)) == a
    assert float_bits([1.0, -2.5]) == (0x3F800000, 0xC0200000)


def test_receipts_of_other_shapes_are_refused():
    with pytest.raises(ValueError):
        compare(receipt(tokens=40), receipt(tokens=39))
    with pytest.raises(ValueError):
        compare(receipt(layers=3), receipt(layers=2))
