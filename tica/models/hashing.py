"""Content hash of a checkpoint's weight files (what `checkpoint_version` and
`resolved_config.weights_hash` name). Standard library plus blake3 (a vLLM dependency)."""

from __future__ import annotations

import hashlib
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors",)


def _hasher():
    try:
        import blake3  # vLLM depends on it; present on every node that runs legs

        return "blake3", blake3.blake3()
    except ImportError:  # pragma: no cover - fallback keeps the name honest
        return "sha256", hashlib.sha256()


def weights_hash(model_dir: str | Path) -> str:
    """blake3 over (relative path, bytes) of every *.safetensors file, sorted by path."""
    model_dir = Path(model_dir)
    files = sorted(p for p in model_dir.rglob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weight files")
    name, h = _hasher()
    for p in files:
        h.update(p.relative_to(model_dir).as_posix().encode() + b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return f"{name}:{h.hexdigest()}"


def sha256_of(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()
