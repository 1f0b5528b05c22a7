"""Trainer forwards behind one interface (`Trainer`, trainer_base.py), picked by `load_trainer`.

A trainer scores fixed token histories: for each sequence of n token ids it returns the n-1
logprobs of tokens 1..n-1 (token 0 has none), float32. Trainers that can train also expose
`token_logprobs(seq)` as a differentiable tensor, their parameters, and the updated weights in
the checkpoint's own (Hugging Face) names so the rollout engine can reload them.

- `transformers`: the common baseline, HF `AutoModelForCausalLM` from the same safetensors.
- `megatron`: a megatron-core `GPTModel` built from the same safetensors (the practice's default
  BI=0 training path); CPU needs the workarounds in ENVIRONMENT.md (applied only without CUDA).
- `external`: a user command that writes logprobs for given token ids (verl/NeMo/torchtitan).
- `vllm_kernels`: the BI=1 trainer that calls vLLM's kernels (tica.legs.vllm_kernels, GPU side).
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

# the interface and helpers the backends share (megatron_trainer imports them from there too)
from tica.legs.trainer_base import Trainer, _dtype, _gather_logprobs

TRAINERS = ("transformers", "megatron", "external", "vllm_kernels", "vllm_engine")


def pack(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    token_ids = np.concatenate([np.asarray(s, dtype=np.int32) for s in seqs])
    seq_lens = np.asarray([len(s) for s in seqs], dtype=np.int32)
    return token_ids, seq_lens


def unpack(token_ids: np.ndarray, seq_lens: np.ndarray) -> list[list[int]]:
    out, i = [], 0
    for n in seq_lens.tolist():
        out.append(token_ids[i : i + n].tolist())
        i += n
    return out


class TransformersTrainer(Trainer):
    name = "transformers"
    trainable = True

    def __init__(self, model_dir: str | Path, dtype: str = "bfloat16", attn_implementation: str = "sdpa") -> None:
        from transformers import AutoModelForCausalLM

        self.model_dir = str(model_dir)
        self.dtype = dtype
        self.attn_implementation = attn_implementation
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_dir, dtype=_dtype(dtype), attn_implementation=attn_implementation
        )
        self.model.eval()

    def token_logprobs(self, seq: list[int]) -> torch.Tensor:
        ids = torch.tensor(seq, dtype=torch.long)
        logits = self.model(input_ids=ids.unsqueeze(0)).logits[0]
        return _gather_logprobs(logits, ids)

    def parameters(self):
        return self.model.named_parameters()

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}

    def describe(self) -> dict:
        return {
            "trainer": self.name,
            "class": type(self.model).__name__,
            "dtype": self.dtype,
            "attention": self.attn_implementation,
            "logprob": "torch.log_softmax(fp32 logits)",
            "matmul": f"torch {torch.__version__} aten::linear ({'cuda' if torch.cuda.is_available() else 'cpu'})",
        }


class ExternalTrainer(Trainer):
    """Runs `command` with {input} and {output} replaced: input is an .npz with `token_ids` and
    `seq_lens` (int32); the command writes an .npz with `logprobs` float32, one per token 1..n-1
    of each sequence, concatenated."""

    name = "external"

    def __init__(self, command: str) -> None:
        if "{input}" not in command or "{output}" not in command:
            raise ValueError("external trainer command must contain {input} and {output}")
        self.command = command
        self.calls: list[dict] = []

    def logprobs(self, seqs: list[list[int]]) -> list[np.ndarray]:
        token_ids, seq_lens = pack(seqs)
        with tempfile.TemporaryDirectory(prefix="tica-ext-") as tmp:
            inp, outp = Path(tmp) / "input.npz", Path(tmp) / "output.npz"
            np.savez(inp, token_ids=token_ids, seq_lens=seq_lens)
            cmd = self.command.replace("{input}", shlex.quote(str(inp))).replace("{output}", shlex.quote(str(outp)))
            proc = subprocess.run(cmd, shell=True, capture_output=True, text=True)
            self.calls.append({"command": cmd, "exit_code": proc.returncode})
            if proc.returncode != 0:
                raise RuntimeError(f"external trainer exited {proc.returncode}: {proc.stderr[-2000:]}")
            flat = np.load(outp)["logprobs"].astype(np.float32)
        want = int(seq_lens.sum() - len(seq_lens))
        if flat.size != want:
            raise RuntimeError(f"external trainer wrote {flat.size} logprobs, expected {want}")
        out, i = [], 0
        for n in seq_lens.tolist():
            out.append(flat[i : i + n - 1])
            i += n - 1
        return out

    def describe(self) -> dict:
        return {"trainer": self.name, "command": self.command, "calls": len(self.calls)}


class VllmEngineTrainer(Trainer):
    """The trainer forward read through the rollout engine's own model code and kernels: a second
    vLLM engine in the trainer's process, loading the same bytes, scoring each sequence alone (batch
    of one, so its batch composition never matches the rollout's). Forward only: no backward.

    This is what a platform without vLLM's batch-invariant mode (the CPU) can show of the BI=1
    idea: if these kernels are batch-invariant here, max = mean = 0."""

    name = "vllm_engine"

    def __init__(self, model_dir: str | Path, dtype: str = "bfloat16", **engine_args) -> None:
        from tica.legs import engine

        self.model_dir = str(model_dir)
        self.llm, self.engine_args = engine.start_llm(model_dir, dtype=dtype, **engine_args)

    def logprobs(self, seqs: list[list[int]]) -> list[np.ndarray]:
        from tica.legs import engine

        return [engine.score(self.llm, [s])[0] for s in seqs]

    def describe(self) -> dict:
        return {"trainer": self.name, "class": "vllm.LLM (second engine, same checkpoint bytes)",
                "batching": "one sequence per forward", "engine_args": self.engine_args,
                "logprob": "vLLM prompt_logprobs (the rollout engine's own log_softmax)"}

    def close_and_record(self, leg) -> None:
        from tica.legs import engine

        n = len(leg.processes)
        engine.shutdown_and_record(self.llm, leg)
        for p in leg.processes[n:]:
            p["role"] = "trainer_" + p["role"]


class VllmKernelsTrainer(Trainer):
    """tica.legs.vllm_kernels.KernelLlama behind this interface: vLLM's own kernels with written
    backwards on a GPU (`VllmKernels`); elsewhere its plain-torch `TorchReference` (not vLLM's
    kernels: recorded as such)."""

    name = "vllm_kernels"
    trainable = True

    def __init__(self, model_dir: str | Path) -> None:
        from tica.legs.vllm_kernels import kernels as K
        from tica.legs.vllm_kernels import model as M

        self._M = M
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.kernels = K.VllmKernels() if self.device == "cuda" else K.TorchReference()
        self.model = M.from_dir(model_dir, self.kernels, device=self.device)

    def _flat(self, seqs: list[list[int]]) -> torch.Tensor:
        ids, cu, mx = self._M.pack(seqs, self.device)
        return self.model.logprobs(ids, cu, mx)

    def token_logprobs(self, seq: list[int]) -> torch.Tensor:
        return self._flat([seq]).cpu()

    def logprobs(self, seqs: list[list[int]]) -> list[np.ndarray]:
        with torch.no_grad():
            flat = self._flat(seqs).float().cpu().numpy().astype(np.float32)
        out, i = [], 0
        for s in seqs:
            out.append(flat[i : i + len(s) - 1])
            i += len(s) - 1
        return out

    def parameters(self):
        return self.model.named_parameters()

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.cpu() for k, v in self.model.deployed_state_dict().items()}

    def describe(self) -> dict:
        return {"trainer": self.name, "class": "tica.legs.vllm_kernels.KernelLlama",
                "kernels": getattr(self.kernels, "name", type(self.kernels).__name__), "device": self.device}


def load_trainer(name: str, model_dir: str | Path | None = None, *, dtype: str = "bfloat16",
                 command: str | None = None, engine_args: dict | None = None) -> Trainer:
    if name == "transformers":
        return TransformersTrainer(model_dir, dtype=dtype)
    if name == "megatron":
        from tica.legs.megatron_trainer import MegatronTrainer

        return MegatronTrainer(model_dir, dtype=dtype)
    if name == "external":
        if not command:
            raise SystemExit("--trainer external needs --trainer-command 'CMD {input} {output}'")
        return ExternalTrainer(command)
    if name == "vllm_kernels":
        return VllmKernelsTrainer(model_dir)
    if name == "vllm_engine":
        return VllmEngineTrainer(model_dir, dtype=dtype, **(engine_args or {}))
    raise SystemExit(f"unknown trainer {name!r}; one of {TRAINERS}")


def _external_main() -> None:
    """`python -m tica.legs.trainers --model DIR --input IN.npz --output OUT.npz [--trainer transformers]`:
    a reference external command (the built-in trainers behind the external interface)."""
    import argparse

    ap = argparse.ArgumentParser(description=_external_main.__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--trainer", default="transformers", choices=("transformers", "megatron"))
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()
    data = np.load(a.input)
    seqs = unpack(data["token_ids"], data["seq_lens"])
    tr = load_trainer(a.trainer, a.model, dtype=a.dtype)
    lps = tr.logprobs(seqs)
    np.savez(a.output, logprobs=np.concatenate(lps).astype(np.float32))


if __name__ == "__main__":
    _external_main()
