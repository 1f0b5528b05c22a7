"""Leg machinery that needs no vLLM engine: models, scorer, problem set, trainer interface, runner."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tica.legs import runner, scorer
from tica.legs.common import ARM_ENV, end_state
from tica.legs.trainers import ExternalTrainer, pack, unpack
from tica.models.hashing import weights_hash
from tica.models.tiny import TinyLlamaSpec, build_tiny_llama
from tica.problems import load_problems


def test_tiny_model_same_seed_same_bytes(tmp_path):
    a = build_tiny_llama(tmp_path / "a")
    b = build_tiny_llama(tmp_path / "b")
    c = build_tiny_llama(tmp_path / "c", TinyLlamaSpec(seed=1))
    assert weights_hash(a) == weights_hash(b) != weights_hash(c)
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["torch_dtype"] == "bfloat16"


def test_tiny_tokenizer_round_trips_random_ids(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(build_tiny_llama(tmp_path / "m")))
    ids = list(range(40, 1024, 37))
    assert tok.encode(tok.decode(ids)) == ids  # the random bench workload keeps its exact length


def test_scorer_extracts_boxed_then_last_number():
    assert scorer.extract("so \\boxed{42}.") == ("42", "boxed")
    assert scorer.extract("3 + 4 = 7") == ("7", "last_number")
    assert scorer.extract("no idea") == (None, "none")
    assert scorer.is_correct("1,024", "1024") and not scorer.is_correct("41", "42")
    assert scorer.scorer_id().startswith("tica.scorer.boxed/1 sha256:")


def test_problem_set_version_is_its_content_hash():
    version, problems = load_problems()
    assert version.startswith("arith30 sha256:") and len(problems) == 30
    assert len({p["problem_id"] for p in problems}) == 30


def test_external_trainer_reads_the_commands_logprobs(tmp_path):
    script = tmp_path / "ext.py"
    script.write_text(
        "import sys, numpy as np\n"
        "d = np.load(sys.argv[1]); n = int(d['seq_lens'].sum() - len(d['seq_lens']))\n"
        "np.savez(sys.argv[2], logprobs=-np.arange(n, dtype=np.float32))\n"
    )
    tr = ExternalTrainer(f"{sys.executable} {script} {{input}} {{output}}")
    out = tr.logprobs([[1, 2, 3], [4, 5, 6, 7]])
    assert [x.tolist() for x in out] == [[-0.0, -1.0], [-2.0, -3.0, -4.0]]
    bad = ExternalTrainer(f"{sys.executable} -c 'import sys; sys.exit(3)' {{input}} {{output}}")
    with pytest.raises(RuntimeError, match="exited 3"):
        bad.logprobs([[1, 2]])


def test_pack_unpack():
    seqs = [[1, 2, 3], [9, 8]]
    assert unpack(*pack(seqs)) == seqs


def test_end_states_name_what_happened():
    assert end_state(0) == ("exited", None)
    assert end_state(-15) == ("signalled", 15)
    assert end_state(-9) == ("killed", 9)
    assert end_state(-9, force_killed=True) == ("force_killed", 9)
    assert end_state(None, alive=True) == ("running", None)


def test_leg_command_sets_the_arm_switch_in_the_childs_env(tmp_path):
    argv, env = runner.leg_command("forward", "bi1", tmp_path / "leg", model="m", steps=5, bi1_attempt_engine=True)
    assert argv[1:4] == ["-m", "tica.legs.forward", "--out"]
    assert "--steps" in argv and "--bi1-attempt-engine" in argv
    assert env["VLLM_BATCH_INVARIANT"] == ARM_ENV["bi1"]["VLLM_BATCH_INVARIANT"] == "1"
    assert runner.leg_command("forward", "bi0", tmp_path / "leg")[1]["VLLM_BATCH_INVARIANT"] == "0"
    with pytest.raises(ValueError):
        runner.leg_command("forward", "bi2", tmp_path)


def test_crossed_order():
    assert runner.crossed_order(3) == [("bi1", "bi0"), ("bi0", "bi1"), ("bi1", "bi0")]


def test_producer_refuses_a_contradicting_env(tmp_path):
    import subprocess

    argv, env = runner.leg_command("backward", "bi0", tmp_path / "leg", model="x")
    env["VLLM_BATCH_INVARIANT"] = "1"
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert p.returncode != 0 and "contradicts --arm bi0" in p.stderr


@pytest.mark.slow
def test_megatron_mapping_round_trips_and_scores_close_to_hf(tmp_path):
    from safetensors.torch import load_file

    from tica.legs.trainers import load_trainer

    model = build_tiny_llama(tmp_path / "m")
    mg = load_trainer("megatron", model)
    file = load_file(str(model / "model.safetensors"))
    back = mg.hf_state_dict()
    assert all(np.array_equal(back[k].view(-1).float().numpy(), file[k].view(-1).float().numpy()) for k in file)
    seqs = [[1, 5, 6, 7, 8, 100, 200, 300]]
    a = load_trainer("transformers", model).logprobs(seqs)[0]
    b = mg.logprobs(seqs)[0]
    assert np.abs(a - b).max() < 0.5  # same model, different kernels: close, not bitwise


@pytest.mark.slow
def test_reference_external_command_matches_the_builtin_trainer(tmp_path):
    from tica.legs.trainers import load_trainer

    model = build_tiny_llama(tmp_path / "m")
    seqs = [[1, 5, 6, 7, 8, 100, 200, 300], [4, 9, 10, 11]]
    ext = ExternalTrainer(f"{sys.executable} -m tica.legs.trainers --model {model} --input {{input}} --output {{output}}")
    a = np.concatenate(ext.logprobs(seqs))
    b = np.concatenate(load_trainer("transformers", model).logprobs(seqs))
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_a_producer_error_is_written_into_the_sealed_leg(tmp_path):
    from tica.legs import common
    from tica.seal import check_seal

    leg = common.Leg(tmp_path / "leg", item="forward", arm="bi0", producer="test", trainer="transformers")
    with pytest.raises(RuntimeError, match="engine died"):
        with leg.errors_recorded():
            raise RuntimeError("engine died")
    meta = json.loads((tmp_path / "leg" / "leg.json").read_text())
    assert meta["errors"] == ["RuntimeError: engine died"]
    assert check_seal(tmp_path / "leg") == []


def test_no_error_leaves_the_leg_to_its_producer(tmp_path):
    from tica.legs import common

    leg = common.Leg(tmp_path / "leg", item="forward", arm="bi0", producer="test", trainer="transformers")
    with leg.errors_recorded():
        pass
    assert not (tmp_path / "leg" / "leg.json").exists()  # finishing is the producer's, not the guard's


@pytest.mark.parametrize("name,in_process", [("bi1", True), ("bi0", True), ("make-model", False), ("bi0_megatron", False)])
def test_launcher_records_only_the_process_it_waited_on(name, in_process):
    """An engine core that ran inside the producer (VLLM_ENABLE_V1_MULTIPROCESSING=0) had no process
    of its own: it is not recorded as one (it used to be, as a copy of the trainer's exit)."""
    from tica.legs.vllm_kernels.legio import launcher_records

    (rec,) = launcher_records(name, 123, 0, "", {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert rec["role"] == "trainer" and rec["pid"] == 123 and rec["exit_code"] == 0 and rec["end_state"] == "exited"
    assert ("engine core ran inside this process" in rec["evidence"]) is in_process


def test_a_force_kill_in_the_trainers_log_is_evidence_not_the_trainers_end_state():
    """vLLM's "force killing remaining processes" names a child it killed, not the process whose
    log it is; it stays in the evidence, where the clean-exit judge still refuses it."""
    from tica.process_exits import exit_problem
    from tica.legs.vllm_kernels.legio import launcher_records
    from tica.receipts import ProcessExit

    (rec,) = launcher_records("bi1-tp", 7, 0, "INFO ... force killing remaining processes count=1\n", {})
    assert rec["end_state"] == "exited" and "force killing remaining processes" in rec["evidence"]
    assert exit_problem(ProcessExit(**rec)) is not None


@pytest.mark.parametrize("arm", ["bi1", "bi0"])
def test_an_engine_that_fails_to_start_is_not_run_under_bi1_and_an_error_under_bi0(arm, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from tica.legs import common, engine
    from tica.legs.forward import start_engine_or_not_run

    def boom(*a, **k):
        raise RuntimeError("no kernel for this platform")

    monkeypatch.setattr(engine, "start_llm", boom)
    leg = common.Leg(tmp_path / "leg", item="forward", arm=arm, producer="test", trainer="transformers")
    args = SimpleNamespace(arm=arm, max_model_len=64, gpu_memory_utilization=0.1, seed=0, shutdown_timeout=30)
    if arm == "bi0":
        with pytest.raises(RuntimeError, match="no kernel"):
            start_engine_or_not_run(leg, args, "m")
        return
    assert start_engine_or_not_run(leg, args, "m") is None
    meta = json.loads((tmp_path / "leg" / "leg.json").read_text())
    assert meta["not_run_reason"].startswith("vLLM engine failed to start with VLLM_BATCH_INVARIANT=1: RuntimeError: no kernel")
