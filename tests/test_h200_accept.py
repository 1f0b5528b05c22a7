"""Issue 31's end-to-end decision, replayed from the committed receipts of the h200-accept runs
(tests/fixtures/h200/accept.tar.xz; one H100 80GB HBM3, SmolLM2-135M-Instruct, vLLM 0.26.0, decode
CUDA graphs, prefix caching, chunked prefill). Each track is materialized item by item into a
fresh DuckDB ledger the way its Dagster assets do it (the replay runner's selection, each item's
question frozen before its legs are read, clean exit and artifacts over the legs they cover), and
then reported. Nothing here touches a GPU. The current runs are run16 (session 18: both candidates,
every item, at one source).

- h200-accept (overlay3): forward, backward, update, quality, clean exit and artifacts pass, their
  questions verifiably frozen before the legs (the runs' signed chain); throughput fails at c=1 over
  all 5 planned crossed rounds (median loss 0.43 over the 0.3 budget), so the candidate is rejected
  and the report's first line names throughput.
- h200-accept-stock: rejected by the forward item, which catches the batch-variant engine (and the
  update's re-check); its throughput is decided at c=1 and left inconclusive at c=64 by BI=0 tiers
  whose cause the legs name (prefix-cache hits).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from resources.legs import LegRequest, ReplayLegRunner
from tica.acceptance import materialize, report
from tica.candidate import identify
from tica.cli.report import questions_in_force
from tica.evidence import COVERS, EvidenceItem
from tica.ledger import Ledger
from tica.manifest import load_manifest
from tica.order_proof import TRUSTED_KEYS_ENV
from tica.receipt_archive import unpacked
from tica.verdict import Verdict
from tica_assets.core import find_question, track_questions

E = EvidenceItem
ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / "tests" / "fixtures" / "h200" / "accept.tar.xz"
QUESTIONS = ROOT / "demo" / "questions"
QUIET = SimpleNamespace(log=SimpleNamespace(info=lambda *_: None, warning=lambda *_: None))


def materialized_track(receipts: Path, ledger_path: Path, track: str):
    loaded = load_manifest(ROOT / "demo" / "candidates" / f"{track}.yaml")
    identity = identify(loaded)
    ledger = Ledger(ledger_path)
    runner = ReplayLegRunner(receipts_dir=str(receipts))
    done = {}
    for item in (E.FORWARD, E.BACKWARD, E.UPDATE, E.QUALITY, E.THROUGHPUT, E.CLEAN_EXIT, E.ARTIFACTS):
        upstream = [leg for covered in COVERS.get(item, ()) for leg in done[covered].current.own_legs]

        def run_legs(question, candidate_id, item=item):
            return runner.run_batches(QUIET, LegRequest(track=track, item=item, question=question, manifest=loaded,
                                                        candidate_id=candidate_id, out_dir=ledger_path.parent / "legs"))

        done[item] = materialize(ledger, loaded, identity, item, find_question(QUESTIONS, track, item), run_legs,
                                 upstream, track_questions=track_questions(QUESTIONS, track))
    return done, report(ledger, track, identity, questions=questions_in_force(QUESTIONS, track))


@pytest.fixture(scope="module")
def tracks(tmp_path_factory):
    root = tmp_path_factory.mktemp("accept")
    receipts = unpacked(ARCHIVE, root / "receipts")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TRUSTED_KEYS_ENV, str(ROOT / "demo" / "trusted-keys"))
        mp.setenv("TICA_CACHE_DIR", str(root / "cache"))
        return {t: materialized_track(receipts, root / f"{t}.duckdb", t) for t in ("h200-accept", "h200-accept-stock")}


def check(done, item: EvidenceItem, name: str):
    return next(c for c in done[item].current.checks if c.name == name)


def test_the_overlay_passes_forward_backward_update_and_quality_under_questions_proven_frozen_before_its_legs(tracks):
    done, _ = tracks["h200-accept"]
    for item in (E.FORWARD, E.BACKWARD, E.UPDATE, E.QUALITY):
        assert done[item].current.cell.verdict is Verdict.PASS, (item, done[item].current.cell.reasons)
        frozen = check(done, item, "frozen_before_run")
        assert frozen.passed, (item, frozen)
        assert "ed25519:e34b0e4d23fe3d8d" in f"{frozen.description} {frozen.detail}"  # by the signed chain


def test_the_freeze_proof_is_worth_nothing_without_a_trusted_key(tmp_path):
    """Negative control: the same receipts prove the order under the shipped key, and nothing with
    no key trusted."""
    from tica.order_proof import proven_freezes, trusted_keys
    from tica.question import load_question

    receipts = unpacked(ARCHIVE, tmp_path / "receipts")
    leg = receipts / "h200-accept" / "run12" / "forward_bi1_decode"
    q = load_question(QUESTIONS / "h200-accept" / "forward.yaml")
    proven, _ = proven_freezes([leg], q.hash, trusted_keys(ROOT / "demo" / "trusted-keys"))
    assert proven[leg.parent][0].startswith("2026-12-05T15:1")
    proven, problems = proven_freezes([leg], q.hash, {})
    assert proven == {} and problems[leg.parent]


def test_the_overlay_is_rejected_by_throughput_at_c1_over_all_five_planned_rounds(tracks):
    """run16 handed in the 5 crossed rounds the frozen question planned, in one call on one node:
    BI=1 at c=1 loses a median 0.43 of BI=0's output throughput per round, over the 0.3 budget, so
    throughput fails and the report's first line names it; at c=64 the loss (0.12) is within."""
    done, rep = tracks["h200-accept"]
    cell = done[E.THROUGHPUT].current.cell
    assert cell.verdict is Verdict.FAIL, cell.summary
    assert "5/5 valid rounds at each of c=1, 64" in cell.summary, cell.summary
    assert any(r.startswith("fail: c=1: BI=1 loses a median 43.3% of BI=0's throughput per round, over the 30% budget")
               for r in cell.reasons), cell.reasons
    assert not any(r.startswith(("fail: c=64:", "inconclusive: c=64:")) for r in cell.reasons), cell.reasons
    assert not any("not handed in" in r for r in cell.reasons), cell.reasons
    assert not rep.accepted and "1 fail (throughput): c=1: BI=1 loses a median 43.3%" in rep.headline, rep.headline


def test_throughput_legs_record_the_serving_processes_cpu_time_and_prefix_cache_hits(tmp_path):
    """run16's throughput legs carry telemetry.cpu_util (engine, API server, client) and the leg's
    prefix-cache hit rate and preemptions, read from vLLM's counters; run15's carried no counters."""
    from tica.receipts import load_leg

    receipts = unpacked(ARCHIVE, tmp_path / "receipts")
    for leg in sorted((receipts / "h200-accept" / "run16").glob("throughput_*")):
        tel = load_leg(leg).meta.telemetry
        assert set(tel.cpu_util) == {"engine_core", "api_server", "client"}, leg.name
        assert tel.prefix_cache_hit_rate is not None and tel.preemptions == 0, leg.name
    old = load_leg(next((receipts / "h200-accept" / "run15").glob("throughput_*"))).meta.telemetry
    assert old.prefix_cache_hit_rate is None and old.preemptions is None


def test_one_server_and_one_client_through_every_round_show_a_clean_exit_for_each_leg(tracks):
    """run16's legs read their serving processes alive after their work: one API server and
    EngineCore per arm through all 5 rounds, one bench client through both arms, one trainer through
    its forward and update legs, each ending once, cleanly. Clean exit passes on both tracks."""
    for track in ("h200-accept", "h200-accept-stock"):
        done, _ = tracks[track]
        cell = done[E.CLEAN_EXIT].current.cell
        assert cell.verdict is Verdict.PASS, (track, cell.reasons)
        assert cell.numbers["arms_verified"] == ["bi0", "bi1"]


def test_run15s_shared_exits_without_live_reads_stay_copies(tmp_path):
    """Negative control on real receipts: run15's throughput legs, the same shape of run but no
    `alive_at_end`, cannot show one server served every round."""
    from tica.judges import judge_criteria
    from tica.question import load_question

    receipts = unpacked(ARCHIVE, tmp_path / "receipts")
    legs = sorted((receipts / "h200-accept" / "run15").glob("throughput_*"))
    cell = judge_criteria(E.CLEAN_EXIT, load_question(QUESTIONS / "h200-accept" / "clean_exit.yaml"), legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("is recorded 10 times, so it shows at most one of them ended" in r for r in cell.reasons), cell.reasons


def test_stock_throughput_is_decided_at_c1_and_its_c64_tiers_are_named_prefix_cache_hits(tracks):
    """Stock's throughput at every c of the frozen question: at c=1 the sign test bounds the median
    loss under the budget; at c=64 BI=0 falls into tiers, inconclusive, and the cause the legs name
    is the prefix cache (every leg sends the same seeded prompts: a leg whose prompts an earlier leg
    served is read from the cache)."""
    done, _ = tracks["h200-accept-stock"]
    cell = done[E.THROUGHPUT].current.cell
    assert cell.verdict is Verdict.INCONCLUSIVE, cell.summary
    assert any(r.startswith("note: c=1: the one-sided 0.95 upper bound of the median loss") and "under the budget" in r
               for r in cell.reasons), cell.reasons
    tiers = [r for r in cell.reasons if r.startswith("inconclusive: c=64: bi0 throughput shows fast/slow tiers")]
    assert tiers and "prefix-cache hit rate" in tiers[0], cell.reasons
    assert not any(r.startswith(("inconclusive: c=1", "fail:")) for r in cell.reasons), cell.reasons


def test_stock_vllm_is_rejected_by_the_forward_item(tracks):
    """run16: stock's BI=1 decode logprobs are not the trainer's at any step; its report names forward first."""
    done, rep = tracks["h200-accept-stock"]
    assert done[E.FORWARD].current.cell.verdict is Verdict.FAIL
    assert "not bitwise" in " ".join(done[E.FORWARD].current.cell.reasons)
    assert not rep.accepted and "forward" in rep.headline


def test_the_update_reproduces_its_grad_norm_and_weights_hash_across_runs_and_machines(tmp_path):
    """run10 (GPU-0ddbaa36), run11 (GPU-ba85492b), run12 (GPU-2044cdbd), run13 (GPU-600f24fe),
    run14 (another machine), run15 (GPU-f169465b) and run16 (GPU-c469191d): one seed, one batch, the
    same grad norm and updated weights hash on seven H100 machines, and within each run its rerun."""
    import json

    receipts = unpacked(ARCHIVE, tmp_path / "receipts")
    seen = set()
    for run in ("run10", "run11", "run12", "run13", "run14", "run15", "run16"):
        row = json.loads((receipts / "h200-accept" / run / "update_bi1" / "metrics.jsonl").read_text().splitlines()[0])
        rerun = row["tica/update_rerun"]
        assert (rerun["grad_norm"], rerun["updated_weights_hash"]) == (row["actor/grad_norm"], row["updated_weights_hash"])
        seen.add((row["actor/grad_norm"], row["updated_weights_hash"]))
    assert len(seen) == 1, seen
