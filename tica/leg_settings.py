"""The settings a leg producer reads where it runs (a GPU node): standard library only, because
producers never import pydantic-based `tica` modules (docs/receipts.md). `tica.settings.TicaSettings`
holds the same variables and validates them with these very parsers, so both read one value the
same way; docs/settings.md is the table of every variable.

Each `parse_*` takes the variable's text (None when unset) and returns its value; each reader reads
the variable from the environment at call time.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR = "TICA_CACHE_DIR"
PROGRESS = "TICA_PROGRESS"
IMAGE_DIGEST = "TICA_IMAGE_DIGEST"
N_STEPS = "TICA_N_STEPS"
OVERLAY_PARTS = "TICA_OVERLAY_PARTS"
ALLOW_VLLM_VERSION = "TICA_VLLM_KERNELS_ALLOW_VERSION"
SMOLLM2_GGUF = "TICA_SMOLLM2_GGUF"

N_STEPS_DEFAULT = 5


def parse_cache_dir(raw: str | None) -> Path:
    return Path(raw) if raw else Path.home() / ".cache" / "tica"


def parse_progress(raw: str | None) -> bool | None:
    """True: forced on, False: forced off, None: not forced (any other text, as unset)."""
    forced = (raw or "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return True
    if forced in ("0", "false", "no", "off"):
        return False
    return None


def parse_image_digest(raw: str | None) -> str | None:
    return raw or None


def parse_n_steps(raw: str | None) -> int:
    if raw is None:
        return N_STEPS_DEFAULT
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not a whole number of forward steps") from None


def parse_overlay_parts(raw: str | None) -> tuple[str, ...] | None:
    """The overlay parts named (an empty text names none); None when unset: every part."""
    return None if raw is None else tuple(x for x in raw.split(",") if x)


def parse_allow_vllm_version(raw: str | None) -> bool:
    return raw == "1"


def parse_smollm2_gguf(raw: str | None) -> Path | None:
    return Path(raw) if raw else None


def _raw(name: str) -> str | None:
    return os.environ.get(name)


def cache_dir() -> Path:
    return parse_cache_dir(_raw(CACHE_DIR))


def progress() -> bool | None:
    return parse_progress(_raw(PROGRESS))


def image_digest() -> str | None:
    return parse_image_digest(_raw(IMAGE_DIGEST))


def n_steps() -> int:
    try:
        return parse_n_steps(_raw(N_STEPS))
    except ValueError as exc:
        raise ValueError(f"{N_STEPS}: {exc}") from None


def overlay_parts() -> tuple[str, ...] | None:
    return parse_overlay_parts(_raw(OVERLAY_PARTS))


def allow_vllm_version() -> bool:
    return parse_allow_vllm_version(_raw(ALLOW_VLLM_VERSION))


def smollm2_gguf() -> Path | None:
    return parse_smollm2_gguf(_raw(SMOLLM2_GGUF))
