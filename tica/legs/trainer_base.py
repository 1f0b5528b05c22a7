"""What every trainer forward shares: the `Trainer` interface, dtype names and the fp32 logprob
gather. Its own module so that trainers.py (which picks a backend) and the backends in their own
modules (megatron_trainer.py) both import it and neither imports the other at load time.

A trainer scores fixed token histories: for each sequence of n token ids it returns the n-1
logprobs of tokens 1..n-1 (token 0 has none), float32. Trainers that can train also expose
`token_logprobs(seq)` as a differentiable tensor, their parameters, and the updated weights in
the checkpoint's own (Hugging Face) names so the rollout engine can reload them.
"""

from __future__ import annotations

import sys

import numpy as np
import torch


def _dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[name]


class Trainer:
    name = "base"
    trainable = False

    def logprobs(self, seqs: list[list[int]]) -> list[np.ndarray]:
        with torch.no_grad():
            return [self.token_logprobs(s).float().numpy().astype(np.float32) for s in seqs]

    def token_logprobs(self, seq: list[int]) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self) -> dict:
        return {"trainer": self.name}

    # training side
    def parameters(self):
        raise NotImplementedError(f"trainer {self.name} cannot train")

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError(f"trainer {self.name} cannot export weights")

    def close(self) -> None:
        pass


def _gather_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """fp32 log_softmax of logits[:-1] gathered at ids[1:]."""
    lp = torch.log_softmax(logits[:-1].float(), dim=-1)
    return lp.gather(-1, ids[1:].unsqueeze(-1)).squeeze(-1)


PARALLEL_KINDS = ("tensor", "pipeline", "data", "expert", "context")


def trainer_parallelism() -> dict:
    """Each parallel size the trainer process ran with, read from the process itself: megatron's
    `parallel_state` where it is initialised; otherwise torch.distributed, where no process group
    (or one of world size 1) means one process held the whole model, every size 1. A distributed
    trainer this cannot read records nothing (unknown) and says why."""
    import torch.distributed as dist

    group = dist.is_available() and dist.is_initialized()
    megatron = sys.modules.get("megatron.core.parallel_state")
    if group and megatron is not None and megatron.model_parallel_is_initialized():
        getters = {"tensor": "get_tensor_model_parallel_world_size", "pipeline": "get_pipeline_model_parallel_world_size",
                   "data": "get_data_parallel_world_size", "expert": "get_expert_model_parallel_world_size",
                   "context": "get_context_parallel_world_size"}
        out: dict = {}
        for kind, getter in getters.items():
            try:
                out[f"{kind}_parallel_size"] = int(getattr(megatron, getter)())
            except Exception:  # a size megatron cannot say is unknown, not 1
                continue
        out["parallelism_read_from"] = "megatron.core.parallel_state (the trainer's own process groups)"
        return out
    world = dist.get_world_size() if group else 1
    if world == 1:
        return {**{f"{kind}_parallel_size": 1 for kind in PARALLEL_KINDS},
                "parallelism_read_from": ("torch.distributed: process group of world size 1" if group else
                                          "torch.distributed not initialised: one trainer process held the whole model")}
    return {"parallelism_read_from": f"torch.distributed world size {world} without megatron's parallel_state: "
                                     "the trainer's parallel sizes are unknown"}


def trainer_resolved(trainer: Trainer) -> dict:
    """What the trainer ran, read from it (not from the arguments it was given): `dtype`, the one
    dtype its matmul weights (parameters of two or more dimensions) hold (several: unknown, each
    listed), and each parallel size (`trainer_parallelism`). A trainer that does not train in this
    process (an external command, a second vLLM engine) is not read here: nothing is recorded."""
    if not trainer.trainable:
        return {}
    out: dict = {}
    try:
        dtypes = sorted({str(p.dtype) for _, p in trainer.parameters() if p.dim() >= 2})
    except NotImplementedError:
        dtypes = []
    if len(dtypes) == 1:
        out["dtype"] = dtypes[0]
    elif dtypes:
        out["matmul_weight_dtypes"] = dtypes
    return {**out, **trainer_parallelism()}
