"""`tica leg ingest` records only what its source recorded, and refuses a source of the wrong shape.

- lm-eval sampling (F9): greedy is recorded only where every lm_eval backend decodes greedily
  (temperature 0, or no temperature and do_sample false); do_sample false beside a temperature
  above 0 leaves sampling unknown, since lm_eval's hf/vllm backends then decode greedily and its
  API/sglang backends sample at that temperature.
- lm-eval length cap (F9): read as the recorded backend reads its aliases (the API backends send
  `max_tokens` first), unknown when several aliases disagree or the backend reads none of them.
- lm-eval results JSON of the wrong shape (F10): exit 4 naming the file and the field, `{"error"}`
  with --json, nothing written, never a traceback.
- bench (F12): a `--metadata version=...` label is no vLLM version (kept as
  resolved_config.metadata.version); `profiled` is written only as the file records it.

Each test has its negative control: the well-formed source still ingests as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tica.errors import InputError
from tica.ingest import SOURCE_FILE, ingest_bench, ingest_lm_eval, leg_unknowns
from tica.cli.ingest import main
from tica.items.quality.judge import judge_quality
from tica.items.quality.receipts import load_recorded_contract
from tica.receipts import load_leg_meta
from tica.verdict import Verdict

from .test_ingest import _bench_file
from .test_ingest_lm_eval import OUT, _copy, _edit_results, _question, _results_file

TASK = "tica_arith30"
# the fixture's generation_kwargs, as lm_eval wrote them
GREEDY = {"until": ["\n"], "do_sample": False, "temperature": 0.0, "max_gen_toks": 8}


def _lm_eval_leg(tmp: Path, name: str, gen: dict | None = None, model: str | None = None,
                 lm_eval_version: str | None = None) -> Path:
    """The committed lm_eval fixture with its task's generation_kwargs (and the recorded backend,
    lm_eval version) replaced, ingested as a BI=1 quality leg."""
    out = _copy(tmp / name)

    def change(d):
        if gen is not None:
            d["configs"][TASK]["generation_kwargs"] = gen
        if model is not None:
            d["config"]["model"] = model
        if lm_eval_version is not None:
            d["lm_eval_version"] = lm_eval_version

    _edit_results(out, change)
    return ingest_lm_eval(out, tmp / name / "leg", "bi1")


_SAMPLED = {"until": ["\n"], "temperature": 0.7, "top_p": 0.9, "top_k": 50, "max_gen_toks": 8}


@pytest.mark.parametrize("model,model_args,want", [
    ("vllm", {"pretrained": "/m", "seed": 1234}, 1234),  # vllm.LLM(seed=model_args.seed); torch_seed never reaches it
    ("vllm", "pretrained=/m,seed=7", 7),  # model_args as given on the command line
    ("local-completions", {"model": "m", "seed": 3}, 3),  # sent with each request
    ("hf", {"pretrained": "/m", "seed": 1234}, 0),  # hf samples from torch's RNG: torch_seed
    ("vllm", {"pretrained": "/m"}, None),  # vLLM's own default is not recorded: unknown
    ("sglang", {"seed": 5}, None),  # a backend TICA does not know where the seed comes from
])
def test_the_sampling_seed_is_the_one_the_backend_used(tmp_path, model, model_args, want):
    out = _copy(tmp_path / "run")

    def change(d):
        d["configs"][TASK]["generation_kwargs"] = dict(_SAMPLED)
        d["config"].update(model=model, model_args=model_args, torch_seed=0)

    _edit_results(out, change)
    leg = ingest_lm_eval(out, tmp_path / "leg", "bi1")
    assert _contract(leg)["sampling"]["seed"] == want
    contract = load_recorded_contract(leg / "contract.json")
    assert (contract.six_items()["sampling parameters"] is None) == (want is None)  # sampled: the seed matters


def _contract(leg: Path) -> dict:
    return json.loads((leg / "contract.json").read_text())


def _unknown(leg: Path) -> list[str]:
    return json.loads((leg / SOURCE_FILE).read_text())["contract_unknown"]


# ---------------------------------------------------------------- F9: sampling


@pytest.mark.parametrize("model", ["local-completions", "hf"])
@pytest.mark.parametrize("extra", [{}, {"top_p": 1.0, "top_k": -1}])
def test_do_sample_false_with_a_temperature_above_0_leaves_sampling_unknown(tmp_path, model, extra):
    gen = {**GREEDY, "temperature": 0.7, **extra}
    leg = _lm_eval_leg(tmp_path, "sampled", gen, model=model)
    assert "sampling" not in _contract(leg)  # neither greedy nor temperature 0.7: which ran is not recorded
    [why] = [u for u in _unknown(leg) if u.startswith("sampling")]
    assert "do_sample: false with temperature 0.7" in why and "depends on the backend" in why and model in why
    assert "contract.sampling" in leg_unknowns(leg)
    cell = judge_quality(_question(4), [leg, ingest_lm_eval(OUT, tmp_path / "bi0", "bi0")])
    assert cell.verdict is not Verdict.PASS and cell.numbers["contract_unknown"] == ["sampling parameters"]
    # control: the same file with temperature 0 is greedy, for every backend
    control = _lm_eval_leg(tmp_path, "greedy", {**GREEDY, **extra}, model=model)
    seed = 1234 if model == "hf" else None  # hf samples from torch_seed; an API backend's seed is not recorded
    assert _contract(control)["sampling"] == {"temperature": 0.0, "seed": seed, "n": 1, "stop": ["\n"]}
    assert not any(u.startswith("sampling") for u in _unknown(control))


@pytest.mark.parametrize("gen", [
    {"until": ["\n"], "max_gen_toks": 8},                                      # neither recorded
    {"until": ["\n"], "do_sample": False, "temperature": None, "max_gen_toks": 8},  # null is no 0
    {"until": ["\n"], "temperature": False, "max_gen_toks": 8},                # False == 0 in Python, no temperature
    {"until": ["\n"], "do_sample": True, "max_gen_toks": 8},                   # sampling, at the backend's default
], ids=["nothing", "null-temperature", "boolean-temperature", "do-sample-true"])
def test_greedy_is_recorded_only_for_temperature_0_or_no_temperature_with_do_sample_false(tmp_path, gen):
    leg = _lm_eval_leg(tmp_path, "unknown", gen)
    assert "sampling" not in _contract(leg) and any(u.startswith("sampling") for u in _unknown(leg))
    # controls: the two records of greedy decoding (and temperature 0 beside do_sample true)
    for i, greedy in enumerate([{"until": ["\n"], "do_sample": False, "max_gen_toks": 8},
                                {"until": ["\n"], "temperature": 0, "max_gen_toks": 8},
                                {"until": ["\n"], "do_sample": True, "temperature": 0.0, "max_gen_toks": 8}]):
        control = _lm_eval_leg(tmp_path, f"greedy{i}", greedy)
        assert _contract(control)["sampling"]["temperature"] == 0.0, greedy


# ---------------------------------------------------------------- F9: length cap


@pytest.mark.parametrize("model", ["local-completions", "local-chat-completions", "sglang-generate"])
def test_an_api_backend_length_cap_is_its_max_tokens(tmp_path, model):
    leg = _lm_eval_leg(tmp_path, "api", {"until": ["\n"], "temperature": 0.0, "max_tokens": 1024}, model=model)
    assert _contract(leg)["length_cap"] == 1024  # what lm_eval 0.4.13's API backends send
    # control: sglang (offline engine) reads max_gen_toks only: its max_tokens is not the cap that ran
    other = _lm_eval_leg(tmp_path, "sglang", {"until": ["\n"], "temperature": 0.0, "max_tokens": 1024}, model="sglang")
    assert "length_cap" not in _contract(other)
    assert any(u.startswith("length_cap") and "sglang" in u for u in _unknown(other))
    # control: the same alias from an lm_eval whose backends' reading is not known here
    older = _lm_eval_leg(tmp_path, "older", {"until": ["\n"], "temperature": 0.0, "max_tokens": 1024}, model=model,
                         lm_eval_version="0.4.2")
    assert "length_cap" not in _contract(older)


@pytest.mark.parametrize("model", ["local-completions", "hf", "vllm"])
def test_length_aliases_that_disagree_leave_the_length_cap_unknown(tmp_path, model):
    leg = _lm_eval_leg(tmp_path, "disagree", {**GREEDY, "max_tokens": 1024}, model=model)
    assert "length_cap" not in _contract(leg)
    [why] = [u for u in _unknown(leg) if u.startswith("length_cap")]
    assert "max_gen_toks 8, max_tokens 1024" in why and "disagree" in why
    # control: the same aliases agreeing name the cap; the fixture's lone max_gen_toks too
    assert _contract(_lm_eval_leg(tmp_path, "agree", {**GREEDY, "max_tokens": 8}, model=model))["length_cap"] == 8
    assert _contract(_lm_eval_leg(tmp_path, "fixture", None, model=model))["length_cap"] == 8


@pytest.mark.parametrize("value", ["8", True, 8.5, None])
def test_a_length_cap_that_is_no_whole_number_is_unknown(tmp_path, value):
    leg = _lm_eval_leg(tmp_path, "bad", {**GREEDY, "max_gen_toks": value})
    assert "length_cap" not in _contract(leg)
    assert any(u.startswith("length_cap") and "max_gen_toks" in u for u in _unknown(leg))
    assert _contract(_lm_eval_leg(tmp_path, "control", {**GREEDY, "max_gen_toks": 8}))["length_cap"] == 8


# ---------------------------------------------------------------- F10: the results JSON's structure


def _set(path: list, value):
    def change(d):
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return change


@pytest.mark.parametrize("path,value,field", [
    (["configs", TASK], "x", f"configs.{TASK}"),
    (["configs", TASK, "generation_kwargs"], "abc", f"configs.{TASK}.generation_kwargs"),
    (["configs", TASK, "generation_kwargs"], ["until"], f"configs.{TASK}.generation_kwargs"),
    (["configs", TASK, "filter_list"], 5, f"configs.{TASK}.filter_list"),
    (["configs", TASK, "filter_list"], [5], f"configs.{TASK}.filter_list.0"),
    (["configs", TASK, "filter_list"], [{"filter": []}], f"configs.{TASK}.filter_list.0.name"),
    (["versions"], ["1.0"], "versions"),
    (["n-shot"], 0, "n-shot"),
    (["task_hashes"], "abc", "task_hashes"),
    (["config"], 1, "config"),
    (["config", "gen_kwargs"], 5, "config.gen_kwargs"),
    (["config", "model_args"], ["pretrained=x"], "config.model_args"),
    (["config", "model"], 3, "config.model"),
])
def test_a_results_json_of_the_wrong_shape_exits_4_naming_the_file_and_field(tmp_path, capsys, path, value, field):
    out = _copy(tmp_path)
    # control: the well-formed file ingests, --json printing the leg
    assert main(["lm-eval", str(out), "--out", str(tmp_path / "control"), "--arm", "bi1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["item"] == "quality"
    _edit_results(out, _set(path, value))
    results = _results_file(out)
    assert main(["lm-eval", str(out), "--out", str(tmp_path / "leg"), "--arm", "bi1", "--json"]) == 4
    captured = capsys.readouterr()
    error = json.loads(captured.out)["error"]
    assert (error["file"], error["field"]) == (str(results), field), error
    assert "Traceback" not in captured.err and field in captured.err
    assert not (tmp_path / "leg").exists() and not list(tmp_path.glob(".leg.ingest-*"))  # nothing written
    with pytest.raises(InputError) as err:
        ingest_lm_eval(out, tmp_path / "leg2", "bi1")
    assert (err.value.file, err.value.field) == (str(results), field)


# ---------------------------------------------------------------- F12: bench metadata


def _bench_with(tmp: Path, **keys) -> Path:
    src = _bench_file(tmp, "bi1", 1, 1.0)
    d = json.loads(src.read_text())
    d.update(keys)
    src.write_text(json.dumps(d))
    return src


def test_a_version_metadata_label_is_not_taken_as_the_vllm_version(tmp_path):
    leg = ingest_bench(_bench_with(tmp_path, version="0.3.3", tp="1"), tmp_path / "label", "bi1", round=1, slot=1)
    meta = load_leg_meta(leg / "leg.json")
    assert meta.versions == {} and meta.producer_version is None  # unknown, not the label
    assert meta.resolved_config["metadata"] == {"version": "0.3.3"}  # the label kept as a label
    assert "producer_version" in leg_unknowns(leg)
    # control: a key that states vLLM's version is still read as such
    leg = ingest_bench(_bench_with(tmp_path, vllm_version="0.26.0"), tmp_path / "stated", "bi1", round=1, slot=1)
    meta = load_leg_meta(leg / "leg.json")
    assert meta.versions == {"vllm": "0.26.0"} and meta.producer_version == "0.26.0"
    assert "metadata" not in meta.resolved_config


def test_profiled_is_written_only_as_the_bench_file_records_it(tmp_path):
    leg = ingest_bench(_bench_file(tmp_path, "bi1", 1, 1.0), tmp_path / "absent", "bi1", round=1, slot=1)
    assert "profiled" not in json.loads((leg / "leg.json").read_text())  # not recorded: never written as false
    assert load_leg_meta(leg / "leg.json").profiled in (None, False)  # the schema's unknown (None, or its old default)
    assert "profiled" in leg_unknowns(leg)
    # control: a recorded value (vLLM's --metadata strings) is written as recorded
    for text, value in (("true", True), ("false", False)):
        leg = ingest_bench(_bench_with(tmp_path, profiled=text), tmp_path / text, "bi1", round=1, slot=1)
        assert json.loads((leg / "leg.json").read_text())["profiled"] is value
        assert load_leg_meta(leg / "leg.json").profiled is value and "profiled" not in leg_unknowns(leg)


def test_the_fixture_still_ingests_its_whole_contract(tmp_path):
    """Negative control for the lm-eval changes as a whole: the committed run's six items are all recorded."""
    leg = ingest_lm_eval(OUT, tmp_path / "leg", "bi1")
    c = load_recorded_contract(leg / "contract.json")
    assert c.sampling.temperature == 0 and c.length_cap == 8 and _unknown(leg) == []
