"""The sealed receipts that came back from the H200 (tests/fixtures/h200, see its README.md),
checked on the CPU: seals, what was measured, and what was recorded about where.

run6: the throughput legs again, each with its own warm-up request (session 2, call 9, on
nvidia-h200-x2 with one GPU visible); run4: the second session's forward/backward/update/quality legs, with the decode-faithful update
re-check and megatron-core's BI=0 arm (its legs identical to run3's are recorded in REPRODUCED.json,
not kept twice); run5: the forward at tensor-parallel 2 on two H200s; run3: the first
forward/backward/update legs (device call 9); run2: the throughput legs (device call 7; its forward
legs, call 6, gave the same step metrics as run3 and are not kept); run1: the first run's legs that
differ (a planted fault that did not fail, throughput legs refused with HTTP 400)."""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from tica.metrics import forward_metrics
from tica.seal import check_seal

FIX = Path(__file__).parent / "fixtures" / "h200"
RUN3 = FIX / "run3"
RUN2 = FIX / "run2"
RUN1 = FIX / "run1"
RUN4 = FIX / "run4"
RUN5 = FIX / "run5"
RUN6 = FIX / "run6"


def legs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


def meta(leg: Path) -> dict:
    return json.loads((leg / "leg.json").read_text())


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def arrays(forward_dir: Path, step: int) -> dict:
    with np.load(forward_dir / "arrays" / f"step_{step:04d}.npz") as z:
        return {k: z[k] for k in z.files}


def test_fixtures_present_and_small():
    assert len(legs(RUN3)) == 9 and len(legs(RUN2)) == 24 and len(legs(RUN4)) == 8 and len(legs(RUN5)) == 4
    assert len(legs(RUN6)) == 24
    total = sum(p.stat().st_size for p in FIX.rglob("*") if p.is_file())
    # the whole tree travels with every device call beside the kit's 35 MB site carry (c2; the 56 MB
    # c1 goes in two halves since the matrix receipts: scripts/h200/stage_split.sh) and, for MoE
    # calls, vLLM's 40 MB _moe_C (m1), 64 MiB in all: with the rest of the tree (about 5 MB) these
    # receipts may hold at most 21 MiB (the MoE matrix's took it past 20). The FP8 matrix (1.3 MB) took
    # them past 21: the whole tree (26.9 MB) beside m1 (40.4 MB) is now about 0.25 MB over 64 MiB, so
    # the next call that carries m1 needs it in halves, as c1 travels, or a smaller tree. The
    # Cutlass-block FP8 cells (matrix_fp8bc, 40 legs, 0.91 MiB) took them past 22 MiB (22.89): the
    # tracked tree (28.5 MB) still fits beside c2 in one 64 MiB carry; beside m1 it is further over
    # (m1 travels in halves now). The MoE row-bound legs (calls/moe_packed, 0.82 MiB with their
    # arrays) took them to 23.75 MiB: the tree (29.4 MB) beside c2 (34.9 MB) is 64.3 of 67.1 MB
    assert total < 24 * 1024 * 1024


ALL_LEGS = legs(RUN6) + legs(RUN5) + legs(RUN4) + legs(RUN3) + legs(RUN2) + legs(RUN1)


@pytest.mark.parametrize("leg", ALL_LEGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_seal_verifies_and_leg_records_where(leg):
    assert check_seal(leg) == []
    m = meta(leg)
    assert m["schema"] == "tica.leg/1"
    assert m["device"]["name"] == "NVIDIA H200"
    if m["producer"] == "tica.legs.quality":
        # run4's quality legs (the CPU path's producer) recorded torch's CUDA runtime as the driver;
        # the producer now asks nvidia-smi (tica.legs.common.device_info)
        assert m["device"]["driver"] == "13.0" and m["versions"]["torch"] == "2.11.0+cu130"
    else:
        assert m["device"]["driver"] == "580.159.04"
    assert m["device"]["capability"] == "9.0"
    assert m["versions"]["vllm"] == "0.26.0"
    assert m["versions"]["torch"].startswith("2.11.0")
    assert m["env"]["VLLM_BATCH_INVARIANT"] == ("1" if m["arm"] == "bi1" else "0")
    assert m["kernels"]
    # run4's quality legs ran vLLM's engine in-process (the kit's VLLM_ENABLE_V1_MULTIPROCESSING=0) and
    # sealed themselves before exiting: no process of theirs could be recorded (their exits are in
    # calls/run4/status.json); the launcher now runs them with the engine in its own process
    assert m["processes"] or m["producer"] == "tica.legs.quality"


def _steps(forward_dir: Path, first: int) -> list[dict]:
    r = rows(forward_dir / "metrics.jsonl")
    assert [x["step"] for x in r] == list(range(first, first + 5))
    return r


@pytest.mark.parametrize("where,first", [("forward_bi1", 1), ("update_bi1/post_forward", 6),
                                         ("forward_bi1_decode", 1), ("forward_bi1_decode_post_update", 6)])
def test_bi1_forward_bitwise_zero_before_and_after_update(where, first):
    d = RUN3 / where
    for row in _steps(d, first):
        assert row["training/rollout_probs_diff_max"] == 0.0
        assert row["training/rollout_probs_diff_mean"] == 0.0
        assert row["tica/n_bitwise_diff"] == 0
        a = arrays(d, row["step"])
        recomputed = forward_metrics(a["trainer_logprobs"], a["rollout_logprobs"])
        assert recomputed["tica/n_bitwise_diff"] == 0
        assert recomputed["training/rollout_probs_diff_max"] == 0.0
        assert a["token_ids"].size == a["seq_lens"].sum() == row["tica/n_tokens"] > 200


def test_run4_reproduced_run3_byte_for_byte():
    """Another H200, another session, the same seeds: every data file of these run4 legs had the
    sha256 of run3's (recorded when run4 came back; the run4 copies were not committed twice)."""
    rep = json.loads((RUN4 / "REPRODUCED.json").read_text())
    assert len(rep["legs"]) == 5
    for leg, entry in rep["legs"].items():
        assert len(entry["files"]) == 6, leg  # 5 steps + metrics.jsonl
        for rel, digest in entry["files"].items():
            assert hashlib.sha256((RUN3 / entry["run3"] / rel).read_bytes()).hexdigest() == digest, (leg, rel)


def test_run4_update_recheck_is_on_the_sampled_tokens_and_bitwise():
    u = rows(RUN4 / "update_bi1" / "metrics.jsonl")[0]
    assert u["reloaded_by_rollout"] is True and u["deployed_bytes_equal"] is True
    for row in _steps(RUN4 / "update_bi1" / "post_forward", 6):
        assert row["tica/n_bitwise_diff"] == 0 and row["checkpoint_version"] == u["updated_weights_hash"]
        assert row["tica/decode_vs_prefill_scoring_n_bitwise_diff"] > 0  # what made run3's re-check fail


def test_megatron_bi0_differs_on_nearly_every_token():
    for row in _steps(RUN4 / "forward_bi0_megatron", 1):
        assert row["tica/n_bitwise_diff"] > 0.99 * row["tica/n_tokens"]
        assert 0 < row["training/rollout_probs_diff_mean"] < 1e-3


def test_tp2_legs():
    for leg in ("forward_bi1_tp2", "forward_bi1_tp2_decode"):
        for row in _steps(RUN5 / leg, 1):
            assert row["tica/n_bitwise_diff"] == 0
    for row in _steps(RUN5 / "forward_bi1_tp2_trainer_tp1", 1):
        assert row["tica/n_bitwise_diff"] == row["tica/n_tokens"]


def test_bi1_forward_shape_and_changing_batches():
    m = meta(RUN3 / "forward_bi1")
    rc = m["resolved_config"]
    assert rc["hidden_size"] >= 2048 and rc["vocab_size"] == 32000
    assert m["trainer"] == "vllm_kernels"
    batches = []
    for row in _steps(RUN3 / "forward_bi1", 1):
        assert 100 <= row["tica/seq_len_min"] and row["tica/seq_len_max"] <= 2000
        batches.append(tuple(row["tica/batch"]["prompts"]))
    assert len(set(batches)) == 5  # batch composition changed every step


def test_bi1_decode_logprobs_differ_from_prefill_as_measured():
    """Measured, not wished: vLLM 0.26's own decode logprobs of the sampled tokens are not bitwise
    equal to its prefill scoring of the same tokens (the trainer equals the prefill bitwise).
    The kernel probe names the cause: _C.fused_add_rms_norm changes bits below 256 tokens."""
    for row in _steps(RUN3 / "forward_bi1", 1):
        assert row["tica/decode_vs_prefill_n_bitwise_diff"] > 0
        assert row["tica/trainer_vs_decode_n_bitwise_diff"] == row["tica/decode_vs_prefill_n_bitwise_diff"]
    probe = json.loads((RUN3 / "forward_bi1" / "kernel_probe.json").read_text())
    assert probe["ops"]["fused_add_rms_norm"]["64"] > 0
    for op in ("linear_qkv", "linear_lm_head", "rms_norm", "silu_and_mul", "rotary", "logprob"):
        assert set(probe["ops"][op].values()) == {0}, op
    assert set(probe["ops"]["attention"]["decode_vs_prefill_paged"].values()) == {0}
    dp = json.loads((RUN3 / "forward_bi1" / "decode_probe.json").read_text())
    assert dp["alone_prefill_vs_trainer_n_diff"] == 0 and dp["alone_decode_vs_prefill_n_diff"] > 0


@pytest.mark.parametrize("leg,first", [("forward_bi1_decode", 1), ("forward_bi1_decode_post_update", 6)])
def test_bi1_trainer_equals_sampled_token_logprobs(leg, first):
    """Response tokens only, rollout = vLLM's own sampled-token logprobs (verl's rollout_log_probs):
    bitwise equal when the trainer runs each row as the engine did (prompt rows as a prefill step,
    generated rows as decode steps), although vLLM's decode differs from its own prefill."""
    for row in _steps(RUN3 / leg, first):
        assert row["tica/n_bitwise_diff"] == 0 and row["training/rollout_probs_diff_max"] == 0.0
        assert row["tica/decode_vs_prefill_scoring_n_bitwise_diff"] > 0
        assert row["tica/trainer_vs_prefill_scoring_n_bitwise_diff"] > 0
    if first == 6:
        u = rows(RUN3 / "update_bi1" / "metrics.jsonl")[0]
        assert {r["checkpoint_version"] for r in rows(RUN3 / leg / "metrics.jsonl")} == {u["updated_weights_hash"]}


def test_bi0_magnitude_nonzero():
    m = meta(RUN3 / "forward_bi0_hf")
    assert m["trainer"] == "transformers"
    for row in _steps(RUN3 / "forward_bi0_hf", 1):
        assert row["tica/n_bitwise_diff"] == row["tica/n_tokens"]
        assert row["training/rollout_probs_diff_max"] > 0.01
        assert row["training/rollout_probs_diff_mean"] > 0


@pytest.mark.parametrize("leg", ["forward_bi1_planted_fault", "forward_bi1_fault_hf_final_norm"])
def test_planted_faults_give_nonzero_diff(leg):
    m = meta(RUN3 / leg)
    assert m["resolved_config"]["canary"] is True
    for row in _steps(RUN3 / leg, 1):
        assert row["tica/n_bitwise_diff"] > 0
        assert row["training/rollout_probs_diff_max"] > 0


def test_cublas_linear_swap_is_bitwise_invisible_on_h200():
    """One linear on torch's default cuBLAS matmul gave the same bits as vLLM's Triton matmul on
    Hopper (vLLM's BI mode keeps cuBLASLt there with split-K off): not a usable canary. Both runs."""
    for d in (RUN3 / "forward_bi1_fault_cublas_linear", RUN1 / "forward_bi1_planted_fault"):
        assert "o_proj" in json.dumps(meta(d)["resolved_config"]["planted_fault"])
        for row in _steps(d, 1):
            assert row["tica/n_bitwise_diff"] == 0


def test_backward_and_update():
    b = rows(RUN3 / "backward_bi1" / "metrics.jsonl")[0]
    assert b["grad_finite"] and b["params_with_grad"] == b["params_total"] == b["params_nonzero_grad"] == 39
    assert b["actor/grad_norm"] > 0 and b["deployed_bytes_equal"] is True
    gc = json.loads((RUN3 / "backward_bi1" / "gradcheck.json").read_text())
    assert gc["pass"] and all(gc["controls_caught"].values())
    assert gc["check"]["device"] == "cuda"
    u = rows(RUN3 / "update_bi1" / "metrics.jsonl")[0]
    assert u["optimizer"] == "adamw"
    assert u["weights_changed_tensors"] == u["weights_total_tensors"] == 39
    assert u["reloaded_by_rollout"] is True and u["deployed_bytes_equal"] is True
    post = rows(RUN3 / "update_bi1" / "post_forward" / "metrics.jsonl")
    assert {r["checkpoint_version"] for r in post} == {u["updated_weights_hash"]}
    pre = rows(RUN3 / "forward_bi1" / "metrics.jsonl")
    assert u["updated_weights_hash"] != pre[0]["checkpoint_version"]


def _bench(leg: Path) -> dict:
    return json.loads((leg / "bench.json").read_text())


@pytest.mark.parametrize("run", [RUN2, RUN6], ids=["run2", "run6"])
def test_throughput_crossed_rounds_with_exact_workload(run):
    tl = [p for p in legs(run) if p.name.startswith("throughput_")]
    seen = {}
    for leg in tl:
        m = meta(leg)
        b = _bench(leg)
        rc = m["resolved_config"]
        assert (rc["input_len"], rc["output_len"], rc["ignore_eos"]) == (8192, 1024, True)
        assert b["completed"] == rc["num_prompts"] and b["failed"] == 0
        assert b["total_input_tokens"] == 8192 * b["completed"]
        assert b["total_output_tokens"] == 1024 * b["completed"]
        assert b["max_concurrency"] == m["concurrency"]
        assert b["arm"] == m["arm"] and int(b["round"]) == m["round"]
        seen[(m["arm"], m["round"], m["concurrency"])] = (m["slot"], b["output_throughput"])
    assert len(seen) == 2 * 3 * 4
    # AB / BA / AB with A = BI=0
    assert [seen[("bi0", r, 1)][0] for r in (1, 2, 3)] == [1, 2, 1]
    for c in (1, 8, 32, 64):
        losses = [1 - seen[("bi1", r, c)][1] / seen[("bi0", r, c)][1] for r in (1, 2, 3)]
        assert all(-1 < x < 1 for x in losses)
        assert statistics.median(losses) == sorted(losses)[1]


def test_clean_exit_recorded_as_measured():
    forward = legs(RUN3)
    for leg in forward:
        for p in meta(leg)["processes"]:
            assert (p["role"], p["end_state"], p["exit_code"]) in {("trainer", "exited", 0), ("engine_core", "exited", 0)}
    # vllm serve: exit code 0 after SIGTERM, but vLLM logged "force killing remaining processes":
    # recorded force_killed, which is not a clean exit
    for leg in (p for p in legs(RUN2) if p.name.startswith("throughput_")):
        procs = meta(leg)["processes"]
        server = [p for p in procs if p["role"] == "api_server"][0]
        client = [p for p in procs if p["role"] == "client"][0]
        assert server["exit_code"] == 0 and server["end_state"] == "force_killed"
        assert "force killing" in server["evidence"]
        assert client["end_state"] == "exited" and client["exit_code"] == 0


def test_first_run_throughput_failures_kept():
    tl = [p for p in legs(RUN1) if p.name.startswith("throughput_")]
    assert len(tl) == 24
    assert all(_bench(p)["failed"] > 0 for p in tl)


def test_run6_every_leg_warmed_up_on_its_own():
    for leg in legs(RUN6):
        assert meta(leg)["resolved_config"]["num_warmups"] == 1
