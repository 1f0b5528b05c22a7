"""The update question's reproducibility rule (criteria.reproduced_on_rerun): the rerun's values decide,
never the producer's flags, and a rerun that was not recorded never passes."""

from __future__ import annotations

import pytest

from tica.items.update.judge import rerun_findings
from tica.receipts import UpdateStep
from tica.verdict import Verdict

W1 = "blake3:" + "a" * 64
W2 = "blake3:" + "b" * 64


def step(rerun: dict | None, grad_norm: float | None = 9.5205, updated: str | None = W1) -> UpdateStep:
    row = {"step": 1, "params_total": 4, "params_with_grad": 4, "optimizer": "adamw", "weights_changed_tensors": 4,
           "weights_total_tensors": 4, "updated_weights_hash": updated, "actor/grad_norm": grad_norm}
    if rerun is not None:
        row["tica/update_rerun"] = rerun
    return UpdateStep.model_validate(row)


def rerun(grad_norm: float = 9.5205, weights: str = W1, **flags) -> dict:
    return {"grad_norm": grad_norm, "updated_weights_hash": weights, "how": "fresh trainer, same batch", **flags}


def test_same_grad_norm_and_weights_pass():
    assert rerun_findings(step(rerun()), "").verdict is Verdict.PASS


def test_the_same_hash_spelled_otherwise_still_passes():  # content, not spelling
    assert rerun_findings(step(rerun(weights=W1.upper())), "").verdict is Verdict.PASS


@pytest.mark.parametrize("changed", [{"grad_norm": 9.5206}, {"weights": W2}])
def test_a_rerun_that_differs_fails_whatever_its_flags_say(changed):
    r = rerun(**changed, grad_norm_equal=True, weights_equal=True)
    assert rerun_findings(step(r), "").verdict is Verdict.FAIL


@pytest.mark.parametrize("s", [step(None), step(rerun(), grad_norm=None), step(rerun(), updated=None)],
                         ids=["no rerun", "grad norm unknown", "weights unknown"])
def test_unknown_is_never_a_pass(s):
    assert rerun_findings(s, "").verdict is Verdict.INCONCLUSIVE


def test_a_malformed_rerun_is_refused():
    with pytest.raises(ValueError):
        step({"grad_norm": 1.0, "how": "x"})  # no weights hash
