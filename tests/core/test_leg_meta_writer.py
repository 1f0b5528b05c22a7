"""leg.json has one writer (tica.receipts.write_leg_meta) for every producer: a record is written
only if it reads back through the judges' model, so no producer can seal a leg the judges refuse.
Each refusal writes nothing; the source scan keeps every producer on the one writer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tica.errors import ReceiptError
from tica.receipts import LEG_FILE, load_leg_meta, write_leg_meta

ROOT = Path(__file__).resolve().parents[2]
META = {"schema": "tica.leg/1", "item": "forward", "arm": "bi1", "producer": "test", "producer_version": "1",
        "env": {"VLLM_BATCH_INVARIANT": "1"}, "started_at": "2026-12-06T00:00:00+00:00"}


def test_a_record_the_model_reads_is_written_and_reads_back_the_same(tmp_path):
    written = write_leg_meta(tmp_path, {**META, "resolved_config": {"cwd": tmp_path}})  # a path is written as text
    assert load_leg_meta(tmp_path / LEG_FILE) == written
    assert written.resolved_config["cwd"] == str(tmp_path)


@pytest.mark.parametrize("change, field", [
    ({"arm": "bi0-megatron"}, "arm"),  # not an arm
    ({"env": {"VLLM_BATCH_INVARIANT": "0"}}, "<root>"),  # the arm its environment contradicts
    ({"item": "forwards"}, "item"),
    ({"processes": [{"role": "engine_core"}]}, "processes"),  # an exit without its pid or code
])
def test_a_record_the_judges_would_refuse_is_never_written(tmp_path, change, field):
    with pytest.raises(ReceiptError) as err:
        write_leg_meta(tmp_path, {**META, **change})
    assert err.value.field.startswith(field) and not (tmp_path / LEG_FILE).exists()


def test_a_refused_rewrite_leaves_the_record_already_there(tmp_path):
    write_leg_meta(tmp_path, META)
    before = (tmp_path / LEG_FILE).read_bytes()
    with pytest.raises(ReceiptError):
        write_leg_meta(tmp_path, {**META, "arm": "bi2"})
    assert (tmp_path / LEG_FILE).read_bytes() == before


# Writers of leg.json's bytes other than the one writer: the canaries plant malformed legs on
# purpose, and ingest writes a leg's files as one set after validating its record with LegMeta.
OTHER_WRITERS = {"tica/canary_legs.py", "tica/ingest.py"}
WRITE = re.compile(r"""(["']leg\.json["']|LEG_FILE)\s*\)?\s*\.write_(text|bytes)|json\.dump\(.*leg""")


def test_every_producer_writes_leg_json_through_the_one_writer():
    found = {str(p.relative_to(ROOT)) for d in ("tica", "resources", "tica_assets", "sensors", "scripts")
             for p in (ROOT / d).rglob("*.py") if WRITE.search(p.read_text())}
    assert found <= OTHER_WRITERS, sorted(found - OTHER_WRITERS)


def test_the_scan_sees_a_direct_write():
    """The negative control: the pattern the scan looks for matches the writes it must catch."""
    assert WRITE.search('(leg_dir / "leg.json").write_text(json.dumps(meta))')
    assert WRITE.search("(path / LEG_FILE).write_bytes(raw)")
