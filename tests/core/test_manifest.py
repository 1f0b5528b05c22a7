"""Candidate manifests: resolved values validated; bad input names file and field, writes nothing."""

from __future__ import annotations

import pytest

from tests.core.conftest import write_manifest
from tica.cli import main
from tica.errors import ManifestError
from tica.ledger import Ledger
from tica.manifest import load_manifest


def test_a_valid_manifest_loads_with_its_checkpoint_resolved(candidate_dir, manifest_data):
    loaded = load_manifest(write_manifest(candidate_dir, manifest_data))
    assert loaded.checkpoint_path == (candidate_dir / "ckpt").resolve()
    assert loaded.manifest.eval_contract.length_cap == 256


@pytest.mark.parametrize(
    ("mutate", "field", "message"),
    [
        (lambda m: m.update(checkpoint={"path": "missing"}), "checkpoint.path", "does not exist"),
        (lambda m: m.update(checkpoint={"path": "ckpt", "digest": "sha256:" + "0" * 64}), "checkpoint", "exactly one"),
        (lambda m: m.update(checkpoint={"digest": "my-model-v2"}), "checkpoint", "not a content digest"),
        (lambda m: m["backends"].update(flash="yes"), "backends.flash", "Extra inputs"),
        (lambda m: m["image"].update(digest="latest"), "image.digest", "not a content digest"),
        (lambda m: m.pop("workload"), "workload", "Field required"),
        (lambda m: m["recipe"].update(bi0="VLLM_BATCH_INVARIANT=1 python x"), "recipe", "switch must select the arm"),
        (lambda m: m["eval_contract"].update(repeats=0), "eval_contract.repeats", "greater than or equal"),
        (lambda m: m.update(track="Has Spaces"), "track", "pattern"),
        # text the file system cannot take (the long fuzz found both as tracebacks)
        (lambda m: m.update(checkpoint={"path": "ck\x00pt"}), "checkpoint.path", "no NUL byte"),
        (lambda m: m.update(checkpoint={"path": "ck\ud800pt"}), "checkpoint.path", "no NUL byte and no unpaired surrogate"),
        (lambda m: m["checkpoint"].update(root="\x00"), "checkpoint.root", "no NUL byte"),
        (lambda m: m["checkpoint"].update(root="\udfff"), "checkpoint.root", "unpaired surrogate"),
    ],
    ids=["missing-checkpoint", "path-and-digest", "digest-is-a-name", "unknown-field", "name-not-digest", "missing-workload", "recipe-switch",
         "zero-repeats", "bad-track", "nul-in-path", "surrogate-in-path", "nul-in-root", "surrogate-in-root"],
)
def test_bad_manifests_name_file_and_field(candidate_dir, manifest_data, mutate, field, message):
    mutate(manifest_data)
    path = write_manifest(candidate_dir, manifest_data)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert info.value.file == str(path) and info.value.field == field and message in info.value.message


def test_malformed_yaml_is_named(candidate_dir):
    path = candidate_dir / "broken.yaml"
    path.write_text("track: x\n  image: : :\n")
    with pytest.raises(ManifestError, match=r"broken.yaml: <yaml>: malformed YAML"):
        load_manifest(path)


def test_record_is_idempotent_and_bad_input_writes_nothing(tmp_path, candidate_dir, manifest_data, capsys):
    ledger_path = str(tmp_path / "l.duckdb")
    good = write_manifest(candidate_dir, manifest_data)
    assert main(["--ledger", ledger_path, "candidate", "record", str(good)]) == 0
    assert main(["--ledger", ledger_path, "candidate", "record", str(good)]) == 0
    ledger = Ledger(ledger_path)
    before = ledger.query("SELECT count(*) FROM ledger_chain")[1]
    manifest_data["backends"]["flash"] = "yes"
    bad = write_manifest(candidate_dir, manifest_data, "bad.yaml")
    assert main(["--ledger", ledger_path, "candidate", "record", str(bad)]) == 4  # bad input
    assert "bad.yaml: backends.flash" in capsys.readouterr().err
    assert ledger.query("SELECT count(*) FROM ledger_chain")[1] == before == [(12,)]
    assert ledger.verify().ok


def test_a_recorded_digest_is_the_weights_fingerprint_when_weights_are_elsewhere(candidate_dir, manifest_data):
    from tica.candidate import identify

    manifest_data["checkpoint"] = {"digest": "sha256:" + "1" * 64}
    loaded = load_manifest(write_manifest(candidate_dir, manifest_data))
    assert loaded.checkpoint_path is None
    assert identify(loaded).components["weights"] == "sha256:" + "1" * 64
