"""One recipe, one image, a switch selects the arm: BI=1 byte-identical, BI=0 differs from the
original baseline only in names, paths and newly added explicit switches, every rc 0."""

from __future__ import annotations

import json
import shutil

import pytest

from tica.canaries import recipe_combo
from tica.judges import judge_recipe_identity
from tica.judges.recipe_identity import bi0_changes
from tica.seal import seal_leg
from tica.verdict import Verdict

from .conftest import FIXTURES


@pytest.fixture
def recipe(tmp_path):
    p = tmp_path / "recipe_dry_runs.json"
    shutil.copy(FIXTURES / "recipe" / "recipe_dry_runs.json", p)
    return p


def _edit(path, mode, arm, when, **kv):
    d = json.loads(path.read_text())
    recipe_combo(d, mode, arm)[when].update(kv)
    path.write_text(json.dumps(d))


def _cmd(path, mode, arm, when):
    return recipe_combo(json.loads(path.read_text()), mode, arm)[when]["command"]


def test_unchanged_bi1_and_renamed_bi0_pass(recipe):
    res = judge_recipe_identity(recipe)
    assert res.verdict is Verdict.PASS, res.reasons
    bi0 = next(c for c in res.numbers["combos"] if c["arm"] == "bi0")
    assert bi0["changes"] and all(c["allowed"] for c in bi0["changes"])


def test_bi1_command_with_an_added_switch_fails_showing_the_token(recipe):
    _edit(recipe, "compose", "bi1", "after", command=_cmd(recipe, "compose", "bi1", "after") + " trainer.total_epochs=2")
    res = judge_recipe_identity(recipe)
    assert res.verdict is Verdict.FAIL and "trainer.total_epochs=2" in res.reasons[0]


def test_bi1_command_differing_by_one_byte_of_whitespace_fails(recipe):
    _edit(recipe, "dry_run", "bi1", "after", command=_cmd(recipe, "dry_run", "bi1", "after").replace(" ", "  ", 1))
    res = judge_recipe_identity(recipe)
    assert res.verdict is Verdict.FAIL and "whitespace or quoting" in res.reasons[0]


def test_bi0_value_change_beyond_names_and_paths_fails_with_tokens(recipe):
    cmd = _cmd(recipe, "dry_run", "bi0", "after").replace("actor.strategy=megatron", "actor.strategy=fsdp")
    _edit(recipe, "dry_run", "bi0", "after", command=cmd)
    res = judge_recipe_identity(recipe)
    assert res.verdict is Verdict.FAIL
    assert "-'actor.strategy=megatron' +'actor.strategy=fsdp'" in res.reasons[0]


def test_bi0_removing_a_baseline_switch_fails(recipe):
    cmd = _cmd(recipe, "dry_run", "bi0", "after").replace(" rollout.name=vllm", "")
    _edit(recipe, "dry_run", "bi0", "after", command=cmd)
    assert judge_recipe_identity(recipe).verdict is Verdict.FAIL


def test_bi0_rename_path_and_new_switch_are_allowed_but_a_new_positional_is_not():
    before = "python3 train.py trainer.experiment_name=run trainer.default_local_dir=/ckpt/run --seed 1"
    ok = "VLLM_BATCH_INVARIANT=0 python3 train.py trainer.experiment_name=run_bi0 " \
         "trainer.default_local_dir=/ckpt/run_bi0 --seed 1 +actor.qat=true --route-replay r3"
    assert all(c.allowed for c in bi0_changes(before, ok))
    bad = before + " extra_script.py"
    assert [c.after for c in bi0_changes(before, bad) if not c.allowed] == ["extra_script.py"]


def test_bi0_setting_again_a_switch_the_baseline_sets_is_not_new():
    before = "python3 train.py --seed 1"
    assert not all(c.allowed for c in bi0_changes(before, before + " --seed=2"))


def test_an_engine_selector_named_name_is_not_a_name():
    changes = bi0_changes("x rollout.name=vllm", "x rollout.name=sglang")
    assert not changes[0].allowed


def test_a_compose_combination_with_nonzero_rc_fails(recipe):
    _edit(recipe, "compose", "bi1", "before", rc=2)
    res = judge_recipe_identity(recipe)
    assert res.verdict is Verdict.FAIL and "rc 2" in res.reasons[0]


def test_a_combination_missing_one_arm_is_inconclusive(recipe):
    d = json.loads(recipe.read_text())
    d["combos"] = [c for c in d["combos"] if not (c["mode"] == "compose" and c["arm"] == "bi0" and c["optimizer"] == "muon")]
    recipe.write_text(json.dumps(d))
    res = judge_recipe_identity(recipe)
    assert res.verdict is Verdict.INCONCLUSIVE and "compose x muon: no bi0" in res.reasons[0]


def test_a_sealed_dry_run_directory_is_checked_before_reading(recipe, tmp_path):
    d = tmp_path / "dry"
    d.mkdir()
    shutil.copy(recipe, d / "recipe_dry_runs.json")
    seal_leg(d)
    assert judge_recipe_identity(d).receipt_hash.startswith("sha256:")
    (d / "recipe_dry_runs.json").write_text((d / "recipe_dry_runs.json").read_text().replace("rc\": 0", "rc\": 0 "))
    from tica.errors import ReceiptError
    with pytest.raises(ReceiptError):
        judge_recipe_identity(d)


@pytest.mark.parametrize("before,after", [
    ("actor_rollout_ref.model.path=/ckpt/qwen3-8b", "actor_rollout_ref.model.path=/ckpt/qwen3-8b-other"),
    ("data.train_files=/data/gsm8k/train.parquet", "data.train_files=/data/math/train.parquet"),
    ("--tokenizer-path /tok/a", "--tokenizer-path /tok/b"),
    ("actor.load_path=/ckpt/step_10", "actor.load_path=/ckpt/step_20"),
])
def test_an_input_path_that_differs_in_bi0_is_a_recipe_change_not_a_name(before, after):
    """Issue 27, class 8: keys are classified by an explicit table, never by a name or a '/' in the
    value: a model, data, tokenizer or load path changes what is computed."""
    base = "python3 -m verl.trainer.main_ppo trainer.experiment_name=baseline "
    changes = bi0_changes(base + before, base.replace("baseline", "baseline_bi0") + after)
    assert any(not c.allowed for c in changes), changes
    # control: the output directory and the run's name may differ
    ok = bi0_changes(base + "trainer.default_local_dir=/ckpt/runs/a", base.replace("baseline", "b") +
                     "trainer.default_local_dir=/ckpt/runs/b")
    assert ok and all(c.allowed for c in ok), ok
