"""Canaries: every criterion is shown able to fail before its verdicts count.

For each evidence item a passing receipt set is built for the question at hand (the same file
formats legs write), checked to pass, and then copied and mutated once per criterion with a
known, planted error. The judge must return `fail` (or `inconclusive` where the practice says
so). A criterion whose canary passes is reported as broken, and blocks acceptance.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from tica.canary_legs import FAIL, INCONCLUSIVE, Canary, edit_meta
from tica.canary_legs import synthetic_identity  # noqa: F401 (tests read it here)
from tica.canary_legs import dump_json as _dump
from tica.canary_legs import leg_meta as _meta
from tica.canary_legs import load_json as _load
from tica.canary_legs import proc as _proc
from tica.canary_legs import write_leg as _write_leg
from tica.canary_legs import leg_where as _leg
from tica.canary_legs import edit_jsonl, perturb_arrays  # noqa: F401 (tests read them here)
from tica.canary_legs import forward_arrays as _arrays  # noqa: F401
from tica.canary_legs import jsonl as _jsonl
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
from tica.items.registry import resolve, room, rooms
from tica.messages import without_prefix
from tica.pairing import crossed
from tica.question import (
    QualityCriteria,
    Question,
    ThroughputCriteria,
    parse_question,
)
from tica.seal import seal_leg
from tica.verdict import Verdict

E = EvidenceItem
DEFAULT_PROMPTS = {1: 8, 8: 32, 32: 128, 64: 256}
# Output tok/s of BI=0 at each concurrency on one H200 (8192 in / 1024 out), for realistic fixtures.
_BASE_TPUT = {1: 151.2, 8: 1013.5, 32: 2871.4, 64: 4102.9}


# ---------------------------------------------------------------- questions

# The canaries' throughput question freezes a reviewed statistical basis: without one the judge
# reports a budget but never declares it passed, and the canaries need a passing baseline. Its
# "pilot" is the builder below (every round under the budget by construction), named by this
# digest, not a measured pilot: a real question's basis comes from `tica plan throughput`.
SYNTHETIC_PILOT = "sha256:" + hashlib.sha256(b"tica.canaries.build_throughput: synthetic rounds, no pilot").hexdigest()
DEFAULT_ROUNDS = 5  # the fewest crossed rounds with which the sign test can pass at alpha 0.05 (0.5^5 = 0.031)


def sign_test_basis(rounds: int, alpha: float = 0.05) -> dict[str, Any]:
    """A sign-test basis (question criteria JSON) for the builder's synthetic rounds."""
    return {"test": "sign_test_median", "alpha": alpha, "power": 0.8, "rounds": rounds,
            "pilot_digests": [SYNTHETIC_PILOT],
            "notes": ["synthetic: tica.canaries builds every round under the budget; not planned from a pilot"]}


def with_rounds(question: Question, rounds: int) -> Question:
    """The throughput question over `rounds` crossed rounds; a frozen basis follows (its rounds
    are the question's repeats)."""
    data = question.model_dump(mode="json")
    data.update(repeats=rounds, pairing_order=crossed(rounds, question.pairing_order[0]))
    if data["criteria"].get("statistical_basis") is not None:
        data["criteria"]["statistical_basis"]["rounds"] = rounds
    return parse_question(data)


def default_questions() -> dict[EvidenceItem, Question]:
    """The questions the fixtures and the built-in canaries are built for."""
    common = {"noise_floor": 0.0, "invalid_leg_rule": "a leg whose receipts do not match the workload is retested"}
    raw = {
        E.QUALITY: {"name": "gsm8k-30-greedy", "compared": "accuracy per problem", "computation": "paired 2x2",
                    "pass_line": "|score diff| <= 3.34 points",
                    "criteria": {"item": "quality", "threshold_points": 3.34, "expected_problems": 30}},
        E.THROUGHPUT: {"name": "rust-bench-8k-1k", "compared": "output tok/s per concurrency",
                       "computation": "vllm bench serve, random 8192/1024, ignore EOS",
                       "pass_line": "the one-sided 0.95 upper bound of the median per-round paired loss (exact "
                                    "sign test) is under the budget at every target c",
                       "repeats": DEFAULT_ROUNDS, "pairing_order": crossed(DEFAULT_ROUNDS),
                       "criteria": {"item": "throughput", "num_prompts": DEFAULT_PROMPTS, "warmups": 1,
                                    "formula": "median_per_round_paired_loss",
                                    "budget": {1: 0.10, 8: 0.10, 32: 0.15, 64: 0.15},
                                    "statistical_basis": sign_test_basis(DEFAULT_ROUNDS)}},
    }
    # an item in a room of its own brings the question its canaries run under (tica.items.registry)
    raw = {item: raw[item] if item in raw else resolve(room(item).canary_question) for item in EvidenceItem}
    return {item: parse_question({"item": item.value, **common, **q}) for item, q in raw.items()}


# ---------------------------------------------------------------- writing legs


def _contract() -> dict[str, Any]:
    return {"dataset_version": "openai/gsm8k@main:test[:30] sha256:3f1c2a", "prompt_template":
            "qwen3-chat sha256:9b1e", "thinking_mode": "off",
            "sampling": {"temperature": 0, "top_p": 1, "top_k": -1, "seed": 0, "n": 1, "stop": []},
            "repeats": 1, "scorer": "tica.scorer.boxed/1 sha256:77aa", "length_cap": 1024}


def build_quality(question: Question, dest: Path) -> list[Path]:
    c: QualityCriteria = question.criteria  # type: ignore[assignment]
    n = c.expected_problems or 30
    rng = np.random.default_rng(7)
    base = rng.random(n) < 0.8
    # One problem flips each way: the scores are equal, the per-problem results are not.
    right = np.flatnonzero(base)
    flips = {"bi1": {int(right[0])}, "bi0": {int(right[1])}}
    legs = []
    for arm in ("bi1", "bi0"):
        rows = []
        for i in range(n):
            correct = bool(base[i]) != (i in flips[arm])
            rows.append({"problem_id": f"gsm8k-test-{i:04d}", "correct": correct,
                         "prompt_hash": f"sha256:{i:064x}", "response": f"... so the answer is \\boxed{{{i * 7}}}",
                         "extracted": str(i * 7 if correct else i * 7 + 1), "truncated": i == 11})
        meta = _meta("quality", arm, processes=[_proc("client", 7100), _proc("engine_core", 7101)])
        legs.append(_write_leg(dest / f"quality_{arm}", meta, {"results.jsonl": _jsonl(rows),
                                                               "contract.json": json.dumps(_contract(), indent=1)}))
    return legs


def bench_json(arm: str, round_no: int, slot: int, c: int, prompts: int, input_len: int, output_len: int,
               output_throughput: float, run: int = 0) -> dict[str, Any]:
    """A `vllm bench serve --save-result --metadata arm=.. round=.. slot=..` result, field for field.
    `run` numbers the run: two runs never measure the same time to first token to the bit, nor
    end at the same second (the judge reads a result equal to another as one run counted twice)."""
    out_tokens = prompts * output_len
    duration = out_tokens / output_throughput
    tpot = 1000.0 * c / output_throughput if c > 1 else 1000.0 / output_throughput
    ttft = 310.0 * (1 + c / 16) + 0.125 * run
    res: dict[str, Any] = {
        "date": f"20261129-{10 + run // 60:02d}{run % 60:02d}50", "endpoint_type": "vllm", "backend": "vllm", "label": None,
        "model_id": "/ckpt/qwen3-8b", "tokenizer_id": "/ckpt/qwen3-8b", "num_prompts": prompts,
        "arm": arm, "round": str(round_no), "slot": str(slot),
        "request_rate": "inf", "burstiness": 1.0, "max_concurrency": c,
        "duration": duration, "completed": prompts, "failed": 0,
        "total_input_tokens": prompts * input_len, "total_output_tokens": out_tokens,
        "request_throughput": prompts / duration, "request_goodput": None,
        "output_throughput": output_throughput,
        "total_token_throughput": (prompts * input_len + out_tokens) / duration,
        "max_output_tokens_per_s": output_throughput * 1.08, "max_concurrent_requests": c,
    }
    for metric, mean in (("ttft", ttft), ("tpot", tpot), ("itl", tpot), ("e2el", ttft + tpot * (output_len - 1))):
        res.update({f"mean_{metric}_ms": mean, f"median_{metric}_ms": mean * 0.99,
                    f"std_{metric}_ms": mean * 0.03, f"p99_{metric}_ms": mean * 1.12})
    return res


def build_throughput(question: Question, dest: Path, loss: Mapping[int, float] | None = None) -> list[Path]:
    c: ThroughputCriteria = question.criteria  # type: ignore[assignment]
    budget = c.budget or {}
    legs = []
    minute = 0
    for conc in c.concurrencies:
        prompts = (c.num_prompts or {}).get(conc) or DEFAULT_PROMPTS.get(conc, 4 * conc)
        base = _BASE_TPUT.get(conc, 64.0 * conc)
        target = loss.get(conc) if loss else budget.get(conc, 0.1) * 0.4
        for r in range(1, question.repeats + 1):
            arms = question.round_arms(r)
            jitter = 1.0 + 0.01 * ((r % 3) - 1) + 0.0001 * r  # no two rounds measure the same
            tputs = {"bi0": base * jitter, "bi1": base * jitter * (1 - target)}
            for slot, arm in enumerate(arms, 1):
                minute += 1
                started = f"2026-11-29T{10 + minute // 60:02d}:{minute % 60:02d}:00+00:00"
                meta = _meta("throughput", arm, round=r, slot=slot, concurrency=conc, started_at=started,
                             ended_at=started.replace(":00+", ":50+"),
                             processes=[_proc("client", 8000 + minute), _proc("api_server", 8100 + minute),
                                        _proc("engine_core", 8200 + minute), _proc("worker", 8300 + minute)])
                meta["resolved_config"].update(num_prompts=prompts, num_warmups=c.warmups, input_len=c.input_len,
                                               output_len=c.output_len, ignore_eos=c.ignore_eos)
                bench = bench_json(arm, r, slot, conc, prompts, c.input_len, c.output_len, tputs[arm], run=minute)
                legs.append(_write_leg(dest / f"tput_c{conc:03d}_r{r}_s{slot}_{arm}", meta,
                                       {"bench.json": json.dumps(bench, indent=2)}))
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
    E.QUALITY: build_quality,
    E.THROUGHPUT: build_throughput,
}
# An item in a room of its own brings its builder (tica.items.registry); the others' are above.
BUILDERS: dict[EvidenceItem, Callable[[Question, Path], list[Path]]] = {
    item: _OLD_LAYOUT[item] if item in _OLD_LAYOUT else room(item).builder() for item in EvidenceItem}


# ---------------------------------------------------------------- mutations (planted errors)


def edit_json(path: Path, fn: Callable[[dict[str, Any]], None], reseal: Path | None) -> None:
    data = _load(path)
    fn(data)
    _dump(path, data)
    if reseal is not None:
        seal_leg(reseal)


def tput_leg(legs: Sequence[Path], arm: str, c: int, r: int) -> Path:
    return _leg(legs, item="throughput", arm=arm, concurrency=c, round=r)


def _bench(legs: Sequence[Path], arm: str, c: int, r: int, **kv: Any) -> None:
    leg = tput_leg(legs, arm, c, r)
    edit_json(leg / "bench.json", lambda d: d.update(kv), leg)


def scale_throughput(leg: Path, factor: float) -> None:
    """A faster (factor > 1) or slower leg, honestly recorded: the same counts over a shorter or
    longer duration, every rate vllm bench serve derives from them moving with it."""
    edit_json(leg / "bench.json", lambda d: d.update(
        duration=d["duration"] / factor,
        **{k: d[k] * factor for k in ("output_throughput", "request_throughput", "total_token_throughput")
           if d.get(k) is not None}), leg)


def _scale_bi1(legs: Sequence[Path], c: int, factor: float, rounds: Sequence[int]) -> None:
    for r in rounds:
        scale_throughput(tput_leg(legs, "bi1", c, r), factor)


def _targets(q: Question) -> list[int]:
    c: ThroughputCriteria = q.criteria  # type: ignore[assignment]
    return sorted((c.budget or {}).keys()) or list(c.concurrencies)


def _over_one_target(q: Question, legs: Sequence[Path]) -> None:
    c: ThroughputCriteria = q.criteria  # type: ignore[assignment]
    target = _targets(q)[-1]
    b = (c.budget or {}).get(target, 0.1)
    # Push this c to twice its budget; the others stay well under, so their average is under too.
    want = min(2 * b + 0.05, 0.9)
    now = 1 - _load(tput_leg(legs, "bi1", target, 1) / "bench.json")["output_throughput"] / \
        _load(tput_leg(legs, "bi0", target, 1) / "bench.json")["output_throughput"]
    _scale_bi1(legs, target, (1 - want) / (1 - now), range(1, q.repeats + 1))


def swap_slots(q: Question, legs: Sequence[Path]) -> None:
    c = _targets(q)[0]
    for arm in ("bi1", "bi0"):
        leg = tput_leg(legs, arm, c, 1)
        slot = _load(leg / "leg.json")["slot"]
        new = 3 - slot
        edit_json(leg / "bench.json", lambda d: d.update(slot=str(new)), None)
        edit_meta(leg, lambda m: m.update(slot=new))
    # Keep the clock consistent with the claimed slots: only the frozen order is violated.
    a, b = tput_leg(legs, "bi1", c, 1), tput_leg(legs, "bi0", c, 1)
    ta, tb = _load(a / "leg.json")["started_at"], _load(b / "leg.json")["started_at"]
    edit_meta(a, lambda m: m.update(started_at=tb))
    edit_meta(b, lambda m: m.update(started_at=ta))


def _tiers(q: Question, legs: Sequence[Path]) -> None:
    c = _targets(q)[0]
    crit: ThroughputCriteria = q.criteria  # type: ignore[assignment]
    # BI=0 lands in a slow tier in one round; BI=1 follows so the loss itself stays under budget.
    for arm in ("bi0", "bi1"):
        leg = tput_leg(legs, arm, c, 2)
        f = 1 / (crit.tier_ratio + 0.25)
        edit_json(leg / "bench.json", lambda d: d.update(output_throughput=d["output_throughput"] * f,
                                                         duration=d["duration"] / f), leg)


def _confounder(q: Question, legs: Sequence[Path], item: str) -> None:
    for leg in legs:
        meta = _load(leg / "leg.json")
        if meta["item"] == item and meta["arm"] == "bi0":
            edit_meta(leg, lambda m: m["resolved_config"].update(enable_prefix_caching=True))


def _drop_problem(legs: Sequence[Path]) -> None:
    leg = _leg(legs, arm="bi0")
    edit_jsonl(leg / "results.jsonl", lambda rows: rows[:-1], leg)


def _over_threshold(q: Question, legs: Sequence[Path]) -> None:
    crit: QualityCriteria = q.criteria  # type: ignore[assignment]
    leg = _leg(legs, arm="bi1")
    n = len((leg / "results.jsonl").read_text().splitlines())
    k = int(math.floor(crit.threshold_points * n / 100)) + 1

    def flip(rows: list[dict[str, Any]]) -> None:
        done = 0
        for row in rows:
            if row["correct"] and done < k:
                row["correct"], done = False, done + 1
    edit_jsonl(leg / "results.jsonl", flip, leg)


def contract_item(key: str, value: Any) -> Callable[[Question, list[Path]], None]:
    def mutate(q: Question, legs: list[Path]) -> None:
        leg = _leg(legs, arm="bi0")
        def f(d: dict[str, Any]) -> None:
            if key.startswith("sampling."):
                d["sampling"][key.split(".", 1)[1]] = value
            else:
                d[key] = value
        edit_json(leg / "contract.json", f, leg)
    return mutate


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


def tput_exit(arm: str, role: str, **kv: Any) -> Callable[[Question, list[Path]], None]:
    """One throughput leg at the first target c whose `role` process did not end cleanly (or, with
    no kv, whose exits were not recorded at all)."""
    def mutate(q: Question, legs: list[Path]) -> None:
        def f(m: dict[str, Any]) -> None:
            if not kv:
                m["processes"] = []
                return
            next(p for p in m["processes"] if p["role"] == role).update(kv)
        edit_meta(tput_leg(legs, arm, _targets(q)[0], 1), f)
    return mutate


def swap_work_times(q: Question, legs: list[Path]) -> None:
    """Slots as frozen, but the legs' credible work times say slot 2 ran first."""
    c = _targets(q)[0]
    a, b = tput_leg(legs, "bi1", c, 1), tput_leg(legs, "bi0", c, 1)
    ma, mb = _load(a / "leg.json"), _load(b / "leg.json")
    edit_meta(a, lambda m: m.update(started_at=mb["started_at"], ended_at=mb["ended_at"]))
    edit_meta(b, lambda m: m.update(started_at=ma["started_at"], ended_at=ma["ended_at"]))


def _needs_budget(question: Question | None) -> str | None:
    c = getattr(question, "criteria", None)
    if isinstance(c, ThroughputCriteria) and (not c.budget or c.formula is None):
        return "the question freezes no budget and formula: no concurrency can be over a budget"
    return None


def _round_left_out(q: Question, legs: Sequence[Path]) -> None:
    """Both arms' round-1 legs at the first target c removed from the set handed to the judge."""
    c = _targets(q)[0]
    for leg in [tput_leg(legs, arm, c, 1) for arm in ("bi1", "bi0")]:
        shutil.rmtree(leg)


def _measurement_twice(q: Question, legs: Sequence[Path]) -> None:
    """Round 1's BI=0 result sealed again as round 2's: `vllm bench serve` without --metadata writing
    one --result-filename (round and slot left to leg.json), the file never rewritten."""
    c = _targets(q)[0]
    src, dst = tput_leg(legs, "bi0", c, 1), tput_leg(legs, "bi0", c, 2)
    edit_json(src / "bench.json", lambda d: [d.pop(k, None) for k in ("arm", "round", "slot")], src)
    shutil.copy2(src / "bench.json", dst / "bench.json")
    seal_leg(dst)


def _receipts_disagree(q: Question, legs: Sequence[Path]) -> None:
    """leg.json says one request count, the bench result file another."""
    leg = tput_leg(legs, "bi1", _targets(q)[0], 1)
    n = _load(leg / "bench.json")["num_prompts"]
    edit_meta(leg, lambda m: m["resolved_config"].update(num_prompts=n + 1))


def _round_on_another_node(q: Question, legs: Sequence[Path]) -> None:
    """The last round of the first target c run on another machine (both its legs)."""
    c, r = _targets(q)[0], q.repeats
    for arm in ("bi1", "bi0"):
        edit_meta(tput_leg(legs, arm, c, r), lambda m: m["resolved_config"].update(node="h200-node-b (boot 0c5e)"))


def _throttled_baseline(q: Question, legs: Sequence[Path]) -> None:
    """The BI=0 legs of the first target c sent requests at 0.05/s (an arrival-limited baseline)."""
    c = _targets(q)[0]
    for r in range(1, q.repeats + 1):
        leg = tput_leg(legs, "bi0", c, r)
        edit_json(leg / "bench.json", lambda d: d.update(request_rate=0.05), leg)


def _stale_result(q: Question, legs: Sequence[Path]) -> None:
    """One leg's bench.json is a result from a year before the leg ran."""
    leg = tput_leg(legs, "bi1", _targets(q)[0], 1)
    edit_json(leg / "bench.json", lambda d: d.update(date="20251129-100000"), leg)


def _node_unrecorded(q: Question, legs: Sequence[Path]) -> None:
    """Legs that do not say which machine they ran on (as receipts of another tool may not)."""
    for leg in legs:
        edit_meta(leg, lambda m: m["resolved_config"].pop("node", None))


def _sampling_unrecorded(q: Question, legs: Sequence[Path]) -> None:
    """Neither arm's contract records its stop tokens: unknown, never vLLM's default."""
    for leg in legs:
        if (leg / "contract.json").is_file():
            edit_json(leg / "contract.json", lambda d: d["sampling"].pop("stop", None), leg)


CANARIES: tuple[Canary, ...] = (
    # quality
    *(Canary(f"quality.contract.{name}", E.QUALITY, f"contract item '{name}' matches", INCONCLUSIVE,
             contract_item(key, value)) for name, key, value in (
        ("dataset_version", "dataset_version", "openai/gsm8k@main:test[:30] sha256:0000"),
        ("template_thinking", "thinking_mode", "on"),
        ("sampling", "sampling.top_p", 0.95),
        ("repeats", "repeats", 2),
        ("scorer", "scorer", "verl.gsm8k/2 sha256:0bb1"),
        ("length_cap", "length_cap", 4096))),
    Canary("quality.contract.sampling_unrecorded", E.QUALITY, "an unrecorded sampling parameter is unknown, not a "
           "default", INCONCLUSIVE, _sampling_unrecorded),
    Canary("quality.pairing_sums_to_n", E.QUALITY, "both_correct+only_bi0+only_bi1+both_wrong = N", INCONCLUSIVE,
           lambda q, legs: _drop_problem(legs)),
    Canary("quality.no_retries", E.QUALITY, "no retries", INCONCLUSIVE,
           lambda q, legs: edit_jsonl(_leg(legs, arm="bi1") / "results.jsonl",
                                      lambda rows: rows + [dict(rows[0], correct=not rows[0]["correct"])],
                                      _leg(legs, arm="bi1"))),
    Canary("quality.threshold", E.QUALITY, "|score difference| within the threshold", FAIL, _over_threshold),
    Canary("quality.confounder", E.QUALITY, "no delta attributed under an unquantified confounder", INCONCLUSIVE,
           lambda q, legs: _confounder(q, legs, "quality")),
    # throughput
    Canary("throughput.workload_tokens", E.THROUGHPUT, "workload receipts checked first: output tokens", INCONCLUSIVE,
           lambda q, legs: _bench(legs, "bi1", _targets(q)[0], 1, total_output_tokens=
                                  _load(tput_leg(legs, "bi1", _targets(q)[0], 1) / "bench.json")["total_output_tokens"] - 311)),
    Canary("throughput.workload_errors", E.THROUGHPUT, "workload receipts: errors and completed requests", INCONCLUSIVE,
           lambda q, legs: _bench(legs, "bi0", _targets(q)[0], 2, failed=3, completed=
                                  _load(tput_leg(legs, "bi0", _targets(q)[0], 2) / "bench.json")["completed"] - 3)),
    Canary("throughput.workload_warmup", E.THROUGHPUT, "workload receipts: warm-up", INCONCLUSIVE,
           lambda q, legs: edit_meta(tput_leg(legs, "bi1", _targets(q)[0], 3 if q.repeats >= 3 else 1),
                                     lambda m: m["resolved_config"].update(num_warmups=0))),
    Canary("throughput.crossed_order", E.THROUGHPUT, "crossed order AB/BA/AB verified from round/slot", INCONCLUSIVE,
           swap_slots),
    Canary("throughput.target_c_over_budget", E.THROUGHPUT, "a target c over budget fails whatever the average", FAIL,
           _over_one_target),
    Canary("throughput.tiers", E.THROUGHPUT, "fast/slow tiers make the attribution inconclusive", INCONCLUSIVE, _tiers),
    Canary("throughput.profiled", E.THROUGHPUT, "a profiled leg never counts", INCONCLUSIVE,
           lambda q, legs: edit_meta(tput_leg(legs, "bi0", _targets(q)[0], 1), lambda m: m.update(profiled=True))),
    Canary("throughput.confounder", E.THROUGHPUT, "no delta attributed under an unquantified confounder",
           INCONCLUSIVE, lambda q, legs: _confounder(q, legs, "throughput")),
    Canary("throughput.client_exit", E.THROUGHPUT, "exit receipts first: the client exits normally", INCONCLUSIVE,
           tput_exit("bi1", "client", exit_code=1)),
    Canary("throughput.server_exit", E.THROUGHPUT, "exit receipts first: the API server is not force killed",
           INCONCLUSIVE, tput_exit("bi0", "api_server", end_state="force_killed",
                                   evidence="force killing remaining processes count=1")),
    Canary("throughput.exits_recorded", E.THROUGHPUT, "exit receipts first: a leg directory records its exits",
           INCONCLUSIVE, tput_exit("bi1", "client")),
    Canary("throughput.slot_times", E.THROUGHPUT, "credible work times corroborate the slot order", INCONCLUSIVE,
           swap_work_times),
    Canary("throughput.rounds_from_1", E.THROUGHPUT, "every round from 1 is handed in (no round left out)",
           INCONCLUSIVE, _round_left_out),
    Canary("throughput.one_measurement_once", E.THROUGHPUT, "one measurement is never counted as two rounds",
           INCONCLUSIVE, _measurement_twice),
    Canary("throughput.receipts_agree", E.THROUGHPUT, "leg.json and the bench result record one workload",
           INCONCLUSIVE, _receipts_disagree),
    Canary("throughput.one_node", E.THROUGHPUT, "crossed rounds on one node: a round on another node is not paired",
           INCONCLUSIVE, _round_on_another_node),
    Canary("throughput.node_recorded", E.THROUGHPUT, "the one node is shown: legs that record none do not pass",
           INCONCLUSIVE, _node_unrecorded),
    Canary("throughput.bench_settings", E.THROUGHPUT, "the run settings bench records are alike across the pairing",
           INCONCLUSIVE, _throttled_baseline),
    Canary("throughput.stale_result", E.THROUGHPUT, "a result dated outside its leg's work is another run's",
           INCONCLUSIVE, _stale_result),
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
