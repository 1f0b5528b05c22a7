"""Canaries: every criterion is shown able to fail before its verdicts count.

For each evidence item a passing receipt set is built for the question at hand (the same file
formats legs write), checked to pass, and then copied and mutated once per criterion with a
known, planted error. The judge must return `fail` (or `inconclusive` where the practice says
so). A criterion whose canary passes is reported as broken, and blocks acceptance.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from tica.canary_legs import FAIL, INCONCLUSIVE, NOT_PASS, Canary, edit_meta
from tica.canary_legs import synthetic_identity  # noqa: F401 (tests read it here)
from tica.canary_legs import edit_json  # noqa: F401 (tests read it here)
from tica.canary_legs import find_leg as _leg
from tica.canary_legs import leg_meta as _meta
from tica.canary_legs import load_json as _load
from tica.canary_legs import proc as _proc
from tica.canary_legs import write_leg as _write_leg
from tica.canary_legs import ckpt as _ckpt
from tica.canary_legs import edit_jsonl, perturb_arrays  # noqa: F401 (tests read them here)
from tica.canary_legs import forward_arrays as _arrays  # noqa: F401
from tica.canary_legs import forward_files as _forward_files
from tica.canary_legs import grad_rows as _grad_rows
from tica.canary_legs import jsonl as _jsonl
from tica.canary_legs import set_row as _set_row
from tica.evidence import EvidenceItem
from tica.items.artifacts.canaries import nothing_ran as _nothing_ran  # noqa: F401 (tests read it here)
from tica.items.update.canaries import as_bi0, drop_post_update_step, shift_post_forward  # noqa: F401 (tests read them here)
from tica.items.update.canaries import needs_rerun as _needs_rerun
from tica.items.update.canaries import update_as_bi0 as _update_as_bi0  # noqa: F401
from tica.items.clean_exit.canaries import arm_roles_missing as _arm_roles_missing  # noqa: F401 (tests read them here)
from tica.items.clean_exit.canaries import build_clean_exit, process_exit  # noqa: F401
from tica.items.quality.canaries import build_quality, contract_item  # noqa: F401 (tests read them here)
from tica.items.quality.canaries import drop_problem as _drop_problem  # noqa: F401
from tica.items.quality.canaries import over_threshold as _over_threshold  # noqa: F401
from tica.items.throughput.canaries import DEFAULT_PROMPTS, SYNTHETIC_PILOT, bench_json  # noqa: F401 (tests read them here)
from tica.items.throughput.canaries import build_throughput, scale_throughput, with_rounds  # noqa: F401
from tica.items.throughput.canaries import swap_slots, swap_work_times, tput_exit, tput_leg  # noqa: F401
from tica.items.throughput.canaries import needs_budget as _needs_budget
from tica.items.throughput.canaries import node_unrecorded as _node_unrecorded  # noqa: F401
from tica.items.throughput.canaries import over_one_target as _over_one_target  # noqa: F401
from tica.items.registry import resolve, room, rooms
from tica.messages import without_prefix
from tica.metrics import forward_metrics, step_content_digest
from tica.question import (
    ForwardCriteria,
    Question,
    parse_question,
)
from tica.seal import seal_leg
from tica.verdict import Verdict

E = EvidenceItem


# ---------------------------------------------------------------- questions


def default_questions() -> dict[EvidenceItem, Question]:
    """The questions the fixtures and the built-in canaries are built for."""
    common = {"noise_floor": 0.0, "invalid_leg_rule": "a leg whose receipts do not match the workload is retested"}
    raw = {
        E.FORWARD: {"name": "forward-bitwise", "compared": "rollout_probs_diff max/mean per step",
                    "computation": "verl calculate_debug_metrics over fixed token histories",
                    "pass_line": "BI=1 max = mean = 0 at every step",
                    "criteria": {"item": "forward", "min_steps": 5, "bi0_reference_mean": 0.01}},
        E.BACKWARD: {"name": "backward-reaches-master", "compared": "grad norm, params with grad",
                     "computation": "one backward per step", "pass_line": "finite grads reaching every master param",
                     "criteria": {"item": "backward"}},
    }
    # an item in a room of its own brings the question its canaries run under (tica.items.registry)
    raw = {item: raw[item] if item in raw else resolve(room(item).canary_question) for item in EvidenceItem}
    return {item: parse_question({"item": item.value, **common, **q}) for item, q in raw.items()}


# ---------------------------------------------------------------- writing legs


def build_forward(question: Question, dest: Path) -> list[Path]:
    c: ForwardCriteria = question.criteria  # type: ignore[assignment]
    steps = list(range(1, c.min_steps + 1))
    legs = []
    for arm, trainer, seed in (("bi1", "vllm_kernels", 1), ("bi0", "megatron", 2)):
        if arm not in c.arms:
            continue
        meta = _meta("forward", arm, trainer=trainer,
                     processes=[_proc("trainer", 4100 + seed), _proc("engine_core", 4200 + seed)])
        legs.append(_write_leg(dest / f"forward_{arm}", meta, _forward_files(arm, steps, c.bi0_reference_mean or 0.01, seed, _ckpt)))
    return legs


def build_backward(question: Question, dest: Path) -> list[Path]:
    legs = []
    for arm, trainer in (("bi1", "vllm_kernels"), ("bi0", "megatron")):
        meta = _meta("backward", arm, trainer=trainer, processes=[_proc("trainer", 5100)])
        legs.append(_write_leg(dest / f"backward_{arm}", meta, {"metrics.jsonl": _jsonl(_grad_rows(3))}))
    return legs


def recipe_dry_runs(optimizers: Sequence[str] = ("adamw", "muon")) -> dict[str, Any]:
    """A passing recipe-identity receipt: BI=1 unchanged, BI=0 differs only by names, paths, new switches."""
    combos = []
    for mode in ("dry_run", "compose"):
        for opt in optimizers:
            bi1 = (f"python3 -m verl.trainer.main_ppo --config-name=nemotron_h_grpo actor.optim.name={opt} "
                   "trainer.project_name=nemotron trainer.experiment_name=ds4-exact "
                   "trainer.default_local_dir=/ckpt/runs/ds4-exact rollout.name=vllm actor.strategy=vllm_kernels")
            bi0_orig = (f"python3 -m verl.trainer.main_ppo --config-name=nemotron_h_grpo actor.optim.name={opt} "
                        "trainer.project_name=nemotron trainer.experiment_name=baseline "
                        "trainer.default_local_dir=/ckpt/runs/baseline rollout.name=vllm actor.strategy=megatron")
            bi0_new = (f"VLLM_BATCH_INVARIANT=0 python3 -m verl.trainer.main_ppo --config-name=nemotron_h_grpo "
                       f"actor.optim.name={opt} trainer.project_name=nemotron trainer.experiment_name=ds4-exact_bi0 "
                       "trainer.default_local_dir=/ckpt/runs/ds4-exact_bi0 rollout.name=vllm actor.strategy=megatron "
                       "+actor.megatron.qat=true")
            combos.append({"mode": mode, "optimizer": opt, "arm": "bi1",
                           "before": {"command": bi1, "rc": 0}, "after": {"command": bi1, "rc": 0}})
            combos.append({"mode": mode, "optimizer": opt, "arm": "bi0",
                           "before": {"command": bi0_orig, "rc": 0}, "after": {"command": bi0_new, "rc": 0}})
    return {"schema": "tica.recipe_dry_runs/1", "recipe": "recipes/nemotron_h/run_grpo.sh", "combos": combos}


def build_recipe(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "recipe_dry_runs.json"
    path.write_text(json.dumps(recipe_dry_runs(), indent=1))
    return path


_OLD_LAYOUT: dict[EvidenceItem, Callable[[Question, Path], list[Path]]] = {
    E.FORWARD: build_forward, E.BACKWARD: build_backward,
}
# An item in a room of its own brings its builder (tica.items.registry); the others' are above.
BUILDERS: dict[EvidenceItem, Callable[[Question, Path], list[Path]]] = {
    item: _OLD_LAYOUT[item] if item in _OLD_LAYOUT else room(item).builder() for item in EvidenceItem}


# ---------------------------------------------------------------- mutations (planted errors)


def flip_route(leg: Path, step: int) -> None:
    """A routing flip the logprobs do not show: one token sent to another expert at one MoE layer
    on the trainer's side, every logprob (and so every logged metric) unchanged."""
    from tica.routing import flip_one_route

    path = leg / "arrays" / f"step_{step:04d}.npz"
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    data["trainer_experts"] = flip_one_route(data["trainer_experts"], token=5, layer=1, n_experts=8)
    np.savez(path, **data)
    seal_leg(leg)


def _recipe_edit(fn: Callable[[dict[str, Any]], None]) -> Callable[[Question | None, list[Path]], None]:
    def mutate(q: Question | None, paths: list[Path]) -> None:
        edit_json(paths[0], fn, None)
    return mutate


def recipe_combo(data: dict[str, Any], mode: str, arm: str) -> dict[str, Any]:
    return next(c for c in data["combos"] if c["mode"] == mode and c["arm"] == arm)


def judged_arm(q: Question) -> str:
    """The forward arm whose leg must have run under `q` (BI=1 when judged, else BI=0)."""
    c: ForwardCriteria = q.criteria  # type: ignore[assignment]
    return "bi1" if "bi1" in c.arms else "bi0"


def drop_arm(arm: str) -> Callable[[Question, list[Path]], None]:
    """The receipt set without any leg of `arm` (the list is edited in place)."""
    def mutate(q: Question, legs: list[Path]) -> None:
        legs[:] = [p for p in legs if _load(p / "leg.json")["arm"] != arm]
    return mutate


def _gradcheck(passed: bool, caught: bool) -> Callable[[Question, list[Path]], None]:
    """The producer's gradient check as vllm_kernels records it, planted on the BI=1 leg."""
    ops = ("linear", "rms_norm", "fused_add_rms_norm", "rotary", "silu_and_mul", "attention", "logprob")

    def mutate(q: Question, legs: list[Path]) -> None:
        leg = _leg(legs, arm="bi1")
        edit_jsonl(leg / "metrics.jsonl", _set_row(0, **{"tica/gradcheck_pass": passed,
                                                         "tica/gradcheck_controls_caught": {op: caught for op in ops}}), leg)
    return mutate


def _bi0_grad_norm(**kv: Any) -> Callable[[Question, list[Path]], None]:
    def mutate(q: Question, legs: list[Path]) -> None:
        leg = _leg(legs, arm="bi0")

        def f(rows: list[dict[str, Any]]) -> None:
            rows[1].pop("actor/grad_norm", None)
            rows[1].update(kv)
        edit_jsonl(leg / "metrics.jsonl", f, leg)
    return mutate


def unrecord(q: Question, legs: list[Path]) -> None:
    """The first field the question requires, removed from one judged leg's leg.json."""
    parts = q.must_record[0].split(".")

    def f(m: dict[str, Any]) -> None:
        node = m
        for part in parts[:-1]:
            node = node.get(part) or {}
        node.pop(parts[-1], None)
    dirs = [p for p in legs if p.is_dir()]
    if q.item is E.FORWARD:
        dirs = [p for p in dirs if _load(p / "leg.json")["arm"] == judged_arm(q)]
    edit_meta(dirs[0], f)


def _needs_bi0_reference(question: Question | None) -> str | None:
    c = getattr(question, "criteria", None)
    if isinstance(c, ForwardCriteria) and c.bi0_reference_mean is None:
        return "the question names no BI=0 reference: the magnitude is reported, not judged"
    return None


def _first_step_dropped(q: Question, legs: Sequence[Path]) -> None:
    """The judged arm's first step left out of metrics and arrays (a receipt that begins late)."""
    leg = _leg(legs, arm=judged_arm(q))
    first = json.loads((leg / "metrics.jsonl").read_text().splitlines()[0])["step"]
    drop_step(leg, first)


def _arrays_renamed(q: Question, legs: Sequence[Path]) -> None:
    """Step 1's arrays under a name the judge does not read (step_1.npz), its logged numbers left."""
    arm = judged_arm(q)
    leg = _leg(legs, arm=arm)
    if arm == "bi1":  # the attack: arrays that show a difference, logged numbers that do not
        perturb_arrays(leg, 1)
        edit_jsonl(leg / "metrics.jsonl", _set_row(0, **{"training/rollout_probs_diff_max": 0.0,
                                                         "training/rollout_probs_diff_mean": 0.0,
                                                         "training/rollout_probs_diff_std": 0.0,
                                                         "rollout_corr/k3_kl": 0.0,
                                                         "tica/logprob_abs_diff_max": 0.0,
                                                         "tica/n_bitwise_diff": 0}), leg)
    (leg / "arrays" / "step_0001.npz").rename(leg / "arrays" / "step_1.npz")
    seal_leg(leg)


def _arrays_left_out(q: Question, legs: Sequence[Path]) -> None:
    """One step's arrays deleted while the others keep theirs (judged from two sources)."""
    leg = _leg(legs, arm=judged_arm(q))
    (leg / "arrays" / "step_0002.npz").unlink()
    seal_leg(leg)


def _placeholder_arrays(q: Question, legs: Sequence[Path]) -> None:
    """Every scored logprob 0.0 on both sides (a torch.zeros placeholder), metrics recomputed."""
    leg = _leg(legs, arm="bi1")
    path = leg / "arrays" / "step_0001.npz"
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    for key in ("trainer_logprobs", "rollout_logprobs", "decode_logprobs"):
        if key in data:
            data[key] = np.zeros_like(data[key])
    np.savez(path, **data)
    m = forward_metrics(data["trainer_logprobs"], data["rollout_logprobs"])
    edit_jsonl(leg / "metrics.jsonl", lambda rows: [({**row, **m} if row["step"] == 1 else row) for row in rows], leg)


CANARIES: tuple[Canary, ...] = (
    # forward
    Canary("forward.bi1_max_zero", E.FORWARD, "BI=1 max = 0 at every step (logged metrics, as verl writes them)",
           FAIL, lambda q, legs: logged_only(_leg(legs, arm="bi1"), 3, **{"training/rollout_probs_diff_max": 0.0078125})),
    Canary("forward.bi1_mean_zero", E.FORWARD, "BI=1 mean = 0 at every step (logged metrics)", FAIL,
           lambda q, legs: logged_only(_leg(legs, arm="bi1"), 1, **{"training/rollout_probs_diff_mean": 1e-9})),
    Canary("forward.bi1_bitwise_arrays", E.FORWARD, "BI=1 logprobs bitwise equal (recomputed from arrays)", FAIL,
           lambda q, legs: perturb_arrays(_leg(legs, arm="bi1"), 2)),
    Canary("forward.route_flip", E.FORWARD, "BI=1 routes the same on both sides (a MoE's experts per token and layer)",
           FAIL, lambda q, legs: flip_route(_leg(legs, arm="bi1"), 2)),
    Canary("forward.arrays_vs_metrics", E.FORWARD, "recompute from arrays; a receipt contradicting itself is no pass",
           NOT_PASS, lambda q, legs: perturb_arrays_keep_metrics(_leg(legs, arm=judged_arm(q)), 1)),
    Canary("forward.missing_step", E.FORWARD, "a missing step is not a pass", INCONCLUSIVE,
           lambda q, legs: drop_step(_leg(legs, arm=judged_arm(q)), 2)),
    Canary("forward.too_few_steps", E.FORWARD, "min_steps present", INCONCLUSIVE,
           lambda q, legs: drop_step(_leg(legs, arm=judged_arm(q)), None)),
    Canary("forward.first_step", E.FORWARD, "steps start where the run began (a missing first step is missing)",
           INCONCLUSIVE, _first_step_dropped),
    Canary("forward.arrays_named", E.FORWARD, "every file in arrays/ is a step's arrays the judge reads",
           INCONCLUSIVE, _arrays_renamed),
    Canary("forward.arrays_whole", E.FORWARD, "one receipt, one source: no step judged from logged numbers beside "
           "steps judged from arrays", INCONCLUSIVE, _arrays_left_out),
    Canary("forward.placeholder_arrays", E.FORWARD, "arrays that hold one constant are no measurement", INCONCLUSIVE,
           _placeholder_arrays),
    Canary("forward.bi0_magnitude", E.FORWARD, "BI=0 mean has the reference's magnitude", FAIL,
           lambda q, legs: logged_only(_leg(legs, arm="bi0"), 2, scale_mean=200.0)),
    Canary("forward.arm_ran", E.FORWARD, "the judged arm's leg ran (BI=1; BI=0 in a BI=0 smoke question)",
           frozenset({Verdict.NOT_RUN}), lambda q, legs: drop_arm(judged_arm(q))(q, legs)),
    Canary("forward.bi0_grad_norm_finite", E.FORWARD, "BI=0 smoke: grad norm finite", FAIL,
           _bi0_grad_norm(**{"actor/grad_norm": float("nan")})),
    Canary("forward.bi0_grad_norm_recorded", E.FORWARD, "BI=0 smoke: grad norm recorded at every step",
           INCONCLUSIVE, _bi0_grad_norm()),
    # backward
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
           FAIL, _gradcheck(passed=False, caught=True)),
    Canary("backward.gradient_check_controls", E.BACKWARD,
           "a gradient check whose planted errors were not detected is no evidence", INCONCLUSIVE,
           _gradcheck(passed=True, caught=False)),
    # the items in rooms of their own: their planted errors (tica/items/<item>/canaries.py)
    *(c for r in rooms() for c in r.room_canaries()),
    # every item: the fields the question requires are recorded
    *(Canary(f"{item.value}.must_record", item, "a field the question requires is recorded (unknown is no pass)",
             INCONCLUSIVE, unrecord) for item in EvidenceItem),
    # recipe identity
    Canary("recipe.bi1_identical", None, "BI=1 command byte-identical", FAIL,
           _recipe_edit(lambda d: recipe_combo(d, "dry_run", "bi1")["after"].update(
               command=recipe_combo(d, "dry_run", "bi1")["after"]["command"] + " actor.ppo_micro_batch_size=4"))),
    Canary("recipe.bi0_only_names_paths_switches", None, "BI=0 differs only in names, paths, new switches", FAIL,
           _recipe_edit(lambda d: recipe_combo(d, "dry_run", "bi0")["after"].update(
               command=recipe_combo(d, "dry_run", "bi0")["after"]["command"].replace("rollout.name=vllm", "rollout.name=sglang")))),
    Canary("recipe.compose_rc", None, "every compose combination returns rc 0", FAIL,
           _recipe_edit(lambda d: recipe_combo(d, "compose", "bi0")["after"].update(rc=1))),
)


def drop_step(leg: Path, step: int | None) -> None:
    """Remove one step (or, with None, the last step) from metrics and arrays."""
    rows = [json.loads(l) for l in (leg / "metrics.jsonl").read_text().splitlines() if l.strip()]
    gone = step if step is not None else rows[-1]["step"]
    (leg / "arrays" / f"step_{gone:04d}.npz").unlink(missing_ok=True)
    edit_jsonl(leg / "metrics.jsonl", lambda rs: [r for r in rs if r["step"] != gone], leg)


def drop_arrays_keep_digests(forward_dir: Path, reseal: Path) -> None:
    """A forward receipt logged only, as TICA's producers log it: each step's content digest
    (tica/content_sha256) recorded from its arrays, the arrays left out."""
    arrays = forward_dir / "arrays"

    def f(rows: list[dict[str, Any]]) -> None:
        for r in rows:
            path = arrays / f"step_{r['step']:04d}.npz"
            if path.is_file():
                with np.load(path) as z:
                    r["tica/content_sha256"] = step_content_digest(z["token_ids"], z["seq_lens"],
                                                                   z["trainer_logprobs"], z["rollout_logprobs"])
    edit_jsonl(forward_dir / "metrics.jsonl", f, reseal)
    shutil.rmtree(arrays, ignore_errors=True)
    seal_leg(reseal)


def logged_only(leg: Path, step: int, scale_mean: float | None = None, **kv: Any) -> None:
    """A receipt logged only (no arrays, each step's content digest kept), with one step's logged values planted."""
    drop_arrays_keep_digests(leg, leg)

    def f(rows: list[dict[str, Any]]) -> None:
        for r in rows:
            if r["step"] == step:
                r.update(kv)
                if scale_mean is not None:  # a probability difference stays in [0, 1]
                    r["training/rollout_probs_diff_mean"] = min(1.0, r["training/rollout_probs_diff_mean"] * scale_mean)
                mean, mx = r.get("training/rollout_probs_diff_mean"), r.get("training/rollout_probs_diff_max")
                if isinstance(mean, float) and isinstance(mx, float) and mean > mx:
                    r["training/rollout_probs_diff_max"] = mean  # a max is never below its mean
    edit_jsonl(leg / "metrics.jsonl", f, leg)


def perturb_arrays_keep_metrics(leg: Path, step: int) -> None:
    path = leg / "arrays" / f"step_{step:04d}.npz"
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    data["rollout_logprobs"] = data["rollout_logprobs"] - np.float32(0.25)
    np.savez(path, **data)
    seal_leg(leg)


# ---------------------------------------------------------------- running canaries


# A criterion the question switches off cannot pass a wrong receipt either: its canary is not
# applicable (reported with the reason) rather than broken. Exact canary name -> why it is off
# under this question, or None (it runs). Every other canary always runs.
def _needs_arm(arm: str) -> Callable[[Question | None], str | None]:
    def why(question: Question | None) -> str | None:
        c = getattr(question, "criteria", None)
        if isinstance(c, ForwardCriteria) and arm not in c.arms:
            return f"the question judges {list(c.arms)}, not {arm}"
        return None
    return why


def _needs_bi0_smoke(question: Question | None) -> str | None:
    c = getattr(question, "criteria", None)
    if isinstance(c, ForwardCriteria) and not c.bi0_smoke:
        return ("the question judges BI=1: BI=0's grad norm is judged where recorded, required only in a "
                "BI=0 smoke question, arms [bi0]")
    return None


def _needs_must_record(question: Question | None) -> str | None:
    if question is not None and not question.must_record:
        return "the question requires no leg.json field to be recorded: must_record is empty"
    return None


SWITCHED_OFF: dict[str, Callable[[Question | None], str | None]] = {
    "forward.bi1_max_zero": _needs_arm("bi1"),
    "forward.bi1_mean_zero": _needs_arm("bi1"),
    "forward.bi1_bitwise_arrays": _needs_arm("bi1"),
    "forward.route_flip": _needs_arm("bi1"),
    "forward.bi0_magnitude": lambda q: _needs_arm("bi0")(q) or _needs_bi0_reference(q),
    "forward.placeholder_arrays": _needs_arm("bi1"),
    "forward.bi0_grad_norm_finite": _needs_arm("bi0"),
    "forward.bi0_grad_norm_recorded": _needs_bi0_smoke,
    "throughput.target_c_over_budget": _needs_budget,
    **{f"update.rerun_{what}": _needs_rerun for what in ("grad_norm", "weights", "recorded")},
    **{f"{item.value}.must_record": _needs_must_record for item in EvidenceItem},
}


def switched_off(canary: "Canary", question: Question | None) -> str | None:
    why = SWITCHED_OFF.get(canary.name)
    return why(question) if why is not None else None


class CanaryResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    item: str
    rule: str
    expected: tuple[str, ...]
    got: str
    broken: bool
    detail: str = ""
    not_applicable: bool = False


def _run_one(canary: Canary, base: Sequence[Path], root: Path, judge_fn: Callable[..., Any], question: Question | None) -> CanaryResult:
    work = root / canary.name
    copies = []
    for p in base:
        dst = work / p.name
        if p.is_dir():
            shutil.copytree(p, dst)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dst)
        copies.append(dst)
    try:
        canary.mutate(question, copies)
        copies = [c for c in copies if c.exists()]  # a canary may leave legs out of the set handed in
        result = judge_fn(question, copies)
        got, detail = result.verdict, (result.reasons[0] if result.reasons else result.summary)
    except Exception as err:  # noqa: BLE001 - a judge that crashes on a canary is broken, not passing
        got, detail = None, f"judge raised {type(err).__name__}: {err}"
    broken = got not in canary.expect
    return CanaryResult(name=canary.name, item=canary.item.value if canary.item else "recipe_identity",
                        rule=canary.rule, expected=tuple(sorted(v.value for v in canary.expect)),
                        got=got.value if got is not None else "error", broken=broken, detail=detail)


def run_canaries(
    questions: Mapping[EvidenceItem, Question] | None = None,
    workdir: str | Path | None = None,
    judge_fn: Callable[[EvidenceItem, Question, Sequence[Path]], Any] | None = None,
    recipe_fn: Callable[[Path], Any] | None = None,
    only: Sequence[str] | None = None,
) -> list[CanaryResult]:
    """Run every canary (or those whose name starts with one of `only`). A canary whose judge
    does not return the expected verdict, or whose passing baseline does not pass, is `broken`."""
    from tica.judges import judge_criteria as default_judge
    from tica.judges.recipe_identity import judge_recipe_identity

    judge_fn = judge_fn or default_judge
    recipe_fn = recipe_fn or judge_recipe_identity
    questions = {**default_questions(), **(questions or {})}
    selected = [c for c in CANARIES if not only or any(c.name.startswith(o) for o in only)]
    results: list[CanaryResult] = []
    with tempfile.TemporaryDirectory(prefix="tica-canaries-", dir=workdir) as tmp:
        root = Path(tmp)
        for item in [*EvidenceItem, None]:
            group = [c for c in selected if c.item == item]
            if not group:
                continue
            key = item.value if item else "recipe_identity"
            if item is None:
                base = [build_recipe(root / key / "base")]
                question = None
                run = lambda q, paths: recipe_fn(paths[0])  # noqa: E731
            else:
                question = questions[item]
                base = BUILDERS[item](question, root / key / "base")
                run = lambda q, paths, item=item: judge_fn(item, q, paths)  # noqa: E731
            off = {c.name: why for c in group if (why := switched_off(c, question))}
            results += [CanaryResult(name=c.name, item=key, rule=c.rule, expected=tuple(sorted(v.value for v in c.expect)),
                                     got="not applicable", broken=False, detail=off[c.name], not_applicable=True)
                        for c in group if c.name in off]
            group = [c for c in group if c.name not in off]
            if not group:
                continue
            baseline = run(question, base)
            if baseline.verdict is not Verdict.PASS:
                why = f"the passing receipt set is {baseline.verdict.value} under this question: " + \
                      "; ".join(without_prefix(r) for r in baseline.reasons[:3])
                results += [CanaryResult(name=c.name, item=key, rule=c.rule,
                                         expected=tuple(sorted(v.value for v in c.expect)), got="baseline " +
                                         baseline.verdict.value, broken=True, detail=why) for c in group]
                continue
            results += [_run_one(c, base, root / key, run, question) for c in group]
    return results


def broken(results: Sequence[CanaryResult]) -> list[CanaryResult]:
    return [r for r in results if r.broken]
