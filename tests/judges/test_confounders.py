"""Confounders: every difference between the arms is tabulated; only the switch is the switch.
What a leg did not record is unknown, never aligned; the question names what must be recorded."""

from __future__ import annotations

from tica.canaries import edit_meta
from tica.judges import judge_criteria
from tica.confounders import UNKNOWN, confounder_table, unknown, unquantified
from tica.receipts import load_leg
from tica.verdict import Verdict

from .conftest import leg, question, with_question

QQ = question("quality")


def _metas(receipts):
    legs = receipts("quality")
    return load_leg(leg(legs, "bi1")).meta, load_leg(leg(legs, "bi0")).meta


def test_aligned_arms_differ_only_in_the_switch(receipts):
    m1, m0 = _metas(receipts)
    table = confounder_table([m1], [m0])
    assert [(c.key, c.status) for c in table if c.status != "unknown"] == [("env.VLLM_BATCH_INVARIANT", "switch")]
    assert unquantified(table) == []
    # what these legs do not record (no candidate identity, no trainer) is listed as unknown, not dropped
    assert {c.key for c in unknown(table)} == {"image_digest", "source", "trainer"}


def test_a_key_recorded_in_neither_arm_is_unknown_not_aligned(receipts):
    m1, m0 = _metas(receipts)
    blank = {"versions": {}, "device": {}, "kernels": {}, "resolved_config": {}}
    table = {c.key: c for c in confounder_table([m1.model_copy(update=blank)], [m0.model_copy(update=blank)])}
    for key in blank:
        assert table[key].status == "unknown" and table[key].bi1 == table[key].bi0 == (UNKNOWN,)
    # control: the same keys recorded alike in both arms are aligned (no row)
    assert not {"versions", "device", "kernels", "resolved_config"} & {c.key for c in confounder_table([m1], [m0])}


def test_a_value_one_arm_does_not_record_shows_as_unknown(receipts):
    m1, m0 = _metas(receipts)
    m0 = m0.model_copy(update={"versions": {k: v for k, v in m0.versions.items() if k != "vllm"}})
    row = next(c for c in confounder_table([m1], [m0]) if c.key == "versions.vllm")
    assert row.bi0 == (UNKNOWN,) and row.bi1 == ('"0.26.0"',) and row.status == "unquantified"


def test_a_leg_that_records_nothing_is_not_a_pass(receipts):
    legs = receipts("quality")
    for p in legs:
        edit_meta(p, lambda m: m.update(versions={}, device={}, kernels={}, resolved_config={}))
    cell = judge_criteria("quality", QQ, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("bi1 quality_bi1: versions.vllm, versions.torch, device.name, kernels, resolved_config.weights_hash "
               "not recorded" in r for r in cell.reasons)
    assert "| kernels | kernel/backend selection | unknown | unknown | unknown |" in cell.tables["confounders"]
    # control: a question that requires nothing recorded lets the same pairing pass
    assert judge_criteria("quality", with_question(QQ, must_record=[]), legs).verdict is Verdict.PASS


def test_one_required_field_unknown_in_one_leg_names_the_field_and_the_leg(receipts):
    legs = receipts("quality")
    edit_meta(leg(legs, "bi0"), lambda m: m["resolved_config"].pop("weights_hash"))
    cell = judge_criteria("quality", with_question(QQ, must_record=["resolved_config.weights_hash"]), legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert cell.reasons[0] == ("inconclusive: bi0 quality_bi0: resolved_config.weights_hash not recorded (unknown); "
                               "the question requires it")


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
