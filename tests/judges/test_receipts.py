"""Receipt loaders: every bad receipt raises ReceiptError naming its file and field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tica.canaries import edit_json, edit_jsonl, edit_meta
from tica.errors import ReceiptError
from tica.items.quality.receipts import load_recorded_contract
from tica.judges import judge_criteria
from tica.receipts import (
    ForwardStep,
    load_bench_leg,
    load_leg,
    load_step_arrays,
    load_step_metrics,
)
from tica.verdict import Verdict

from .conftest import FIXTURES, leg, question


def test_sealed_leg_loads(receipts):
    legs = receipts("forward")
    loaded = load_leg(leg(legs, "bi1"))
    assert loaded.meta.arm == "bi1" and loaded.digest.startswith("sha256:")


def test_leg_changed_after_sealing_is_refused_naming_the_seal(receipts):
    p = leg(receipts("forward"), "bi1")
    (p / "metrics.jsonl").write_text((p / "metrics.jsonl").read_text() + "\n")
    with pytest.raises(ReceiptError) as e:
        load_leg(p)
    assert e.value.file.endswith("seal.json") and "changed after sealing" in e.value.message


def test_unsealed_leg_is_refused(receipts):
    p = leg(receipts("forward"), "bi1")
    (p / "seal.json").unlink()
    with pytest.raises(ReceiptError, match="missing seal"):
        load_leg(p)


def test_unknown_leg_field_names_the_field(receipts):
    p = leg(receipts("forward"), "bi1")
    edit_meta(p, lambda m: m.update(armm="bi1"))
    with pytest.raises(ReceiptError) as e:
        load_leg(p)
    assert e.value.field == "armm" and e.value.file.endswith("leg.json")


def test_arm_contradicting_the_switch_is_refused(receipts):
    p = leg(receipts("forward"), "bi1")
    edit_meta(p, lambda m: m["env"].update(VLLM_BATCH_INVARIANT="0"))
    with pytest.raises(ReceiptError, match="VLLM_BATCH_INVARIANT"):
        load_leg(p)


def test_invented_step_zero_is_refused(receipts):
    p = leg(receipts("forward"), "bi1")
    edit_jsonl(p / "metrics.jsonl", lambda rows: [dict(rows[0], step=0), *rows], p)
    with pytest.raises(ReceiptError) as e:
        load_step_metrics(p / "metrics.jsonl", ForwardStep)
    assert e.value.field == "line 1.step" and "step 0" in e.value.message


def test_real_step_one_is_accepted(receipts):
    p = leg(receipts("forward"), "bi1")
    steps = load_step_metrics(p / "metrics.jsonl", ForwardStep)
    assert steps[0].step == 1 and steps[0].step_basis == "rollout" and steps[0].checkpoint_version.startswith("blake3:")


def test_step_without_basis_or_checkpoint_is_read_as_unknown(receipts):
    # verl writes neither: unknown, read (tests/judges/test_unknowns.py: BI=1 is then inconclusive).
    p = leg(receipts("forward"), "bi1")
    edit_jsonl(p / "metrics.jsonl", lambda rows: [{k: v for k, v in r.items() if k != "step_basis"} for r in rows], p)
    assert {s.step_basis for s in load_step_metrics(p / "metrics.jsonl", ForwardStep)} == {None}


@pytest.mark.parametrize("placeholder", ["", "unknown", "N/A", " ? "])
def test_a_placeholder_checkpoint_version_is_read_as_unknown_and_the_bitwise_claim_is_not_passed(receipts, placeholder):
    p = leg(receipts("forward"), "bi1")
    edit_jsonl(p / "metrics.jsonl", lambda rows: [{**r, "checkpoint_version": placeholder} for r in rows], p)
    assert {s.checkpoint_version for s in load_step_metrics(p / "metrics.jsonl", ForwardStep)} == {None}
    cell = judge_criteria("forward", question("forward"), [p])
    assert cell.verdict is not Verdict.PASS and any("checkpoint_version" in r for r in cell.reasons), cell.reasons


def test_duplicate_step_is_refused(receipts):
    p = leg(receipts("forward"), "bi1")
    edit_jsonl(p / "metrics.jsonl", lambda rows: [*rows, rows[-1]], p)
    with pytest.raises(ReceiptError, match="appears twice"):
        load_step_metrics(p / "metrics.jsonl", ForwardStep)


def test_mixed_step_bases_are_refused(receipts):
    p = leg(receipts("forward"), "bi1")
    edit_jsonl(p / "metrics.jsonl", lambda rows: [dict(rows[0], step_basis="optimizer"), *rows[1:]], p)
    with pytest.raises(ReceiptError, match="mixes step bases"):
        load_step_metrics(p / "metrics.jsonl", ForwardStep)


def test_arrays_with_wrong_dtype_are_refused(tmp_path):
    path = tmp_path / "step_0001.npz"
    np.savez(path, token_ids=np.zeros(3, np.int64), seq_lens=np.array([3], np.int32),
             trainer_logprobs=np.zeros(3, np.float32), rollout_logprobs=np.zeros(3, np.float32))
    with pytest.raises(ReceiptError) as e:
        load_step_arrays(path)
    assert e.value.field == "token_ids"


def test_arrays_whose_lengths_disagree_are_refused(tmp_path):
    path = tmp_path / "step_0001.npz"
    np.savez(path, token_ids=np.zeros(3, np.int32), seq_lens=np.array([2], np.int32),
             trainer_logprobs=np.zeros(3, np.float32), rollout_logprobs=np.zeros(3, np.float32))
    with pytest.raises(ReceiptError, match="seq_lens"):
        load_step_arrays(path)


def test_a_contract_item_left_out_is_unknown_and_a_malformed_one_is_named(receipts):
    p = leg(receipts("quality"), "bi1")
    edit_json(p / "contract.json", lambda d: d.pop("scorer"), p)
    assert load_recorded_contract(p / "contract.json").scorer is None  # unknown, never a default
    edit_json(p / "contract.json", lambda d: d.update(repeats=0), p)
    with pytest.raises(ReceiptError) as e:
        load_recorded_contract(p / "contract.json")
    assert e.value.field == "repeats"


def test_bare_vllm_bench_file_reads_metadata_as_place():
    [first] = [p for p in sorted((FIXTURES / "bare_bench").iterdir()) if "r2-s1" in p.name]
    bl = load_bench_leg(first)
    assert (bl.arm, bl.round, bl.slot, bl.concurrency) == ("bi0", 2, 1, 8)
    assert bl.meta is None and bl.workload("num_warmups") == 1


def test_bare_bench_without_arm_metadata_is_refused(tmp_path):
    src = sorted((FIXTURES / "bare_bench").iterdir())[0]
    data = json.loads(src.read_text())
    del data["arm"]
    p = tmp_path / "b.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ReceiptError) as e:
        load_bench_leg(p)
    assert e.value.field == "arm"


def test_bench_missing_a_required_field_names_it(tmp_path):
    src = sorted((FIXTURES / "bare_bench").iterdir())[0]
    data = json.loads(src.read_text())
    del data["total_output_tokens"]
    p = tmp_path / "b.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ReceiptError) as e:
        load_bench_leg(p)
    assert e.value.field == "total_output_tokens"


def test_judge_turns_an_unreadable_receipt_into_inconclusive(receipts):
    legs = receipts("forward")
    p = leg(legs, "bi1")
    (p / "metrics.jsonl").write_text("{not json\n")
    cell = judge_criteria("forward", question("forward"), legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert cell.numbers["receipt_error"]["file"].endswith("seal.json")


def test_bench_metadata_contradicting_its_leg_is_refused(receipts):
    from tica.canaries import tput_leg
    legs = receipts("throughput")
    p = tput_leg(legs, "bi1", 8, 2)
    edit_json(p / "bench.json", lambda d: d.update(round="3"), p)
    with pytest.raises(ReceiptError) as e:
        load_bench_leg(p)
    assert e.value.field == "round" and e.value.file.endswith("bench.json")


def test_a_leg_whose_producer_recorded_errors_cannot_pass(receipts):
    from tica.canaries import edit_meta
    from tica.judges import judge_criteria
    from tica.verdict import Verdict

    from .conftest import question

    legs = receipts("backward")
    assert judge_criteria("backward", question("backward"), legs).verdict is Verdict.PASS
    edit_meta(legs[0], lambda m: m.update(errors=["RuntimeError: engine died mid-leg"]))
    cell = judge_criteria("backward", question("backward"), legs)
    assert cell.verdict is Verdict.INCONCLUSIVE and "engine died mid-leg" in cell.reasons[-1]
