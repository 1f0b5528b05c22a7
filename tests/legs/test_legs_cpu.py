"""The real CPU path on the tiny model: vLLM (CPU build) rollouts, trainer forwards, sealed receipts
for every evidence item, and the planted faults that must show in them; then the same legs judged by
the same judges as every other track: each leg.json is a valid receipt, and each cell reflects what
vLLM and the trainer actually did on this machine. One file for every test of the demo leg set
(tests/legs/conftest.py): under pytest-xdist's `--dist loadfile` the set is then produced once, on
the one worker that runs this file, not once on each worker."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.legs.conftest import by_arm, leg_json, metrics
from tica.fingerprint import FingerprintCache, fingerprint_checkpoint
from tica.judges import judge_criteria
from tica.process_exits import ZERO_TIMEOUT_HINT
from tica.legs.common import SHUTDOWN_TIMEOUT_S
from tica.metrics import PROBS_DIFF_MAX, PROBS_DIFF_MEAN, forward_metrics
from tica.models.hashing import weights_hash
from tica.question import parse_question
from tica.receipts import LegMeta
from tica.seal import check_seal
from tica.verdict import Verdict

pytestmark = pytest.mark.slow

SERVER_ITEMS = ("throughput", "clean_exit")


def all_legs(demo_legs):
    return [d for dirs in demo_legs["legs"].values() for d in dirs]


def work_span(meta: dict) -> tuple[dt.datetime, dt.datetime]:
    return dt.datetime.fromisoformat(meta["started_at"]), dt.datetime.fromisoformat(meta["ended_at"])


def test_demo_set_covers_every_item_and_both_arms(demo_legs):
    from tica.legs import ITEMS

    print(f"\n[legs] full demo leg set: {demo_legs['seconds']:.0f} s")
    for item in ITEMS:
        dirs = demo_legs["legs"][item]
        assert by_arm(dirs, "bi0") and by_arm(dirs, "bi1"), item


def test_every_leg_is_sealed_and_names_its_switches(demo_legs):
    for d in all_legs(demo_legs):
        assert check_seal(d) == [], d
        meta = leg_json(d)
        assert meta["schema"] == "tica.leg/1"
        assert meta["env"]["VLLM_BATCH_INVARIANT"] == {"bi1": "1", "bi0": "0"}[meta["arm"]]
        assert meta["versions"]["vllm"] and meta["versions"]["torch"]
        assert meta["device"]["kind"] == "cpu"
        assert meta["source"]["repository"] == "tica" and meta["source"]["commit"]
        start, end = work_span(meta)
        assert start <= end


def test_bi1_on_cpu_is_not_run_with_vllms_own_reason(demo_legs):
    for d in by_arm(all_legs(demo_legs), "bi1"):
        reason = leg_json(d)["not_run_reason"]
        assert reason and "VLLM_BATCH_INVARIANT=1" in reason and "batch_invariant.py" in reason, d


def test_bi0_forward_trainer_differs_from_vllm_every_step(demo_legs):
    (leg,) = by_arm(demo_legs["legs"]["forward"], "bi0")
    rows = metrics(leg)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert len({r["tica/batch_size"] for r in rows}) > 1  # batch composition changes
    version = leg_json(leg)["resolved_config"]["weights_hash"]
    for r in rows:
        print(f"[legs] BI=0 step {r['step']}: probs_diff max {r[PROBS_DIFF_MAX]:.4g} mean {r[PROBS_DIFF_MEAN]:.4g} "
              f"({r['tica/n_bitwise_diff']}/{r['tica/n_tokens']} logprobs differ)")
        assert r[PROBS_DIFF_MEAN] > 0 and r["tica/n_bitwise_diff"] > 0
        assert r["checkpoint_version"] == version
        arr = np.load(leg / "arrays" / f"step_{r['step']:04d}.npz")
        recomputed = forward_metrics(arr["trainer_logprobs"], arr["rollout_logprobs"])
        assert recomputed[PROBS_DIFF_MAX] == r[PROBS_DIFF_MAX] and recomputed["tica/n_tokens"] == r["tica/n_tokens"]
        assert arr["trainer_logprobs"].size == arr["seq_lens"].sum() == arr["token_ids"].size  # scored tokens


def test_trainer_on_vllms_own_cpu_kernels_matches_the_rollout_bitwise(demo_legs):
    """Where vLLM cannot run BI=1 (CPU), the BI=1 idea can still be shown: a trainer forward that
    reads the same bytes through vLLM's own model code and kernels (a second engine, one sequence
    per forward, so batch composition differs from the rollout's) gives max = mean = 0 here."""
    (leg,) = demo_legs["legs"]["forward_vllm_engine"]
    meta = leg_json(leg)
    assert meta["trainer"] == "vllm_engine" and meta["env"]["VLLM_BATCH_INVARIANT"] == "0"
    rows = metrics(leg)
    assert len(rows) >= 5
    for r in rows:
        print(f"[legs] trainer on vLLM kernels, step {r['step']} (batch {r['tica/batch_size']}): "
              f"max {r[PROBS_DIFF_MAX]} mean {r[PROBS_DIFF_MEAN]} bitwise diff {r['tica/n_bitwise_diff']}")
        assert r[PROBS_DIFF_MAX] == r[PROBS_DIFF_MEAN] == 0.0 and r["tica/n_bitwise_diff"] == 0
    roles = [p["role"] for p in meta["processes"]]
    assert roles.count("engine_core") == 1 and roles.count("trainer_engine_core") == 1


def test_decode_vs_prefill_comparison_is_recorded(demo_legs):
    (leg,) = by_arm(demo_legs["legs"]["forward"], "bi0")
    for r in metrics(leg):
        arr = np.load(leg / "arrays" / f"step_{r['step']:04d}.npz")
        mask = arr["decode_mask"]
        d, p = arr["decode_logprobs"][mask], arr["rollout_logprobs"][mask]
        assert r["tica/decode_vs_prefill_n_tokens"] == int(mask.sum()) > 0
        assert r["tica/decode_vs_prefill_n_bitwise_diff"] == int(np.count_nonzero(d.view(np.uint32) != p.view(np.uint32)))
        print(f"[legs] step {r['step']}: decode vs prefill {r['tica/decode_vs_prefill_n_bitwise_diff']}/"
              f"{r['tica/decode_vs_prefill_n_tokens']} differ")


def test_backward_gradients_finite_and_reach_every_weight(demo_legs):
    (leg,) = by_arm(demo_legs["legs"]["backward"], "bi0")
    (row,) = metrics(leg)
    assert row["grad_finite"] and row["actor/grad_norm"] > 0
    assert row["params_with_grad"] == row["params_total"] > 0
    assert row["deployed_bytes_equal"] is True


def test_update_written_reloaded_and_rechecked(demo_legs):
    (leg,) = by_arm(demo_legs["legs"]["update"], "bi0")
    (row,) = metrics(leg)
    assert row["optimizer"] == "adamw" and row["weights_changed_tensors"] > 0
    assert row["updated_weights_hash"] == weights_hash(leg / "weights") != row["weights_hash_before"]
    # the folder the rollout reloaded, by the core's fingerprint
    assert row["updated_weights_hash"] == fingerprint_checkpoint(leg / "weights", FingerprintCache(leg.parent / "fp.json"))
    assert leg_json(leg)["resolved_config"]["updated_weights_hash"] == row["updated_weights_hash"]
    assert row["reloaded_by_rollout"] is True
    post = metrics(leg / "post_forward")
    assert len(post) >= 5 and all(r["checkpoint_version"] == row["updated_weights_hash"] for r in post)
    assert all(r[PROBS_DIFF_MEAN] > 0 for r in post)  # BI=0 after the update: still the baseline's mismatch


def test_quality_per_problem_records_under_a_contract(demo_legs):
    (leg,) = by_arm(demo_legs["legs"]["quality"], "bi0")
    rows = metrics(leg, "results.jsonl")
    contract = json.loads((leg / "contract.json").read_text())
    assert len(rows) == 10 and len({r["problem_id"] for r in rows}) == 10
    assert set(contract) >= {"dataset_version", "prompt_template", "thinking_mode", "sampling", "repeats", "scorer", "length_cap"}
    assert contract["sampling"]["temperature"] == 0 and contract["length_cap"] == 32
    sampled = json.loads((leg / "passes" / "sampled" / "contract.json").read_text())
    assert sampled["sampling"]["temperature"] > 0 and sampled["dataset_version"] == contract["dataset_version"]


def test_throughput_bench_for_every_concurrency_and_round_in_crossed_order(demo_legs):
    legs = by_arm(demo_legs["legs"]["throughput"], "bi0")
    seen = {}
    for d in legs:
        meta, bench = leg_json(d), json.loads((d / "bench.json").read_text())
        cfg = meta["resolved_config"]
        seen[(meta["round"], meta["concurrency"])] = bench
        assert bench["max_concurrency"] == meta["concurrency"]
        assert bench["completed"] == cfg["num_prompts"] and bench["failed"] == 0
        assert bench["total_input_tokens"] == cfg["num_prompts"] * cfg["input_len"]
        assert bench["total_output_tokens"] == cfg["num_prompts"] * cfg["output_len"]
        assert bench["arm"] == "bi0" and bench["round"] == str(meta["round"])
        start, end = work_span(meta)  # the leg's work is its bench's own run
        assert (end - start).total_seconds() >= bench["duration"]
        assert meta["slot"] == (2 if meta["round"] % 2 else 1)  # AB then BA, A = bi1
        print(f"[legs] bi0 r{meta['round']} c={meta['concurrency']}: {bench['output_throughput']:.1f} out tok/s, "
              f"TTFT {bench['mean_ttft_ms']:.0f} ms, TPOT {bench['mean_tpot_ms']:.1f} ms, {bench['duration']:.1f} s")
    assert set(seen) == {(1, 1), (1, 2), (2, 1), (2, 2)}
    spans = sorted(work_span(leg_json(d)) for d in legs)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # one bench at a time, none overlapping


def test_clean_exit_reflects_what_vllm_did(demo_legs):
    for item in SERVER_ITEMS:
        for d in by_arm(demo_legs["legs"][item], "bi0"):
            procs = leg_json(d)["processes"]
            roles = {p["role"] for p in procs}
            assert {"client", "api_server", "engine_core"} <= roles, d
            log = (d / "server.log").read_text()
            for p in procs:
                print(f"[legs] {item} {d.name}: {p['role']} pid {p['pid']} -> {p['end_state']} (exit {p['exit_code']})")
                if p["role"] == "engine_core":
                    forced = f"force killing remaining process EngineCore pid {p['pid']}" in log
                    assert (p["end_state"] == "force_killed") == forced
    for item in ("forward", "update", "quality"):
        (d,) = by_arm(demo_legs["legs"][item], "bi0")
        procs = leg_json(d)["processes"]
        log = (d / "producer.log").read_text()
        (core,) = [p for p in procs if p["role"] == "engine_core"]
        assert "EngineCore" in core["name"] and core["pid"]  # vLLM's own child process, not the producer
        assert (core["end_state"] == "force_killed") == (f"force killing remaining process EngineCore pid {core['pid']}" in log)


@pytest.mark.parametrize("item,victim", [("update", "weights/model.safetensors"), ("forward", "arrays/step_0003.npz"),
                                         ("quality", "results.jsonl"), ("backward", "metrics.jsonl")])
def test_a_file_changed_after_sealing_breaks_the_seal(demo_legs, tmp_path, item, victim):
    (leg,) = by_arm(demo_legs["legs"][item], "bi0")
    copy = tmp_path / leg.name
    shutil.copytree(leg, copy)
    assert check_seal(copy) == []
    with open(copy / victim, "r+b") as f:
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 0x01]))
    problems = check_seal(copy)
    assert problems and "changed after sealing" in problems[0]


@pytest.fixture(scope="module")
def faulted_throughput(tiny_model, tmp_path_factory):
    from tica.legs.runner import run_leg, throughput_leg_dirs

    out = tmp_path_factory.mktemp("faults") / "throughput"
    run_leg("throughput", "bi0", out, model=str(tiny_model), concurrencies=[1, 2], input_len=32, output_len=8,
            num_prompts=4, num_warmups=0, fault="truncate-workload,kill-engine-core")
    return throughput_leg_dirs(out)


def test_each_throughput_leg_ran_when_its_bench_ran(faulted_throughput):
    c1, c2 = (leg_json(d) for d in faulted_throughput)
    (client1,) = [p for p in c1["processes"] if p["role"] == "client"]
    assert client1["pid"] and client1["exit_code"] == 0
    assert work_span(c1)[0] < work_span(c1)[1] <= work_span(c2)[0] < work_span(c2)[1]
    assert work_span(c1)[1] - work_span(c1)[0] < work_span(c2)[1] - work_span(c1)[0]
    assert c1["resolved_config"]["weights_hash"] == c2["resolved_config"]["weights_hash"]


def test_truncated_workload_shows_in_the_receipt(faulted_throughput):
    c1 = faulted_throughput[0]
    meta, bench = leg_json(c1), json.loads((c1 / "bench.json").read_text())
    assert check_seal(c1) == []
    assert bench["completed"] < meta["resolved_config"]["num_prompts"]


def test_killed_engine_core_is_not_a_clean_exit(faulted_throughput):
    c2 = faulted_throughput[1]
    meta = leg_json(c2)
    (core,) = [p for p in meta["processes"] if p["role"] == "engine_core"]
    print(f"[legs] killed EngineCore recorded as {core}")
    assert not (core["end_state"] == "exited" and core["exit_code"] == 0)
    client = next(p for p in meta["processes"] if p["role"] == "client")
    bench = c2 / "bench.json"
    failed_requests = (json.loads(bench.read_text())["failed"] > 0) if bench.is_file() else True
    assert client["exit_code"] != 0 or failed_requests


# ---------------------------------------------------------------------------- judged

COMMON = {"compared": "x", "computation": "x", "pass_line": "x", "noise_floor": 0.0,
          "invalid_leg_rule": "a broken seal or workload mismatch is inconclusive and rerun"}


def q(item: str, repeats: int = 1, order=("AB",), **criteria):
    return parse_question({"name": f"cpu-{item}", "item": item, "repeats": repeats, "pairing_order": list(order),
                           **COMMON, "criteria": {"item": item, **criteria}})


def test_every_leg_json_is_a_valid_receipt(demo_legs):
    dirs = [d for v in demo_legs["legs"].values() for d in v]
    assert dirs
    for d in dirs:
        LegMeta.model_validate(json.loads((Path(d) / "leg.json").read_text()))


def test_forward_bi1_is_not_run_with_vllms_reason_and_bi0_differs(demo_legs):
    legs = [d for d in demo_legs["legs"]["forward"] if "vllm_engine" not in str(d)]
    cell = judge_criteria("forward", q("forward", min_steps=5, bi0_reference_mean=None), legs)
    assert any("did not run" in r and "VLLM_BATCH_INVARIANT" in r for r in cell.reasons), cell.reasons
    bi0 = [s for leg in cell.numbers["legs"] if leg["arm"] == "bi0" for s in leg["steps"]]
    assert len(bi0) >= 5 and all(s["mean"] > 0 for s in bi0)
    assert cell.verdict is Verdict.NOT_RUN


def test_throughput_is_not_run_without_bi1_and_bi0_covers_every_concurrency_crossed(demo_legs):
    legs = demo_legs["legs"]["throughput"]
    question = q("throughput", repeats=2, order=("AB", "BA"), input_len=64, output_len=16,
                 concurrencies=[1, 2], num_prompts={1: 6, 2: 6}, warmups=1,
                 formula="median_per_round_paired_loss", budget={1: 0.5, 2: 0.5})
    cell = judge_criteria("throughput", question, legs)
    assert cell.verdict is Verdict.NOT_RUN and "no bi1 leg ran" in cell.summary
    assert any("did not run" in r and "VLLM_BATCH_INVARIANT" in r for r in cell.reasons)
    bi0 = [json.loads((Path(d) / "leg.json").read_text()) for d in legs]
    bi0 = [m for m in bi0 if m["arm"] == "bi0"]
    assert sorted({m["concurrency"] for m in bi0}) == [1, 2]
    assert {(m["round"], m["slot"]) for m in bi0} == {(1, 2), (2, 1)}  # AB then BA: BI=0 second, then first
    for d in legs:
        if json.loads((Path(d) / "leg.json").read_text())["arm"] == "bi0":
            bench = json.loads((Path(d) / "bench.json").read_text())
            assert bench["completed"] == 6 and bench["failed"] == 0 and bench["total_output_tokens"] == 6 * 16


def test_clean_exit_passes_over_every_demo_leg_that_ran_processes(demo_legs):
    """Under the recipe's positive shutdown timeout every client, API server, EngineCore and worker
    of every leg exits on its own. Backward legs are left out: their trainer runs inside the
    producer, so they record no process (and such a leg keeps a cell inconclusive). The timeout-0
    canary is in the clean exit section below."""
    legs = [d for item, v in demo_legs["legs"].items() if item != "backward" for d in v]
    cell = judge_criteria("clean_exit", q("clean_exit", required_roles=["client", "api_server", "engine_core", "worker"]),
                          legs)
    assert cell.verdict is Verdict.PASS, cell.reasons


# ---------------------------------------------------------------------------- clean exit
# Clean exit on the CPU track, with the real tiny model and vLLM's CPU build: with the recipe's
# positive shutdown timeout every process of a serving leg exits on its own and the clean-exit cell
# passes; with vLLM's default, 0, vLLM force-kills its EngineCore and the cell fails (the canary).
ROLES = {"client", "api_server", "engine_core", "worker"}
CLEAN_EXIT_QUESTION = parse_question({
    "name": "cpu-clean-exit", "item": "clean_exit", "compared": "x", "computation": "x", "pass_line": "x",
    "noise_floor": 0.0, "repeats": 1, "pairing_order": ["AB"], "invalid_leg_rule": "none",
    "criteria": {"item": "clean_exit", "required_roles": ["client", "api_server", "engine_core", "worker"]}})


@pytest.fixture(scope="module")
def exit_legs(demo_legs, tiny_model, tmp_path_factory):
    """One BI=0 clean-exit leg per shutdown timeout: the recipe's (positive) and vLLM's default, 0.
    The positive one is the demo set's own BI=0 clean-exit leg (run_demo_legs runs it with the
    producer's default, the recipe's SHUTDOWN_TIMEOUT_S: the first test below checks that it did);
    the canary runs here."""
    from tica.legs.runner import run_leg

    (recipe,) = by_arm(demo_legs["legs"]["clean_exit"], "bi0")
    root = tmp_path_factory.mktemp("clean-exit")
    return {SHUTDOWN_TIMEOUT_S: recipe,
            0: run_leg("clean_exit", "bi0", root / "timeout-0", model=str(tiny_model), shutdown_timeout=0)}


def _show(leg) -> dict:
    meta = leg_json(leg)
    for p in meta["processes"]:
        print(f"[clean-exit] shutdown_timeout={meta['resolved_config']['shutdown_timeout']}: {p['role']} pid {p['pid']} "
              f"-> {p['end_state']} (exit {p['exit_code']}): {p['evidence']}")
    return meta


def test_each_leg_records_the_shutdown_timeout_its_server_was_given_and_vllm_applied(exit_legs):
    for timeout, leg in exit_legs.items():
        meta = leg_json(leg)
        assert meta["resolved_config"]["shutdown_timeout"] == timeout
        assert meta["kernels"]["rollout"]["shutdown_timeout"] == timeout  # vLLM's own log line at shutdown
        # the workers' grace after the EngineCore's shutdown follows it (vLLM's 5 s is too little on a loaded host)
        assert meta["env"].get("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS") == (str(timeout) if timeout else None)


def test_with_a_positive_shutdown_timeout_every_process_exits_on_its_own_and_the_cell_passes(exit_legs):
    leg = exit_legs[SHUTDOWN_TIMEOUT_S]
    meta = _show(leg)
    assert {p["role"] for p in meta["processes"]} == ROLES
    assert all(p["end_state"] == "exited" and p["exit_code"] == 0 for p in meta["processes"])
    # each exit names its own process by content, read from it while it ran: no two alike
    idents = [p["identity"] for p in meta["processes"]]
    assert all(i.get("create_time") and (i.get("name") or i.get("cmdline")) for i in idents), idents
    assert len({(i["create_time"], i.get("name"), tuple(i.get("cmdline") or ())) for i in idents}) == len(idents)
    assert "producer_cleanup" not in meta["resolved_config"]  # nothing was left for the producer to kill
    cell = judge_criteria("clean_exit", CLEAN_EXIT_QUESTION, [leg])
    assert cell.verdict is Verdict.PASS, cell.reasons


def test_with_shutdown_timeout_0_vllm_force_kills_the_engine_core_and_the_cell_fails(exit_legs):
    """The canary: vLLM's default fails the cell, and the reason names the timeout."""
    meta = _show(exit_legs[0])
    (core,) = [p for p in meta["processes"] if p["role"] == "engine_core"]
    assert core["end_state"] == "force_killed"
    cell = judge_criteria("clean_exit", CLEAN_EXIT_QUESTION, [exit_legs[0]])
    assert cell.verdict is Verdict.FAIL
    assert any(ZERO_TIMEOUT_HINT in r for r in cell.reasons), cell.reasons
