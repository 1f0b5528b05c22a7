"""Two leg assets with no dependency between them, run by Dagster's multiprocess executor (each
step its own process, as `dagster dev` runs them): what two legs contending for the GPU pool look
like. The steps rebuild this job from `TICA_GPU_TEST` (JSON: project root, runner config), so it
is loaded through `reconstructable(gpu_job)`."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dagster import Definitions, MaterializeResult, MetadataValue, asset, multiprocess_executor

from resources import LegRequest, LocalGpuLegRunner
from tica.evidence import EvidenceItem
from tica.manifest import load_manifest
from tica.question import load_question

ENV = "TICA_GPU_TEST"


def request_for(root: Path, item: EvidenceItem, name: str) -> LegRequest:
    manifest = load_manifest(root / "candidates" / "demo.yaml")
    question = load_question(root / "questions" / f"{item.value}.yaml")
    return LegRequest(track="demo", item=item, question=question, manifest=manifest, candidate_id="gpu-test",
                      out_dir=root / "gpu_legs" / name)


def leg_asset(name: str, item: EvidenceItem):
    @asset(name=name, required_resource_keys={"gpu"})
    def _leg(context) -> MaterializeResult:
        root = Path(json.loads(os.environ[ENV])["root"])
        legs = context.resources.gpu.run_legs(context, request_for(root, item, name))
        return MaterializeResult(metadata={"leg_dirs": MetadataValue.json([str(p) for p in legs])})

    return _leg


def gpu_defs() -> Definitions:
    config = json.loads(os.environ[ENV])
    return Definitions(
        assets=[leg_asset("leg_a", EvidenceItem.BACKWARD), leg_asset("leg_b", EvidenceItem.BACKWARD)],
        resources={"gpu": LocalGpuLegRunner(**config["runner"])},
        executor=multiprocess_executor.configured({"max_concurrent": 2}),
    )


def gpu_job():
    from dagster import define_asset_job

    defs = Definitions.merge(gpu_defs(), Definitions(jobs=[define_asset_job("legs", selection=["leg_a", "leg_b"])]))
    return defs.resolve_job_def("legs")
