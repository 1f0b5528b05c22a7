"""Evidence items, candidate components, and the invalidation matrix between them.

This module is the one place the matrix lives: `tica candidate diff`, the ledger's
invalidation rows, the Dagster asset dependencies and the sensor all read it.
"""

from __future__ import annotations

from enum import Enum


class EvidenceItem(str, Enum):
    """One evidence item per asset; one artifact answers one question (docs/practice.md)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    UPDATE = "update"
    QUALITY = "quality"
    THROUGHPUT = "throughput"
    CLEAN_EXIT = "clean_exit"
    ARTIFACTS = "artifacts"


class Component(str, Enum):
    """A separately fingerprinted part of a candidate."""

    WEIGHTS = "weights"
    IMAGE = "image"
    SOURCE = "source"
    HARDWARE = "hardware"
    RUNNER = "runner"
    PRECISION = "precision"
    BACKENDS = "backends"
    GRAPH_CACHE = "graph_cache"
    RECIPE = "recipe"
    EVAL_CONTRACT = "eval_contract"
    WORKLOAD = "workload"


E = EvidenceItem
ALL_ITEMS: tuple[EvidenceItem, ...] = tuple(EvidenceItem)
NUMERICS: tuple[EvidenceItem, ...] = (E.FORWARD, E.BACKWARD, E.UPDATE)

# component -> (evidence it voids, why). Order of items follows EvidenceItem.
INVALIDATION_MATRIX: dict[Component, tuple[tuple[EvidenceItem, ...], str]] = {
    Component.WEIGHTS: (
        ALL_ITEMS,
        "new checkpoint content: every logprob, score, timing and artifact was produced from other bytes",
    ),
    Component.IMAGE: (
        ALL_ITEMS,
        "new image digest: kernels, libraries and the serving stack may all differ",
    ),
    Component.SOURCE: (
        ALL_ITEMS,
        "new source/overlay: the code that computes and serves the model changed",
    ),
    Component.HARDWARE: (
        ALL_ITEMS,
        "new hardware or nodes: kernel selection, numerics and speed are hardware facts",
    ),
    Component.RUNNER: (
        ALL_ITEMS,
        "new runner or parallelism: TP/PP/EP change reduction order, speed and the processes that must exit",
    ),
    Component.RECIPE: (
        ALL_ITEMS,
        "new resolved recipe command: what runs in each arm changed",
    ),
    Component.PRECISION: (
        (*NUMERICS, E.QUALITY, E.THROUGHPUT, E.CLEAN_EXIT, E.ARTIFACTS),
        "new weight/KV precision: quantization dispatch changes numerics, quality and speed",
    ),
    Component.BACKENDS: (
        (*NUMERICS, E.QUALITY, E.THROUGHPUT, E.CLEAN_EXIT, E.ARTIFACTS),
        "new attention/GEMM/MoE/all-to-all backend: numerics, quality and speed come from other kernels",
    ),
    Component.GRAPH_CACHE: (
        (E.FORWARD, E.UPDATE, E.QUALITY, E.THROUGHPUT, E.CLEAN_EXIT, E.ARTIFACTS),
        "new CUDA-graph/cache config: rollout numerics (prefix caching, chunked prefill, graphs) and speed change; "
        "the trainer's backward does not read it",
    ),
    Component.EVAL_CONTRACT: (
        (E.QUALITY, E.CLEAN_EXIT, E.ARTIFACTS),
        "new evaluation contract or scorer: a score under another contract is not the same score; the quality "
        "legs must be rerun, and their servers' exits checked again",
    ),
    Component.WORKLOAD: (
        (E.THROUGHPUT, E.CLEAN_EXIT, E.ARTIFACTS),
        "new throughput workload: fixed-length legs must be rerun, and their servers' exits checked again",
    ),
}


# Evidence that judges the legs of other items as well as its own: clean exit reads the exits of
# every leg that starts vLLM processes (client, API server, EngineCore; a backward leg runs the
# trainer alone and starts none), the final artifacts name every sealed receipt (clean exit's
# included). A covering verdict stands only while it judged every leg, with the same digest, of
# the current verdict of each item it covers (`tica.acceptance.report`).
LEG_ITEMS: tuple[EvidenceItem, ...] = (E.FORWARD, E.BACKWARD, E.UPDATE, E.QUALITY, E.THROUGHPUT)
COVERS: dict[EvidenceItem, tuple[EvidenceItem, ...]] = {
    E.CLEAN_EXIT: tuple(i for i in LEG_ITEMS if i is not E.BACKWARD),
    E.ARTIFACTS: (*LEG_ITEMS, E.CLEAN_EXIT),
}


def invalidated_by(component: Component) -> tuple[EvidenceItem, ...]:
    return INVALIDATION_MATRIX[component][0]


def reason(component: Component) -> str:
    return INVALIDATION_MATRIX[component][1]


def sensitive_components(item: EvidenceItem) -> tuple[Component, ...]:
    """The components an evidence item depends on: the inverse of the matrix."""
    return tuple(c for c, (items, _) in INVALIDATION_MATRIX.items() if item in items)
