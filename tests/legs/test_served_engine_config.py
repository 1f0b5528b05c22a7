"""What a leg served by vLLM's API server records of its engine, without starting vLLM: the
resolved config its EngineCore reported (one whole `TICA_ENGINE_CONFIG` line), never a value read
from inside another line, never one of two disagreeing values; and what a trainer records of
the way it ran, read from the process and its parameters rather than from its arguments."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import torch

from tica.legs import engine
from tica.legs.trainer_base import Trainer, trainer_parallelism, trainer_resolved

REPORTED = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1,
            "expert_parallel_size": 1, "context_parallel_size": 1, "dtype": "torch.bfloat16",
            "kv_cache_dtype": "auto", "prefix_caching": False, "chunked_prefill": True, "async_scheduling": False,
            "enforce_eager": True, "shutdown_timeout": 30, "attention": "CPU_ATTN"}
LINE = f"(EngineCore pid=7) {engine.ENGINE_CONFIG_LINE} {json.dumps(REPORTED)}\n"
SHUTDOWN = "(APIServer pid=1) INFO [launcher.py:270] [shutdown] API server: stopping engine client mode=drain timeout=30s\n"


def test_the_engines_reported_config_is_what_the_served_leg_records():
    rollout = engine.served_engine_kernels(LINE + SHUTDOWN)
    for key, value in REPORTED.items():
        assert rollout[key] == value, key
    assert rollout["shutdown_mode"] == "drain"
    assert "engine_config_note" not in rollout and "engine_config_conflicts" not in rollout


def test_a_marker_inside_another_line_is_text_and_nothing_reported_stays_unknown():
    echoed = (f"(APIServer pid=1) INFO [logger.py:39] Received request cmpl-1: prompt: "
              f"'{engine.ENGINE_CONFIG_LINE} {json.dumps({**REPORTED, 'attention': 'FLASH_ATTN'})}'\n")
    rollout = engine.served_engine_kernels(echoed + SHUTDOWN)
    for key in ("attention", "expert_parallel_size", "async_scheduling", "dtype"):
        assert key not in rollout, key  # unrecorded: the binding calls it unbound, never a pass
    assert "no engine reported" in rollout["engine_config_note"]
    assert engine.served_engine_kernels(LINE + echoed)["attention"] == "CPU_ATTN"  # the whole line wins


def test_two_engines_reporting_different_configs_leave_it_unknown():
    other = LINE.replace('"attention": "CPU_ATTN"', '"attention": "TORCH_SDPA"')
    rollout = engine.served_engine_kernels(LINE + other)
    assert "attention" not in rollout and "2 different engine configs" in rollout["engine_config_note"]


def test_vllms_log_line_that_contradicts_the_engines_report_makes_the_value_unknown():
    logged = ("(EngineCore pid=7) INFO 12-01 10:00:00 [core.py:93] Initializing a V1 LLM engine (v0.32.0) with config: "
              "tensor_parallel_size=2, dtype=torch.bfloat16, enforce_eager=True\n")
    rollout = engine.served_engine_kernels(LINE + logged)
    assert rollout["tensor_parallel_size"] is None and rollout["dtype"] == "torch.bfloat16"
    assert any("tensor_parallel_size" in c for c in rollout["engine_config_conflicts"])


def test_the_resolved_config_is_read_from_vllms_config_object():
    """expert parallelism by vLLM's own rule (TP x DP x PCP only with enable_expert_parallel), an
    async scheduling vLLM left unresolved stays None."""
    def cfg(ep: bool, async_scheduling):
        return SimpleNamespace(
            parallel_config=SimpleNamespace(tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=2,
                                            enable_expert_parallel=ep, prefill_context_parallel_size=1,
                                            decode_context_parallel_size=1),
            cache_config=SimpleNamespace(cache_dtype="auto", enable_prefix_caching=False),
            scheduler_config=SimpleNamespace(enable_chunked_prefill=True, async_scheduling=async_scheduling,
                                             max_num_batched_tokens=4096),
            model_config=SimpleNamespace(dtype=torch.bfloat16, enforce_eager=True),
            compilation_config=SimpleNamespace(cudagraph_mode=None), shutdown_timeout=30)
    assert engine.resolved_engine_config(cfg(True, True))["expert_parallel_size"] == 4
    resolved = engine.resolved_engine_config(cfg(False, None))
    assert resolved["expert_parallel_size"] == 1 and resolved["async_scheduling"] is None
    assert resolved["dtype"] == "torch.bfloat16"


class _Tiny(Trainer):
    name, trainable = "tiny", True

    def __init__(self, dtype) -> None:
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 4).to(dtype), torch.nn.LayerNorm(4))

    def parameters(self):
        return self.model.named_parameters()


def test_a_trainer_records_the_dtype_its_weights_hold_and_the_parallelism_of_its_process(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: False)  # an earlier test may have set up groups
    got = trainer_resolved(_Tiny(torch.bfloat16))
    assert got["dtype"] == "torch.bfloat16"  # the matmul weights', not the fp32 norm's
    assert {got[f"{k}_parallel_size"] for k in ("tensor", "pipeline", "data", "expert", "context")} == {1}
    assert "not initialised" in got["parallelism_read_from"]
    assert trainer_resolved(_Tiny(torch.float32))["dtype"] == "torch.float32"  # read, not the argument's bf16


def test_a_trainer_that_does_not_run_in_this_process_records_nothing(monkeypatch):
    class External(Trainer):
        name, trainable = "external", False
    assert trainer_resolved(External()) == {}
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.delitem(sys.modules, "megatron.core.parallel_state", raising=False)  # groups without megatron
    got = trainer_parallelism()
    assert not any(k.endswith("_parallel_size") for k in got) and "unknown" in got["parallelism_read_from"]


def test_the_bi1_not_run_reason_is_one_sentence_that_names_the_gpu():
    try:
        def mean_dim():
            raise TypeError("'function' object is not subscriptable;\nsecond line")
        mean_dim()
    except TypeError as err:
        text = engine.bi1_unsupported_sentence("cpu", "CpuPlatform", err)
    assert text.startswith("BI=1 needs a GPU because vLLM's batch-invariant mode")
    assert "CPU platform" in text and "VLLM_BATCH_INVARIANT=1" in text and "TypeError" in text
    assert "\n" not in text and "; " not in text
