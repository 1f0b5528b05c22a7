"""checks.canaries keeps each item's canary results per (question, runner, judging code) within a
process: asked again, it answers as the run did; a question or a judge that changed is run anew,
so a result of the real judge never answers for another one."""

from __future__ import annotations

from pathlib import Path

from tica import checks
from tica.evidence import EvidenceItem
from tica.question import load_question

DEMO = Path(__file__).resolve().parents[2] / "demo" / "questions"


def _counting(calls: list):
    import tica.canaries

    real = tica.canaries.run_canaries

    def run(**kw):
        calls.append(kw)
        return real(**kw)
    return run


def test_the_same_question_and_code_is_answered_as_the_run_answered():
    calls: list = []
    run = _counting(calls)
    q = load_question(DEMO / "forward.yaml")
    first = checks.canaries(EvidenceItem.FORWARD, q, run=run)
    again = [checks.canaries(EvidenceItem.FORWARD, q, run=run) for _ in range(3)]
    assert first.passed and all(o == first for o in again)
    assert 1 <= len(calls) <= 2  # a second run only if the first imported judging modules it had not


def test_a_rebound_judge_is_run_anew_and_its_misses_are_not_hidden(monkeypatch):
    """The negative control: with the forward judge replaced by one that passes everything, the
    cached result of the real judge must not answer: the canaries run and are not caught."""
    import tica.judges
    from tica.verdict import Verdict

    q = load_question(DEMO / "forward.yaml")
    assert checks.canaries(EvidenceItem.FORWARD, q).passed
    real = tica.judges.judge_criteria

    def lenient(item, question, legs, *a, **kw):
        cell = real(item, question, legs, *a, **kw)
        return cell.model_copy(update={"verdict": Verdict.PASS})
    monkeypatch.setattr(tica.judges, "judge_criteria", lenient)
    outcome = checks.canaries(EvidenceItem.FORWARD, q)
    assert not outcome.passed and "not caught" in outcome.description, outcome.description


def test_another_question_is_run_anew(tmp_path):
    import yaml

    calls: list = []
    run = _counting(calls)
    data = yaml.safe_load((DEMO / "forward.yaml").read_text())
    q1 = load_question(DEMO / "forward.yaml")
    checks.canaries(EvidenceItem.FORWARD, q1, run=run)
    n = len(calls)
    data["name"] = data["name"] + "-renamed"
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(data))
    q2 = load_question(tmp_path / "q.yaml")
    assert q2.hash != q1.hash
    checks.canaries(EvidenceItem.FORWARD, q2, run=run)
    assert len(calls) == n + 1


def test_a_rebinding_in_any_module_a_verdict_depends_on_changes_the_cache_key(monkeypatch):
    """The class, not the case: every module a judge's verdict depends on (the files JUDGE_VERSION
    hashes, wherever they move: a room, a core reader) keys the cache. Rebinding one attribute of
    each changes the key; the control: a module no judge reads (the command line's) does not."""
    import importlib

    import tica.canaries  # noqa: F401  (the canary code loaded, as checks.canaries loads it)

    for name in sorted(checks.judging_modules()):
        module = importlib.import_module(name)
        attr = next(a for a in sorted(vars(module)) if not a.startswith("__"))
        before = checks._judging_code()
        with monkeypatch.context() as m:
            m.setattr(module, attr, object())
            assert checks._judging_code() != before, name
    for moved in ("tica.judging", "tica.forward_reading", "tica.grad_reading", "tica.confounders"):
        assert moved in checks.judging_modules()
    cli = importlib.import_module("tica.cli._common")
    before = checks._judging_code()
    with monkeypatch.context() as m:
        m.setattr(cli, "BAD", object())
        assert checks._judging_code() == before
