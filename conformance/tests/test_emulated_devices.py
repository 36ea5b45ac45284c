"""A sample of the catalogue under every emulated device: the case as written (a plain
``pallas_call``, no ``backend=``) runs as on that device and matches the interpreter.

Sampled for CI (the emulated path compiles each kernel with the real compiler and runs
it under the backend's executor); ``PALLAS_CONFORMANCE_FULL=1`` widens the sample. The
whole catalogue runs at the ``emulate`` level per backend (``pallas-conformance``)."""

from __future__ import annotations

import os

import jax
import pytest

import pallas as pl
import pallas.plugins
from pallas_conformance.catalogue import get_case
from pallas_conformance.levels import bound, claimed_tags, compare, unclaimed

# Per device: cases whose tags the backend chosen there claims.
SAMPLE = {
    "tpu:v5e": ("broadcasting/row_vector_f32", "control_flow/fori_loop_static",
                "dot/f32_to_f32"),
    "tpu:v6e": ("control_flow/cond",),
    "cuda:sm_80": ("broadcasting/column_vector_f32", "control_flow/when_program_id"),
    "cuda:sm_90a": ("broadcasting/iota_i32",),
}
FULL = {
    "tpu:v4": ("dot/f32_to_f32_tB",), "tpu:v5p": ("control_flow/scan",),
    "tpu:7x": ("control_flow/switch",), "cuda:sm_100a": ("broadcasting/transpose_f32",),
    "rocm:gfx942": ("elementwise/cbrt_f32", "dot/accumulate_over_grid_into_output_f32"),
}
if os.environ.get("PALLAS_CONFORMANCE_FULL") == "1":
    SAMPLE = {**SAMPLE, **FULL}

PARAMS = [(d, c) for d, cases in SAMPLE.items() for c in cases]


@pytest.mark.parametrize(("device", "name"), PARAMS, ids=[f"{d}-{c}" for d, c in PARAMS])
def test_case_on_emulated_device(device, name):
    from pallas.plugins import emulated_backend as backend_for

    case = get_case(name)
    args = case.make_inputs()
    want = jax.jit(bound(case, interpret=True))(*args)
    with pl.emulate_device(device) as dev:
        try:
            b = backend_for(dev, None, None)
        except pallas.plugins.BackendNotFoundError as e:
            pytest.skip(str(e))
        if unclaimed(case, claimed_tags(b)):
            pytest.skip(f"{b.name} does not claim {case.tags}")
        if device.startswith("cuda") and not _can_lower_cuda():
            pytest.skip("lowering for cuda needs jax-cuda13-plugin")
        got = jax.jit(bound(case))(*args)
    compare(case, got, want, "interpreter")
    ran = [k for k in pallas.plugins.emulated_kernels() if k.device is dev]
    assert ran and ran[-1].backend == b.name


def _can_lower_cuda() -> bool:
    import importlib.util

    return importlib.util.find_spec("jax_plugins.xla_cuda13") is not None
