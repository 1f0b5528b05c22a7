"""Models the CPU path runs: a tiny seeded Llama for tests, SmolLM2-135M-Instruct for the demo.

Both end as a Hugging Face-shaped directory (config.json, model.safetensors, tokenizer files)
that vLLM, transformers and megatron-core all load from the same bytes.
"""

from tica.models.tiny import TinyLlamaSpec, build_tiny_llama
from tica.models.hashing import weights_hash

__all__ = ["TinyLlamaSpec", "build_tiny_llama", "weights_hash"]
