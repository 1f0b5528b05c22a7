"""Every message a person reads is readable: no repeated verdict prefix, no headline its body
contradicts, no text cut mid-word, nothing nested deeper than one level, no absolute path
(`tica.messages.faults`).

The messages are the ones the project already makes: every canary's cell (planted errors per item,
judged on the criteria alone), the same canaries planted in receipt sets bound to a candidate and
judged for it (tests/bound_receipts.py, the false-pass suite's starting points), those sets judged
for no candidate and for another one, every check of them (tica.checks), and every committed
receipt set (scripts/committed_verdicts.py). Each rule has a negative control: a bad message it
must reject, so that the test can fail.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.bound_receipts import build_bound
from tests.false_pass.conftest import manifest_data, write_manifest
from tica import canaries, checks
from tica.canaries import default_questions, run_canaries
from tica.evidence import EvidenceItem
from tica.judges import judge, judge_criteria, load_candidate
from tica.judges.planted import canary_table
from tica.judges.recipe_identity import judge_recipe_identity
from tica.messages import clip, digest, faults, in_leg, relative, sliced_text, unparenthesized
from tica.question import load_question, parse_question
from tica.seal import seal_leg
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[2]
E = EvidenceItem
Message = tuple[str, str, str]  # (where it came from, what it is, the text)

# ---------------------------------------------------------------------------- the rules, shown to bite

BAD = {
    "a repeated verdict prefix": [
        ("not run: not run: throughput pairing not run", False),
        ("inconclusive: x; inconclusive: inconclusive: y", False),
        ("not run: throughput pairing not run: no bi1 leg ran", True),
        ("bi0 run7/leg: did not run: not run: device-time deadline", False),
    ],
    "a 'not run' headline whose body says legs were judged": [("not run: 1 backward leg(s) judged", True)],
    "a 'fail' headline over an all-good count": [
        ("fail: 32 of 32 receipts sealed and intact", True), ("fail: 20/20 valid rounds; c=64 0.35 OVER", True)],
    "a text cut by slicing": [("their bench files have the same content sha256:7b1027f10cff...", False)],
    "unbalanced parentheses": [("a receipt set passes (inconclusive: c=1: 3 valid round(s) of the 5 froz", False)],
    "parentheses inside parentheses": [("c=1: one measurement (same content (sha256:7b10…); same run)", False)],
    "more than one verdict prefix": [
        ("inconclusive: 6 binding problem(s); criteria: pass: 1 backward leg(s) judged", True),
        ("inconclusive: x: inconclusive: y", False)],
    "an absolute path": [
        ("fail: /tmp/tica-canaries-rd7ftvdu/artifacts/forward_bi1/metrics.jsonl: changed after sealing", False),
        ("tests/x records nothing; /work/main/tests/fixtures/h200/run4/leg.json", False)],
}

GOOD = [
    ("pass: 20/20 valid rounds; median per-round paired loss: median_r(1 - T_BI1[c,r] / T_BI0[c,r]); c=1 0.04", True),
    ("pass: BI=1 pass over 5 step(s); BI=0 mean |diff| 0.00865..0.0112 vs reference 0.01", True),
    ("fail: forward_bi1: weights named 'Qwen3-8B', not by a content hash; 3 of 3 receipts sealed and intact", True),
    ("inconclusive: not evidence for this candidate: update_bi1: source not bound: the manifest pins source.commit "
     "= 9085005; tests/fixtures/h200/run4/update_bi1/leg.json records nothing for it", False),
    ("note: c=1 round 1 invalid, kept: the same measurement as tput_c001_r2_s1_bi0, same content sha256:7b1027f10cff…",
     False),
    ("not run: bi0 run7/throughput_bi0_r4_c1: did not run: device-time deadline", False),
    ("fail: dry_run x adamw x bi1: BI=1 command changed: -'dir=/ckpt/runs/a' +'dir=/ckpt/runs/b' (quoted as recorded)",
     False),
    ("2 canary(ies) not caught: forward.x (got pass), forward.y (got inconclusive)", False),
    ("github.com/verl-project/verl at https://example.org/a/b, 1014 tok/s", False),
]


@pytest.mark.parametrize("rule,text,headline", [(r, t, h) for r, bad in BAD.items() for t, h in bad])
def test_each_rule_rejects_its_negative_control(rule, text, headline):
    assert any(f.startswith(rule) for f in faults(text, headline=headline)), (rule, text, faults(text, headline))


@pytest.mark.parametrize("text,headline", GOOD)
def test_readable_messages_pass_the_rules(text, headline):
    assert faults(text, headline=headline) == []


def test_slicing_a_message_is_found_in_code():
    assert sliced_text('m = f"got {detail[:300]}"\n') == [1]
    assert sliced_text('m = text[:77] + "..."\n') == [1]
    assert sliced_text('m = f"{len(x)} legs: {\'. \'.join(names[:3])}"\nh = hexdigest()[:16]\n') == []


def test_the_helpers_make_what_the_rules_accept():
    assert relative(f"{ROOT}/tests/fixtures/h200/run4/update_bi1/leg.json records nothing") == \
        "tests/fixtures/h200/run4/update_bi1/leg.json records nothing"
    assert relative("/tmp/pytest-1/sets/forward/forward_bi1/leg.json: x") == "forward_bi1/leg.json: x"
    assert relative("changed: -'dir=/ckpt/runs/a'") == "changed: -'dir=/ckpt/runs/a'"  # a quoted value, as recorded
    assert in_leg("/tmp/x/forward_bi1/arrays/step_1.npz: added", "/tmp/x/forward_bi1") == \
        "forward_bi1/arrays/step_1.npz: added"
    assert digest("sha256:" + "ab" * 32) == "sha256:abababababab…"
    cut = clip("the set is inconclusive: c=1: loss 0.04 (median per-round paired loss, under the budget 0.1)", 60)
    assert len(cut) <= 61 and not faults(cut) and cut.endswith("…"), cut
    assert not faults(unparenthesized("deadline (round 4 estimated at 85s (2 legs)); 2 leg(s) done"))


PRODUCERS = sorted([*(ROOT / "tica" / "judges").glob("*.py"), ROOT / "tica" / "checks.py", ROOT / "tica" / "canaries.py"])


@pytest.mark.parametrize("path", PRODUCERS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_producer_cuts_a_message_by_slicing(path):
    assert sliced_text(path.read_text(), str(path)) == [], \
        f"{path.name}: message text cut by slicing on these lines; use tica.messages.clip or digest"


# ---------------------------------------------------------------------------- collecting the messages


def _cell(where: str, c) -> list[Message]:
    return [(where, "summary", c.summary), *((where, "reason", r) for r in c.reasons)]


def _check(where: str, outcome: checks.CheckOutcome) -> list[Message]:
    return [(f"{where} check {outcome.name}", "description", outcome.description)]


def _details(where: str, results: Iterable[canaries.CanaryResult]) -> list[Message]:
    return [(f"{where} canary {r.name}", "detail", r.detail) for r in results if r.detail]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TICA_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield mp


@pytest.fixture(scope="module")
def criteria_canaries(env):
    """Every canary judged on the criteria alone, as the canary check runs them."""
    found: list[Message] = []

    def judge_fn(item, q, paths):
        c = judge_criteria(item, q, paths)
        found.extend(_cell(f"canary/{item.value}", c))
        return c

    def recipe_fn(path):
        c = judge_recipe_identity(path)
        found.extend(_cell("canary/recipe", c))
        return c

    results = run_canaries(judge_fn=judge_fn, recipe_fn=recipe_fn)
    return found + _details("criteria", results), results


def _candidate(folder: Path, weights: bytes = bytes(range(256)) * 64):
    return load_candidate(write_manifest(folder, manifest_data(), weights=weights))


@pytest.fixture(scope="module")
def bound_messages(env, tmp_path_factory, criteria_canaries):
    """The canaries planted in bound receipt sets, judged for their candidate; the bound sets judged
    for no candidate and for another one; every check of them."""
    tmp = tmp_path_factory.mktemp("bound")
    candidate = _candidate(tmp / "cand")
    other = _candidate(tmp / "other", weights=bytes(range(255, -1, -1)) * 64)
    questions = default_questions()
    found: list[Message] = []
    n = [0]

    def bound_builder(item):
        def build(q, dest):
            n[0] += 1
            return build_bound(item, q, candidate, tmp / f"b{n[0]}" / dest.name, compress=False)
        return build

    def judge_fn(item, q, paths):
        c = judge(item, q, paths, candidate)
        found.extend(_cell(f"bound canary/{item.value}", c))
        return c

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(canaries, "BUILDERS", {item: bound_builder(item) for item in EvidenceItem})
        results = run_canaries(judge_fn=judge_fn, only=[f"{i.value}." for i in EvidenceItem])
    found += _details("bound", results)

    legs: dict[EvidenceItem, list[Path]] = {}
    for item, q in questions.items():
        legs[item] = build_bound(item, q, candidate, tmp / "sets" / item.value, compress=False)
        found += _cell(f"unbound/{item.value}", judge(item, q, legs[item], None))
        found += _cell(f"other candidate/{item.value}", judge(item, q, legs[item], other))

    # the canary check: all caught, switched off, not caught, none at all, cannot run
    _, criteria_results = criteria_canaries
    for item, q in questions.items():
        found += _check(item.value, checks.canaries(item, q, run=lambda questions, only: criteria_results))
    q = questions[E.FORWARD]
    missed = [r.model_copy(update={"broken": True, "got": "pass"}) for r in criteria_results if r.item == "forward"]
    found += _check("forward missed", checks.canaries(E.FORWARD, q, run=lambda questions, only: missed))
    found += _check("forward none", checks.canaries(E.FORWARD, q, run=lambda questions, only: []))
    report_only = parse_question({**questions[E.THROUGHPUT].model_dump(mode="json"), "criteria": {
        **questions[E.THROUGHPUT].model_dump(mode="json")["criteria"], "statistical_basis": None}})
    found += _check("throughput report-only", checks.canaries(E.THROUGHPUT, report_only))
    found += _details("report-only", run_canaries(questions={E.THROUGHPUT: report_only}, only=["throughput."]))
    q = parse_question({**questions[E.FORWARD].model_dump(mode="json"), "criteria": {
        **questions[E.FORWARD].model_dump(mode="json")["criteria"], "bi0_reference_mean": None}})
    found += _check("forward no reference", checks.canaries(
        E.FORWARD, q, run=lambda questions, only: run_canaries(questions=questions, only=["forward.bi0_magnitude"])))

    # receipts: as recorded, never recorded, recorded otherwise, a file added after
    fwd = legs[E.FORWARD]
    seals = {str(leg): [json.loads((leg / "seal.json").read_text())["files"]] for leg in fwd}
    found += _check("receipts ok", checks.receipts(fwd, seals))
    found += _check("receipts unrecorded", checks.receipts(fwd, {}))
    changed = {k: [{f: "sha256:" + "0" * 64 for f in v[0]}] for k, v in seals.items()}
    found += _check("receipts differ", checks.receipts(fwd, changed))
    extra = shutil.copytree(fwd[0], tmp / "extra" / fwd[0].name)
    (extra / "notes.txt").write_text("added later")
    seal_leg(extra)
    found += _check("receipts added", checks.receipts([extra], {str(extra): seals[str(fwd[0])]}))
    tampered = shutil.copytree(fwd[0], tmp / "tampered" / fwd[0].name)
    (tampered / "metrics.jsonl").write_text("{}\n")
    found += _check("receipts tampered", checks.receipts([tampered], {str(tampered): seals[str(fwd[0])]}))

    # frozen before run: unknown freeze, after the fact, start unknown, in order
    found += _check("frozen unknown", checks.frozen_before_run(None, fwd))
    found += _check("frozen late", checks.frozen_before_run("2999-01-01T00:00:00+00:00", fwd))
    found += _check("frozen ok", checks.frozen_before_run("2000-01-01T00:00:00+00:00", fwd))
    no_start = shutil.copytree(fwd[0], tmp / "nostart" / fwd[0].name)
    meta = json.loads((no_start / "leg.json").read_text())
    meta.pop("started_at")
    (no_start / "leg.json").write_text(json.dumps(meta))
    seal_leg(no_start)
    found += _check("frozen start unknown", checks.frozen_before_run("2000-01-01T00:00:00+00:00", [no_start]))

    # quality sums: as judged, recounted otherwise, not run
    ql = legs[E.QUALITY]
    qcell = judge(E.QUALITY, questions[E.QUALITY], ql, candidate)
    found += _check("quality ok", checks.quality_sums(qcell, questions[E.QUALITY], ql))
    off = qcell.model_copy(update={"numbers": {**qcell.numbers, "n": 29}})
    found += _check("quality differ", checks.quality_sums(off, questions[E.QUALITY], ql))
    found += _check("quality one arm", checks.quality_sums(qcell, questions[E.QUALITY], ql[:1]))
    found += _check("quality not run", checks.quality_sums(qcell.model_copy(update={"verdict": Verdict.NOT_RUN}),
                                                           questions[E.QUALITY], ql))

    # workload: as the manifest says, and a leg that completed fewer requests
    tl = legs[E.THROUGHPUT]
    found += _check("workload ok", checks.workload(tl, candidate.manifest.workload, questions[E.THROUGHPUT]))
    short = shutil.copytree(tl[0], tmp / "short" / tl[0].name)
    bench = json.loads((short / "bench.json").read_text())
    bench["completed"] -= 1
    (short / "bench.json").write_text(json.dumps(bench))
    found += _check("workload short", checks.workload([short], candidate.manifest.workload, questions[E.THROUGHPUT]))
    return found


@pytest.fixture(scope="module")
def committed(env):
    """Every committed receipt set, judged as scripts/committed_verdicts.py judges them."""
    spec = importlib.util.spec_from_file_location("committed_verdicts", ROOT / "scripts" / "committed_verdicts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    found: list[Message] = []
    module.line = lambda name, c: (found.extend(_cell(f"committed {name}", c)), "")[1]
    matrix_cells = module.matrix_cells

    def cells(*args, **kwargs):
        out = matrix_cells(*args, **kwargs)
        found.extend((f"matrix {c.run}", "reason", r) for c in out for r in c.reasons)
        found.extend((f"matrix {c.run}", "cause", c.cause) for c in out if c.cause)
        return out

    module.matrix_cells = cells
    module.verdict_lines()
    # planted-fault legs beside their control (tica.judges.planted), on the H200's run3
    run3 = ROOT / "tests" / "fixtures" / "h200" / "run3"
    forward = load_question(ROOT / "demo" / "questions" / "h200-mid4" / "forward.yaml")
    pairs = [(run3 / n, run3 / "forward_bi1") for n in
             ("forward_bi1_planted_fault", "forward_bi1_fault_hf_final_norm", "forward_bi1_fault_cublas_linear")]
    found += [(f"planted {s.leg}", "reason", s.reason) for s in canary_table(forward, pairs)]
    return found


def _unreadable(messages: list[Message]) -> str:
    bad: dict[str, list[str]] = defaultdict(list)
    for where, what, text in messages:
        for fault in faults(text, headline=what == "summary"):
            bad[fault].append(f"{where} ({what}): {text}")
    return "\n".join(f"{fault}: {len(found)} message(s), e.g.\n  " + "\n  ".join(sorted(set(found))[:5])
                     for fault, found in bad.items())


def test_canary_messages_are_readable(criteria_canaries):
    messages, results = criteria_canaries
    assert len(results) > 50 and len(messages) > 200, "the canaries made too few messages: the test reads nothing"
    assert not _unreadable(messages), _unreadable(messages)


def test_bound_verdicts_and_their_checks_are_readable(bound_messages):
    assert sum(w.startswith("bound canary/") for w, _, _ in bound_messages) > 200
    assert sum(what == "description" for _, what, _ in bound_messages) >= 20
    assert not _unreadable(bound_messages), _unreadable(bound_messages)


def test_committed_verdicts_are_readable(committed):
    assert sum(w.startswith("committed ") for w, _, _ in committed) > 20
    assert sum(w.startswith("matrix ") for w, _, _ in committed) > 100
    assert sum(w.startswith("planted ") for w, _, _ in committed) == 3
    assert not _unreadable(committed), _unreadable(committed)
