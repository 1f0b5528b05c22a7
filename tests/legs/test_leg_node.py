"""The node a leg ran on, for the throughput judge's one-node rule: TICA's producers record this
host (name and boot id), `tica leg run` records it only where every address it was given reaches
this host, an ingested bench result only where the file names one; nothing else is invented."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tica.errors import InputError
from tica.ingest import ingest_bench, leg_unknowns
from tica.cli.ingest import main as ingest_main
from tica.leg_run import LegRunSpec, leg_node, read_command
from tica.legs import common
from tica.legs.common import Leg, this_node

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
BENCH = ROOT / "h200" / "run2" / "throughput_bi1_r1_c32" / "bench.json"


def test_a_producer_records_this_host_and_its_boot(tmp_path):
    leg = Leg(tmp_path / "leg", item="throughput", arm="bi0", producer="test")
    meta = json.loads((leg.finish() / "leg.json").read_text())
    node = meta["resolved_config"]["node"]
    assert node == this_node() and node.startswith(socket.gethostname())
    assert common.BOOT_ID.read_text().strip() in node


def test_two_machines_that_share_a_name_are_two_nodes(monkeypatch, tmp_path):
    here = this_node()
    other = tmp_path / "boot_id"
    other.write_text("00000000-1111-2222-3333-444444444444\n")
    monkeypatch.setattr(common, "BOOT_ID", other)
    this_node.cache_clear()
    try:
        assert this_node() != here and this_node().startswith(socket.gethostname())
    finally:
        this_node.cache_clear()


def test_a_node_the_launcher_names_is_kept(tmp_path):
    leg = Leg(tmp_path / "leg", item="throughput", arm="bi0", producer="test")
    leg.meta["resolved_config"]["node"] = "rack4-gpu2"
    assert json.loads((leg.finish() / "leg.json").read_text())["resolved_config"]["node"] == "rack4-gpu2"


def _spec(tmp_path, command: list[str], **over) -> LegRunSpec:
    return LegRunSpec(out=tmp_path / "leg", item="throughput", arm="bi0", command=command, **over)


@pytest.mark.parametrize("address", [None, "http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000",
                                     "http://0.0.0.0:8000", "127.0.0.2"])
def test_leg_run_records_this_host_where_every_address_reaches_it(tmp_path, address):
    command = ["vllm", "bench", "serve", "--model", "m"] + (["--base-url", address] if address else [])
    assert leg_node(_spec(tmp_path, command), read_command(command, tmp_path)) == this_node()
    plain = ["python", "train.py"]
    assert leg_node(_spec(tmp_path, plain, server_url=address), read_command(plain, tmp_path)) == this_node()


@pytest.mark.parametrize("where", ["base_url", "host", "server_url", "lm_eval"])
def test_leg_run_leaves_the_node_unknown_where_an_address_names_another_host(tmp_path, where):
    remote = "http://gpu-node-7:8000"
    command = {"base_url": ["vllm", "bench", "serve", "--base-url", remote],
               "host": ["vllm", "bench", "serve", "--host", "10.1.2.3"],
               "server_url": ["vllm", "bench", "serve"],
               "lm_eval": ["lm_eval", "--model", "local-completions", "--model_args",
                           f"model=m,base_url={remote}/v1/completions", "--tasks", "gsm8k"]}[where]
    spec = _spec(tmp_path, command, server_url=remote if where == "server_url" else None)
    assert leg_node(spec, read_command(command, tmp_path)) is None


def _bench(folder: Path, **labels) -> Path:
    """vLLM's result file, as --metadata node=... would leave it (or without the label)."""
    d = json.loads(BENCH.read_bytes()) | labels
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / "bench.json"
    p.write_text(json.dumps(d))
    return p


def test_an_ingested_bench_result_names_its_node_only_where_the_file_does(tmp_path):
    named = ingest_bench(_bench(tmp_path / "a", node="gpu-node-7"), tmp_path / "named", "bi1")
    assert json.loads((named / "leg.json").read_text())["resolved_config"]["node"] == "gpu-node-7"
    assert "resolved_config.node" not in leg_unknowns(named)
    bare = ingest_bench(_bench(tmp_path / "b"), tmp_path / "bare", "bi1")
    assert "node" not in json.loads((bare / "leg.json").read_text())["resolved_config"]
    assert "resolved_config.node" in leg_unknowns(bare)


@pytest.mark.parametrize("node", ["", 7, ["a"]])
def test_an_ingested_node_that_is_not_a_name_is_refused_naming_the_field(tmp_path, node):
    src = _bench(tmp_path / "raw", node=node)
    with pytest.raises(InputError) as err:
        ingest_bench(src, tmp_path / "leg", "bi1")
    assert err.value.field == "node" and err.value.file == str(src)
    assert not (tmp_path / "leg").exists()
    assert ingest_main(["bench", str(src), "--out", str(tmp_path / "leg"), "--arm", "bi1"]) == 4
