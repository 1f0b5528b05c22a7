"""Throughput's canaries: a passing receipt set (every frozen concurrency over the question's
crossed rounds, each leg a `vllm bench serve` result whose BI=1 loss is well under its budget)
and one planted error per rule, each of which the judge must not pass. `tica.canaries` runs them
with every other item's."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tica.canary_legs import FAIL, INCONCLUSIVE, Canary, edit_json, edit_meta, find_leg, leg_meta, load_json, proc
from tica.canary_legs import unquantified_confounder, write_leg
from tica.evidence import EvidenceItem
from tica.items.throughput.criteria import ThroughputCriteria
from tica.pairing import crossed
from tica.question import Question, parse_question
from tica.seal import seal_leg

E = EvidenceItem
DEFAULT_PROMPTS = {1: 8, 8: 32, 32: 128, 64: 256}
# Output tok/s of BI=0 at each concurrency on one H200 (8192 in / 1024 out), for realistic fixtures.
_BASE_TPUT = {1: 151.2, 8: 1013.5, 32: 2871.4, 64: 4102.9}

# The canaries' throughput question freezes a reviewed statistical basis: without one the judge
# reports a budget but never declares it passed, and the canaries need a passing baseline. Its
# "pilot" is the builder below (every round under the budget by construction), named by this
# digest, not a measured pilot: a real question's basis comes from `tica plan throughput`. The
# digest's text and the basis's notes are part of the question's hash: they keep the words they
# were frozen with (tica.canaries, where the builder lived then).
SYNTHETIC_PILOT = "sha256:" + hashlib.sha256(b"tica.canaries.build_throughput: synthetic rounds, no pilot").hexdigest()
DEFAULT_ROUNDS = 5  # the fewest crossed rounds with which the sign test can pass at alpha 0.05 (0.5^5 = 0.031)


def sign_test_basis(rounds: int, alpha: float = 0.05) -> dict[str, Any]:
    """A sign-test basis (question criteria JSON) for the builder's synthetic rounds."""
    return {"test": "sign_test_median", "alpha": alpha, "power": 0.8, "rounds": rounds,
            "pilot_digests": [SYNTHETIC_PILOT],
            "notes": ["synthetic: tica.canaries builds every round under the budget; not planned from a pilot"]}


# The question the built-in canaries and the committed fixtures are judged under.
QUESTION: dict[str, Any] = {
    "name": "rust-bench-8k-1k", "compared": "output tok/s per concurrency",
    "computation": "vllm bench serve, random 8192/1024, ignore EOS",
    "pass_line": "the one-sided 0.95 upper bound of the median per-round paired loss (exact "
                 "sign test) is under the budget at every target c",
    "repeats": DEFAULT_ROUNDS, "pairing_order": crossed(DEFAULT_ROUNDS),
    "criteria": {"item": "throughput", "num_prompts": DEFAULT_PROMPTS, "warmups": 1,
                 "formula": "median_per_round_paired_loss",
                 "budget": {1: 0.10, 8: 0.10, 32: 0.15, 64: 0.15},
                 "statistical_basis": sign_test_basis(DEFAULT_ROUNDS)}}


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
                meta = leg_meta("throughput", arm, round=r, slot=slot, concurrency=conc, started_at=started,
                                ended_at=started.replace(":00+", ":50+"),
                                processes=[proc("client", 8000 + minute), proc("api_server", 8100 + minute),
                                           proc("engine_core", 8200 + minute), proc("worker", 8300 + minute)])
                meta["resolved_config"].update(num_prompts=prompts, num_warmups=c.warmups, input_len=c.input_len,
                                               output_len=c.output_len, ignore_eos=c.ignore_eos)
                bench = bench_json(arm, r, slot, conc, prompts, c.input_len, c.output_len, tputs[arm], run=minute)
                legs.append(write_leg(dest / f"tput_c{conc:03d}_r{r}_s{slot}_{arm}", meta,
                                      {"bench.json": json.dumps(bench, indent=2)}))
    return legs


def with_rounds(question: Question, rounds: int) -> Question:
    """The throughput question over `rounds` crossed rounds; a frozen basis follows (its rounds
    are the question's repeats)."""
    data = question.model_dump(mode="json")
    data.update(repeats=rounds, pairing_order=crossed(rounds, question.pairing_order[0]))
    if data["criteria"].get("statistical_basis") is not None:
        data["criteria"]["statistical_basis"]["rounds"] = rounds
    return parse_question(data)


def tput_leg(legs: Sequence[Path], arm: str, c: int, r: int) -> Path:
    return find_leg(legs, item="throughput", arm=arm, concurrency=c, round=r)


def set_bench(legs: Sequence[Path], arm: str, c: int, r: int, **kv: Any) -> None:
    leg = tput_leg(legs, arm, c, r)
    edit_json(leg / "bench.json", lambda d: d.update(kv), leg)


def scale_throughput(leg: Path, factor: float) -> None:
    """A faster (factor > 1) or slower leg, honestly recorded: the same counts over a shorter or
    longer duration, every rate vllm bench serve derives from them moving with it."""
    edit_json(leg / "bench.json", lambda d: d.update(
        duration=d["duration"] / factor,
        **{k: d[k] * factor for k in ("output_throughput", "request_throughput", "total_token_throughput")
           if d.get(k) is not None}), leg)


def scale_bi1(legs: Sequence[Path], c: int, factor: float, rounds: Sequence[int]) -> None:
    for r in rounds:
        scale_throughput(tput_leg(legs, "bi1", c, r), factor)


def targets(q: Question) -> list[int]:
    c: ThroughputCriteria = q.criteria  # type: ignore[assignment]
    return sorted((c.budget or {}).keys()) or list(c.concurrencies)


def over_one_target(q: Question, legs: Sequence[Path]) -> None:
    c: ThroughputCriteria = q.criteria  # type: ignore[assignment]
    target = targets(q)[-1]
    b = (c.budget or {}).get(target, 0.1)
    # Push this c to twice its budget; the others stay well under, so their average is under too.
    want = min(2 * b + 0.05, 0.9)
    now = 1 - load_json(tput_leg(legs, "bi1", target, 1) / "bench.json")["output_throughput"] / \
        load_json(tput_leg(legs, "bi0", target, 1) / "bench.json")["output_throughput"]
    scale_bi1(legs, target, (1 - want) / (1 - now), range(1, q.repeats + 1))


def swap_slots(q: Question, legs: Sequence[Path]) -> None:
    c = targets(q)[0]
    for arm in ("bi1", "bi0"):
        leg = tput_leg(legs, arm, c, 1)
        slot = load_json(leg / "leg.json")["slot"]
        new = 3 - slot
        edit_json(leg / "bench.json", lambda d: d.update(slot=str(new)), None)
        edit_meta(leg, lambda m: m.update(slot=new))
    # Keep the clock consistent with the claimed slots: only the frozen order is violated.
    a, b = tput_leg(legs, "bi1", c, 1), tput_leg(legs, "bi0", c, 1)
    ta, tb = load_json(a / "leg.json")["started_at"], load_json(b / "leg.json")["started_at"]
    edit_meta(a, lambda m: m.update(started_at=tb))
    edit_meta(b, lambda m: m.update(started_at=ta))


def slow_tier(q: Question, legs: Sequence[Path]) -> None:
    c = targets(q)[0]
    crit: ThroughputCriteria = q.criteria  # type: ignore[assignment]
    # BI=0 lands in a slow tier in one round; BI=1 follows so the loss itself stays under budget.
    for arm in ("bi0", "bi1"):
        leg = tput_leg(legs, arm, c, 2)
        f = 1 / (crit.tier_ratio + 0.25)
        edit_json(leg / "bench.json", lambda d: d.update(output_throughput=d["output_throughput"] * f,
                                                         duration=d["duration"] / f), leg)


def tput_exit(arm: str, role: str, **kv: Any) -> Callable[[Question, list[Path]], None]:
    """One throughput leg at the first target c whose `role` process did not end cleanly (or, with
    no kv, whose exits were not recorded at all)."""
    def mutate(q: Question, legs: list[Path]) -> None:
        def f(m: dict[str, Any]) -> None:
            if not kv:
                m["processes"] = []
                return
            next(p for p in m["processes"] if p["role"] == role).update(kv)
        edit_meta(tput_leg(legs, arm, targets(q)[0], 1), f)
    return mutate


def swap_work_times(q: Question, legs: list[Path]) -> None:
    """Slots as frozen, but the legs' credible work times say slot 2 ran first."""
    c = targets(q)[0]
    a, b = tput_leg(legs, "bi1", c, 1), tput_leg(legs, "bi0", c, 1)
    ma, mb = load_json(a / "leg.json"), load_json(b / "leg.json")
    edit_meta(a, lambda m: m.update(started_at=mb["started_at"], ended_at=mb["ended_at"]))
    edit_meta(b, lambda m: m.update(started_at=ma["started_at"], ended_at=ma["ended_at"]))


def round_left_out(q: Question, legs: Sequence[Path]) -> None:
    """Both arms' round-1 legs at the first target c removed from the set handed to the judge."""
    c = targets(q)[0]
    for leg in [tput_leg(legs, arm, c, 1) for arm in ("bi1", "bi0")]:
        shutil.rmtree(leg)


def measurement_twice(q: Question, legs: Sequence[Path]) -> None:
    """Round 1's BI=0 result sealed again as round 2's: `vllm bench serve` without --metadata writing
    one --result-filename (round and slot left to leg.json), the file never rewritten."""
    c = targets(q)[0]
    src, dst = tput_leg(legs, "bi0", c, 1), tput_leg(legs, "bi0", c, 2)
    edit_json(src / "bench.json", lambda d: [d.pop(k, None) for k in ("arm", "round", "slot")], src)
    shutil.copy2(src / "bench.json", dst / "bench.json")
    seal_leg(dst)


def receipts_disagree(q: Question, legs: Sequence[Path]) -> None:
    """leg.json says one request count, the bench result file another."""
    leg = tput_leg(legs, "bi1", targets(q)[0], 1)
    n = load_json(leg / "bench.json")["num_prompts"]
    edit_meta(leg, lambda m: m["resolved_config"].update(num_prompts=n + 1))


def round_on_another_node(q: Question, legs: Sequence[Path]) -> None:
    """The last round of the first target c run on another machine (both its legs)."""
    c, r = targets(q)[0], q.repeats
    for arm in ("bi1", "bi0"):
        edit_meta(tput_leg(legs, arm, c, r), lambda m: m["resolved_config"].update(node="h200-node-b (boot 0c5e)"))


def throttled_baseline(q: Question, legs: Sequence[Path]) -> None:
    """The BI=0 legs of the first target c sent requests at 0.05/s (an arrival-limited baseline)."""
    c = targets(q)[0]
    for r in range(1, q.repeats + 1):
        leg = tput_leg(legs, "bi0", c, r)
        edit_json(leg / "bench.json", lambda d: d.update(request_rate=0.05), leg)


def stale_result(q: Question, legs: Sequence[Path]) -> None:
    """One leg's bench.json is a result from a year before the leg ran."""
    leg = tput_leg(legs, "bi1", targets(q)[0], 1)
    edit_json(leg / "bench.json", lambda d: d.update(date="20251129-100000"), leg)


def node_unrecorded(q: Question, legs: Sequence[Path]) -> None:
    """Legs that do not say which machine they ran on (as receipts of another tool may not)."""
    for leg in legs:
        edit_meta(leg, lambda m: m["resolved_config"].pop("node", None))


def needs_budget(question: Question | None) -> str | None:
    c = getattr(question, "criteria", None)
    if isinstance(c, ThroughputCriteria) and (not c.budget or c.formula is None):
        return "the question freezes no budget and formula: no concurrency can be over a budget"
    return None


# The must_record canary every item has is tica.canaries' (it reads the question, not the item);
# the over-budget canary is switched off where the question freezes no budget (tica.canaries.SWITCHED_OFF).
CANARIES: tuple[Canary, ...] = (
    Canary("throughput.workload_tokens", E.THROUGHPUT, "workload receipts checked first: output tokens", INCONCLUSIVE,
           lambda q, legs: set_bench(legs, "bi1", targets(q)[0], 1, total_output_tokens=
                                     load_json(tput_leg(legs, "bi1", targets(q)[0], 1) / "bench.json")["total_output_tokens"] - 311)),
    Canary("throughput.workload_errors", E.THROUGHPUT, "workload receipts: errors and completed requests", INCONCLUSIVE,
           lambda q, legs: set_bench(legs, "bi0", targets(q)[0], 2, failed=3, completed=
                                     load_json(tput_leg(legs, "bi0", targets(q)[0], 2) / "bench.json")["completed"] - 3)),
    Canary("throughput.workload_warmup", E.THROUGHPUT, "workload receipts: warm-up", INCONCLUSIVE,
           lambda q, legs: edit_meta(tput_leg(legs, "bi1", targets(q)[0], 3 if q.repeats >= 3 else 1),
                                     lambda m: m["resolved_config"].update(num_warmups=0))),
    Canary("throughput.crossed_order", E.THROUGHPUT, "crossed order AB/BA/AB verified from round/slot", INCONCLUSIVE,
           swap_slots),
    Canary("throughput.target_c_over_budget", E.THROUGHPUT, "a target c over budget fails whatever the average", FAIL,
           over_one_target),
    Canary("throughput.tiers", E.THROUGHPUT, "fast/slow tiers make the attribution inconclusive", INCONCLUSIVE, slow_tier),
    Canary("throughput.profiled", E.THROUGHPUT, "a profiled leg never counts", INCONCLUSIVE,
           lambda q, legs: edit_meta(tput_leg(legs, "bi0", targets(q)[0], 1), lambda m: m.update(profiled=True))),
    Canary("throughput.confounder", E.THROUGHPUT, "no delta attributed under an unquantified confounder",
           INCONCLUSIVE, lambda q, legs: unquantified_confounder(q, legs, "throughput")),
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
           INCONCLUSIVE, round_left_out),
    Canary("throughput.one_measurement_once", E.THROUGHPUT, "one measurement is never counted as two rounds",
           INCONCLUSIVE, measurement_twice),
    Canary("throughput.receipts_agree", E.THROUGHPUT, "leg.json and the bench result record one workload",
           INCONCLUSIVE, receipts_disagree),
    Canary("throughput.one_node", E.THROUGHPUT, "crossed rounds on one node: a round on another node is not paired",
           INCONCLUSIVE, round_on_another_node),
    Canary("throughput.node_recorded", E.THROUGHPUT, "the one node is shown: legs that record none do not pass",
           INCONCLUSIVE, node_unrecorded),
    Canary("throughput.bench_settings", E.THROUGHPUT, "the run settings bench records are alike across the pairing",
           INCONCLUSIVE, throttled_baseline),
    Canary("throughput.stale_result", E.THROUGHPUT, "a result dated outside its leg's work is another run's",
           INCONCLUSIVE, stale_result),
)
