"""A leg records the logprob op its trainer ran, read from the kernel set (VllmKernels.logprob),
never a fixed string: the MoE trainer runs the V1 sampler's op, the dense trainer the V2 runner's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tica.legs.vllm_kernels.matrix import LOGPROB_OPS, kernels_describe


@pytest.mark.parametrize("setting", sorted(LOGPROB_OPS))
def test_the_recorded_logprob_op_is_the_one_the_kernels_run(setting):
    assert kernels_describe(SimpleNamespace(name="k", logprob=setting))["logprob"] == LOGPROB_OPS[setting]


def test_kernels_that_do_not_say_record_it_as_unknown():
    """The control: nothing is assumed for a kernel set that names no logprob op."""
    assert kernels_describe(SimpleNamespace(name="k"))["logprob"] == "unknown"
    assert LOGPROB_OPS["v1_sampler"] != LOGPROB_OPS["v2_runner"]
