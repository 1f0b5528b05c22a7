"""One canonical form per manifest field (tica.canonical), used by fingerprint, diff and binding
alike (issue 28, class 4): two spellings the form equates get the same component fingerprint and
bind each other; two it does not never bind."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.manifests import BASE_MANIFEST
from tica import binding, canonical
from tica.evidence import Component
from tica.manifest import Manifest, value_fingerprint

HEX = st.text("0123456789abcdef", min_size=64, max_size=64)


def fingerprints(**over) -> dict[Component, str]:
    data = copy.deepcopy(BASE_MANIFEST)
    for dotted, value in over.items():
        node = data
        *parents, last = dotted.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return {c: value_fingerprint(v) for c, v in Manifest.model_validate(data).component_values().items()}


def spellings_of_digest(hex_: str) -> list[str]:
    return ["sha256:" + hex_, "SHA256:" + hex_.upper(), hex_, " sha256:" + hex_ + " "]


@settings(max_examples=25, deadline=None)
@given(a=HEX, b=HEX)
def test_digest_spellings_fingerprint_and_bind_alike_and_other_digests_never(a, b):
    prints = {fingerprints(image__digest=s)[Component.IMAGE] for s in spellings_of_digest(a)}
    assert len(prints) == 1
    assert all(binding._digest(s, t) for s in spellings_of_digest(a) for t in spellings_of_digest(a))
    if a != b:
        assert fingerprints(image__digest="sha256:" + b)[Component.IMAGE] not in prints
        assert not any(binding._digest(s, t) for s in spellings_of_digest(a) for t in spellings_of_digest(b))


DTYPE_CLASSES = [["bf16", "bfloat16", "BF16", "torch.bfloat16"], ["fp16", "half", "float16"], ["fp32", "float", "float32"]]


def test_dtype_aliases_fingerprint_and_bind_alike_and_other_dtypes_never():
    for i, names in enumerate(DTYPE_CLASSES):
        prints = {fingerprints(precision__weights=n, precision__kv_cache=n)[Component.PRECISION] for n in names}
        assert len(prints) == 1, names
        assert all(binding._dtype(a, b) for a in names for b in names)
        for other in DTYPE_CLASSES[i + 1:]:
            assert not any(binding._dtype(a, b) for a in names for b in other)
            assert fingerprints(precision__weights=other[0], precision__kv_cache=other[0])[Component.PRECISION] not in prints


@settings(max_examples=25, deadline=None)
@given(st.permutations([1, 8, 32, 64]), st.integers(1, 64))
def test_unordered_concurrencies_and_one_count_everywhere_fingerprint_alike(order, n):
    base = fingerprints(workload__concurrencies=[1, 8, 32, 64], workload__num_prompts=n)[Component.WORKLOAD]
    assert fingerprints(workload__concurrencies=list(order),
                        workload__num_prompts={c: n for c in order})[Component.WORKLOAD] == base
    # control: another count at one concurrency is another workload
    assert fingerprints(workload__concurrencies=list(order),
                        workload__num_prompts={c: n + (c == 8) for c in order})[Component.WORKLOAD] != base


@settings(max_examples=25, deadline=None)
@given(st.permutations(["\n", "</s>", "Question:"]))
def test_stop_sequences_are_a_set_for_fingerprint_and_binding(order):
    base = fingerprints(eval_contract__sampling__stop=["\n", "</s>", "Question:"])[Component.EVAL_CONTRACT]
    assert fingerprints(eval_contract__sampling__stop=list(order))[Component.EVAL_CONTRACT] == base
    assert binding._unordered(("\n", "</s>", "Question:"), list(order))
    assert not binding._unordered(("\n", "</s>", "Question:"), list(order)[:2])  # control: one stop fewer
    assert not binding._unordered(("\n",), ["\n", "\n"])  # a set, not a multiset


def test_package_pin_spellings_fingerprint_and_bind_alike():
    engine = BASE_MANIFEST["runner"]["rollout_engine"]
    name, version = engine.split("==")
    spelled = [engine, f"{name} == {version}", f"{name}==v{version}", f" {name}== v{version} "]
    assert len({fingerprints(runner__rollout_engine=s)[Component.RUNNER] for s in spelled}) == 1
    assert binding._package_version(version, "v" + version) and binding._package_version("v" + version, version)
    assert not binding._package_version(version, version + ".1")  # control: another release


def test_spellings_not_named_by_the_canonical_form_are_compared_exactly():
    assert canonical.dtype("fp8_e4m3") != canonical.dtype("fp8_e5m2")
    assert canonical.digest("blake3:" + "ab" * 32) != canonical.digest("sha256:" + "ab" * 32)
    assert fingerprints(backends__attention="FLASH_ATTN (FA3, num_splits=1)")[Component.BACKENDS] != \
        fingerprints(backends__attention="FLASH_ATTN (FA2)")[Component.BACKENDS]
