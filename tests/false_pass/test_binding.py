"""No false pass, binding: a receipt is evidence only for the candidate whose identity it records.

Each test breaks one value a leg records against what the candidate manifest pins (resealed, as
an honest producer of another candidate would have sealed it) and asserts the cell is not `pass`,
with the binding list naming the manifest field and whether it differs or is unrecorded."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.bound_receipts import build_bound
from tica.canaries import edit_json, edit_meta, tput_leg
from tica.errors import ManifestError
from tica.judges import judge
from tica.seal import seal_leg
from tica.verdict import Verdict

from .conftest import (
    COMMIT,
    OTHER_WEIGHTS,
    RECEIPTS,
    E,
    all_reasons,
    assert_no_pass,
    assert_unbound,
    drop_key,
    leg_of,
    load,
    question_with,
    set_key,
)


# ------------------------------------------------------------------ another candidate's identity


def test_a_leg_with_another_checkpoints_weights_is_not_evidence(bound, candidate, questions):
    legs = bound(E.FORWARD)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: m["resolved_config"].update(weights_hash=OTHER_WEIGHTS))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_unbound(cell, "checkpoint (weights fingerprint)", "differs")
    assert OTHER_WEIGHTS in all_reasons(cell)


def test_receipts_of_another_candidates_checkpoint_are_not_evidence_for_this_one(bound, make_candidate, questions):
    """The same receipts, judged for a candidate whose checkpoint bytes differ by one byte."""
    legs = bound(E.BACKWARD)
    other = make_candidate("other", weights=bytes(range(256)) * 63 + bytes(range(255)) + b"\x00")
    cell = judge(E.BACKWARD, questions[E.BACKWARD], legs, other)
    assert_unbound(cell, "checkpoint (weights fingerprint)", "differs")


def test_the_artifacts_of_two_checkpoints_are_not_one_candidates_artifacts(bound, candidate, questions):
    legs = bound(E.ARTIFACTS)
    edit_meta(legs[-1], lambda m: m["resolved_config"].update(weights_hash=OTHER_WEIGHTS))
    cell = judge(E.ARTIFACTS, questions[E.ARTIFACTS], legs, candidate)
    assert_no_pass(cell, "name different weights")
    assert_unbound(cell, "checkpoint (weights fingerprint)", "differs")


def test_a_bi1_forward_scored_by_vllm_itself_is_not_the_vllm_kernels_trainer(bound, candidate, questions):
    """`trainer: vllm_engine` is vLLM scoring its own tokens; the manifest's BI=1 trainer is vllm_kernels."""
    legs = bound(E.FORWARD)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: m.update(trainer="vllm_engine"))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_unbound(cell, "runner.trainer", "differs")
    assert "vllm_engine" in all_reasons(cell)


@pytest.mark.parametrize("item", [E.BACKWARD, E.UPDATE])
def test_a_bi1_trainer_leg_run_by_another_trainer_is_not_evidence(item, bound, candidate, questions):
    legs = bound(item)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: m.update(trainer="megatron"))
    cell = judge(item, questions[item], legs, candidate)
    assert_unbound(cell, "runner.trainer", "differs")


def test_a_leg_on_another_accelerator_is_not_evidence(bound, candidate, questions):
    legs = bound(E.FORWARD)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: m["device"].update(name="NVIDIA H100 80GB HBM3"))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_unbound(cell, "hardware.accelerator", "differs")


def test_a_leg_under_another_gpu_driver_is_not_evidence(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    edit_meta(legs[0], lambda m: m["device"].update(driver="570.86.15"))
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate)
    assert_unbound(cell, "hardware.driver", "differs")


def test_a_leg_built_from_another_source_commit_is_not_evidence(bound, candidate, questions):
    legs = bound(E.UPDATE)
    edit_meta(legs[0], lambda m: m["source"].update(commit="fedcba9876543210aa"))
    cell = judge(E.UPDATE, questions[E.UPDATE], legs, candidate)
    assert_unbound(cell, "source.commit", "differs")


def test_a_dirty_checkout_is_not_the_clean_commit_the_manifest_pins(bound, candidate, questions):
    legs = bound(E.FORWARD)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: m["source"].update(commit=COMMIT + "+dirty"))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_unbound(cell, "source.commit", "differs")
    assert "+dirty" in all_reasons(cell)


def test_a_clean_checkout_is_not_the_dirty_tree_the_manifest_pins(bound, make_candidate, questions):
    dirty = make_candidate("dirty", source={"repository": "github.com/verl-project/verl",
                                            "commit": COMMIT + "+dirty.0123456789ab"})
    legs = bound(E.FORWARD, cand=dirty)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: m["source"].update(commit=COMMIT))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, dirty)
    assert_unbound(cell, "source.commit", "differs")


def test_two_bare_dirty_trees_never_bind_each_other(bound, make_candidate, questions):
    """Issue 28, class 3: `+dirty` alone names no changes, so it cannot show two trees are one."""
    pinned = make_candidate("bare", source={"repository": "github.com/verl-project/verl", "commit": COMMIT + "+dirty"})
    legs = bound(E.FORWARD)  # control: the clean commit binds (the fixture checks it passes)
    for leg in legs:
        edit_meta(leg, lambda m: m["source"].update(commit=COMMIT + "+dirty"))
    assert_unbound(judge(E.FORWARD, questions[E.FORWARD], legs, pinned), "source.commit", "differs")


def test_a_leg_in_another_image_is_not_evidence_even_with_the_same_vllm(bound, candidate, questions):
    legs = bound(E.QUALITY)
    edit_meta(legs[0], lambda m: m.update(image_digest="sha256:" + "9f" * 32))
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_unbound(cell, "image.digest", "differs")


def test_a_leg_with_another_vllm_version_is_not_evidence(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi1", 32, 2)
    edit_meta(leg, lambda m: m["versions"].update(vllm="0.25.1"))
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_unbound(cell, "package vllm", "differs")


@pytest.mark.parametrize("recorded", ["0.26.0+mypatch", "0.26.0+g1a2b3c"])
def test_a_locally_patched_vllm_build_is_another_version(bound, candidate, questions, recorded):
    """A local version label other than the platform's (+cpu, +cu130) is another build of vLLM."""
    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi1", 32, 2)
    edit_meta(leg, lambda m: m["versions"].update(vllm=recorded))
    assert_unbound(judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate), "package vllm", "differs")


def test_a_platform_label_on_the_pinned_vllm_version_binds(bound, candidate, questions):
    """The negative control of the test above: the pinned release built for CUDA 13.0 is the same vLLM."""
    legs = bound(E.THROUGHPUT)
    for leg in legs:
        edit_meta(leg, lambda m: m["versions"].update(vllm=m["versions"]["vllm"] + "+cu130"))
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert cell.verdict is Verdict.PASS, cell.reasons


def test_a_leg_with_other_weight_precision_is_not_evidence(bound, candidate, questions):
    legs = bound(E.FORWARD)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: m["resolved_config"].update(dtype="float16"))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_unbound(cell, "precision.weights", "differs")


def test_a_leg_whose_rollout_selected_another_attention_backend_is_not_evidence(bound, candidate, questions):
    legs = bound(E.QUALITY)
    edit_meta(legs[1], lambda m: m["kernels"]["rollout"].update(attention="FLASHINFER"))
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_unbound(cell, "backends.attention", "differs")


def test_every_place_a_receipt_records_a_value_must_agree(bound, candidate, questions):
    """kernels.rollout.attention says FLASH_ATTN (the manifest's); kernels.attention says another backend."""
    legs = bound(E.FORWARD)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: m["kernels"].update(attention="TRITON_ATTN"))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_unbound(cell, "backends.attention", "differs")
    assert "TRITON_ATTN" in all_reasons(cell)


@pytest.mark.parametrize("key, value, field", [
    ("prefix_caching", True, "graph_cache.prefix_caching"),
    ("chunked_prefill", True, "graph_cache.chunked_prefill"),
    ("async_scheduling", True, "graph_cache.async_scheduling"),
    ("enforce_eager", False, "graph_cache.cuda_graph_mode"),
])
def test_a_rollout_with_another_graph_or_cache_setting_is_not_evidence(key, value, field, bound, candidate, questions):
    legs = bound(E.FORWARD)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: m["kernels"]["rollout"].update({key: value}))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_unbound(cell, field, "differs")


def test_a_leg_at_another_tensor_parallel_size_is_not_evidence(bound, candidate, questions):
    legs = bound(E.BACKWARD)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: m["resolved_config"].update(tensor_parallel_size=2))
    cell = judge(E.BACKWARD, questions[E.BACKWARD], legs, candidate)
    assert_unbound(cell, "runner.parallelism.tp", "differs")


def test_throughput_under_another_workload_is_not_evidence(bound, candidate, questions):
    """Both arms ran 4096 in, consistently (the bench agrees with itself); the manifest pins 8192."""
    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi0", 8, 3)
    edit_meta(leg, lambda m: m["resolved_config"].update(input_len=4096))
    edit_json(leg / "bench.json", lambda b: b.update(total_input_tokens=b["total_input_tokens"] // 2), leg)
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_unbound(cell, "workload.input_len", "differs")


def test_two_scores_under_another_evaluation_contract_are_not_this_candidates_score(bound, candidate, questions):
    """Both arms scored with another scorer: the same score as each other (the criteria pass), not
    the candidate's contract."""
    legs = bound(E.QUALITY)
    for leg in legs:
        edit_json(leg / "contract.json", lambda c: c.update(scorer="verl.gsm8k/2 sha256:0bb1"), leg)
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_unbound(cell, "eval_contract.scorer", "differs")


# ------------------------------------------------------------------ nothing where the manifest pins a value

# (item, arm of the leg edited, key deleted from leg.json, the manifest field left unbound)
UNRECORDED = [
    (E.FORWARD, "bi1", "resolved_config.weights_hash", "checkpoint (weights fingerprint)"),
    (E.FORWARD, "bi1", "source.commit", "source.commit"),
    (E.FORWARD, "bi1", "source", "source.commit"),
    (E.FORWARD, "bi1", "device.name", "hardware.accelerator"),
    (E.FORWARD, "bi1", "device.driver", "hardware.driver"),
    (E.FORWARD, "bi1", "device", "hardware.accelerator"),
    (E.FORWARD, "bi1", "versions.vllm", "package vllm"),
    (E.FORWARD, "bi1", "versions", "package vllm"),
    (E.FORWARD, "bi1", "trainer", "runner.trainer"),
    (E.BACKWARD, "bi1", "trainer", "runner.trainer"),
    (E.UPDATE, "bi1", "trainer", "runner.trainer"),
    (E.FORWARD, "bi1", "resolved_config.dtype", "precision.weights"),
    (E.FORWARD, "bi1", "kernels.rollout.attention", "backends.attention"),
    (E.FORWARD, "bi0", "kernels.rollout.prefix_caching", "graph_cache.prefix_caching"),
    (E.FORWARD, "bi1", "kernels.rollout.chunked_prefill", "graph_cache.chunked_prefill"),
    (E.QUALITY, "bi1", "kernels.rollout.async_scheduling", "graph_cache.async_scheduling"),
    (E.FORWARD, "bi1", "kernels.rollout.enforce_eager", "graph_cache.cuda_graph_mode"),
    (E.FORWARD, "bi1", "resolved_config.tensor_parallel_size", "runner.parallelism.tp"),
    (E.THROUGHPUT, "bi1", "resolved_config.input_len", "workload.input_len"),
    (E.THROUGHPUT, "bi0", "resolved_config.output_len", "workload.output_len"),
    (E.THROUGHPUT, "bi1", "resolved_config.ignore_eos", "workload.ignore_eos"),
    (E.THROUGHPUT, "bi0", "resolved_config.num_warmups", "workload.warmups"),
]


@pytest.mark.parametrize("item, arm, key, field", UNRECORDED,
                         ids=[f"{i.value}-{a}-{k}" for i, a, k, _ in UNRECORDED])
def test_a_leg_recording_nothing_where_the_manifest_pins_a_value_is_not_evidence(item, arm, key, field, bound,
                                                                                   candidate, questions):
    legs = bound(item)
    edit_meta(leg_of(legs, arm=arm), lambda m: drop_key(m, key))
    cell = judge(item, questions[item], legs, candidate)
    assert_unbound(cell, field, "unrecorded")


def test_a_leg_recording_neither_image_digest_nor_package_versions_is_not_evidence(bound, candidate, questions):
    """The practice accepts "image or package versions": a leg recording neither names no image."""
    legs = bound(E.UPDATE)
    edit_meta(legs[0], lambda m: (m.pop("image_digest"), m.pop("versions")))
    cell = judge(E.UPDATE, questions[E.UPDATE], legs, candidate)
    assert_unbound(cell, "image.digest", "unrecorded")
    assert_unbound(cell, "package vllm", "unrecorded")


CONTRACT_ITEMS = ["dataset_version", "prompt_template", "thinking_mode", "repeats", "scorer", "length_cap",
                  "sampling.temperature", "sampling.top_p", "sampling.seed"]


@pytest.mark.parametrize("key", CONTRACT_ITEMS)
def test_a_quality_leg_whose_contract_records_nothing_for_an_item_is_not_evidence(key, bound, candidate, questions):
    legs = bound(E.QUALITY)
    leg = leg_of(legs, arm="bi0")
    edit_json(leg / "contract.json", lambda c: drop_key(c, key), leg)
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_unbound(cell, f"eval_contract.{key}", "unrecorded")


def test_a_quality_leg_without_its_contract_file_is_not_evidence(bound, candidate, questions):
    legs = bound(E.QUALITY)
    leg = leg_of(legs, arm="bi1")
    (leg / "contract.json").unlink()
    edit_meta(leg, lambda m: None)  # resealed without it
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_unbound(cell, "eval_contract.dataset_version", "unrecorded")
    assert_no_pass(cell, "contract.json")


# ------------------------------------------------------------------ no candidate at all


def test_a_judgement_bound_to_no_candidate_never_passes(bound, questions):
    for item in (E.FORWARD, E.QUALITY, E.CLEAN_EXIT):
        cell = judge(item, questions[item], bound(item), None)
        assert cell.candidate_id is None
        assert_no_pass(cell, "bound to no candidate")


def test_a_bare_bench_json_without_its_leg_directory_records_no_candidate(bound, candidate, questions, tmp_path):
    """One leg's bench.json fed alone, with its metadata (arm, round, slot), in place of its leg."""
    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi1", 64, 2)
    bare = tmp_path / "bare" / "vllm-bench-c64-r2-bi1.json"
    bare.parent.mkdir()
    shutil.copy(leg / "bench.json", bare)
    paths = [bare if p == leg else p for p in legs]
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], paths, candidate)
    assert_no_pass(cell, "a bare result file records no candidate identity", "bare bench file")


def test_the_committed_bare_bench_files_are_evidence_for_no_candidate(candidate, tmp_path):
    from tica.question import load_question

    bare = tmp_path / "bare_bench"
    shutil.copytree(RECEIPTS / "bare_bench", bare)
    files = sorted(bare.glob("*.json"))
    cell = judge(E.THROUGHPUT, load_question(RECEIPTS / "questions" / "throughput.yaml"), files, candidate)
    assert cell.verdict is not Verdict.PASS
    assert len(cell.numbers["binding"]) == len(files)
    assert all("bare result file" in b["reason"] for b in cell.numbers["binding"])


def test_a_leg_that_records_no_item_cannot_be_bound(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    edit_meta(legs[1], lambda m: m.update(item="exit"))
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate)
    assert_no_pass(cell, "is not an evidence item")


def test_a_leg_json_that_is_not_an_object_binds_nothing(bound, candidate, questions):
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi0")
    meta = load(leg / "leg.json")
    (leg / "leg.json").write_text(json.dumps([meta]))
    seal_leg(leg)
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, "not a JSON object")


@pytest.mark.parametrize("value", ["1", True])
def test_a_value_recorded_as_the_wrong_type_is_not_the_pinned_value(value, bound, candidate, questions):
    """tensor_parallel_size "1" or True is not the pinned integer 1."""
    legs = bound(E.FORWARD)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: set_key(m, "resolved_config.tensor_parallel_size", value))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_unbound(cell, "runner.parallelism.tp", "differs")


def test_a_whole_number_spelled_as_a_float_is_that_number(bound, candidate, questions):
    """Issue 27, class 5: JSON has one number type; 1.0 is 1 spelled another way, and binds."""
    legs = bound(E.FORWARD)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: set_key(m, "resolved_config.tensor_parallel_size", 1.0))
    assert judge(E.FORWARD, questions[E.FORWARD], legs, candidate).verdict is Verdict.PASS
    # control: 1.5 is no count of GPUs
    edit_meta(leg_of(legs, arm="bi1"), lambda m: set_key(m, "resolved_config.tensor_parallel_size", 1.5))
    assert_unbound(judge(E.FORWARD, questions[E.FORWARD], legs, candidate), "runner.parallelism.tp", "differs")


# ------------------------------------------------------------ found: false passes (strict xfail)
# Legs recording, where a vLLM engine or producer writes it, a value other than the one the manifest
# pins, and still bound (no Pin reads the field, or the comparison is too coarse); and manifests
# that pin a name, or vLLM itself as the trainer.


def every_leg(legs, fn):
    """The whole set ran so (both arms alike: no confounder between them to catch it)."""
    for leg in legs:
        edit_meta(leg, fn)


def test_a_leg_whose_kv_cache_is_another_precision_is_not_evidence(bound, candidate, questions):
    legs = bound(E.QUALITY)
    every_leg(legs, lambda m: m["resolved_config"].update(kv_cache_dtype="fp8_e4m3"))
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_no_pass(cell, pattern=r"kv_cache")


def test_a_leg_at_another_pipeline_parallel_size_is_not_evidence(bound, candidate, questions):
    legs = bound(E.FORWARD)
    every_leg(legs, lambda m: m["resolved_config"].update(pipeline_parallel_size=2))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, pattern=r"parallelism\.pp|pipeline_parallel")


def test_a_rollout_with_another_cuda_graph_mode_is_not_evidence(bound, make_candidate, questions):
    full = make_candidate("full", graph_cache={"cuda_graph_mode": "full", "prefix_caching": False,
                                               "chunked_prefill": False, "async_scheduling": False})
    legs = bound(E.FORWARD, cand=full)
    every_leg(legs, lambda m: m["kernels"]["rollout"].update(cudagraph_mode="PIECEWISE"))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, full)
    assert_no_pass(cell, pattern=r"cuda_graph_mode|cudagraph_mode")


_GRAPHS = {"cuda_graph_mode": "full_and_piecewise", "cuda_graph_sizes": [1, 2, 4, 8], "prefix_caching": False,
           "chunked_prefill": False, "async_scheduling": False}


@pytest.mark.parametrize("recorded", [[1, 2, 4], [1, 2, 4, 8, 16], None])
def test_a_rollout_capturing_other_cuda_graph_sizes_is_not_evidence(bound, make_candidate, questions, recorded):
    """Pinned capture sizes bind the engine's resolved sizes: others, or none recorded, are no pass."""
    graphs = make_candidate("graphs", graph_cache=_GRAPHS)
    legs = bound(E.FORWARD, cand=graphs)
    every_leg(legs, lambda m: m["kernels"]["rollout"].update(cudagraph_capture_sizes=recorded))
    assert_no_pass(judge(E.FORWARD, questions[E.FORWARD], legs, graphs), pattern=r"cuda_graph_sizes")


def test_the_same_cuda_graph_sizes_in_another_order_bind(bound, make_candidate, questions):
    """Negative control: the engine reads the sizes as a set."""
    graphs = make_candidate("graphs", graph_cache=_GRAPHS)
    legs = bound(E.FORWARD, cand=graphs)
    every_leg(legs, lambda m: m["kernels"]["rollout"].update(cudagraph_capture_sizes=[8, 4, 2, 1]))
    assert judge(E.FORWARD, questions[E.FORWARD], legs, graphs).verdict is Verdict.PASS


def test_a_rollout_with_another_all_to_all_backend_is_not_evidence(bound, make_candidate, questions):
    a2a = make_candidate("a2a", backends={"attention": "FLASH_ATTN (FA3, num_splits=1)",
                                          "dense_gemm": "batch_invariant matmul_persistent",
                                          "all_to_all": "allgather_reducescatter"})
    legs = bound(E.FORWARD, cand=a2a)
    assert judge(E.FORWARD, questions[E.FORWARD], legs, a2a).verdict is Verdict.PASS  # control: as pinned
    every_leg(legs, lambda m: m["kernels"]["rollout"].update(all2all_backend="deepep_low_latency"))
    assert_no_pass(judge(E.FORWARD, questions[E.FORWARD], legs, a2a), pattern=r"all_to_all")


@pytest.mark.parametrize("change,named", [
    ({"input_len": 4096}, "input_len is 8192 in the manifest, 4096 in the question"),
    ({"ignore_eos": False}, "ignore_eos"),
    ({"warmups": 2}, "warmups"),
    ({"num_prompts": {1: 2, 8: 32, 32: 128, 64: 256}}, "num_prompts at c=1 is 8 in the manifest, 2 in the question"),
    ({"concurrencies": [1, 8, 32, 64, 128], "num_prompts": {1: 8, 8: 32, 32: 128, 64: 256, 128: 512}},
     "concurrencies [128]"),
])
def test_a_throughput_question_the_manifests_workload_disagrees_with_names_it(bound, candidate, questions,
                                                                              change, named):
    """The legs are bound by the manifest's workload and judged by the question's: where the two
    disagree no leg is evidence under both, and the cell says so first."""
    legs = bound(E.THROUGHPUT)
    assert judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate).verdict is Verdict.PASS  # control
    cell = judge(E.THROUGHPUT, question_with(questions[E.THROUGHPUT], change), legs, candidate)
    assert_no_pass(cell, named)
    assert "disagree" in cell.summary


def test_a_leg_running_an_overlay_the_manifest_does_not_name_is_not_evidence(bound, candidate, questions):
    legs = bound(E.BACKWARD)
    every_leg(legs, lambda m: m["source"].update(overlay_digest="sha256:" + "ee" * 32))
    cell = judge(E.BACKWARD, questions[E.BACKWARD], legs, candidate)
    assert_no_pass(cell, pattern=r"overlay")


OVERLAY = "sha256:" + "0a" * 32


@pytest.mark.parametrize("arm", ["bi1", "bi0"])
@pytest.mark.parametrize("recorded", [None, "sha256:" + "0b" * 32], ids=["stock", "other-parts"])
@pytest.mark.parametrize("item", [E.FORWARD, E.QUALITY, E.THROUGHPUT])
def test_an_overlay_candidate_binds_the_overlay_in_both_arms(item, arm, recorded, bound, make_candidate, questions):
    """A candidate's overlay runs in both arms, so that the arms differ by the switch alone: a leg of
    either arm that ran stock vLLM or other overlay parts is not evidence for it (the stock and
    overlay legs of one run must not pass under each other's name)."""
    over = make_candidate("over", source={"repository": "tica", "commit": COMMIT, "overlay_digest": OVERLAY})
    legs = bound(item, cand=over)
    assert judge(item, questions[item], legs, over).verdict == "pass"  # control: the bound legs pass
    for leg in [x for x in legs if json.loads((x / "leg.json").read_text())["arm"] == arm]:
        edit_meta(leg, lambda m: m["source"].update(overlay_digest=recorded))
    assert_no_pass(judge(item, questions[item], legs, over), pattern=r"overlay")


def test_a_leg_on_another_gpu_count_is_not_evidence(bound, candidate, questions):
    legs = bound(E.FORWARD)
    every_leg(legs, lambda m: m["device"].update(count=8))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, pattern=r"count_per_node|device\.count")


def test_a_source_named_by_a_branch_not_a_commit_is_refused(make_candidate):
    """A branch name names no content: the manifest is bad input, naming the field."""
    with pytest.raises(ManifestError, match=r"source\.commit"):
        make_candidate("branch", source={"repository": "github.com/verl-project/verl", "commit": "mainline"})


def test_vllm_scoring_its_own_tokens_is_not_a_trainer_forward(make_candidate, questions, tmp_path):
    engine = make_candidate("engine", runner={"rollout_engine": "vllm==0.26.0", "trainer": "vllm_engine",
                                              "parallelism": {"tp": 1}})
    legs = build_bound(E.FORWARD, questions[E.FORWARD], engine, tmp_path / "legs")
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, engine)
    assert_no_pass(cell, pattern=r"vllm_engine")


# ------------------------------------------------------------------ the serving recipe's shutdown timeout


@pytest.fixture
def graceful(make_candidate):
    """A candidate whose recipe pins a 30 s engine shutdown grace (what clean exit depends on)."""
    from tests.manifests import H200_SHAPED

    return make_candidate("graceful", recipe={**H200_SHAPED["recipe"], "shutdown_timeout": 30})


def test_a_leg_whose_engine_was_given_no_shutdown_grace_is_not_evidence(bound, graceful, questions):
    legs = bound(E.CLEAN_EXIT, cand=graceful)
    edit_meta(legs[0], lambda m: m["resolved_config"].update(shutdown_timeout=0))
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, graceful)
    assert_unbound(cell, "recipe.shutdown_timeout", "differs")


def test_a_leg_that_does_not_record_its_shutdown_grace_is_not_evidence(bound, graceful, questions):
    legs = bound(E.THROUGHPUT, cand=graceful)
    edit_meta(legs[0], lambda m: m["resolved_config"].pop("shutdown_timeout"))
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, graceful)
    assert_unbound(cell, "recipe.shutdown_timeout", "unrecorded")


# ------------------------------------------------------------------ the arm's switch, the workload, stop tokens


@pytest.mark.parametrize("item", [E.FORWARD, E.QUALITY, E.THROUGHPUT, E.BACKWARD, E.UPDATE])
def test_a_bi1_leg_that_does_not_record_the_switch_is_not_shown_to_be_bi1(item, bound, candidate, questions):
    """vLLM reads an unset VLLM_BATCH_INVARIANT as 0: a "BI=1" leg without it is not shown to be BI=1."""
    legs = bound(item)
    for leg in [p for p in legs if load(p / "leg.json")["arm"] == "bi1"]:
        edit_meta(leg, lambda m: m["env"].pop("VLLM_BATCH_INVARIANT", None))
    cell = judge(item, questions[item], legs, candidate)
    assert_unbound(cell, "env.VLLM_BATCH_INVARIANT (bi1)", "unrecorded")


def test_a_bi0_leg_that_does_not_record_the_switch_is_not_bound_either(bound, candidate, questions):
    legs = bound(E.QUALITY)
    edit_meta(leg_of(legs, arm="bi0"), lambda m: m["env"].pop("VLLM_BATCH_INVARIANT", None))
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_unbound(cell, "env.VLLM_BATCH_INVARIANT (bi0)", "unrecorded")


def test_throughput_legs_with_another_request_count_are_not_this_candidates_workload(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi1", 1, 1)
    edit_meta(leg, lambda m: m["resolved_config"].update(num_prompts=m["resolved_config"]["num_prompts"] * 2))
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_unbound(cell, "workload.num_prompts (c=1)", "differs")


def test_throughput_legs_that_do_not_record_their_request_count_are_not_bound(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    edit_meta(tput_leg(legs, "bi0", 8, 2), lambda m: m["resolved_config"].pop("num_prompts"))
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_unbound(cell, "workload.num_prompts (c=8)", "unrecorded")


def test_a_throughput_leg_at_a_concurrency_the_candidate_does_not_pin_is_not_evidence(make_candidate, bound,
                                                                                        questions):
    """The same legs, for a candidate whose workload is c = 1/8/32 only: the c=64 legs name another."""
    legs = bound(E.THROUGHPUT)
    other = make_candidate("three-c", workload={"input_len": 8192, "output_len": 1024, "ignore_eos": True,
                                                "concurrencies": [1, 8, 32], "num_prompts": {1: 8, 8: 32, 32: 128},
                                                "warmups": 1})
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, other)
    assert_unbound(cell, "workload.concurrencies", "differs")


def test_quality_legs_that_stopped_on_other_tokens_are_not_this_candidates_score(bound, make_candidate, questions):
    legs = bound(E.QUALITY)
    other = make_candidate("stops", eval_contract={**load_manifest_contract(), "sampling": {
        **load_manifest_contract()["sampling"], "stop": ["</answer>"]}})
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, other)
    assert_unbound(cell, "eval_contract.sampling.stop", "differs")


def test_quality_legs_that_do_not_record_their_stop_tokens_are_not_bound(bound, candidate, questions):
    legs = bound(E.QUALITY)
    for leg in legs:
        edit_json(leg / "contract.json", lambda d: d["sampling"].pop("stop"), leg)
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_unbound(cell, "eval_contract.sampling.stop", "unrecorded")
    assert "sampling parameters" in all_reasons(cell)  # and the contract item is unknown, not vLLM's default


def load_manifest_contract() -> dict:
    from .conftest import manifest_data

    return manifest_data()["eval_contract"]


def test_package_versions_never_stand_in_for_a_pinned_image_digest(bound, candidate, questions):
    """Issue 28, class 3: the image binds by digest. A leg that records the pinned vllm version but
    no image digest is not shown to have run in the pinned image."""
    legs = bound(E.QUALITY)
    edit_meta(legs[0], lambda m: m.pop("image_digest"))
    assert_unbound(judge(E.QUALITY, questions[E.QUALITY], legs, candidate), "image.digest", "unrecorded")


def test_a_manifest_with_no_image_is_bound_by_its_packages_and_contradicted_by_an_image(bound, make_candidate,
                                                                                         questions):
    bare = make_candidate("bare", image={"digest": None, "reference": "this machine's .venv"})
    legs = bound(E.QUALITY, cand=bare)  # control: legs that record no image bind (the fixture checks)
    edit_meta(legs[0], lambda m: m.update(image_digest="sha256:" + "9f" * 32))
    assert_unbound(judge(E.QUALITY, questions[E.QUALITY], legs, bare), "image.digest", "differs")


def test_a_pin_no_receipt_records_is_named_on_the_cell_never_taken_as_checked(bound, make_candidate, questions):
    from tests.manifests import H200_SHAPED

    moe = make_candidate("moe", backends={"attention": "FLASH_ATTN (FA3, num_splits=1)", "dense_gemm": "cublas",
                                          "moe": "triton fused_moe"}, hardware={**H200_SHAPED["hardware"], "nodes": 2})
    cell = judge(E.FORWARD, questions[E.FORWARD], bound(E.FORWARD, cand=moe), moe)
    notes = cell.numbers["unbound_pins"]
    assert any(n.startswith("backends.moe = triton fused_moe is pinned but no receipt records it") for n in notes)
    assert any(n.startswith("hardware.nodes = 2") for n in notes)
    assert any(r.startswith("note: backends.dense_gemm") for r in cell.reasons)
    # control: a manifest that pins no MoE backend gets no note about one
    plain = make_candidate("plain")
    quiet = judge(E.FORWARD, questions[E.FORWARD], bound(E.FORWARD, cand=plain), plain)
    assert not any("backends.moe" in n for n in quiet.numbers["unbound_pins"])


def test_capture_sizes_pinned_without_cuda_graphs_are_refused_by_name(make_candidate):
    """Eager mode captures no graphs: sizes pinned beside it describe no engine (vLLM resolves them to [])."""
    from tests.manifests import H200_SHAPED

    with pytest.raises(ManifestError, match=r"cuda_graph_sizes"):
        make_candidate("eager", graph_cache={**H200_SHAPED["graph_cache"], "cuda_graph_sizes": [1, 2, 4, 8]})
