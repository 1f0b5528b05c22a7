"""A leg started with an engine's settings (the accept run's `graphs` engine names its own
shutdown_timeout) and its own options starts one engine with one value for each: the leg's
options win. The accept run's quality legs died on the duplicate before this (device call 24)."""

from __future__ import annotations

from types import SimpleNamespace

from tica.legs import engine, forward
from tica.legs.vllm_kernels.rollout import ENGINES


class Leg:
    def begin(self) -> None:
        pass


def test_the_legs_own_shutdown_timeout_wins_over_the_engine_settings(monkeypatch):
    seen = {}
    monkeypatch.setattr(engine, "start_llm", lambda model, **kw: seen.update(kw) or ("llm", kw))
    for name, settings in ENGINES.items():
        args = SimpleNamespace(max_model_len=512, gpu_memory_utilization=0.2, seed=0, shutdown_timeout=7,
                               engine_args=dict(settings), arm="bi1")
        forward.start_engine_or_not_run(Leg(), args, "model")
        assert seen["shutdown_timeout"] == 7, name
        assert {k: seen[k] for k in settings if k != "shutdown_timeout"} == \
            {k: v for k, v in settings.items() if k != "shutdown_timeout"}, name
    assert any("shutdown_timeout" in s for s in ENGINES.values())  # the case that collided is covered
