"""A weight reload into a running engine drops its prefix cache: KV that the old weights computed
must not serve the post-update rollout (the h200-accept run's re-checks failed on every token)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tica.legs.vllm_kernels.rollout import VllmRollout


class FakeLLM:
    def __init__(self, resets: bool) -> None:
        self.calls: list[str] = []
        self.resets = resets

    def apply_model(self, fn):
        self.calls.append("load")
        return [3]

    def reset_prefix_cache(self) -> bool:
        self.calls.append("reset_prefix_cache")
        return self.resets


def rollout(llm: FakeLLM, **cfg) -> VllmRollout:
    r = VllmRollout.__new__(VllmRollout)  # no engine: the reload's order is what is tested
    r.llm, r.cfg = llm, {"enable_prefix_caching": True, **cfg}
    return r


def test_a_reload_resets_the_prefix_cache_after_loading(tmp_path):
    llm = FakeLLM(resets=True)
    assert rollout(llm).reload(tmp_path / "model.safetensors") == 3
    assert llm.calls == ["load", "reset_prefix_cache"]


def test_a_prefix_cache_that_would_not_reset_fails_the_reload(tmp_path):
    with pytest.raises(RuntimeError, match="prefix cache"):
        rollout(FakeLLM(resets=False)).reload(tmp_path / "model.safetensors")
    rollout(FakeLLM(resets=False), enable_prefix_caching=False).reload(tmp_path / "m.safetensors")  # nothing cached


def test_the_trainer_side_engine_records_every_engine_field_a_manifest_pins():
    """Every `kernels.rollout.*` key a manifest's pins read is recorded by the in-process rollout
    (the forward, backward and update legs), from vLLM's resolved config, never from the
    arguments; a field missing here is a pin those legs can never satisfy (the h200-accept run's
    legs recorded no parallel sizes, kv-cache dtype or shutdown timeout)."""
    from types import SimpleNamespace

    from tica.binding import pins
    from tica.judges import load_candidate

    vc = SimpleNamespace(
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
                                        enable_expert_parallel=False, prefill_context_parallel_size=1,
                                        decode_context_parallel_size=1, all2all_backend="allgather_reducescatter",
                                        nnodes=1),
        cache_config=SimpleNamespace(cache_dtype="auto", enable_prefix_caching=True),
        scheduler_config=SimpleNamespace(enable_chunked_prefill=True, async_scheduling=True, max_num_batched_tokens=8192),
        model_config=SimpleNamespace(dtype="torch.bfloat16", enforce_eager=False),
        compilation_config=SimpleNamespace(cudagraph_mode="FULL_DECODE_ONLY", cudagraph_capture_sizes=[2, 1]),
        attention_config=SimpleNamespace(backend="FLASH_ATTN"), shutdown_timeout=30)
    r = VllmRollout.__new__(VllmRollout)
    r.llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=vc))
    recorded = r.selected()
    candidate = load_candidate(Path(__file__).resolve().parents[2] / "demo" / "candidates" / "h200-accept.yaml")
    read = {k.removeprefix("kernels.rollout.") for p in pins(candidate) for k in p.receipt_keys if k.startswith("kernels.rollout.")}
    assert read and {k for k in read if recorded.get(k) is None} == set()
    # negative control: an engine that resolved nothing records nothing, which binds nothing
    r.llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace()))
    assert set(r.selected()) == {"error"}
