"""Confounders: every difference between the arms is tabulated; only the switch is the switch."""

from __future__ import annotations

from tica.judges.confounders import confounder_table, unquantified
from tica.receipts import load_leg

from .conftest import leg


def _metas(receipts):
    legs = receipts("quality")
    return load_leg(leg(legs, "bi1")).meta, load_leg(leg(legs, "bi0")).meta


def test_aligned_arms_differ_only_in_the_switch(receipts):
    m1, m0 = _metas(receipts)
    table = confounder_table([m1], [m0])
    assert [(c.key, c.status) for c in table] == [("env.VLLM_BATCH_INVARIANT", "switch")]
    assert unquantified(table) == []


def test_a_known_confounder_is_named_in_the_practices_words(receipts):
    m1, m0 = _metas(receipts)
    m0 = m0.model_copy(update={"resolved_config": {**m0.resolved_config, "enable_prefix_caching": True},
                               "kernels": {"attention": "FLASHINFER"}})
    table = {c.key: c for c in confounder_table([m1], [m0])}
    assert table["resolved_config.enable_prefix_caching"].known_as == "prefix caching"
    assert table["kernels.attention"].bi0 == ('"FLASHINFER"',)
    assert {c.key for c in unquantified(list(table.values()))} == {"resolved_config.enable_prefix_caching",
                                                                   "kernels.attention"}


def test_a_quantified_confounder_is_kept_in_the_table_with_where(receipts):
    m1, m0 = _metas(receipts)
    m0 = m0.model_copy(update={"resolved_config": {**m0.resolved_config, "gpu_memory_utilization": 0.9}})
    table = confounder_table([m1], [m0], {"resolved_config.gpu_memory_utilization": "sweep 2026-11-28"})
    row = next(c for c in table if c.key == "resolved_config.gpu_memory_utilization")
    assert row.status == "quantified" and row.note == "sweep 2026-11-28" and unquantified(table) == []


def test_a_setting_that_varies_within_one_arm_is_a_confounder(receipts):
    m1, m0 = _metas(receipts)
    m1b = m1.model_copy(update={"resolved_config": {**m1.resolved_config, "enforce_eager": True}})
    keys = {c.key for c in unquantified(confounder_table([m1, m1b], [m0]))}
    assert keys == {"resolved_config.enforce_eager"}
