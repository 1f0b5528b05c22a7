"""The MoE row bound on the device (issue 33), replayed: nothing here touches a GPU.

One H100 ran the matrix's `moe_packed` load (40 sequences of about 2,000 tokens, 80,221 packed rows)
on mixtral-8x7b_l1 for both candidates (tests/fixtures/h200/calls/moe_packed/README.md). One
`fused_experts` call over all of it wraps its 32-bit row offset (tokens x top-2 rows of width
2 x 14336) from token 74,898 on. What the receipts show: the product trainer, which splits the call
under the signed bound, is bitwise with vLLM's prefill; its one-call control (`unchunked`) differs
on exactly the scored tokens whose row is past the wrap, and on no other.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tica.judges.matrix import matrix_cells
from tica.legs.vllm_kernels.kernels import ROW_CALL_ELEMS
from tica.question import load_question
from tica.receipt_archive import unpacked
from tica.seal import check_seal
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / "tests" / "fixtures" / "h200" / "calls" / "moe_packed" / "legs.tar.xz"
QUESTION = load_question(ROOT / "demo" / "questions" / "h200-matrix" / "forward.yaml")
INTER, TOP_K = 14336, 2  # mixtral-8x7b: 8 experts x 14336, top-2
ROW_WIDTH = TOP_K * 2 * INTER  # silu_and_mul's elements per token in one fused_experts call
FIRST_WRAPPED = -(-2**32 // (2 * INTER)) // TOP_K  # the first token one of whose rows starts past 2^32


@pytest.fixture(scope="module")
def legs(tmp_path_factory) -> dict[str, Path]:
    root = unpacked(ARCHIVE, tmp_path_factory.mktemp("moe_packed")) / "h200"
    # mx-<candidate>-mixtral-8x7b_l1-moe_packed-<scored>, keyed "<candidate>/<scored>"
    return {f"{d.name.split('-')[1]}/{d.name.rsplit('-', 1)[1]}": d for d in sorted(root.glob("mx-*"))}


def _metrics(leg: Path) -> dict:
    (row,) = [json.loads(x) for x in (leg / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return row


def _wrapped_scored(leg: Path, first_wrapped: int) -> int:
    """How many scored tokens of the packed batch are predicted from a row at or past
    `first_wrapped` (token k of a sequence is scored from the row before it; a sequence's first
    token is not scored, its last row predicts nothing)."""
    with np.load(leg / "arrays" / "step_0001.npz") as z:
        full = z["seq_lens"].astype(np.int64) + 1
    starts = np.concatenate([[0], np.cumsum(full)[:-1]])
    rows = np.concatenate([np.arange(s, s + n - 1) for s, n in zip(starts, full)])  # the predicting rows
    return int((rows >= first_wrapped).sum())


def test_four_legs_sealed_on_one_h100_past_the_wrap(legs):
    assert sorted(legs) == ["overlay3/decode", "overlay3/prefill", "stock/decode", "stock/prefill"]
    for leg in legs.values():
        assert check_seal(leg) == []
        meta = json.loads((leg / "leg.json").read_text())
        assert meta["device"]["name"] == "NVIDIA H100 80GB HBM3" and meta["versions"]["vllm"] == "0.26.0"
        assert _metrics(leg)["tica/packed_rows"] == 80221 > FIRST_WRAPPED


def test_the_product_trainer_splits_fused_experts_under_the_bound_and_the_control_does_not(legs):
    for candidate in ("overlay3", "stock"):
        variants = _metrics(legs[f"{candidate}/prefill"])["tica/variants"]
        product = variants["product"]["largest_call_rows"]["fused_experts"]
        control = variants["unchunked"]["largest_call_rows"]["fused_experts"]
        assert product * ROW_WIDTH <= ROW_CALL_ELEMS < control * ROW_WIDTH
        assert control == 80221 and FIRST_WRAPPED * ROW_WIDTH < 2**32 <= (FIRST_WRAPPED + 1) * ROW_WIDTH


def test_split_the_prefill_is_bitwise_and_one_call_differs_exactly_past_the_wrap(legs):
    """The one-call control's differing tokens are the scored tokens whose row is past the wrap;
    control: the same count one token earlier or later does not match, so the relation is exact."""
    for candidate in ("overlay3", "stock"):
        leg = legs[f"{candidate}/prefill"]
        row = _metrics(leg)
        assert row["tica/n_bitwise_diff"] == 0 and row["tica/variants"]["product"]["prefill_n_diff"] == 0
        differing = row["tica/variants"]["unchunked"]["prefill_n_diff"]
        assert differing == _wrapped_scored(leg, FIRST_WRAPPED) == 5320
        assert _wrapped_scored(leg, FIRST_WRAPPED - 1) != differing != _wrapped_scored(leg, FIRST_WRAPPED + 1)


def test_judged_overlay3_passes_both_and_stock_fails_only_its_decode(legs):
    """Under the matrix question frozen before the matrix: the packed load changes nothing of the
    verdicts seen on every smaller load (stock's decode differs as vLLM's decode differs from its
    prefill)."""
    cells = {(c.candidate, c.scored): c for c in matrix_cells(QUESTION, next(iter(legs.values())).parents[1])}
    assert {k: c.verdict for k, c in cells.items()} == {
        ("overlay3", "decode"): Verdict.PASS, ("overlay3", "prefill"): Verdict.PASS,
        ("stock", "decode"): Verdict.FAIL, ("stock", "prefill"): Verdict.PASS}
    assert all(c.load == "moe_packed" for c in cells.values())
    stock = _metrics(legs["stock/decode"])
    assert stock["tica/n_bitwise_diff"] == stock["tica/vllm_decode_vs_prefill_n_bitwise_diff"] == 3
