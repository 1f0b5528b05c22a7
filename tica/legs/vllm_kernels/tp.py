"""The forward at tensor-parallel 2 (``producers bi1-tp``): vLLM serves the model over two GPUs
(BI=1: vLLM sets the NCCL determinism variables and turns symmetric-memory all-reduce off), and
the trainer reproduces that layout (``KernelLlama.tp = 2``: each rank's shard through the same
kernels, the partial sums added as the all-reduce adds them).

Legs (all arm bi1, trainer vllm_kernels):
  forward_bi1_tp2              prefill scoring, steps 1-5 (as forward_bi1 at TP=1)
  forward_bi1_tp2_decode       response tokens vs vLLM's sampled-token logprobs, steps 1-5
  forward_bi1_tp2_trainer_tp1  the same as _decode with the trainer left at TP=1: the layout
                               mismatch must show (a control, not evidence)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


TRAINER_TP_LAYOUT = ("2 ranks emulated on the trainer's one device: each rank's shard through the same kernels, partials of "
                     "o_proj / down_proj summed in fp32 and rounded to bf16 once (the all-reduce of two ranks), "
                     "lm_head logits concatenated (the gather)")
DRY_TP = ("CPU dry run, no engine: TP=2 emulated on one CPU device, each rank's shard through the reference "
          "kernels, the partials summed in rank order (KernelLlama.tp), the rollout scored by the same model")


def _all_reduce_record(worker) -> dict:
    """Runs in each vLLM worker: which all-reduce the TP group holds and the NCCL settings it saw."""
    import os as _os

    from vllm.distributed.parallel_state import get_tp_group

    dc = get_tp_group().device_communicator
    out = {"rank": get_tp_group().rank_in_group, "world_size": get_tp_group().world_size,
           "nccl_env": {k: v for k, v in sorted(_os.environ.items()) if k.startswith("NCCL_")},
           "VLLM_ALLREDUCE_USE_SYMM_MEM": _os.environ.get("VLLM_ALLREDUCE_USE_SYMM_MEM")}
    for name in ("ca_comm", "pynccl_comm", "symm_mem_comm", "qr_comm", "fi_ar_comm"):
        comm = getattr(dc, name, None)
        out[name] = None if comm is None else ("disabled" if getattr(comm, "disabled", False) else "enabled")
    return out


def cmd_bi1_tp(a) -> int:
    if os.environ.get("VLLM_BATCH_INVARIANT") != "1" and not a.dry_run:
        raise SystemExit("bi1-tp needs VLLM_BATCH_INVARIANT=1 in its environment (set before vLLM is imported)")
    import numpy as np

    from tica.models.hashing import weights_hash

    from . import legio
    from .forward_leg import trainer_logprobs, write_decode_leg, write_forward_step
    from .kernels import TorchReference
    from .legio import log
    from .model import from_dir
    from .pin import KERNELS, check_vllm
    from .rollout import FORWARD_CFG, N_STEPS, SCHEDULE_SEED, FakeRollout, VllmRollout, schedule

    legs, m0, tp = Path(a.legs), Path(a.model), a.tp
    t0 = time.time()
    dev = "cpu" if a.dry_run else "cuda"
    ck0 = weights_hash(m0)  # before anything loads the folder
    t_engine = legio.now()  # every leg here scores the rollouts of this engine's steps 1..N
    if a.dry_run:  # CPU: torch reference kernels, a fake rollout scored by the TP=1 layout
        pin = {"vllm_pinned": "0.26.0", "dry_run": True}
        rollout = FakeRollout(from_dir(m0, TorchReference, device=dev))
        ar = [{"dry_run": True}]
        model = from_dir(m0, TorchReference, device=dev)
    else:
        from .kernels import VllmKernels

        pin = check_vllm()
        rollout = VllmRollout(m0, tensor_parallel_size=tp)
        log(f"vLLM BI=1 TP={tp} engine up after {time.time() - t0:.1f}s")
        try:
            ar = rollout.llm.collective_rpc(_all_reduce_record)
        except Exception as err:  # noqa: BLE001 - recorded, not hidden
            ar = [{"error": repr(err)[:500]}]
        log(f"all-reduce: {json.dumps(ar)[:1500]}")
        model = from_dir(m0, VllmKernels(), device=dev)
    model.tp = tp
    cfg = json.loads((m0 / "config.json").read_text())
    kern = {"trainer": {k: v["entry"] for k, v in KERNELS.items()}, "trainer_detail": pin,
            "trainer_tensor_parallel": TRAINER_TP_LAYOUT,
            "rollout": {"attention": "FLASH_ATTN", **rollout.selected(), "logprob": KERNELS["logprob"]["entry"],
                        "tensor_parallel_size": tp, "all_reduce": ar}}
    base_cfg = {"model": str(m0), "model_shape": a.shape, "weights_hash": ck0, "architecture": cfg["architectures"][0],
                "hidden_size": cfg["hidden_size"], "num_hidden_layers": cfg["num_hidden_layers"],
                "vocab_size": cfg["vocab_size"], "weights": "random, seeded, built on the GPU at run time",
                **FORWARD_CFG, "tensor_parallel_size": tp, "schedule_seed": SCHEDULE_SEED,
                "sampling": {"temperature": 1.0, "logprobs": 0, "ignore_eos": True}}
    prompts, steps = schedule(cfg["vocab_size"], 1, N_STEPS)
    fwd = legs / f"forward_bi1_tp{tp}"
    rows, kept = [], []
    for st in steps:
        ro = rollout.step(prompts, st)
        rows.append(write_forward_step(legio, fwd, st, ro, trainer_logprobs(model, ro["fulls"], dev), ck0))
        kept.append((st, ro))
        log(f"tp{tp} step {st['step']}: n={rows[-1]['tica/n_tokens']} bitwise_diff={rows[-1]['tica/n_bitwise_diff']}")
    legio.write_jsonl(fwd / "metrics.jsonl", rows)
    meta = legio.new_meta("forward", legio.kernels_arm(), trainer="vllm_kernels", started_at=t_engine)
    meta["ended_at"] = legio.now()
    meta["kernels"] = kern
    meta["resolved_config"] = dict(base_cfg, scoring="prompt_logprobs=0 over prompt+generated, with neighbours")
    legio.write_meta(fwd, meta)
    write_decode_leg(legio, legs / f"forward_bi1_tp{tp}_decode", kept, model, dev, ck0, kern, base_cfg,
                     started_at=t_engine)
    model.tp = 1
    ctl = legs / f"forward_bi1_tp{tp}_trainer_tp1"
    write_decode_leg(legio, ctl, kept, model, dev, ck0, dict(kern, trainer_tensor_parallel="1 (not the rollout's)"),
                     dict(base_cfg, control=f"trainer at TP=1 against a TP={tp} rollout: the layouts differ, "
                                           "so the bits may; evidence that the trainer must match the rollout's layout",
                          canary=True), started_at=t_engine)
    legio.add_processes(legio.legs_written(), rollout.shutdown_records())
    nd = [json.loads(x)["tica/n_bitwise_diff"] for x in (ctl / "metrics.jsonl").read_text().splitlines()]
    log(f"trainer TP=1 vs rollout TP={tp}: bitwise diffs per step {nd}")
    log(f"bi1-tp done in {time.time() - t0:.1f}s; {np.sum(nd)} control diffs")
    return 0
