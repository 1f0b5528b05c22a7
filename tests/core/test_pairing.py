"""The crossed pairing is defined once (tica/pairing.py): every producer of a plan agrees with the
question round by round, the GPU server's default plan is the one the committed receipts ran under,
and no other module spells the alternation."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tica.canaries import SYNTHETIC_PILOT, build_throughput, default_questions, with_rounds
from tica.evidence import EvidenceItem
from tica.legs import runner
from tica.legs.vllm_kernels.launcher import _pairing_order
from tica.legs.vllm_kernels.server import _plan
from tica.pairing import crossed, other_arm, round_order
from tica.question import Question, load_question, parse_question
from tica.stats.plan import ThroughputPlan, ThroughputPlanRow, throughput_draft

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tica", "tica_assets", "resources", "sensors", "scripts")
PAIRING = "tica/pairing.py"


def _question(first: str, n: int, arm_a: str) -> Question:
    data = default_questions()[EvidenceItem.THROUGHPUT].model_dump(mode="json")
    data.update(repeats=n, pairing_order=crossed(n, first))
    data["criteria"].update(arm_a=arm_a, concurrencies=[1], num_prompts={1: 8}, budget={1: 0.1},
                            statistical_basis=None)
    return parse_question(data)


def _slots(plan: list[dict]) -> dict[int, tuple[str, ...]]:
    """round -> arms in slot order, from a plan's or a leg set's (round, slot, arm) rows."""
    rows = sorted({(x["round"], x["slot"], x["arm"]) for x in plan})
    return {r: tuple(a for rr, _, a in rows if rr == r) for r in sorted({r for r, _, _ in rows})}


def _disagreements(question: Question, plan: list[dict]) -> list[int]:
    return [r for r, arms in _slots(plan).items() if arms != question.round_arms(r)]


def _drafted(question: Question, rounds: int) -> Question:
    row = ThroughputPlanRow(c=1, pilot_rounds=question.repeats, median=0.01, sd=0.01, mad=0.01, tier_bi1=None,
                            tier_bi0=None, budget=0.1, margin=0.05, rounds_needed=rounds, rounds_at_sd_upper=None,
                            planned=True)
    plan = ThroughputPlan(rows=[row], alpha=0.05, power=0.8, digests=[SYNTHETIC_PILOT], notes=[])
    return throughput_draft(question, plan, {1: 0.1})


def _built(question: Question, dest: Path) -> list[dict]:
    return [json.loads((leg / "leg.json").read_text()) for leg in build_throughput(question, dest)]


pairings = st.tuples(st.sampled_from(["AB", "BA"]), st.integers(1, 6), st.sampled_from(["bi0", "bi1"]),
                     st.integers(5, 8), st.integers(0, 3))  # planned: the sign test needs 5


@settings(max_examples=25, deadline=None)
@given(pairings)
def test_every_producer_of_a_plan_agrees_with_the_question_round_by_round(tmp_path_factory, pairing):
    first, n, arm_a, planned, extra = pairing
    q = _question(first, n, arm_a)
    rounds = max(n, planned) + extra
    # the GPU server's plan, in one call and continued by a second one
    assert _disagreements(q, _plan(rounds, (1, 64), 1, 1, arm_a, q.pairing_order)) == []
    assert _disagreements(q, _plan(extra + 1, (1,), 1, n + 1, arm_a, q.pairing_order)) == []
    # the stats planner's draft and the canaries' builder, over another number of rounds
    for other in (_drafted(q, planned), with_rounds(q, planned)):
        assert [other.round_arms(r) for r in range(1, rounds + 1)] == [q.round_arms(r) for r in range(1, rounds + 1)]
    assert _disagreements(q, _built(with_rounds(q, planned), tmp_path_factory.mktemp("legs"))) == []
    # the CPU demo runner plans the demo question's order: A = BI=1, AB first
    if (first, arm_a) == ("AB", "bi1"):
        assert [tuple(o) for o in runner.crossed_order(rounds)] == [q.round_arms(r) for r in range(1, rounds + 1)]


@settings(max_examples=25, deadline=None)
@given(pairings)
def test_the_agreement_check_sees_a_plan_under_the_other_arm_or_order(pairing):
    first, n, arm_a, _, extra = pairing
    q = _question(first, n, arm_a)
    rounds = n + extra
    assert _disagreements(q, _plan(rounds, (1,), 1, 1, other_arm(arm_a), q.pairing_order)) == list(range(1, rounds + 1))
    flipped = crossed(n, round_order(crossed(1, first), 2))
    assert _disagreements(q, _plan(rounds, (1,), 1, 1, arm_a, flipped)) == list(range(1, rounds + 1))


# _plan(6, (1, 64), 1) and _plan(3, (1, 8), 2, first_round=4) as the server wrote them before the
# pairing was defined once (odd rounds BI=0 first): (round, slot, arm, c, num_prompts).
PINNED_SIX_ROUNDS = [
    (1, 1, "bi0", 1, 2), (1, 1, "bi0", 64, 64), (1, 2, "bi1", 1, 2), (1, 2, "bi1", 64, 64),
    (2, 1, "bi1", 1, 2), (2, 1, "bi1", 64, 64), (2, 2, "bi0", 1, 2), (2, 2, "bi0", 64, 64),
    (3, 1, "bi0", 1, 2), (3, 1, "bi0", 64, 64), (3, 2, "bi1", 1, 2), (3, 2, "bi1", 64, 64),
    (4, 1, "bi1", 1, 2), (4, 1, "bi1", 64, 64), (4, 2, "bi0", 1, 2), (4, 2, "bi0", 64, 64),
    (5, 1, "bi0", 1, 2), (5, 1, "bi0", 64, 64), (5, 2, "bi1", 1, 2), (5, 2, "bi1", 64, 64),
    (6, 1, "bi1", 1, 2), (6, 1, "bi1", 64, 64), (6, 2, "bi0", 1, 2), (6, 2, "bi0", 64, 64)]
PINNED_CONTINUED = [
    (4, 1, "bi1", 1, 4), (4, 1, "bi1", 8, 16), (4, 2, "bi0", 1, 4), (4, 2, "bi0", 8, 16),
    (5, 1, "bi0", 1, 4), (5, 1, "bi0", 8, 16), (5, 2, "bi1", 1, 4), (5, 2, "bi1", 8, 16),
    (6, 1, "bi1", 1, 4), (6, 1, "bi1", 8, 16), (6, 2, "bi0", 1, 4), (6, 2, "bi0", 8, 16)]


def _rows(plan: list[dict]) -> list[tuple]:
    assert all(x["num_warmups"] == 1 and set(x) == {"arm", "round", "slot", "c", "num_prompts", "num_warmups"}
               for x in plan)
    return [(x["round"], x["slot"], x["arm"], x["c"], x["num_prompts"]) for x in plan]


def test_the_server_default_plan_is_the_one_the_committed_receipts_ran_under():
    assert _rows(_plan(6, (1, 64), 1)) == PINNED_SIX_ROUNDS
    assert _rows(_plan(3, (1, 8), 2, first_round=4)) == PINNED_CONTINUED
    # the flags' defaults say the same as leaving them out
    assert _plan(6, (1, 64), 1, 1, "bi0", _pairing_order("AB")) == _plan(6, (1, 64), 1)
    # negative control: the other arm called A is another plan
    assert _rows(_plan(6, (1, 64), 1, arm_a="bi1")) != PINNED_SIX_ROUNDS


def _h200_throughput_questions() -> list[Question]:
    return [load_question(p) for p in sorted((ROOT / "demo" / "questions").glob("h200-*/throughput.yaml"))]


def test_the_h200_script_runs_the_arm_and_order_its_questions_froze():
    script = (ROOT / "scripts" / "h200" / "run_h200.sh").read_text()
    flags = re.findall(r"--arm-a (\S+) --pairing-order (\S+)", script)
    questions = _h200_throughput_questions()
    assert len(flags) == 2 and len(questions) >= 2
    for arm_a, order in flags:
        plan = _plan(8, (1,), 1, 1, arm_a, _pairing_order(order))  # type: ignore[arg-type]
        assert all(_disagreements(q, plan) == [] for q in questions)
        assert plan == _plan(8, (1,), 1)  # and that is the server's default plan
    # negative control: the other arm called A disagrees with every one of them
    assert all(_disagreements(q, _plan(8, (1,), 1, 1, "bi1")) for q in questions)


def test_the_launcher_takes_only_a_crossed_order():
    assert _pairing_order("AB, BA,AB") == ("AB", "BA", "AB")
    for bad in ("AB,AB", "AB,XY", ""):
        with pytest.raises(Exception, match="crossed order"):
            _pairing_order(bad)


# ------------------------------------------------------------- the alternation is spelled once

_LITERALS = {"AB", "BA", "bi0", "bi1"}


def _consts(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _parity(node: ast.AST) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and isinstance(n.right, ast.Constant)
               and n.right.value == 2 for n in ast.walk(node))


def _tests_a_literal(test: ast.AST, literals: set[str]) -> bool:
    return any(isinstance(n, ast.Compare) and all(isinstance(op, (ast.Eq, ast.NotEq)) for op in n.ops)
               and _consts(n) & literals for n in ast.walk(test))


def _conditionals(node: ast.AST) -> list[ast.IfExp | ast.If]:
    return [n for n in ast.walk(node) if isinstance(n, (ast.IfExp, ast.If))]


def alternations(tree: ast.AST) -> list[int]:
    """Lines that spell the pairing: a round-parity conditional in a function naming an order or
    an arm, a conditional on an order ("AB"/"BA"), or the other arm by comparison."""
    lines = set()
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    scopes += [s for s in getattr(tree, "body", []) if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                          ast.ClassDef))]
    for scope in scopes:
        if _consts(scope) & _LITERALS:
            lines |= {c.lineno for c in _conditionals(scope) if _parity(c.test)}
    for c in _conditionals(tree):
        if _tests_a_literal(c.test, {"AB", "BA"}):
            lines.add(c.lineno)
        elif isinstance(c, ast.IfExp) and _tests_a_literal(c.test, {"bi0", "bi1"}) \
                and _consts(c.body) | _consts(c.orelse) == {"bi0", "bi1"}:
            lines.add(c.lineno)
    return sorted(lines)


def test_no_module_but_the_pairing_module_spells_the_alternation():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel != PAIRING:
                found += [f"{rel}:{line}" for line in alternations(ast.parse(path.read_text()))]
    assert found == []


# Today's spellings before the pairing was defined once, each of which the scan must see.
SPELLED = {
    "server": 'def plan(rounds):\n    for r in range(rounds):\n        order = ["bi0", "bi1"] if r % 2 == 1 else ["bi1", "bi0"]\n',
    "runner": 'def crossed_order(rounds):\n    return [("bi1", "bi0") if r % 2 == 0 else ("bi0", "bi1") for r in range(rounds)]\n',
    "planner": 'def crossed(first, n):\n    other = "BA" if first == "AB" else "AB"\n'
               '    return [first if i % 2 == 0 else other for i in range(n)]\n',
    "arms": 'def round_arms(self, r):\n    a = self.arm_a\n    b = "bi0" if a == "bi1" else "bi1"\n'
            '    return (a, b) if self.round_order(r) == "AB" else (b, a)\n',
    "statement": 'if order != "BA":\n    first = arm_a\n',
}


@pytest.mark.parametrize("name", sorted(SPELLED))
def test_the_scan_sees_each_spelling_of_the_alternation(name):
    assert alternations(ast.parse(SPELLED[name]))


def test_the_scan_passes_other_parities_and_sees_the_pairing_module():
    benign = ('def unquote(parts, fn):\n    return "".join(p if i % 2 else fn(p) for i, p in enumerate(parts))\n'
              'def judged(arms):\n    return "bi1" if "bi1" in arms else "bi0"\n')
    assert alternations(ast.parse(benign)) == []
    assert alternations(ast.parse((ROOT / PAIRING).read_text()))


# ------------------------------------------------------------- the GPU machine can import it

def test_the_pairing_module_imports_the_standard_library_only():
    tree = ast.parse((ROOT / PAIRING).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}
    assert "pydantic" not in set(sys.stdlib_module_names)  # negative control: the check can refuse one


def test_the_gpu_server_plans_without_pydantic():
    probe = "import sys, {m}; print('pydantic' in sys.modules)"
    loaded = {m: subprocess.run([sys.executable, "-c", probe.format(m=m)], capture_output=True, text=True, check=True,
                                cwd=ROOT).stdout.strip() for m in ("tica.legs.vllm_kernels.server", "tica.question")}
    assert loaded == {"tica.legs.vllm_kernels.server": "False", "tica.question": "True"}
