"""``producers bi1``: the BI=1 arm in one process holding vLLM (in-process engine core) and the
vllm_kernels trainer. The GPU backward check, then the forward legs over steps 1..N_STEPS with
their probes and planted faults (forward_leg.py), then the backward, one AdamW step, the reload
into vLLM and the steps on the new weights (backward_update.py).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

# the core fingerprint of a model folder, as the manifest's checkpoint.path hashes (no cache file)
from tica.models.hashing import weights_hash

from .backward_update import bi1_backward_and_update
from .forward_leg import bi1_forward_legs
from .legio import log
from .overlay import CANDIDATE_PARTS, overlay_record
from .rollout import ENGINES, FORWARD_CFG, SCHEDULE_SEED, FakeRollout, VllmRollout


def cmd_bi1(a) -> int:
    if os.environ.get("VLLM_BATCH_INVARIANT") != ("0" if a.dry_run else "1") and not a.dry_run:
        raise SystemExit("bi1 needs VLLM_BATCH_INVARIANT=1 in its environment (set before vLLM is imported)")
    import torch

    from . import legio
    from .gradcheck import check_with_controls
    from .kernels import TorchReference
    from .model import from_dir
    from .pin import KERNELS, check_vllm

    legs = Path(a.legs)
    m0 = Path(a.model)
    candidate = getattr(a, "candidate", None)
    engine_cfg = ENGINES[getattr(a, "engine", "eager")]
    parts = list(CANDIDATE_PARTS[candidate] or []) if candidate else []
    t0 = time.time()
    dev = "cpu" if a.dry_run else "cuda"
    pin = {"vllm_pinned": "0.26.0", "dry_run": True} if a.dry_run else check_vllm()
    ck0 = weights_hash(m0)  # before anything loads the folder
    # when each leg's work started: the engine (forward legs over steps 1-5), the GPU backward check
    # (backward_bi1), the backward of the update (update_bi1), the steps on the new weights
    t_engine = legio.now()
    if a.dry_run:
        kernels = TorchReference
        rollout_kern = {"fake": "CPU dry run: the reference model"}
        model = from_dir(m0, kernels, device=dev)
        rollout = FakeRollout(model)
        gc_tol = 2e-2
        t_gradcheck = legio.now()
        gc = check_with_controls(kernels, device="cpu", dtype=torch.bfloat16, tol=gc_tol)
    else:
        rollout = VllmRollout(m0, **engine_cfg)
        log(f"vLLM BI=1 engine up after {time.time() - t0:.1f}s")
        from .kernels import VllmKernels

        if candidate:
            from .matrix import product_trainer

            kernels, rollout_kern, parts = product_trainer(candidate, rollout)
        else:
            kernels = VllmKernels()
        model = from_dir(m0, kernels, device=dev)
        gc_tol = 2e-2
        t_gradcheck = legio.now()
        gc = check_with_controls(kernels, device="cuda", dtype=torch.bfloat16, tol=gc_tol)
    log(f"GPU backward check pass={gc['pass']} (controls caught {gc['controls_caught']})")
    cfg = json.loads((m0 / "config.json").read_text())
    kern = {"trainer": {k: v["entry"] for k, v in KERNELS.items()}, "trainer_detail": pin,
            "rollout": {"attention": "FLASH_ATTN", **rollout.selected(), "logprob": KERNELS["logprob"]["entry"]},
            "attention_backward": "torch fp32 reference recompute (FA3 has no backward in vLLM's wheel)"}
    if candidate:  # the product trainer: the candidate's kernels, every row in one packed forward
        from .forward_leg import PRODUCT_ROWS
        from .matrix import kernels_describe

        model.engine_step_rows = False
        kern = {"trainer": kernels_describe(kernels), "trainer_detail": pin,
                "rollout": {**rollout_kern, "logprob": KERNELS["logprob"]["entry"]},
                "attention_backward": "FA2 varlen backward (see each backward row's tica/backward_impls)",
                "trainer_rows": PRODUCT_ROWS}
    base_cfg = {"model": str(m0), "model_shape": a.shape, "weights_hash": ck0, "architecture": cfg["architectures"][0],
                "hidden_size": cfg["hidden_size"], "num_hidden_layers": cfg["num_hidden_layers"],
                "vocab_size": cfg["vocab_size"], "tie_word_embeddings": bool(cfg.get("tie_word_embeddings")),
                "weights": a.weights_note, **{**FORWARD_CFG, **engine_cfg}, "schedule_seed": SCHEDULE_SEED,
                "candidate": candidate, "source_overlay": overlay_record(parts) if parts else None,
                "sampling": {"temperature": 1.0, "logprobs": 0, "ignore_eos": True},
                "scoring": "prompt_logprobs=0 over prompt+generated, in a different batch with neighbours",
                "trainer_packing": "all sequences of a step packed into one varlen batch"}
    kept = bi1_forward_legs(legs, rollout, model, kernels, cfg, kern, base_cfg, ck0, dev, t_engine=t_engine,
                            dry_run=a.dry_run)
    bi1_backward_and_update(legs, a.work, m0, rollout, model, cfg, kern, base_cfg, ck0, dev, kept, gc=gc, gc_tol=gc_tol,
                            t_gradcheck=t_gradcheck, dry_run=a.dry_run)
    legio.add_processes(legio.legs_written(), rollout.shutdown_records())
    log(f"bi1 done in {time.time() - t0:.1f}s")
    return 0
