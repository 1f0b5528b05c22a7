"""Issue 31, the tiers' shape (replayed; nothing here touches a GPU): were the slow legs slow on
every token, or on a few long pauses?

A pause of the engine's loop (a garbage collection, a compile) would stall a few tokens for a long
time: the mean time between tokens rises, the median hardly moves. In both committed readings of the
tiers (itl_host, placement) the slow legs' median moved with their throughput at c=1, so every token
was slower: the cause sits in something fixed for the leg's whole server, not in pauses inside it.
Controls: the same receipts with the slow legs' median put back to the fast legs' (the mean kept)
read as pauses, and with both put back read as neither."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tica.items.throughput.tiers import split_tiers, tier_shape
from tica.receipt_archive import unpacked
from tica.receipts import load_leg

ROOT = Path(__file__).resolve().parents[1]
CALLS = ROOT / "tests" / "fixtures" / "h200" / "calls"
TIERED = 1.15  # the questions' tier_ratio


@pytest.fixture(scope="module", params=["itl_host", "placement"])
def dirs(request, tmp_path_factory) -> list[Path]:
    root = unpacked(CALLS / request.param / "legs.tar.xz", tmp_path_factory.mktemp(request.param))
    return sorted((root / "h200").glob("throughput_*"))


def _legs(dirs: list[Path], arm: str, c: int) -> list[tuple[float, float, float]]:
    """(output tok/s, median and mean time between tokens) of one arm's legs at c."""
    out = []
    for d in dirs:
        meta = load_leg(d).meta
        if meta.arm == arm and meta.concurrency == c:
            b = json.loads((d / "bench.json").read_text())
            out.append((b["output_throughput"], b["median_itl_ms"], b["mean_itl_ms"]))
    return out


def _tiered(legs) -> bool:
    xs = [x for x, _, _ in legs]
    return min(xs) > 0 and max(xs) / min(xs) > TIERED  # a leg at 0 failed: no tier to read


def test_at_c1_a_tiered_arm_was_slower_on_every_token(dirs):
    tiered = [arm for arm in ("bi0", "bi1") if _tiered(_legs(dirs, arm, 1))]
    assert tiered  # BI=0 fell into tiers at c=1 in both readings
    for arm in tiered:
        assert "every token was slower" in (tier_shape(_legs(dirs, arm, 1)) or ""), arm


@pytest.mark.parametrize("c", [1, 64])
def test_no_arm_reads_as_pauses(dirs, c):
    for arm in ("bi0", "bi1"):
        assert "in a few long pauses" not in (tier_shape(_legs(dirs, arm, c)) or "")


def test_the_same_receipts_with_the_slow_median_put_back_read_as_pauses_and_with_both_as_neither(dirs):
    legs = _legs(dirs, "bi0", 1)
    fast, _ = split_tiers([x for x, _, _ in legs])
    fast_med = min(legs[i][1] for i in fast)
    fast_mean = min(legs[i][2] for i in fast)
    paused = [(x, med if i in fast else fast_med, mean) for i, (x, med, mean) in enumerate(legs)]
    assert "in a few long pauses" in (tier_shape(paused) or "")
    flat = [(x, med if i in fast else fast_med, mean if i in fast else fast_mean) for i, (x, med, mean) in enumerate(legs)]
    assert tier_shape(flat) is None


def test_a_leg_without_its_times_between_tokens_tells_nothing(dirs):
    legs = _legs(dirs, "bi0", 1)
    assert tier_shape([(legs[0][0], None, legs[0][2]), *legs[1:]]) is None
    assert tier_shape([(0.0, legs[0][1], legs[0][2]), *legs[1:]]) is None  # a failed leg: no tier to read
    assert tier_shape(legs[:1]) is None


def _census(tmp: Path) -> dict[tuple[str, str, int], list[tuple[float, float | None, float | None]]]:
    """Every committed GPU throughput leg (sealed folders and archives), grouped by run, arm and c."""
    fixtures = ROOT / "tests" / "fixtures" / "h200"
    roots = [p.parent for p in fixtures.glob("run*/**/bench.json")]
    for n, tar in enumerate(sorted(fixtures.rglob("*.tar.xz"))):
        roots.append(unpacked(tar, tmp / str(n)))
    groups: dict[tuple[str, str, int], list] = {}
    for bench in sorted({b for r in roots for b in Path(r).rglob("bench.json")}):
        if not (bench.parent / "leg.json").is_file():
            continue
        meta = json.loads((bench.parent / "leg.json").read_text())
        if meta.get("item") != "throughput":
            continue
        b = json.loads(bench.read_text())
        key = (str(bench.parent.parent), meta["arm"], meta["concurrency"])
        groups.setdefault(key, []).append((b["output_throughput"], b.get("median_itl_ms"), b.get("mean_itl_ms")))
    return groups


def test_across_every_committed_gpu_throughput_run_no_tier_is_pauses_and_every_c1_tier_is_every_token(tmp_path):
    """The census README states: each run's tiered arms (max/min over 1.15), H200 and H100 alike."""
    shapes = {key: tier_shape(legs) for key, legs in _census(tmp_path).items() if len(legs) >= 2 and _tiered(legs)}
    assert len(shapes) >= 30
    assert not [k for k, s in shapes.items() if s and "in a few long pauses" in s]
    c1 = {k: s for k, s in shapes.items() if k[2] == 1}
    assert c1 and all(s and "every token was slower" in s for s in c1.values()), c1
    told = sum(1 for s in shapes.values() if s and "every token was slower" in s)
    print(f"{len(shapes)} tiered arms, {len(c1)} at c=1; every token slower in {told}, neither in {len(shapes) - told}")


def test_the_judge_names_the_shape_in_a_tiered_cells_reason(tmp_path):
    """Through the real judge: the committed h200-tput runs (H200, tiered at c=1 in both arms in
    run8) carry the shape in the reason that keeps their cells inconclusive, once per tiered arm."""
    import yaml

    from tica.judges import judge, load_candidate
    from tica.question import load_question

    basis = unpacked(ROOT / "tests" / "fixtures" / "h200" / "basis.tar.xz", tmp_path / "basis") / "h200-tput"
    candidate = load_candidate(ROOT / "demo" / "candidates" / "h200-tput.yaml")
    question = load_question(ROOT / "demo" / "questions" / "h200-tput" / "throughput.yaml")
    runs = {r["run"]: r for r in yaml.safe_load((basis / "replay.yaml").read_text())["throughput"]}
    legs = [p for pattern in runs["run8"]["legs"] for p in sorted(basis.glob(pattern))]
    cell = judge("throughput", question, legs, candidate)
    tiered = cell.numbers["per_concurrency"]["1"]["tier_causes"]
    assert set(tiered) == {"bi0", "bi1"}
    assert all("every token was slower in the slow legs" in cause for cause in tiered.values()), tiered
    assert cell.verdict.value == "inconclusive" and "every token was slower" in " ".join(cell.reasons)
