"""What the FP8 replays (tests/test_h200_matrix_fp8.py; block FP8: tests/test_h200_matrix_fp8b.py, DeepGEMM,
tests/test_h200_matrix_fp8bc.py, Cutlass) read alike: the one kernel a sealed leg records, the check that
an edited kernel is refused, and the check that one changed logprob never passes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tica.canaries import edit_meta, perturb_arrays
from tica.items.forward.judge import judge_forward
from tica.judges.matrix import matrix_cells
from tica.receipts import read_receipt
from tica.seal import check_seal
from tica.verdict import Verdict

DEEPGEMM = "DeepGemmFp8BlockScaledMMKernel"
CUTLASS = "CutlassFp8BlockScaledMMKernel"


def config(leg: Path) -> dict:
    return read_receipt(leg / "leg.json")["resolved_config"]


def served_kernel(leg: Path) -> str:
    """The one block-FP8 kernel a leg records vLLM serving every linear with and the trainer calling,
    refused (ValueError) where the receipt's seal is broken or its records disagree."""
    if problems := check_seal(leg):
        raise ValueError(f"{leg.name}: seal broken: {problems[0]}")
    meta = read_receipt(leg / "leg.json")
    fp8 = meta["resolved_config"]["fp8"]
    vllm = {key.split("/")[1] for key in fp8["vllm"]["linear_kernels"]}
    named = {"vllm's linears": vllm, "vllm's block plan": {fp8["vllm"]["block"]["plan"]["kernel"]},
             "the trainer": {fp8["trainer"]["kernel"]}, "the trainer's plan": {fp8["trainer"]["ops"]["plan"]["kernel"]},
             "the leg's kernels": {meta["kernels"]["trainer"]["linear_fp8"]["kernel"]}}
    if len(set().union(*named.values())) != 1 or any(len(v) != 1 for v in named.values()):
        raise ValueError(f"{leg.name}: the recorded kernels disagree: {named}")
    (kernel,) = vllm
    return kernel


def kernel_edit_is_refused(question, src: Path, run_dir: Path, served: str, other: str, reseal: bool) -> None:
    """One sealed passing leg copied to run_dir with vLLM's linears relabelled `other`: resealed, the
    records disagree and the judge, which reads logprobs, still passes it; unsealed, the seal is broken
    and the cell is not judged."""
    assert served_kernel(src) == served and judge_forward(question, [src]).verdict is Verdict.PASS  # control
    leg = shutil.copytree(src, run_dir / src.name)

    def relabel(meta: dict) -> None:
        kernels = meta["resolved_config"]["fp8"]["vllm"]["linear_kernels"]
        kernels[f"Fp8LinearMethod/{other}/out torch.bfloat16"] = kernels.pop(f"Fp8LinearMethod/{served}/out torch.bfloat16")

    if reseal:
        edit_meta(leg, relabel)
        assert check_seal(leg) == []
        with pytest.raises(ValueError, match="the recorded kernels disagree"):
            served_kernel(leg)
        (c,) = matrix_cells(question, run_dir.parent)
        assert c.verdict is Verdict.PASS
    else:
        meta = json.loads((leg / "leg.json").read_text())
        relabel(meta)
        (leg / "leg.json").write_text(json.dumps(meta, indent=1))
        with pytest.raises(ValueError, match="seal broken"):
            served_kernel(leg)
        (c,) = matrix_cells(question, run_dir.parent)
        assert c.verdict is Verdict.INCONCLUSIVE and c.cause == "not judged: inconclusive"


def one_logprob_changed_never_passes(question, src: Path, run_dir: Path, reseal: bool) -> None:
    """One sealed passing leg copied to run_dir with one trainer logprob one ulp off: resealed, the
    cell fails on that one token; unsealed, it is not judged; never a pass."""
    assert judge_forward(question, [src]).verdict is Verdict.PASS  # control
    leg = shutil.copytree(src, run_dir / src.name)
    if reseal:
        perturb_arrays(leg, 1)  # one rollout logprob one ulp off, metrics recomputed, resealed
        assert check_seal(leg) == []
    else:
        p = leg / "arrays" / "step_0001.npz"
        with np.load(p) as z:
            data = {k: z[k] for k in z.files}
        data["trainer_logprobs"][4] = np.nextafter(data["trainer_logprobs"][4], np.float32(0))
        np.savez_compressed(p, **data)
        assert check_seal(leg) != []
    (c,) = matrix_cells(question, run_dir.parent)
    assert c.verdict is not Verdict.PASS and c.cause is not None
    if reseal:
        assert c.verdict is Verdict.FAIL and c.n_diff == 1


def update_record_removed_is_not_judged_after_the_update(question, src: Path, run_dir: Path) -> None:
    """A post-update leg resealed without its update record is inconclusive; as it came back, it passes."""
    leg = shutil.copytree(src, run_dir / src.name)
    edit_meta(leg, lambda meta: meta["resolved_config"].pop("update"))  # resealed: only the judge can tell
    (c,) = matrix_cells(question, run_dir.parent)
    assert c.verdict is Verdict.INCONCLUSIVE
    assert f"is named for scored '{src.name.rsplit('-', 1)[1]}' but recorded running scored 'decode'" in c.reasons[0]
    shutil.rmtree(run_dir)  # control: the same leg as it came back passes as a cell scored after the update
    shutil.copytree(src, run_dir / src.name)
    (c,) = matrix_cells(question, run_dir.parent)
    assert (c.verdict, c.scored) == (Verdict.PASS, "decode_post_update")
