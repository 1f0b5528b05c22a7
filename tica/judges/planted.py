"""Planted-fault legs: a BI=1 forward run with one kernel replaced on purpose (the leg's
`resolved_config.planted_fault`), judged beside its control, the same run without the fault. A
fault is a canary only where it makes the criterion fail in a way its control does not:

- `caught`: the fault leg fails for a reason its control does not have;
- `not_a_canary`: it adds no failure to its control's (the replacement equals the kernel bit for
  bit on that shape, say torch's cuBLAS matmul for one linear on Hopper): flagged for that shape;
- `unknown`: either leg could not be judged (inconclusive, not run): it proves nothing.

A fault leg judged alone would take any failure for the fault's: on the H200's run3 the control
itself fails (vLLM's decode logprobs differ from its prefill scoring), and a fault that changed
nothing failed with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from tica.errors import ReceiptError
from tica.items.forward.judge import judge_forward
from tica.messages import without_prefix
from tica.question import Question
from tica.receipts import LEG_FILE, load_leg
from tica.verdict import Verdict, VerdictCell

Status = Literal["caught", "not_a_canary", "unknown"]


class CanaryStatus(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    leg: str
    control: str
    target: str
    shape: str | None  # None: the leg does not record its model shape (unknown)
    status: Status
    reason: str


def _failures(cell: VerdictCell, leg: Path) -> set[str]:
    """The cell's failure reasons with the leg's own name taken out, so two legs compare."""
    return {re.sub(rf"\b{re.escape(leg.name)}\b", "<leg>", r) for r in cell.reasons if r.startswith("fail:")}


def canary_status(question: Question, leg: str | Path, control: str | Path) -> CanaryStatus:
    """What one planted-fault leg proves under the forward question, beside its control."""
    path, ctrl = Path(leg), Path(control)
    meta = load_leg(path).meta
    fault = meta.resolved_config.get("planted_fault")
    if not isinstance(fault, dict) or not fault.get("target"):
        raise ReceiptError(path / LEG_FILE, "resolved_config.planted_fault", "not a planted-fault leg (no target recorded)")
    if load_leg(ctrl).meta.resolved_config.get("planted_fault") is not None:
        raise ReceiptError(ctrl / LEG_FILE, "resolved_config.planted_fault", "a control must run without a planted fault")
    shape = meta.resolved_config.get("model_shape")
    where = f"shape {shape}" if isinstance(shape, str) else "this (unrecorded) shape"
    cell, base = judge_forward(question, [path]), judge_forward(question, [ctrl])
    decided = (Verdict.PASS, Verdict.FAIL)
    if cell.verdict not in decided or base.verdict not in decided:
        status: Status = "unknown"
        reason = f"fault leg {cell.verdict.value}, control {base.verdict.value}: nothing to compare"
    elif new := sorted(_failures(cell, path) - _failures(base, ctrl)):
        status, reason = "caught", (f"{len(new)} failure(s) its control does not have, e.g. "
                                    + without_prefix(new[0]).replace("<leg>", path.name))
    else:
        status = "not_a_canary"
        reason = (f"{fault['target']} adds no failure to its control's on {where}: it cannot show the criterion "
                  "failing there")
    return CanaryStatus(leg=path.name, control=ctrl.name, target=str(fault["target"]),
                        shape=shape if isinstance(shape, str) else None, status=status, reason=reason)


def canary_table(question: Question, pairs: Sequence[tuple[str | Path, str | Path]]) -> list[CanaryStatus]:
    """One row per (fault leg, control) pair, in order."""
    return [canary_status(question, leg, control) for leg, control in pairs]
