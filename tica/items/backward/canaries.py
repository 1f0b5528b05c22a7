"""The backward's canaries: a passing receipt set (a BI=1 and a BI=0 backward leg, three steps of
finite gradients reaching every parameter) and one planted error per rule, each of which the
judge must not pass. `tica.canaries` runs them with every other item's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tica.canary_legs import FAIL, INCONCLUSIVE, Canary, drop_arm, edit_jsonl, find_leg
from tica.canary_legs import grad_rows as _grad_rows
from tica.canary_legs import jsonl as _jsonl
from tica.canary_legs import leg_meta as _meta
from tica.canary_legs import proc as _proc
from tica.canary_legs import set_row as _set_row
from tica.canary_legs import write_leg as _write_leg
from tica.evidence import EvidenceItem
from tica.question import Question
from tica.verdict import Verdict

E = EvidenceItem

# The question the built-in canaries and the committed fixtures are judged under.
QUESTION: dict[str, Any] = {
    "name": "backward-reaches-master", "compared": "grad norm, params with grad",
    "computation": "one backward per step", "pass_line": "finite grads reaching every master param",
    "criteria": {"item": "backward"}}


def build_backward(question: Question, dest: Path) -> list[Path]:
    legs = []
    for arm, trainer in (("bi1", "vllm_kernels"), ("bi0", "megatron")):
        meta = _meta("backward", arm, trainer=trainer, processes=[_proc("trainer", 5100)])
        legs.append(_write_leg(dest / f"backward_{arm}", meta, {"metrics.jsonl": _jsonl(_grad_rows(3))}))
    return legs


def gradcheck(passed: bool, caught: bool) -> Callable[[Question, list[Path]], None]:
    """The producer's gradient check as vllm_kernels records it, planted on the BI=1 leg."""
    ops = ("linear", "rms_norm", "fused_add_rms_norm", "rotary", "silu_and_mul", "attention", "logprob")

    def mutate(q: Question, legs: list[Path]) -> None:
        leg = find_leg(legs, arm="bi1")
        edit_jsonl(leg / "metrics.jsonl", _set_row(0, **{"tica/gradcheck_pass": passed,
                                                         "tica/gradcheck_controls_caught": {op: caught for op in ops}}), leg)
    return mutate


# The must_record canary every item has is tica.canaries' (it reads the question, not the item).
CANARIES: tuple[Canary, ...] = (
    Canary("backward.finite", E.BACKWARD, "gradients finite", FAIL,
           lambda q, legs: edit_jsonl(legs[0] / "metrics.jsonl", _set_row(1, **{"actor/grad_norm": float("nan"),
                                                                             "grad_finite": False}), legs[0])),
    Canary("backward.reaches_master", E.BACKWARD, "gradients reach the master weights", FAIL,
           lambda q, legs: edit_jsonl(legs[0] / "metrics.jsonl", _set_row(0, params_with_grad=18, params_nonzero_grad=18),
                                      legs[0])),
    Canary("backward.zero_grad_vs_rewards", E.BACKWARD, "grad norm 0 with varied group rewards is a fault", FAIL,
           lambda q, legs: edit_jsonl(legs[0] / "metrics.jsonl", _set_row(1, **{"actor/grad_norm": 0.0}), legs[0])),
    Canary("backward.deployed_bytes", E.BACKWARD, "forward equals the deployed bytes", FAIL,
           lambda q, legs: edit_jsonl(legs[1] / "metrics.jsonl", _set_row(0, deployed_bytes_equal=False), legs[1])),
    Canary("backward.bi1_leg_ran", E.BACKWARD, "a BI=1 backward leg ran (BI=0 legs alone are no evidence)",
           frozenset({Verdict.NOT_RUN}), drop_arm("bi1")),
    Canary("backward.gradient_check", E.BACKWARD, "a gradient check the producer recorded as failed is no pass",
           FAIL, gradcheck(passed=False, caught=True)),
    Canary("backward.gradient_check_controls", E.BACKWARD,
           "a gradient check whose planted errors were not detected is no evidence", INCONCLUSIVE,
           gradcheck(passed=True, caught=False)),
)
