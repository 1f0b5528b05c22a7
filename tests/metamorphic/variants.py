"""The receipt sets every relation starts from: per item the passing bound set (`base`) and
non-passing variants, each made so by one planted error from `tica.canaries` (or a question the
set cannot pass, or a removed leg). Every variant's verdict is checked when it is built."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.false_pass.conftest import question_with
from tica import canaries as cn
from tica.evidence import EvidenceItem
from tica.question import Question
from tica.stats.bases import EXACT_MCNEMAR_EQUIVALENCE
from tica.verdict import Verdict

from . import ops

E = EvidenceItem
PASS = frozenset({Verdict.PASS})
FAIL = frozenset({Verdict.FAIL})
INCONCLUSIVE = frozenset({Verdict.INCONCLUSIVE})
NOT_RUN = frozenset({Verdict.NOT_RUN})

Mutate = Callable[[Question, list[Path]], None]
Questions = Mapping[EvidenceItem, Question]


@dataclass(frozen=True)
class Variant:
    item: EvidenceItem
    name: str
    expect: frozenset[Verdict]
    mutate: Mutate | None = None
    question: Callable[[Questions], Question] | None = None
    why: str = ""

    @property
    def id(self) -> str:
        return f"{self.item.value}-{self.name}"

    @property
    def passing(self) -> bool:
        return self.expect == PASS


# ---------------------------------------------------------------------------- planted errors


def _unrecord(key: str, arm: str = "bi1") -> Mutate:
    def mutate(q: Question, legs: list[Path]) -> None:
        leg = next(l for l in legs if ops.meta(l)["arm"] == arm)
        ops.edit_meta(leg, lambda m: ops.del_dotted(m, key))
    return mutate


def _fwd_drop_last_step(q: Question, legs: list[Path]) -> None:
    cn.drop_step(ops.leg_of(legs, arm="bi1"), None)


def _fwd_logged_drop_last_step(q: Question, legs: list[Path]) -> None:
    """The BI=1 receipt logged only (no arrays, each step's content digest kept), its last step missing."""
    leg = ops.leg_of(legs, arm="bi1")
    cn.drop_arrays_keep_digests(leg, leg)
    ops.edit_rows(leg / "metrics.jsonl", lambda rows: rows[:-1], leg)


def _fwd_perturb(q: Question, legs: list[Path]) -> None:
    cn.perturb_arrays(ops.leg_of(legs, arm="bi1"), 2)


def _fwd_bi0_magnitude(q: Question, legs: list[Path]) -> None:
    cn.logged_only(ops.leg_of(legs, arm="bi0"), 2, scale_mean=200.0)


def _bwd_grad_nan(q: Question, legs: list[Path]) -> None:
    leg = ops.leg_of(legs, arm="bi1")
    ops.edit_rows(leg / "metrics.jsonl", lambda rows: rows[1].update({"actor/grad_norm": math.nan, "grad_finite": False}),
                  leg)


def _drop_arm(arm: str) -> Mutate:
    def mutate(q: Question, legs: list[Path]) -> None:
        for leg in [l for l in legs if ops.meta(l)["arm"] == arm]:
            legs.remove(leg)
            shutil.rmtree(leg)
    return mutate


def _upd_not_reloaded(q: Question, legs: list[Path]) -> None:
    ops.edit_rows(legs[0] / "metrics.jsonl", lambda rows: rows[0].update(reloaded_by_rollout=False), legs[0])


def _upd_post_perturbed(q: Question, legs: list[Path]) -> None:
    cn.perturb_arrays(legs[0], 1, "post_forward")


def _quality_finer(qs: Questions) -> Question:
    # 30 problems move the score in steps of 3.33 points: a 2-point threshold cannot be shown met.
    return question_with(qs[E.QUALITY], {"threshold_points": 2.0, "expected_problems": None})


QUALITY_BASIS = {"test": EXACT_MCNEMAR_EQUIVALENCE, "alpha": 0.05, "power": 0.8,
                 "pilot_digests": ["sha256:" + "0" * 64], "problems": 60, "repeats": 1,
                 "min_detectable_difference": 10.0}


def _quality_basis(qs: Questions) -> Question:
    # A frozen basis that needs 60 paired problems; the set holds 30.
    return question_with(qs[E.QUALITY], {"threshold_points": 20.0, "expected_problems": None,
                                         "statistical_basis": QUALITY_BASIS})


def _qual_drop_problem(q: Question, legs: list[Path]) -> None:
    cn._drop_problem(legs)


def _tput_too_few_rounds(q: Question, legs: list[Path]) -> None:
    """Rounds 4 and 5 of the frozen 5 never handed in, at every concurrency."""
    for leg in [l for l in legs if ops.meta(l)["round"] in (4, 5)]:
        legs.remove(leg)
        shutil.rmtree(leg)


def _tput_node_unrecorded(q: Question, legs: list[Path]) -> None:
    cn._node_unrecorded(q, legs)


def _exit_arm_roles_missing(q: Question, legs: list[Path]) -> None:
    cn._arm_roles_missing(q, legs)


def _art_weights_named(q: Question, legs: list[Path]) -> None:
    ops.edit_meta(legs[0], lambda m: m["resolved_config"].update(weights_hash="Qwen3-8B"))


VARIANTS: list[Variant] = [
    # forward
    Variant(E.FORWARD, "base", PASS),
    Variant(E.FORWARD, "missing_last_step", INCONCLUSIVE, _fwd_drop_last_step,
            why="BI=1 leg holds 4 of the 5 steps the question requires"),
    Variant(E.FORWARD, "logged_missing_last_step", INCONCLUSIVE, _fwd_logged_drop_last_step,
            why="BI=1 leg logged only (no arrays), 4 of the 5 steps"),
    Variant(E.FORWARD, "bi1_not_bitwise", FAIL, _fwd_perturb, why="one BI=1 rollout logprob one ulp off at step 2"),
    Variant(E.FORWARD, "bi0_magnitude", FAIL, _fwd_bi0_magnitude, why="BI=0 mean 200x the reference at step 2"),
    Variant(E.FORWARD, "torch_unrecorded", INCONCLUSIVE, _unrecord("versions.torch"),
            why="BI=1 leg does not record versions.torch (must_record)"),
    # backward
    Variant(E.BACKWARD, "base", PASS),
    Variant(E.BACKWARD, "grad_nan", FAIL, _bwd_grad_nan, why="BI=1 grad norm NaN at step 2"),
    Variant(E.BACKWARD, "bi1_not_run", NOT_RUN, _drop_arm("bi1"), why="no BI=1 leg handed in"),
    Variant(E.BACKWARD, "controls_missed", INCONCLUSIVE, cn._gradcheck(passed=True, caught=False),
            why="gradient check whose planted errors were not detected"),
    Variant(E.BACKWARD, "torch_unrecorded", INCONCLUSIVE, _unrecord("versions.torch")),
    # update
    Variant(E.UPDATE, "base", PASS),
    Variant(E.UPDATE, "post_steps_short", INCONCLUSIVE, cn.drop_post_update_step,
            why="post-update forward holds 4 of the 5 frozen steps"),
    Variant(E.UPDATE, "post_not_bitwise", FAIL, _upd_post_perturbed),
    Variant(E.UPDATE, "not_reloaded", FAIL, _upd_not_reloaded),
    Variant(E.UPDATE, "torch_unrecorded", INCONCLUSIVE, _unrecord("versions.torch")),
    # quality
    Variant(E.QUALITY, "base", PASS),
    Variant(E.QUALITY, "finer_threshold", INCONCLUSIVE, question=_quality_finer,
            why="threshold 2 points, finer than one problem of 30 (3.33 points), no statistical basis"),
    Variant(E.QUALITY, "basis_short", INCONCLUSIVE, question=_quality_basis,
            why="statistical basis needs 60 paired problems, 30 handed in"),
    Variant(E.QUALITY, "over_threshold", FAIL, cn._over_threshold),
    Variant(E.QUALITY, "problem_dropped", INCONCLUSIVE, _qual_drop_problem),
    Variant(E.QUALITY, "scorer_differs", INCONCLUSIVE, cn.contract_item("scorer", "verl.gsm8k/2 sha256:0bb1")),
    # throughput
    Variant(E.THROUGHPUT, "base", PASS),
    Variant(E.THROUGHPUT, "too_few_rounds", INCONCLUSIVE, _tput_too_few_rounds,
            why="rounds 1..3 of the frozen 5 at every c"),
    Variant(E.THROUGHPUT, "over_budget", FAIL, cn._over_one_target),
    Variant(E.THROUGHPUT, "client_exit", INCONCLUSIVE, cn.tput_exit("bi1", "client", exit_code=1)),
    Variant(E.THROUGHPUT, "node_unrecorded", INCONCLUSIVE, _tput_node_unrecorded),
    # clean exit
    Variant(E.CLEAN_EXIT, "base", PASS),
    Variant(E.CLEAN_EXIT, "client_failed", FAIL, cn.process_exit("client", exit_code=1)),
    Variant(E.CLEAN_EXIT, "engine_core_missing", INCONCLUSIVE, _exit_arm_roles_missing,
            why="the BI=1 leg records no engine_core exit"),
    Variant(E.CLEAN_EXIT, "worker_signalled", FAIL,
            cn.process_exit("worker", end_state="signalled", exit_code=None, signal="SIGKILL")),
    # artifacts
    Variant(E.ARTIFACTS, "base", PASS),
    Variant(E.ARTIFACTS, "weights_named", FAIL, _art_weights_named, why="weights named 'Qwen3-8B', not by content"),
    Variant(E.ARTIFACTS, "torch_unrecorded", PASS, _unrecord("versions.torch"),
            why="(artifacts requires no must_record field: still passes; kept as a second passing start)"),
    Variant(E.ARTIFACTS, "nothing_ran", NOT_RUN, cn._nothing_ran),
]

BY_ID = {v.id: v for v in VARIANTS}
NON_PASSING = [v for v in VARIANTS if not v.passing]
BASES = [v for v in VARIANTS if v.name == "base"]


def of(item: EvidenceItem, *, passing: bool | None = None) -> list[Variant]:
    return [v for v in VARIANTS if v.item is item and (passing is None or v.passing is passing)]
