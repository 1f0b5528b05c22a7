"""`tica leg ingest`: results as their producers write them become sealed legs; what a producer
did not record is unknown (never invented, never a wholesale refusal), and the judge lists it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tica.errors import InputError
from tica.ingest import SOURCE_FILE, ingest_bench, ingest_problems, ingest_verl_metrics
from tica.cli.ingest import main
from tica.items.forward.judge import judge_forward
from tica.items.throughput.judge import judge_throughput
from tica.question import WORKLOAD_FIELDS, load_question, parse_question
from tica.receipts import load_bench_leg, load_leg, load_leg_meta, load_quality_results
from tica.seal import sha256_file
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
TEMPLATE = ROOT / "h200" / "run2" / "throughput_bi1_r1_c32" / "bench.json"  # as vLLM wrote it
ORDER = ["AB", "BA", "AB", "BA", "AB"]


def _bench_file(tmp: Path, arm: str, r: int, slow: float) -> Path:
    """The template with its run's metadata stripped, its duration scaled (rates kept consistent)."""
    d = json.loads(TEMPLATE.read_bytes())
    for k in ("arm", "round", "slot"):
        d.pop(k, None)
    d["duration"] *= slow
    for rate, counts in (("output_throughput", ("total_output_tokens",)), ("request_throughput", ("completed",)),
                         ("total_token_throughput", ("total_input_tokens", "total_output_tokens"))):
        d[rate] = sum(d[c] for c in counts) / d["duration"]
    p = tmp / "raw" / f"{arm}_r{r}.json"
    p.parent.mkdir(exist_ok=True)
    p.write_text(json.dumps(d))
    return p


def _ingest_rounds(tmp: Path) -> list[Path]:
    legs = []
    for r, order in enumerate(ORDER, 1):
        first = "bi1" if order == "AB" else "bi0"
        for arm in ("bi1", "bi0"):
            src = _bench_file(tmp, arm, r, 1.05 if arm == "bi1" else 1.0)
            legs.append(ingest_bench(src, tmp / "legs" / f"{arm}_r{r}", arm, round=r, slot=1 if arm == first else 2))
    return legs


def _question(**over):
    base = load_question(ROOT / "receipts" / "questions" / "throughput.yaml").model_dump(mode="json")
    t = json.loads(TEMPLATE.read_bytes())
    base.update(repeats=5, pairing_order=ORDER, must_record=[])
    base["criteria"].update(concurrencies=[32], num_prompts={32: t["num_prompts"]}, budget={32: 0.1},
                            input_len=t["total_input_tokens"] // t["num_prompts"],
                            output_len=t["total_output_tokens"] // t["num_prompts"], ignore_eos=True, **over)
    return parse_question(base)


def test_a_raw_bench_json_becomes_a_sealed_leg_holding_its_bytes(tmp_path):
    src = _bench_file(tmp_path, "bi1", 1, 1.0)
    leg = ingest_bench(src, tmp_path / "leg", "bi1", round=1, slot=1)
    assert (leg / "bench.json").read_bytes() == src.read_bytes()
    note = json.loads((leg / SOURCE_FILE).read_text())
    assert note["path"] == str(src.resolve()) and note["sha256"] == "sha256:" + sha256_file(src)
    meta = load_leg(leg).meta
    assert (meta.producer, meta.producer_version, meta.concurrency, meta.env) == ("vllm bench serve", None, 32, {})
    assert load_bench_leg(leg).workload("num_warmups") is None  # unknown, not invented


def test_ingested_rounds_are_judged_and_the_unknown_warmups_listed(tmp_path):
    legs = _ingest_rounds(tmp_path)
    relaxed = _question(required_workload=[f for f in WORKLOAD_FIELDS if f != "num_warmups"])
    cell = judge_throughput(relaxed, legs)  # a verdict, not a refusal
    notes = [r for r in cell.reasons if r.startswith("note: ")]
    assert any("c=32: unknown: num_warmups" in r for r in notes), cell.reasons
    assert not any("num_warmups" in r for r in cell.reasons if r.startswith("inconclusive"))
    strict = judge_throughput(_question(), legs)
    assert strict.verdict is Verdict.INCONCLUSIVE
    assert any("c=32: unknown: num_warmups" in r for r in strict.reasons if r.startswith("inconclusive"))


def test_a_json_stating_another_arm_is_refused_and_nothing_written(tmp_path):
    d = json.loads(TEMPLATE.read_bytes())
    d["arm"] = "bi0"
    src = tmp_path / "b.json"
    src.write_text(json.dumps(d))
    with pytest.raises(InputError) as err:
        ingest_bench(src, tmp_path / "leg", "bi1")
    assert err.value.field == "arm" and err.value.file == str(src)
    assert not (tmp_path / "leg").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]
    assert main(["bench", str(src), "--out", str(tmp_path / "leg"), "--arm", "bi1"]) == 4


def test_a_bench_json_missing_a_required_field_names_it(tmp_path):
    d = json.loads(TEMPLATE.read_bytes())
    del d["completed"]
    src = tmp_path / "b.json"
    src.write_text(json.dumps(d))
    with pytest.raises(InputError) as err:
        ingest_bench(src, tmp_path / "leg", "bi1")
    assert err.value.field == "completed" and not (tmp_path / "leg").exists()


def _verl_file(tmp: Path, diff: float, wrapped: bool = False) -> Path:
    rows = [{"step": 0, "val-core/acc": 0.5}]
    rows += [{"step": s, "training/rollout_probs_diff_max": diff, "training/rollout_probs_diff_mean": diff / 10,
              "actor/grad_norm": 0.3, "timing_s/gen": 1.2} for s in range(1, 6)]
    if wrapped:
        rows = [{"step": r["step"], "data": {k: v for k, v in r.items() if k != "step"}} for r in rows]
    p = tmp / f"verl_{diff}.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.mark.parametrize("wrapped", [False, True])
def test_verl_metrics_become_a_forward_leg_with_the_checkpoint_tie_unknown(tmp_path, wrapped):
    bi1 = ingest_verl_metrics(_verl_file(tmp_path, 0.0, wrapped), tmp_path / "f_bi1", "bi1")
    bi0 = ingest_verl_metrics(_verl_file(tmp_path, 0.02, wrapped), tmp_path / "f_bi0", "bi0")
    assert json.loads((bi1 / SOURCE_FILE).read_text())["lines_without_forward_metrics"] == [1]
    q = load_question(ROOT / "receipts" / "questions" / "forward.yaml")
    cell = judge_forward(parse_question({**q.model_dump(mode="json"), "must_record": []}), [bi1, bi0])
    assert cell.verdict is Verdict.INCONCLUSIVE
    bad = [r for r in cell.reasons if r.startswith("inconclusive")]
    assert any("unknown: step_basis, checkpoint_version" in r for r in bad), cell.reasons
    assert not any(r.startswith("fail") for r in cell.reasons)


def test_per_problem_jsonl_becomes_a_quality_leg_contract_unknown_unless_given(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"problem_id": f"q{i}", "correct": i % 2 == 0}) + "\n" for i in range(4)))
    leg = ingest_problems(src, tmp_path / "q", "bi0")
    assert len(load_quality_results(leg / "results.jsonl")) == 4 and not (leg / "contract.json").exists()
    assert load_leg_meta(leg / "leg.json").producer is None
    src.write_text(src.read_text() + json.dumps({"problem_id": "q9"}) + "\n")
    with pytest.raises(InputError) as err:
        ingest_problems(src, tmp_path / "q2", "bi0")
    assert err.value.field == "line 5.correct" and not (tmp_path / "q2").exists()
