"""Issue 31, the tiers' cause: the cold-prefix-cache intervention, replayed (nothing here touches a GPU).

run16's stock BI=0 legs at c=64 fell into fast and slow tiers whose only recorded difference was the
prefix-cache hit rate (0.99 against 0.52). Session 19's call 23 reran those throughput legs with the
server's prefix cache emptied before every leg (tests/fixtures/h200/calls/cold_cache/README.md).
What the receipts show: every leg started cold and the hit rates came out alike, and BI=0 still
falls into tiers, at c=1 and at c=64. So the prefix cache was not the tiers' cause; what the
judge names now is what differs beside them, never the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from tica.evidence import EvidenceItem
from tica.judges import judge_criteria
from tica.question import load_question
from tica.receipt_archive import unpacked
from tica.receipts import load_leg
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1]
COLD = ROOT / "tests" / "fixtures" / "h200" / "calls" / "cold_cache" / "legs.tar.xz"
ACCEPT = ROOT / "tests" / "fixtures" / "h200" / "accept.tar.xz"
QUESTION = ROOT / "demo" / "questions" / "h200-accept" / "throughput.yaml"


@pytest.fixture(scope="module")
def receipts(tmp_path_factory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("cold")
    cold = sorted((unpacked(COLD, root / "cold") / "run17").glob("throughput_*"))
    warm = sorted((unpacked(ACCEPT, root / "accept") / "h200-accept-stock" / "run16").glob("throughput_*"))
    return {"cold": cold, "warm": warm}


def _tier_reason(cell, c: int) -> str | None:
    return next((r for r in cell.reasons if r.startswith(f"inconclusive: c={c}: bi0 throughput shows fast/slow tiers")), None)


def test_every_leg_started_cold_and_each_concurrency_saw_one_hit_rate(receipts):
    """The intervention took: each of the 20 legs records its cache emptied, and at each c every leg,
    fast or slow, either arm, had the same prefix-cache hit rate (the prompts' shared prefix within a
    leg). Control: run16's legs, not emptied, had hit rates that differ at c=64."""
    cold = [load_leg(d).meta for d in receipts["cold"]]
    assert len(cold) == 20 and all(m.telemetry.prefix_cache_reset is True for m in cold)
    for c in (1, 64):
        rates = {m.telemetry.prefix_cache_hit_rate for m in cold if m.concurrency == c}
        assert len(rates) == 1 and None not in rates, (c, rates)
    warm = [load_leg(d).meta for d in receipts["warm"]]
    assert all(m.telemetry.prefix_cache_reset is None for m in warm)
    assert len({m.telemetry.prefix_cache_hit_rate for m in warm if m.concurrency == 64}) > 1


def test_bi0_tiers_remain_with_the_cache_emptied_so_the_cache_is_not_their_cause(receipts):
    """Judged under the frozen h200-accept throughput question: with every leg cold, BI=0 still shows
    tiers at c=64 (and now at c=1), and the judge's cause no longer names the prefix cache. The same
    judge on run16's warm legs names it (the correlation the intervention tested)."""
    question = load_question(QUESTION)
    cold = judge_criteria(EvidenceItem.THROUGHPUT, question, receipts["cold"])
    assert cold.verdict is Verdict.INCONCLUSIVE, cold.summary
    for c in (1, 64):
        reason = _tier_reason(cold, c)
        assert reason is not None, cold.reasons
        assert "prefix-cache" not in reason, reason
    warm = judge_criteria(EvidenceItem.THROUGHPUT, question, receipts["warm"])
    assert "prefix-cache hit rate" in (_tier_reason(warm, 64) or ""), warm.reasons


def test_the_cold_run_bounds_stocks_c64_loss_under_the_budget_but_cannot_decide_it_beside_tiers(receipts):
    """At c=64 the sign test bounds the median loss (0.064) under the 0.3 budget, yet the tiers keep
    c=64 inconclusive: a bound beside unexplained tiers is not a decision. At c=1 the bound (0.306)
    is not under the budget, and the judge says how many more crossed rounds would decide it."""
    cold = judge_criteria(EvidenceItem.THROUGHPUT, load_question(QUESTION), receipts["cold"])
    assert any(r.startswith("note: c=64: the one-sided 0.95 upper bound of the median loss") and "under the budget" in r
               for r in cold.reasons), cold.reasons
    assert any(r.startswith("inconclusive: c=1: inside the noise") and "more crossed round(s) would decide" in r
               for r in cold.reasons), cold.reasons
    assert not any(r.startswith("fail:") for r in cold.reasons), cold.reasons
