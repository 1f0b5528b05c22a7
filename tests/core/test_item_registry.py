"""The item registry (tica.items.registry): every evidence item has an entry, every entry's pieces
resolve to what the judges' entry point, the canary table, the checks and the leg plan use, and
an item with a room of its own keeps its pieces in its folder. A control: an entry that points
at another item's pieces, or at nothing, is caught."""

from __future__ import annotations

import typing
from dataclasses import replace
from pathlib import Path

import pytest

from tica import canaries, checks
from tica.evidence import EvidenceItem
from tica.items.registry import ROOMS, ItemRoom, item_names, resolve, room, rooms
from tica.judges import JUDGES, judge_criteria
from tica.question import Criteria, parse_question
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[2]
ROOM_FILES = ("__init__.py", "criteria.py", "judge.py", "canaries.py", "legs.py")
CRITERIA_MODELS = typing.get_args(typing.get_args(Criteria)[0])


def problems(r: ItemRoom) -> list[str]:
    """What is wrong with one entry: a piece that does not resolve, or that belongs to another item."""
    out: list[str] = []
    for piece in ("criteria", "judge", "canary_builder", "own_canaries", "canary_question", "leg_plan"):
        ref = getattr(r, piece)
        if ref is None:
            continue
        try:
            resolve(ref)
        except (ImportError, AttributeError) as err:
            out.append(f"{r.item.value}.{piece}: {ref} does not resolve ({err})")
    if out:
        return out
    model = r.criteria_model()
    if model not in CRITERIA_MODELS or model.model_fields["item"].default is not r.item:
        out.append(f"{r.item.value}: {model.__name__} is not its arm of tica.question.Criteria")
    if r.item.value not in r.judge.split(":")[-1]:
        out.append(f"{r.item.value}: judge {r.judge} is another item's")
    if r.item.value not in r.canary_builder.split(":")[-1]:
        out.append(f"{r.item.value}: canary builder {r.canary_builder} is another item's")
    if not r.canaries():
        out.append(f"{r.item.value}: no canary")
    if any(c.item is not r.item for c in r.room_canaries()):
        out.append(f"{r.item.value}: its room holds another item's canary")
    if r.folder is not None:
        missing = [f for f in ROOM_FILES if not (ROOT / r.folder / f).is_file()]
        refs = [x for x in (r.criteria, r.judge, r.canary_builder, r.own_canaries, r.leg_plan) if x]
        module = "tica.items." + r.item.value
        if missing or r.folder != f"tica/items/{r.item.value}" or not all(x.startswith(module + ".") for x in refs):
            out.append(f"{r.item.value}: its room {r.folder} lacks {missing} or names pieces outside it")
    return out


def test_every_item_has_one_entry_in_the_enums_order():
    assert tuple(ROOMS) == tuple(EvidenceItem)
    assert item_names() == tuple(i.value for i in EvidenceItem)
    assert all(room(i).item is i and room(i.value) is room(i) for i in EvidenceItem)


@pytest.mark.parametrize("item", list(EvidenceItem), ids=lambda i: i.value)
def test_each_entry_resolves_to_what_its_readers_use(item):
    r = room(item)
    assert problems(r) == []
    assert JUDGES[item] is r.judge_fn()
    assert canaries.BUILDERS[item] is r.builder()
    assert set(r.room_canaries()) <= set(r.canaries()) <= set(canaries.CANARIES)
    assert checks.REQUIRED[item] == (checks.CANARIES, checks.RECEIPTS, checks.FROZEN) + r.extra_checks
    assert set(r.extra_checks) <= {checks.QUALITY_SUMS, checks.WORKLOAD}


def test_the_rooms_that_exist_are_named():
    """Every evidence item has its room (docs/architecture.md): the older layout holds none."""
    assert [r.item for r in rooms() if r.folder] == [EvidenceItem.FORWARD, EvidenceItem.BACKWARD, EvidenceItem.UPDATE,
                                                     EvidenceItem.QUALITY, EvidenceItem.THROUGHPUT,
                                                     EvidenceItem.CLEAN_EXIT, EvidenceItem.ARTIFACTS]
    on_disk = sorted(p.name for p in (ROOT / "tica" / "items").iterdir() if (p / "__init__.py").is_file())
    assert on_disk == sorted(r.item.value for r in rooms() if r.folder)


def test_a_room_judges_through_the_entry_point(tmp_path):
    """The room's canary builder and judge, read through the registry, give the pass the
    canaries start from; its planted errors do not pass."""
    q = canaries.default_questions()[EvidenceItem.CLEAN_EXIT]
    legs = room(EvidenceItem.CLEAN_EXIT).builder()(q, tmp_path / "base")
    assert judge_criteria("clean_exit", q, legs).verdict is Verdict.PASS
    force_killed = next(c for c in room(EvidenceItem.CLEAN_EXIT).room_canaries() if c.name.endswith("force_killed"))
    force_killed.mutate(q, legs)
    assert judge_criteria("exit", q, legs).verdict is Verdict.FAIL


def test_the_artifacts_room_judges_through_the_entry_point(tmp_path):
    """The artifacts' builder (the forward and update builders, read through the registry) gives
    a pass; a receipt edited after sealing fails; the room runs no legs of its own."""
    from resources.legs import plan_legs

    q = canaries.default_questions()[EvidenceItem.ARTIFACTS]
    legs = room(EvidenceItem.ARTIFACTS).builder()(q, tmp_path / "base")
    assert judge_criteria("artifacts", q, legs).verdict is Verdict.PASS
    sealed = next(c for c in room(EvidenceItem.ARTIFACTS).room_canaries() if c.name == "artifacts.sealed")
    sealed.mutate(q, legs)
    assert judge_criteria("artifacts", q, legs).verdict is Verdict.FAIL
    assert plan_legs(EvidenceItem.ARTIFACTS, q) == []


@pytest.mark.parametrize("item", [EvidenceItem.FORWARD, EvidenceItem.BACKWARD, EvidenceItem.CLEAN_EXIT,
                                  EvidenceItem.UPDATE, EvidenceItem.QUALITY], ids=lambda i: i.value)
def test_the_rooms_leg_plan_is_the_plan_it_replaced(item):
    """Behaviour-neutral: one leg per arm in the first round's order, as resources/legs.py planned it."""
    from resources.legs import LegSpec, plan_legs

    q = canaries.default_questions()[item]
    expected = [LegSpec(item, arm, slot=slot) for slot, arm in enumerate(q.round_arms(1), start=1)]
    assert plan_legs(item, q) == expected


def test_the_throughput_rooms_leg_plan_is_the_plan_it_replaced():
    """Behaviour-neutral: per round, the round's pair in its crossed order (tica.pairing), as
    resources/legs.py planned it; a question that starts BA, or calls arm A BI=0, keeps its order."""
    from resources.legs import LegSpec, plan_legs

    item = EvidenceItem.THROUGHPUT
    q = canaries.default_questions()[item]
    bi0_first = canaries.with_rounds(q.model_copy(update={"pairing_order": ("BA",)}), 5)
    arm_a_bi0 = parse_question({**q.model_dump(mode="json"), "criteria": {
        **q.model_dump(mode="json")["criteria"], "arm_a": "bi0"}})
    for question in (q, bi0_first, arm_a_bi0):
        expected = [LegSpec(item, arm, round=r, slot=slot) for r in range(1, len(question.pairing_order) + 1)
                    for slot, arm in enumerate(question.round_arms(r), start=1)]
        assert plan_legs(item, question) == expected
    assert [(s.arm, s.round, s.slot) for s in plan_legs(item, bi0_first)][:6] == [
        ("bi0", 1, 1), ("bi1", 1, 2), ("bi1", 2, 1), ("bi0", 2, 2), ("bi0", 3, 1), ("bi1", 3, 2)]


def test_the_throughput_room_judges_through_the_entry_point(tmp_path):
    """Throughput's builder and judge, read through the registry, pass under the canaries' frozen
    sign-test basis; one target c pushed over its budget fails; the over-budget canary is switched
    off under a question that freezes no budget; its workload check stays required."""
    q = canaries.default_questions()[EvidenceItem.THROUGHPUT]
    legs = room(EvidenceItem.THROUGHPUT).builder()(q, tmp_path / "base")
    assert judge_criteria("throughput", q, legs).verdict is Verdict.PASS
    over = next(c for c in room(EvidenceItem.THROUGHPUT).room_canaries() if c.name == "throughput.target_c_over_budget")
    over.mutate(q, legs)
    assert judge_criteria("throughput", q, legs).verdict is Verdict.FAIL
    data = q.model_dump(mode="json")
    data["criteria"].update(budget=None, statistical_basis=None)
    assert canaries.switched_off(over, parse_question(data)) is not None
    assert room(EvidenceItem.THROUGHPUT).extra_checks == (checks.WORKLOAD,)


def test_the_update_room_judges_through_the_entry_point(tmp_path):
    """The update's builder and judge, read through the registry, pass; a post-update logprob one
    ulp off fails; the rerun canaries stay switched off under a question that asks for no rerun."""
    q = canaries.default_questions()[EvidenceItem.UPDATE]
    legs = room(EvidenceItem.UPDATE).builder()(q, tmp_path / "base")
    assert judge_criteria("update", q, legs).verdict is Verdict.PASS
    bitwise = next(c for c in room(EvidenceItem.UPDATE).room_canaries() if c.name == "update.post_forward_bitwise")
    bitwise.mutate(q, legs)
    assert judge_criteria("update", q, legs).verdict is Verdict.FAIL
    rerun = next(c for c in room(EvidenceItem.UPDATE).room_canaries() if c.name == "update.rerun_weights")
    assert canaries.switched_off(rerun, q) is not None


@pytest.mark.parametrize("item,planted", [(EvidenceItem.FORWARD, "forward.bi1_bitwise_arrays"),
                                           (EvidenceItem.BACKWARD, "backward.reaches_master")],
                         ids=lambda x: getattr(x, "value", x))
def test_the_forward_and_backward_rooms_judge_through_the_entry_point(tmp_path, item, planted):
    """Each room's builder and judge, read through the registry, pass under its default question; a
    planted error from its room does not."""
    q = canaries.default_questions()[item]
    legs = room(item).builder()(q, tmp_path / "base")
    assert judge_criteria(item.value, q, legs).verdict is Verdict.PASS
    next(c for c in room(item).room_canaries() if c.name == planted).mutate(q, legs)
    assert judge_criteria(item.value, q, legs).verdict is Verdict.FAIL


def test_the_forward_rooms_switches_apply_to_its_canaries():
    """A BI=0 smoke question switches the BI=1 canaries off (the reasons are the forward room's)."""
    from tica.question import parse_question

    raw = canaries.default_questions()[EvidenceItem.FORWARD].model_dump(mode="json")
    smoke = parse_question({**raw, "criteria": {**raw["criteria"], "arms": ["bi0"]}})
    by_name = {c.name: c for c in room(EvidenceItem.FORWARD).room_canaries()}
    assert canaries.switched_off(by_name["forward.route_flip"], smoke) is not None
    assert canaries.switched_off(by_name["forward.bi0_grad_norm_recorded"], smoke) is None
    assert canaries.switched_off(by_name["forward.route_flip"], canaries.default_questions()[EvidenceItem.FORWARD]) is None


def test_the_quality_room_judges_through_the_entry_point(tmp_path):
    """Quality's builder and judge, read through the registry, pass; one problem too many wrong in
    BI=1 fails; its 2x2 recount stays the check its verdict carries."""
    q = canaries.default_questions()[EvidenceItem.QUALITY]
    legs = room(EvidenceItem.QUALITY).builder()(q, tmp_path / "base")
    assert judge_criteria("quality", q, legs).verdict is Verdict.PASS
    over = next(c for c in room(EvidenceItem.QUALITY).room_canaries() if c.name == "quality.threshold")
    over.mutate(q, legs)
    assert judge_criteria("quality", q, legs).verdict is Verdict.FAIL
    assert room(EvidenceItem.QUALITY).extra_checks == (checks.QUALITY_SUMS,)


def test_control_a_wrong_or_missing_piece_is_caught():
    r = room(EvidenceItem.CLEAN_EXIT)
    assert problems(replace(r, judge="tica.items.throughput.judge:judge_throughput"))
    assert problems(replace(r, canary_builder="tica.canaries:build_forward"))
    assert problems(replace(r, criteria="tica.question:QualityCriteria"))
    assert problems(replace(r, judge="tica.items.clean_exit.judge:no_such_judge"))
    assert problems(replace(r, own_canaries="tica.items.clean_exit.canaries:NOTHING"))
    assert problems(replace(r, folder="tica/items/nowhere"))


IMPORT_ALONE = "import importlib, sys; importlib.import_module(sys.argv[1])"


def _imports_alone(module: str, path: str = ".") -> bool:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", IMPORT_ALONE, module], cwd=path, capture_output=True).returncode == 0


def test_every_room_module_imports_first_in_a_fresh_process():
    """A room stands on the core: importing any of its modules first (a script, a worker, a test
    file of its own) works, with no import cycle through the judges package."""
    root = Path(__file__).resolve().parents[2]
    modules = sorted(".".join(p.relative_to(root).with_suffix("").parts)
                     for p in (root / "tica" / "items").rglob("*.py") if p.name != "__init__.py")
    assert modules and [m for m in modules if not _imports_alone(m, str(root))] == []


def test_the_probe_sees_an_import_cycle(tmp_path):
    """The negative control: two modules that need each other's names at import time fail the probe."""
    (tmp_path / "cyc_a.py").write_text("from cyc_b import B\nA = 1\n")
    (tmp_path / "cyc_b.py").write_text("from cyc_a import A\nB = 1\n")
    assert not _imports_alone("cyc_a", str(tmp_path))
    assert _imports_alone("json", str(tmp_path))
