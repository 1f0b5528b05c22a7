"""A weight reload into a running engine drops its prefix cache: KV that the old weights computed
must not serve the post-update rollout (the h200-accept run's re-checks failed on every token)."""

from __future__ import annotations

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
