"""The candidate manifest: every component of a candidate as resolved values, never names.

A manifest is YAML, one file per candidate track. Paths inside it (the checkpoint, the
problem set) are relative to the manifest's own folder. Validation errors name the file and
the field.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from tica import canonical
from tica.errors import ManifestError, pydantic_errors, read_yaml_mapping
from tica.evidence import Component, EvidenceItem
from tica.named_files import named_file_digests
from tica.source import WORKING_TREE, checkout_commit

DIGEST_PREFIXES = ("sha256:", "blake3:", "xxh3-128:")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _digest(value: str) -> str:
    """A content digest in its canonical spelling (tica.canonical: case, a bare sha256)."""
    value = canonical.digest(value)
    if not value.startswith(DIGEST_PREFIXES) or len(value.split(":", 1)[1]) < 16:
        raise ValueError(f"{value!r} is not a content digest (expected one of {', '.join(DIGEST_PREFIXES)}<hex>)")
    return value


class Checkpoint(_Strict):
    """The deployed weights: a path TICA hashes itself, or, for a track measured elsewhere whose
    weights are not on this machine, the content digest its producer recorded."""

    path: str | None = Field(None, description="folder or file of the deployed weights, relative to the manifest")
    root: str | None = Field(None, description="a folder the checkpoint's links and index-named shards may resolve "
                                               "into (an HF cache's models--org--name), relative to the manifest; "
                                               "default: the checkpoint folder itself")
    digest: str | None = Field(None, description="recorded content digest, only when the weights are not here")
    format: Literal["safetensors", "gguf", "dcp", "other"] = "safetensors"

    @field_validator("path", "root")
    @classmethod
    def _a_path(cls, v: str | None) -> str | None:
        # the file system takes neither a NUL byte nor text that is not Unicode (a lone surrogate)
        if v is not None and ("\x00" in v or any(0xD800 <= ord(c) <= 0xDFFF for c in v)):
            raise ValueError("a path holds no NUL byte and no unpaired surrogate")
        return v

    @model_validator(mode="after")
    def _one_identity(self) -> "Checkpoint":
        if (self.path is None) == (self.digest is None):
            raise ValueError("give exactly one of checkpoint.path (hashed here) or checkpoint.digest (recorded elsewhere)")
        if self.digest is not None:
            object.__setattr__(self, "digest", _digest(self.digest))
        return self


class Image(_Strict):
    digest: str | None = Field(..., description="the image's content digest; null: no image (a machine's own "
                                                "environment), bound by the package versions runner pins")
    reference: str | None = Field(None, description="human tag, informational only; the digest identifies it")

    _check = field_validator("digest")(classmethod(lambda cls, v: None if v is None else _digest(v)))


class Source(_Strict):
    repository: str
    commit: str = Field(..., pattern=rf"^([0-9a-fA-F]{{7,40}}(\+dirty(\.[0-9a-f]{{12}})?)?|{WORKING_TREE})$",
                        description=f"a git commit (7 to 40 hex digits, `+dirty` for a changed checkout), or "
                        f"{WORKING_TREE!r}: the checkout holding the manifest, resolved to its HEAD when loaded")
    overlay_digest: str | None = None

    _commit = field_validator("commit")(classmethod(lambda cls, v: canonical.commit(v)))

    @field_validator("overlay_digest")
    @classmethod
    def _overlay(cls, v: str | None) -> str | None:
        return None if v is None else _digest(v)


class Hardware(_Strict):
    accelerator: str
    count_per_node: int = Field(..., ge=1)
    nodes: int = Field(1, ge=1)
    driver: str | None = None
    interconnect: str | None = None


class Parallelism(_Strict):
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    cp: int = Field(1, ge=1)


class Runner(_Strict):
    rollout_engine: str = Field(..., description="e.g. vllm==0.26.0")
    trainer: str = Field(..., description="e.g. megatron-core==0.16.1 or vllm_kernels")
    parallelism: Parallelism = Parallelism()

    _pins = field_validator("rollout_engine", "trainer")(classmethod(lambda cls, v: canonical.package_pin(v)))


class Precision(_Strict):
    weights: str
    kv_cache: str

    _dtypes = field_validator("weights", "kv_cache")(classmethod(lambda cls, v: canonical.dtype(v)))


class Backends(_Strict):
    """Backends actually selected (read from the engine's log or receipt), not requested."""

    attention: str
    dense_gemm: str
    moe: str | None = None
    all_to_all: str | None = None


class GraphCache(_Strict):
    cuda_graph_mode: str
    cuda_graph_sizes: tuple[int, ...] = ()
    prefix_caching: bool
    chunked_prefill: bool
    max_num_batched_tokens: int | None = None
    async_scheduling: bool = False

    @field_validator("cuda_graph_sizes")
    @classmethod
    def _sizes(cls, v: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        mode = str(info.data.get("cuda_graph_mode", "")).strip().lower()
        if v and (mode.startswith("none") or not mode):
            raise ValueError(f"capture sizes pinned while cuda_graph_mode is {mode or 'unset'}: an engine without "
                             "CUDA graphs captures none (vLLM resolves the sizes to [])")
        return canonical.unordered(v)


class Recipe(_Strict):
    """The recipe's resolved command per arm, as printed by its dry-run mode."""

    bi1: str = Field(..., min_length=1)
    bi0: str = Field(..., min_length=1)
    shutdown_timeout: int | None = Field(
        None, ge=0, le=86_400,
        description="the serving recipe's vLLM --shutdown-timeout, seconds: 0 (vLLM's default) force-kills the "
                    "EngineCore at shutdown; null: not pinned")

    @model_validator(mode="after")
    def _one_switch(self) -> "Recipe":
        if "VLLM_BATCH_INVARIANT=1" not in self.bi1:
            raise ValueError("recipe.bi1 must set VLLM_BATCH_INVARIANT=1 in its resolved command")
        if "VLLM_BATCH_INVARIANT=1" in self.bi0:
            raise ValueError("recipe.bi0 sets VLLM_BATCH_INVARIANT=1: the switch must select the arm")
        return self


class Sampling(_Strict):
    temperature: float = Field(..., ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    seed: int = 0
    n: int = Field(1, ge=1)
    stop: tuple[str, ...] = ()

    _stop = field_validator("stop")(classmethod(lambda cls, v: canonical.unordered(v)))


class EvalContract(_Strict):
    """The six items; two scores that differ in any of them are not the same score."""

    dataset_version: str
    prompt_template: str
    thinking_mode: Literal["on", "off", "n/a"] = "n/a"
    sampling: Sampling
    repeats: int = Field(..., ge=1)
    scorer: str
    length_cap: int = Field(..., ge=1)


class Workload(_Strict):
    input_len: int = Field(8192, ge=1)
    output_len: int = Field(1024, ge=1)
    ignore_eos: bool = True
    concurrencies: tuple[int, ...] = (1, 8, 32, 64)
    # requests per leg: one number for every concurrency, or one per concurrency (each listed)
    num_prompts: int | dict[int, int] = Field(...)
    warmups: int = Field(1, ge=0)
    seed: int = 0

    @model_validator(mode="after")
    def _prompts_per_concurrency(self) -> "Workload":
        counts = self.num_prompts.values() if isinstance(self.num_prompts, dict) else [self.num_prompts]
        if any(isinstance(n, bool) or n < 1 for n in counts):
            raise ValueError("num_prompts: a request count is at least 1")
        if len(set(self.concurrencies)) != len(self.concurrencies):
            raise ValueError(f"concurrencies {list(self.concurrencies)} names one twice")
        if isinstance(self.num_prompts, dict) and set(self.num_prompts) != set(self.concurrencies):
            raise ValueError(f"num_prompts names concurrencies {sorted(self.num_prompts)}, the workload's are "
                             f"{sorted(self.concurrencies)}")
        # canonical forms (tica.canonical): the order of concurrencies is no substance, and a count
        # per concurrency that is one number everywhere is that number
        object.__setattr__(self, "concurrencies", canonical.unordered(self.concurrencies))
        object.__setattr__(self, "num_prompts", canonical.per_concurrency(self.num_prompts))
        return self

    def prompts_at(self, concurrency: int) -> int | None:
        """Requests per leg at this concurrency; None where the workload has no such concurrency."""
        if concurrency not in self.concurrencies:
            return None
        return self.num_prompts[concurrency] if isinstance(self.num_prompts, dict) else self.num_prompts


class Deviation(_Strict):
    item: str
    reference: str
    ours: str
    why: str
    affects: tuple[EvidenceItem, ...]


class Manifest(_Strict):
    """A candidate: every component docs/practice.md names, as resolved values."""

    track: str = Field(..., pattern=r"^[a-z0-9][a-z0-9_-]*$", description="a candidate track (one model line)")
    description: str = ""
    checkpoint: Checkpoint
    image: Image
    source: Source
    hardware: Hardware
    runner: Runner
    precision: Precision
    backends: Backends
    graph_cache: GraphCache
    recipe: Recipe
    eval_contract: EvalContract
    workload: Workload
    deviations: tuple[Deviation, ...] = ()

    def component_values(self) -> dict[Component, Any]:
        """The resolved value of every component except weights (hashed from files)."""
        dump = self.model_dump(mode="json")
        return {
            Component.IMAGE: dump["image"]["digest"],
            Component.SOURCE: dump["source"],
            Component.HARDWARE: dump["hardware"],
            Component.RUNNER: dump["runner"],
            Component.PRECISION: dump["precision"],
            Component.BACKENDS: dump["backends"],
            Component.GRAPH_CACHE: dump["graph_cache"],
            Component.RECIPE: dump["recipe"],
            Component.EVAL_CONTRACT: dump["eval_contract"],
            Component.WORKLOAD: dump["workload"],
        }


def value_fingerprint(value: Any) -> str:
    """Fingerprint of a resolved (JSON-able) value: sha256 of canonical JSON."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


class LoadedManifest(BaseModel):
    """A validated manifest with where it came from, its checkpoint resolved on disk, and the files
    its evaluation contract and recipe name, resolved and hashed (`named_files`)."""

    model_config = ConfigDict(frozen=True)

    path: Path
    manifest: Manifest
    checkpoint_path: Path | None
    text_hash: str
    checkpoint_root: Path | None = None
    named_files: dict[Component, dict[str, str]] = {}


# Where a manifest names a file by its path (a `--chat-template templates/chat.jinja`, a scorer
# module `scorers/math.py`), the file's content is the identity, not the name: each token of these
# fields that is the path of a regular file inside the manifest's folder is hashed, and the hash is
# part of the component's fingerprint (tica.candidate.identify). A path outside the folder, or to
# no file, is left as the text it is.
NAMED_FILE_FIELDS: dict[Component, tuple[str, ...]] = {
    Component.EVAL_CONTRACT: ("prompt_template", "scorer"),
    Component.RECIPE: ("bi1", "bi0"),
}


def named_file_texts(manifest: Manifest) -> list[tuple[str, str]]:
    """(component, field text) of every field that may name a file (NAMED_FILE_FIELDS)."""
    return [(component.value, str(getattr(getattr(manifest, "eval_contract" if component is Component.EVAL_CONTRACT
                                                   else "recipe"), field)))
            for component, fields in NAMED_FILE_FIELDS.items() for field in fields]


def named_files(manifest: Manifest, folder: Path) -> dict[Component, dict[str, str]]:
    """{component: {path as named: sha256 of the file}} for every file the fields name."""
    return {Component(c): files for c, files in named_file_digests(named_file_texts(manifest), folder).items()}


def load_manifest(path: str | Path) -> LoadedManifest:
    """Read and validate a manifest; every failure names the file and the field."""
    path = Path(path)
    raw, data = read_yaml_mapping(path, ManifestError)
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as err:
        raise pydantic_errors(ManifestError, path, err) from None
    if manifest.source.commit == WORKING_TREE:
        # "the checkout next to this manifest": resolved to its commit (+dirty), as producers record it
        resolved = checkout_commit(path.parent)
        if resolved is not None:
            manifest = manifest.model_copy(update={"source": manifest.source.model_copy(update={"commit": resolved})})
    ckpt = ckpt_root = None
    if manifest.checkpoint.root is not None:
        ckpt_root = (path.parent / manifest.checkpoint.root).resolve()
        if not ckpt_root.is_dir():
            raise ManifestError(path, "checkpoint.root", f"{manifest.checkpoint.root} is not a folder")
    if manifest.checkpoint.path is not None:
        ckpt = (path.parent / manifest.checkpoint.path).resolve()
        named = manifest.checkpoint.path
        if not ckpt.exists():
            raise ManifestError(path, "checkpoint.path", f"{named} does not exist (relative to the manifest)")
        if ckpt.is_dir() and not any(p.is_file() for p in ckpt.rglob("*")):
            raise ManifestError(path, "checkpoint.path", f"{named} holds no files")
    return LoadedManifest(
        path=path.resolve(),
        manifest=manifest,
        checkpoint_path=ckpt,
        checkpoint_root=ckpt_root,
        named_files=named_files(manifest, path.parent),
        text_hash="sha256:" + hashlib.sha256(raw).hexdigest(),
    )
