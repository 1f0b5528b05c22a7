"""What every trainer forward shares: the `Trainer` interface, dtype names and the fp32 logprob
gather. Its own module so that trainers.py (which picks a backend) and the backends in their own
modules (megatron_trainer.py) both import it and neither imports the other at load time.

A trainer scores fixed token histories: for each sequence of n token ids it returns the n-1
logprobs of tokens 1..n-1 (token 0 has none), float32. Trainers that can train also expose
`token_logprobs(seq)` as a differentiable tensor, their parameters, and the updated weights in
the checkpoint's own (Hugging Face) names so the rollout engine can reload them.
"""

from __future__ import annotations

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
