"""A producer launched through Dagster Pipes reports back through Pipes (the producer itself
imports only dagster-pipes; this test is the orchestrating side)."""

import dagster as dg
import pytest

pytestmark = pytest.mark.slow


def test_backward_producer_reports_through_pipes(tmp_path, tiny_model):
    from tica.legs.runner import leg_command
    from tica.seal import check_seal

    out = tmp_path / "backward-bi0"
    argv, env = leg_command("backward", "bi0", out, model=str(tiny_model))
    seen: dict = {}

    @dg.asset
    def backward_leg(context: dg.AssetExecutionContext, pipes: dg.PipesSubprocessClient) -> dg.MaterializeResult:
        inv = pipes.run(command=argv, context=context, env=env)
        msgs = inv.get_custom_messages()
        seen["messages"] = msgs
        return dg.MaterializeResult(metadata={"leg_dir": msgs[-1]["leg_dir"]})

    result = dg.materialize([backward_leg], resources={"pipes": dg.PipesSubprocessClient()})
    assert result.success
    (msg,) = seen["messages"]
    assert msg["item"] == "backward" and msg["metrics"][0]["grad_finite"] is True
    assert check_seal(out) == []
