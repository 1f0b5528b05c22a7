"""Progress of long work goes to stderr, only when asked or to a terminal, and never changes
stdout or the result: fingerprints, ingested legs and `--json` output are the same either way."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from tica import progress
from tica.cli import main
from tica.fingerprint import fingerprint_checkpoint


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _weights(tmp: Path) -> Path:
    model = tmp / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(os.urandom(3 << 20))
    (model / "config.json").write_text("{}")
    return model


def test_forced_progress_shows_fingerprinting_on_stderr_and_the_digest_is_unchanged(tmp_path, monkeypatch, capsys):
    model = _weights(tmp_path)
    monkeypatch.setenv(progress.ENV, "0")
    quiet = fingerprint_checkpoint(model, persist=False)
    assert capsys.readouterr() == ("", "")  # control: off, nothing shown
    monkeypatch.setenv(progress.ENV, "1")
    monkeypatch.setattr("tica.fingerprint.HASH_SLICE", 1 << 20)  # progress inside one file, slice by slice
    monkeypatch.setattr(progress, "REFRESH_S", 0.0)
    assert fingerprint_checkpoint(model, persist=False) == quiet
    out, err = capsys.readouterr()
    assert out == "" and f"fingerprint {model}: 3.0 MiB/3.0 MiB" in err and err.count("\r") >= 4


def test_forced_progress_leaves_ingest_json_stdout_unchanged(tmp_path, monkeypatch, capsys):
    src = tmp_path / "history.jsonl"
    src.write_text("".join(json.dumps({"_step": s, "training/rollout_probs_diff_max": 0.0}) + "\n" for s in (1, 2)))
    outs = {}
    for mode in ("0", "1"):
        monkeypatch.setenv(progress.ENV, mode)
        leg = tmp_path / "legs" / "leg"  # same path: the JSON names it
        assert main(["leg", "ingest", "verl-wandb", str(src), "--out", str(leg), "--arm", "bi1", "--json"]) == 0
        outs[mode] = capsys.readouterr()
        (tmp_path / "legs").rename(tmp_path / f"legs_{mode}")
    assert outs["0"].out == outs["1"].out and json.loads(outs["1"].out)["leg"] == str(tmp_path / "legs" / "leg")
    assert outs["0"].err == "" and "seal " in outs["1"].err


def test_progress_is_off_for_a_stream_that_is_not_a_terminal_and_delayed_on_one(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    piped, tty = io.StringIO(), _Terminal()
    for stream in (piped, tty):
        with progress.Progress("work", 2, stream=stream) as bar:
            bar.update()  # quick work on a terminal: within DELAY_S, nothing drawn
    assert piped.getvalue() == "" and tty.getvalue() == ""
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    for stream in (piped, tty):
        with progress.Progress("work", 2, stream=stream) as bar:
            bar.update(2)
    assert piped.getvalue() == "" and tty.getvalue().endswith("work: 2/2 files\n")
