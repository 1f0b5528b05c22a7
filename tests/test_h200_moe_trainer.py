"""The MoE trainer forward against vLLM 0.26 on one H100 (tests/fixtures/h200/calls/moe_trainer,
issue 33's first step): what `scripts/h200/moe_trainer.py` measured, replayed from its receipts.
Nothing here touches a GPU; the routing comparisons are recomputed from the receipts."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from tica.legs.vllm_kernels.routing import compare, from_json

HERE = Path(__file__).resolve().parent / "fixtures" / "h200" / "calls" / "moe_trainer"
ARMS = ("overlay3", "stock")


def summary(run: str, arm: str) -> dict:
    return json.loads((HERE / run / arm / "summary.json").read_text())


def receipts(run: str, arm: str) -> dict:
    with gzip.open(HERE / run / arm / "routing.json.gz", "rt") as f:
        return json.load(f)


@pytest.mark.parametrize("arm", ARMS)
def test_the_conditions_are_recorded(arm):
    s = summary("run1", arm)
    assert s["candidate"] == arm and s["env"]["VLLM_BATCH_INVARIANT"] == "1"
    assert s["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the engine core in the script's process
    assert s["overlay_parts"] == (["rmsnorm", "fa_pin_tile"] if arm == "overlay3" else [])
    assert s["versions"]["vllm"] == "0.26.0" and s["versions"]["torch"].startswith("2.11.0")
    assert s["versions"]["gpu"].startswith("NVIDIA H100 80GB HBM3")
    cfg = s["model_config"]
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["hidden_size"] == 1024
    assert (cfg["num_hidden_layers"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]) == (4, 8, 256)
    assert cfg.get("num_experts", cfg.get("num_local_experts")) == 64 and cfg["norm_topk_prob"] is True
    assert s["trainer"]["expert_weights_equal_vllm_layer0"] == [
        {"model.layers.0.mlp.experts.routed_experts.w13_weight": True,
         "model.layers.0.mlp.experts.routed_experts.w2_weight": True}]
    log = (HERE / "run1" / arm / "run.log").read_text()
    assert "Using TRITON Unquantized MoE backend" in log and "Using TritonExperts MoE backend" in log
    assert "gpu_model_runner.py" in log  # vLLM's V1 model runner (Qwen3-MoE is not a default-V2 MoE)


@pytest.mark.parametrize("arm", ARMS)
def test_vllms_routing_is_the_trainers_on_every_prefill_row(arm):
    """vLLM's router (captured in its process) and the trainer's: the same experts in the same order
    with bitwise-equal gate weights on every one of the 19,634 rows of the scoring batch (one engine
    step) and on the anchor scored alone, in both arms."""
    r = summary("run1", arm)["routing"]
    for key, tokens in (("trainer_vs_vllm_score_alone", 564), ("trainer_pack_vs_vllm_score_batch", 19634),
                        ("trainer_anchor_alone_vs_in_pack", 564)):
        assert r[key]["identical"] is True and r[key]["tokens"] == tokens and r[key]["layers"] == 4, key
    rec = receipts("run1", arm)
    assert rec["sha256"]["vllm_score_alone"] == rec["sha256"]["trainer_anchor"]


def replay_generate_alone(arm: str) -> dict:
    rec = receipts("run1", arm)["receipts"]
    trainer, vllm = from_json(rec["trainer_anchor"]), from_json(rec["vllm_generate_alone"])
    n = vllm[0].tokens  # 500 prompt rows (the prefill step), then one row per decode step
    assert n == 563 and trainer[0].tokens == 564
    return compare([x.rows(0, n) for x in trainer], vllm)


def test_with_the_overlay_decode_steps_route_as_the_trainer_does():
    """overlay3: vLLM's decode steps (one row a step) route every generated token as the trainer's
    packed forward does, bit for bit; recomputed here from the receipts."""
    c = replay_generate_alone("overlay3")
    assert c["identical"] and c["tokens"] == 563
    assert summary("run1", "overlay3")["routing"]["trainer_vs_vllm_decode_rows"]["identical"] is True


def test_stock_decode_steps_route_differently():
    """Stock 0.26: the step-dependent norm and attention tile change the hidden states of decode rows,
    and with them the routing: 47 (layer, token) pairs of the 63 decode rows pick experts in another
    order or set, first at layer 0 on the first decode row (position 500); prompt rows agree."""
    c = replay_generate_alone("stock")
    assert not c["identical"]
    assert (c["ids_differing"], c["expert_set_differing"], c["weights_differing"]) == (47, 10, 252)
    assert c["first"]["layer"] == 0 and c["first"]["token"] == 500
    device = summary("run1", "stock")["routing"]["trainer_vs_vllm_generate_alone"]
    assert c["per_layer"] == device["per_layer"] and c["first"]["ids"] == device["first"]["ids"]


def test_a_router_of_other_arithmetic_is_caught():
    """The control: torch's fp32 softmax/topk in place of _moe_C.topk_softmax on the same logits gives
    gate weights of other bits on 2,234 of 2,256 (layer, token) pairs and other experts on 51."""
    c = summary("run1", "overlay3")["routing"]["torch_router_vs_vllm_router_anchor"]
    assert not c["identical"] and (c["ids_differing"], c["expert_set_differing"], c["weights_differing"]) == (
        442, 51, 2234)
    lp = summary("run1", "overlay3")["logprobs"]
    assert lp["torch_router_vs_vllm_prefill"]["n_bitwise_diff"] == 18004


def test_run1_logprobs_differ_by_one_ulp_with_the_v2_runners_logprob_kernel():
    """run1's trainer computed logprobs with the V2 runner's kernel (as the dense trainer does), but
    vLLM served this MoE model on its V1 runner, whose sampler takes log_softmax(float32) (the Triton
    batch-invariant log_softmax under BI=1): 49 of 2,048 decode and 435 of 19,602 prefill logprobs
    differ, each by at most 9.5e-7 (one float32 ulp at |logprob| ~ 10), while every route agrees."""
    s = summary("run1", "overlay3")
    assert "logprob" not in s["trainer"]["kernels"]  # run1 predates the choice: the V2 kernel
    lp = s["logprobs"]
    assert lp["vllm_decode_vs_vllm_prefill"]["n_bitwise_diff"] == 0  # vLLM agrees with itself
    assert lp["trainer_anchor_alone_vs_in_pack"]["n_bitwise_diff"] == 0  # so does the trainer
    assert (lp["trainer_vs_vllm_decode"]["n_bitwise_diff"], lp["trainer_vs_vllm_prefill"]["n_bitwise_diff"]) == (49, 435)
    assert max(lp["trainer_vs_vllm_decode"]["max_abs_diff"], lp["trainer_vs_vllm_prefill"]["max_abs_diff"]) <= 2 ** -20


def test_stock_decode_differs_from_prefill_in_vllm_itself():
    lp = summary("run1", "stock")["logprobs"]
    assert lp["vllm_decode_vs_vllm_prefill"]["n_bitwise_diff"] == 1849
    assert lp["trainer_vs_vllm_decode"]["n_bitwise_diff"] == 1852


def test_fixtures_are_small():
    total = sum(p.stat().st_size for p in HERE.rglob("*") if p.is_file())
    assert total < 1_000_000


def test_receipt_digests_match_their_content():
    for arm in ARMS:
        rec = receipts("run1", arm)
        for k, v in rec["receipts"].items():
            assert hashlib.sha256(json.dumps(v, sort_keys=True).encode()).hexdigest() == rec["sha256"][k]


# ---------------------------------------------------------------- run2: the runner's logprob op, --diag


def test_run2_with_the_runners_logprob_op_the_trainer_is_bitwise_vllm():
    """run2 (another H100): the trainer takes the logprob op of the runner vLLM reports (V1: the
    batch-invariant log_softmax on fp32 logits). With overlay3 every one of 2,048 decode and 19,602
    prefill logprobs is bitwise vLLM's; the V2 kernel on the same forward is the control (49, 435)."""
    s = summary("run2", "overlay3")
    assert s["vllm_model_runner"] == "v1" and s["trainer"]["kernels"]["logprob"] == "v1_sampler"
    lp = s["logprobs"]
    assert lp["trainer_vs_vllm_decode"] == {"tokens": 2048, "n_bitwise_diff": 0, "max_abs_diff": 0.0}
    assert lp["trainer_vs_vllm_prefill"] == {"tokens": 19602, "n_bitwise_diff": 0, "max_abs_diff": 0.0}
    assert lp["v2_runner_logprob_vs_vllm_decode"]["n_bitwise_diff"] == 49
    assert lp["v2_runner_logprob_vs_vllm_prefill"]["n_bitwise_diff"] == 435
    assert s["versions"]["gpu"] != summary("run1", "overlay3")["versions"]["gpu"]  # another card
    for key in ("trainer_vs_vllm_score_alone", "trainer_vs_vllm_decode_rows", "trainer_pack_vs_vllm_score_batch"):
        assert s["routing"][key]["identical"] is True, key


def test_run2_stock_fails_decode_only():
    """Stock: prefill bitwise (0/19,602), decode not (1,849/2,048 — exactly the tokens where vLLM's
    decode differs from its own prefill), and the decode rows route differently (47 pairs)."""
    lp = summary("run2", "stock")["logprobs"]
    assert lp["trainer_vs_vllm_prefill"]["n_bitwise_diff"] == 0
    assert lp["trainer_vs_vllm_decode"]["n_bitwise_diff"] == lp["vllm_decode_vs_vllm_prefill"]["n_bitwise_diff"] == 1849
    assert summary("run2", "stock")["routing"]["trainer_vs_vllm_decode_rows"]["ids_differing"] == 47


@pytest.mark.parametrize("arm", ARMS)
def test_run2_diag_every_intermediate_is_vllms(arm):
    """--diag: vLLM's modules hooked while it scored the anchor alone (564 rows, one step). Each
    layer's attention output, MoE input and MoE output, the final norm and the logits are bitwise the
    trainer's; the trainer's MoE block on vLLM's own input reproduces vLLM's output; the V1 logprob op
    on vLLM's logits reproduces its prompt logprobs, the V2 kernel does not (the measured reason)."""
    d = summary("run2", arm)["diag"]
    assert len(d["ops"]) == 4 * 4 + 1
    for name, c in d["ops"].items():
        assert c["rows"] == 564 and c["rows_differing"] == 0, name
    assert d["logits_trainer_vs_vllm"]["rows_differing"] == 0 and d["logits_input_trainer_vs_vllm"]["rows_differing"] == 0
    assert d["v1_sampler_logprob_on_vllm_logits"]["n_bitwise_diff"] == 0
    assert d["v2_runner_logprob_on_vllm_logits"]["n_bitwise_diff"] == {"overlay3": 10, "stock": 12}[arm]
    assert d["v2_runner_logprob_on_vllm_logits"]["max_abs_diff"] <= 2 ** -20
