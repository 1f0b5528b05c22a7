"""The H200 legs, one command each (``python -m tica.legs.vllm_kernels.producers CMD ...``).

  make-model   seeded random Llama (bf16 safetensors + config.json [+ a word-level tokenizer])
  bi1          VLLM_BATCH_INVARIANT=1, one process holding vLLM (in-process engine core) and the
               vllm_kernels trainer: GPU backward check; forward steps 1-5 (batch composition
               changes every step); a planted fault (one linear on torch's default cuBLAS
               matmul) over the same steps; backward + one AdamW step; updated weights written
               as safetensors and reloaded by vLLM; forward steps 6-10 on the new weights
  bi1-tp       the BI=1 forward with vLLM at tensor-parallel 2 and the trainer in its layout
  bi0          VLLM_BATCH_INVARIANT=0: the same steps' prompts, vLLM BI=0 rollout, HF
               transformers trainer (bf16, sdpa, fp32 log_softmax: the regular baseline)
  bi0-megatron megatron-core's trainer forward over the rollouts bi0 saved
  throughput   `vllm serve` BI=0 and BI=1 + `vllm bench serve` (random, fixed lengths, ignore
               EOS), crossed AB/BA/AB, stopped at a deadline (legs past it: not run, with why)
  all          the whole run in that order, each child's exit recorded, every leg sealed,
               receipts packed into $OUT

Legs are written unsealed by the measuring process; the launcher adds the process ends it
observed (exit codes, "force killing" lines in the child's log) and seals them (legio.py).
Every leg names its weights by the core fingerprint of the folder they were loaded from
(tica.models.hashing.weights_hash), and records when its own work started and ended.
A CPU dry run (``all --dry-run``) drives the same code with a tiny model, the torch reference
kernels and a fake rollout engine, so the receipts' shape is tested without a GPU.

This module is the entry point that legs record as their producer (legio.PRODUCER) and that
`all` and pipes_child launch; the code lives in the modules it names below, by concern:
  seeded_model.py     make-model
  rollout.py          the step schedule, vLLM's offline engine and the dry run's fake one
  forward_leg.py      forward legs: step arrays and rows, bi1's forward legs and faults, bi0, bi0-megatron
  backward_update.py  bi1's backward, AdamW step, reload and steps on the new weights
  bi1.py              the bi1 command (forward_leg, then backward_update, in one process)
  tp.py               bi1-tp
  server.py           throughput and bench-client
  launcher.py         all, and the command line
"""

from __future__ import annotations

import sys

# the core fingerprint of a model folder, as the manifest's checkpoint.path hashes (no cache file)
from tica.models.hashing import weights_hash

from .backward_update import LR, bi1_backward_and_update
from .bi1 import cmd_bi1
from .forward_leg import (FAULT_LINEAR, FAULTS, arrays_for, bi1_forward_legs, cmd_bi0, cmd_bi0_megatron, decode_kernels,
                          decode_probe, step_extra, trainer_decode_logprobs, trainer_logprobs, write_decode_leg,
                          write_decode_rows, write_forward_step)
from .launcher import cmd_all, main
from .legio import log
from .rollout import FORWARD_CFG, N_STEPS, SCHEDULE_SEED, FakeRollout, VllmRollout, schedule
from .seeded_model import SHAPES, make_model, model_config, write_word_tokenizer
from .server import CONCURRENCIES, bench_times, cmd_bench_client, cmd_throughput

__all__ = [
    "CONCURRENCIES", "FAULTS", "FAULT_LINEAR", "FORWARD_CFG", "LR", "N_STEPS", "SCHEDULE_SEED", "SHAPES",
    "FakeRollout", "VllmRollout", "arrays_for", "bench_times", "bi1_backward_and_update", "bi1_forward_legs",
    "cmd_all", "cmd_bench_client", "cmd_bi0", "cmd_bi0_megatron", "cmd_bi1", "cmd_throughput", "decode_kernels",
    "decode_probe", "log", "main", "make_model", "model_config", "schedule", "step_extra", "trainer_decode_logprobs",
    "trainer_logprobs", "weights_hash", "write_decode_leg", "write_decode_rows", "write_forward_step",
    "write_word_tokenizer",
]

if __name__ == "__main__":
    sys.exit(main())
