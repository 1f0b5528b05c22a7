"""Models the CPU path runs: a tiny seeded Llama for tests, SmolLM2-135M-Instruct for the demo.

Both end as a Hugging Face-shaped directory (config.json, model.safetensors, tokenizer files)
that vLLM, transformers and megatron-core all load from the same bytes.

Names are loaded on first use, so `tica.models.hashing` (standard library + blake3) can be
imported on a GPU node without importing torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TinyLlamaSpec", "build_tiny_llama", "weights_hash"]


def __getattr__(name: str) -> Any:
    if name in ("TinyLlamaSpec", "build_tiny_llama"):
        from tica.models import tiny

        return getattr(tiny, name)
    if name == "weights_hash":
        from tica.models.hashing import weights_hash

        return weights_hash
    raise AttributeError(f"module 'tica.models' has no attribute {name!r}")
