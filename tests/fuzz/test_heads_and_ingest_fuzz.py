"""Fuzzing the two inputs the receipt and manifest fuzz does not reach (issue 32): a published head
as `tica ledger verify --expect-head` reads it, and the result files `tica leg ingest` turns into
legs. Each starts from a valid input, changes it once (bytes or structure), and runs the command
as a user would, in process: a traceback fails the test (hypothesis reports it), and so does a pass
on a head that is not the published one.

* heads: exit 0 only for a head whose content is the published head's (a JSON-equivalent text
  may still verify); with its public key, any change of a signed head's fields is a failure.
* ingest: exit 0 (a sealed leg that the judges' reader loads) or exit 4, one line; nothing else.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from tica.cli import main as tica_main
from tica.cli.ledger import HEAD_MAX_BYTES
from tica.errors import InputError
from tica.ledger import Head, Ledger
from tica.receipts import load_leg

from .conftest import CI, counted, long_for, long_only, mutate_bytes, mutate_json_text, mutate_jsonl_text, no_hang

pytestmark = pytest.mark.filterwarnings("ignore")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
_count = itertools.count()


def run_cli(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return tica_main(argv)


# ---------------------------------------------------------------------------- heads


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A ledger of a few rows, its head published plain and signed, and the signer's public key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from tica.head_signing import sign

    root = tmp_path_factory.mktemp("heads")
    led = Ledger(root / "l.duckdb")
    for k in range(4):
        led.append_many([("candidates", {"candidate_id": f"c{k}", "track": "t"})])
    head = led.verify().head
    key = Ed25519PrivateKey.generate()
    pub = root / "head.pub"
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return root / "l.duckdb", head, sign(head, key), pub


def _signed_content(h: Head) -> tuple:
    """What a signed head says: its fields, its signer's name and its signature's bytes (base64
    has more than one spelling of the same bytes: a spelling is not content)."""
    try:
        sig = base64.b64decode(h.signature or "", validate=True)
    except (binascii.Error, ValueError):
        sig = None
    return h.seq, h.row_hash, h.recorded_at, h.signed_by, sig


def head_property(data, published, tmp_path: Path) -> None:
    ledger, head, signed, pub = published
    use_key = data.draw(st.booleans(), label="signed head, checked with its key")
    original = signed if use_key else head
    text = original.to_json()
    if data.draw(st.booleans(), label="structural"):
        raw, what = mutate_json_text(data.draw, text)
        raw = raw.encode()
    else:
        raw, what = mutate_bytes(data.draw, text.encode())
    note(f"head ({'signed' if use_key else 'plain'}): {what}")
    path = tmp_path / f"head{next(_count)}.json"
    path.write_bytes(raw)
    argv = ["--ledger", str(ledger), "ledger", "verify", "--expect-head", str(path)]
    with no_hang(what=what):
        rc = run_cli(argv + (["--public-key", str(pub)] if use_key else []))
    assert rc in (0, 1, 4), (rc, what)
    if len(raw) > HEAD_MAX_BYTES:  # a head is small: a larger file is refused unread
        assert rc == 4, (rc, what)
        return
    try:
        got = Head.from_json(raw.decode("utf-8"))
    except (InputError, UnicodeDecodeError):
        got = None
    if use_key:  # signed fields and the signer's name: only the published head's content verifies
        same = got is not None and _signed_content(got) == _signed_content(original)
    else:  # verify checks the row at seq against row_hash; the rest of a plain head is not evidence
        same = got is not None and (got.seq, got.row_hash) == (head.seq, head.row_hash)
    assert (rc == 0) == same, (rc, what)


@CI
@given(data=st.data())
def test_head_ci(data, published, tmp_path):
    head_property(data, published, tmp_path)


@pytest.mark.fuzz
@long_only
@long_for("heads")
@given(data=st.data())
def test_head_long(data, published, tmp_path):
    counted("heads")
    head_property(data, published, tmp_path)


def test_the_published_head_verifies_and_a_changed_one_does_not(published, tmp_path):
    """The property's controls: the head as published passes, signed and plain; one hex digit of
    its row hash changed fails."""
    ledger, head, signed, pub = published
    for h, key in ((head, []), (signed, ["--public-key", str(pub)])):
        p = tmp_path / "h.json"
        p.write_text(h.to_json())
        assert run_cli(["--ledger", str(ledger), "ledger", "verify", "--expect-head", str(p), *key]) == 0
        bad = json.loads(h.to_json()) | {"row_hash": ("0" if h.row_hash[0] != "0" else "1") + h.row_hash[1:]}
        p.write_text(json.dumps(bad))
        assert run_cli(["--ledger", str(ledger), "ledger", "verify", "--expect-head", str(p), *key]) == 1


# ---------------------------------------------------------------------------- ingest

def _verl_text() -> str:
    rows = [{"step": 0, "val-core/acc": 0.5}]
    rows += [{"step": s, "training/rollout_probs_diff_max": 0.0, "training/rollout_probs_diff_mean": 0.0,
              "actor/grad_norm": 0.3, "timing_s/gen": 1.2} for s in range(1, 6)]
    return "".join(json.dumps(r) + "\n" for r in rows)


def _problems_text() -> str:
    return "".join(json.dumps({"problem_id": f"q{i}", "correct": i % 2 == 0}) + "\n" for i in range(6))


def _bench_text() -> str:
    """vLLM's bench JSON as it wrote it, without the run metadata TICA's runner adds."""
    d = json.loads((FIXTURES / "h200" / "run2" / "throughput_bi1_r1_c32" / "bench.json").read_text())
    return json.dumps({k: v for k, v in d.items() if k not in ("arm", "round", "slot")})


# (source, file name, valid text, extra arguments): one valid input per kind of result file
INGEST = {
    "bench": ("bench.json", _bench_text(), ["--round", "1", "--slot", "1"]),
    "verl-metrics": ("metrics.jsonl", _verl_text(), []),
    "problems": ("problems.jsonl", _problems_text(), []),
}


def ingest_property(data, tmp_path: Path) -> None:
    source = data.draw(st.sampled_from(sorted(INGEST)), label="source")
    name, text, extra = INGEST[source]
    how = data.draw(st.sampled_from(["bytes", "structure"]), label="mutation")
    if how == "bytes":
        raw, what = mutate_bytes(data.draw, text.encode())
    elif name.endswith(".jsonl"):
        new, what = mutate_jsonl_text(data.draw, text)
        raw = new.encode()
    else:
        new, what = mutate_json_text(data.draw, text)
        raw = new.encode()
    note(f"ingest {source}: {what}")
    k = next(_count)
    src = tmp_path / f"in{k}" / name
    src.parent.mkdir()
    src.write_bytes(raw)
    out = tmp_path / f"leg{k}"
    with no_hang(what=what):
        rc = run_cli(["leg", "ingest", source, str(src), "--out", str(out), "--arm", "bi1", *extra])
    assert rc in (0, 4), (rc, what)
    if rc == 0:
        load_leg(out)  # what was sealed reads back through the judges' reader
    else:
        assert not out.exists() or not any(out.iterdir()), what  # a refused input leaves nothing behind


@CI
@given(data=st.data())
def test_ingest_ci(data, tmp_path):
    ingest_property(data, tmp_path)


@pytest.mark.fuzz
@long_only
@long_for("ingest")
@given(data=st.data())
def test_ingest_long(data, tmp_path):
    counted("ingest")
    ingest_property(data, tmp_path)


@pytest.mark.parametrize("source", sorted(INGEST))
def test_each_valid_input_ingests(source, tmp_path):
    """The property's control: every starting input is a valid one (exit 0, a sealed leg)."""
    name, text, extra = INGEST[source]
    src = tmp_path / name
    src.write_text(text)
    assert run_cli(["leg", "ingest", source, str(src), "--out", str(tmp_path / "leg"), "--arm", "bi1", *extra]) == 0
    load_leg(tmp_path / "leg")
