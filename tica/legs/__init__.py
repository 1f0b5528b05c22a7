"""Leg producers: each a standalone process (`python -m tica.legs.<item> --out LEG_DIR --arm bi1|bi0`)
that sets its arm's switches before vLLM is imported, writes a leg directory per
docs/receipts.md and seals it last.

Producers import only what a GPU node has (torch, vllm, numpy, safetensors, transformers,
megatron-core, dagster-pipes, the standard library) plus tica.metrics and tica.seal. The
orchestrating side calls `tica.legs.runner`.
"""

ITEMS = ("forward", "backward", "update", "quality", "throughput", "clean_exit")
ARMS = ("bi1", "bi0")
