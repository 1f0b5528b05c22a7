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

from pydantic import BaseModel, ConfigDict

from tica.canary_legs import FAIL, INCONCLUSIVE, Canary, edit_meta
from tica.canary_legs import synthetic_identity  # noqa: F401 (tests read it here)
from tica.canary_legs import edit_json  # noqa: F401 (tests read it here)
from tica.canary_legs import load_json as _load
from tica.canary_legs import edit_jsonl, perturb_arrays  # noqa: F401 (tests read them here)
from tica.canary_legs import forward_arrays as _arrays  # noqa: F401
from tica.evidence import EvidenceItem
from tica.items.artifacts.canaries import nothing_ran as _nothing_ran  # noqa: F401 (tests read it here)
from tica.items.backward.canaries import gradcheck as _gradcheck  # noqa: F401 (tests read it here)
from tica.items.forward.canaries import (  # noqa: F401 (tests read them here)
    build_forward,
    drop_arrays_keep_digests,
    drop_step,
    flip_route,
    logged_only,
    perturb_arrays_keep_metrics,
)
from tica.items.forward.canaries import judged_arm
from tica.items.forward.canaries import needs_arm as _needs_arm
from tica.items.forward.canaries import needs_bi0_reference as _needs_bi0_reference
from tica.items.forward.canaries import needs_bi0_smoke as _needs_bi0_smoke
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
from tica.question import (
    Question,
    parse_question,
)
from tica.verdict import Verdict

E = EvidenceItem


# ---------------------------------------------------------------- questions


def default_questions() -> dict[EvidenceItem, Question]:
    """The questions the fixtures and the built-in canaries are built for."""
    common = {"noise_floor": 0.0, "invalid_leg_rule": "a leg whose receipts do not match the workload is retested"}
    # each item's room brings the question its canaries run under (tica.items.registry)
    raw = {item: resolve(room(item).canary_question) for item in EvidenceItem}
    return {item: parse_question({"item": item.value, **common, **q}) for item, q in raw.items()}


# ---------------------------------------------------------------- writing legs


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


# Each item's room brings its builder (tica.items.registry).
BUILDERS: dict[EvidenceItem, Callable[[Question, Path], list[Path]]] = {item: room(item).builder() for item in EvidenceItem}


# ---------------------------------------------------------------- mutations (planted errors)


def _recipe_edit(fn: Callable[[dict[str, Any]], None]) -> Callable[[Question | None, list[Path]], None]:
    def mutate(q: Question | None, paths: list[Path]) -> None:
        edit_json(paths[0], fn, None)
    return mutate


def recipe_combo(data: dict[str, Any], mode: str, arm: str) -> dict[str, Any]:
    return next(c for c in data["combos"] if c["mode"] == mode and c["arm"] == arm)


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


CANARIES: tuple[Canary, ...] = (
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


# ---------------------------------------------------------------- running canaries


# A criterion the question switches off cannot pass a wrong receipt either: its canary is not
# applicable (reported with the reason) rather than broken. Exact canary name -> why it is off
# under this question, or None (it runs); the forward's and the update's reasons are their rooms'
# (tica/items/<item>/canaries.py). Every other canary always runs.
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
