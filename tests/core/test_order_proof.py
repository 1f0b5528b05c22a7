"""Frozen before the run, shown by the signed chain that travels with the receipts (tica.order_proof).

One invariant per test, each beside its control: the proof makes a replayed leg's freeze earlier
only when every part of it holds (rows, head, a trusted signature, this question's row); any part
that fails leaves the check where the replaying ledger's own freeze puts it (after the fact)."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tica import checks, order_proof
from tica.head_signing import sign
from tica.ledger import Ledger, export_chain
from tica.records import freeze_question
from tica.seal import seal_leg

QUESTIONS = Path(__file__).resolve().parents[1] / "fixtures" / "receipts" / "questions"
AFTER_THE_FACT = "2999-01-01T00:00:00+00:00"  # the replaying ledger froze the question long after


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _leg(run: Path, name: str) -> Path:
    leg = run / name
    leg.mkdir(parents=True)
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    (leg / "leg.json").write_text(json.dumps({"schema": "tica.leg/1", "item": "forward", "arm": "bi1",
                                              "started_at": now, "ended_at": now}))
    time.sleep(0.01)
    seal_leg(leg)
    return leg


def _proof(run: Path, key: Ed25519PrivateKey, question: str = "forward.yaml") -> str:
    ledger = Ledger(run.parent / f"{run.name}-{question}.duckdb").init()
    q = freeze_question(ledger, QUESTIONS / question)
    folder = run / order_proof.PROOF_DIR
    folder.mkdir(parents=True)
    head = export_chain(ledger, folder / order_proof.CHAIN_FILE)
    (folder / order_proof.HEAD_FILE).write_text(sign(head, key).to_json())
    time.sleep(0.01)
    return q.hash


@pytest.fixture
def world(tmp_path):
    """A run whose question was frozen (and the chain signed) before its leg ran; the key trusted."""
    key = Ed25519PrivateKey.generate()
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / "team.pem").write_bytes(_pem(key))
    run = tmp_path / "run"
    run.mkdir()
    qhash = _proof(run, key)
    leg = _leg(run, "forward_bi1")
    return {"run": run, "leg": leg, "qhash": qhash, "keys": order_proof.trusted_keys(trusted), "key": key}


def _check(world, keys=None):
    proven, problems = order_proof.proven_freezes([world["leg"]], world["qhash"], world["keys"] if keys is None else keys)
    return checks.frozen_before_run(AFTER_THE_FACT, [world["leg"]], proven, problems)


def test_a_signed_chain_with_the_receipts_shows_the_freeze_before_the_run(world):
    out = _check(world)
    assert out.passed and "signed chain" in out.description and "signed by ed25519:" in out.description


def test_without_the_proof_the_replay_is_after_the_fact(world):
    import shutil

    shutil.rmtree(world["run"] / order_proof.PROOF_DIR)
    out = _check(world)
    assert not out.passed and "after the fact" in out.description


def test_a_key_this_deployment_does_not_trust_proves_nothing(world):
    out = _check(world, keys={})
    assert not out.passed and "does not trust" in out.description


def test_a_chain_signed_by_another_key_under_a_trusted_id_proves_nothing(world):
    other = Ed25519PrivateKey.generate()
    head_file = world["run"] / order_proof.PROOF_DIR / order_proof.HEAD_FILE
    head = json.loads(head_file.read_text())
    forged = sign(order_proof.Head(head["seq"], head["row_hash"], head["recorded_at"]), other)
    head_file.write_text(json.dumps({**json.loads(forged.to_json()), "signed_by": head["signed_by"]}))
    out = _check(world)
    assert not out.passed and "signature" in out.description


@pytest.mark.parametrize("field,value", [("recorded_at", "2000-01-01T00:00:00+00:00"), ("payload.name", "another")])
def test_an_edited_row_of_the_chain_proves_nothing(world, field, value):
    chain = world["run"] / order_proof.PROOF_DIR / order_proof.CHAIN_FILE
    lines = chain.read_text().splitlines()
    row = json.loads(lines[1])
    if field.startswith("payload."):
        row["payload"][field.split(".", 1)[1]] = value
    else:
        row[field] = value
    chain.write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    out = _check(world)
    assert not out.passed and "row_hash" in out.description


def test_a_chain_that_froze_another_question_proves_nothing(tmp_path, world):
    import shutil

    shutil.rmtree(world["run"] / order_proof.PROOF_DIR)
    _proof(world["run"], world["key"], question="backward.yaml")
    out = _check(world)
    assert not out.passed and "does not freeze this question" in out.description


def test_a_proof_of_a_freeze_after_the_leg_started_is_still_after_the_fact(tmp_path):
    key = Ed25519PrivateKey.generate()
    (tmp_path / "trusted").mkdir()
    (tmp_path / "trusted" / "k.pem").write_bytes(_pem(key))
    run = tmp_path / "run"
    run.mkdir()
    leg = _leg(run, "forward_bi1")  # ran first
    qhash = _proof(run, key)  # frozen after
    proven, problems = order_proof.proven_freezes([leg], qhash, order_proof.trusted_keys(tmp_path / "trusted"))
    out = checks.frozen_before_run(AFTER_THE_FACT, [leg], proven, problems)
    assert proven and not out.passed and "after the fact" in out.description


def test_the_proof_covers_only_the_run_it_travels_with(world, tmp_path):
    """A leg of another run (no proof beside it) keeps the replaying ledger's freeze: after the fact."""
    other = _leg(tmp_path / "other_run", "forward_bi1")
    proven, problems = order_proof.proven_freezes([world["leg"], other], world["qhash"], world["keys"])
    out = checks.frozen_before_run(AFTER_THE_FACT, [world["leg"], other], proven, problems)
    assert not out.passed and "other_run" not in out.description and "1 leg(s) had started" in out.description


def test_a_trusted_keys_setting_that_is_no_folder_of_keys_is_refused_by_name(tmp_path):
    from tica.errors import InputError

    with pytest.raises(InputError, match="TICA_TRUSTED_KEYS"):
        order_proof.trusted_keys(tmp_path / "missing")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "bad.pem").write_text("not a key")
    with pytest.raises(InputError, match="bad.pem"):
        order_proof.trusted_keys(tmp_path / "keys")
    assert order_proof.trusted_keys("") == {}  # unset: no key is trusted


# ------------------------------------------------- a leg whose work never began: placed by its seal


def _not_run_leg(run: Path, name: str, **times) -> Path:
    """A sealed leg the producer wrote as not run (a round the device's deadline left out)."""
    leg = run / name
    leg.mkdir(parents=True)
    meta = {"schema": "tica.leg/1", "item": "throughput", "arm": "bi0", "started_at": None, "ended_at": None,
            "not_run_reason": "did not run: device-time deadline", **times}
    (leg / "leg.json").write_text(json.dumps(meta))
    seal_leg(leg)
    return leg


def test_a_leg_that_never_began_counts_as_written_under_a_question_frozen_before_its_seal(tmp_path):
    """Relation: moving the freeze from before the not-run leg's seal to after it turns the check
    from passed to after the fact; the seal is the only time such a leg has."""
    leg = _not_run_leg(tmp_path, "throughput_bi0_r5_c1")
    ran = _leg(tmp_path, "throughput_bi0_r4_c1")
    assert checks.frozen_before_run("2000-01-01T00:00:00+00:00", [ran, leg]).passed
    late = checks.frozen_before_run(AFTER_THE_FACT, [ran, leg])
    assert not late.passed and "throughput_bi0_r5_c1" in " ".join(late.detail["started_before_freeze"])


@pytest.mark.parametrize("times", [{"ended_at": "2026-12-06T09:00:00+00:00"}, {"not_run_reason": None}],
                         ids=["an end time", "no not-run reason"])
def test_a_leg_that_may_have_worked_is_not_placed_by_its_seal(tmp_path, times):
    """Control: a leg with no start but an end, or with no start and no not-run reason, may hold a
    measurement: its start stays unknown and the freeze is not shown before it."""
    leg = _not_run_leg(tmp_path, "throughput_bi0_r5_c1", **times)
    out = checks.frozen_before_run("2000-01-01T00:00:00+00:00", [leg])
    assert not out.passed and out.detail["start_unknown"] == ["throughput_bi0_r5_c1"]
