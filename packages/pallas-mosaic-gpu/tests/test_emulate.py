"""The emulate level executes the Mosaic GPU module the lowering generates: a fault planted
in the lowering shows up as wrong numbers there, and what the executor cannot run is
reported unsupported, never passed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
import pallas.plugins
from pallas_mosaic_gpu._src.backend import params
from pallas_mosaic_gpu._src.executor import OPS, EmulationUnsupported, run_kernel
from pallas_mosaic_gpu._src.lowering import RULES, build

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")
levels = pytest.importorskip("pallas_conformance.levels")
catalogue = pytest.importorskip("pallas_conformance.catalogue")

F32 = jnp.float32


def _emulate(case_name: str):
    backend = pallas.plugins.get_backend("mosaic_gpu")
    return levels.CaseRunner(backend).run(catalogue.get_case(case_name), "emulate")


def _kernel(body, out_shape, *args, **kw):
    """The built Mosaic GPU kernel of ``pallas_call(body, ...)(*args)``."""
    f = pl.pallas_call(body, out_shape=out_shape, backend="mosaic_gpu", **kw)
    (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    return build(req.jaxpr, req.grid_mapping, params(req.compiler_params), "k")


def test_mosaic_gpu_provides_the_emulate_level():
    assert "emulate" in pallas.plugins.get_backend("mosaic_gpu").levels


def test_an_elementwise_case_passes_at_emulate():
    r = _emulate("elementwise/sub_f32")
    assert r.status == "pass", r.detail


def test_a_subtract_lowered_as_an_add_fails_at_emulate():
    with RULES.overridden(lax.sub_p, lambda rule: RULES[lax.add_p]):
        r = _emulate("elementwise/sub_f32")
    assert r.status == "fail"
    assert "differ" in r.detail


_GPU_RUNNER = {}


def _emulate_gpu_case(case_name: str):
    """A GPU case at emulate; one runner, so GPU interpret mode's expected numbers are
    computed once per case."""
    if "runner" not in _GPU_RUNNER:
        _GPU_RUNNER["runner"] = levels.CaseRunner(pallas.plugins.get_backend("mosaic_gpu"))
    return _GPU_RUNNER["runner"].run(catalogue.get_case(case_name), "emulate")


def test_a_subtract_lowered_as_an_add_fails_a_tma_pipeline_case_at_emulate():
    # (without the fault the case passes at emulate: conformance/tests/test_catalogue.py)
    with RULES.overridden(lax.sub_p, lambda rule: RULES[lax.add_p]):
        r = _emulate_gpu_case("gpu/tma_emit_pipeline_sub")
    assert r.status == "fail"
    assert "differ" in r.detail


def test_a_wgmma_issued_twice_fails_the_wgmma_case_at_emulate():
    from pallas_mosaic_gpu._src.primitives.mma import wgmma_p

    def twice(rule):
        def faulty(lctx, eqn, *ops):
            rule(lctx, eqn, *ops)
            return rule(lctx, eqn, *ops)

        return faulty

    with RULES.overridden(wgmma_p, twice):
        r = _emulate_gpu_case("gpu/wgmma_matmul_f16_swizzle128")
    assert r.status == "fail"
    assert "differ" in r.detail


def test_a_blocked_kernel_runs_every_cuda_block_through_tma():
    def body(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.exp(x_ref[...]) - y_ref[...] * 2.0

    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((32, 128), np.float32) for _ in range(2))
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    k = _kernel(body, jax.ShapeDtypeStruct((32, 128), F32), x, y, grid=(4,),
                in_specs=[spec, spec], out_specs=spec)
    assert k.cuda_grid == (4, 1, 1)
    (out,) = run_kernel(k, [x, y])
    np.testing.assert_allclose(out, np.exp(x) - 2 * y, rtol=1e-6)


def test_a_reduction_axis_runs_as_a_loop_revisiting_the_output_block():
    def body(x_ref, o_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...]

    x = np.arange(16 * 512, dtype=np.float32).reshape(16, 512)
    k = _kernel(body, jax.ShapeDtypeStruct((16, 128), F32), x, grid=(2, 4),
                in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
                out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, 0)))
    assert k.sequential_axes == (1,)
    (out,) = run_kernel(k, [x])
    np.testing.assert_array_equal(out, x.reshape(16, 4, 128).sum(1))


def test_an_axis_the_output_index_map_computes_with_but_drops_stays_sequential():
    """An index map remapped onto a reversed grid (the state sweep of a carried-state
    backward pass) computes ``n - 1 - k`` for every axis, used or not. The dead use of
    ``k`` must not make it a parallel axis: the revisited output block (and scratch
    carried between the steps) would then live in separate CUDA blocks, never
    initialised (NaN at emulate, wrong numbers on a GPU)."""
    def body(x_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] = acc_ref[...] * 0.5 + x_ref[...]
        o_ref[...] = acc_ref[...]

    def out_map(i, j):
        _ = 3 - j  # computed and dropped: the block index does not depend on j
        return i, 0

    x = np.random.default_rng(0).standard_normal((16, 512)).astype(np.float32)
    k = _kernel(body, jax.ShapeDtypeStruct((16, 128), F32), x, grid=(2, 4),
                in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
                out_specs=pl.BlockSpec((8, 128), out_map),
                scratch_shapes=[pl.ANY((8, 128), F32)])
    assert k.sequential_axes == (1,) and k.cuda_grid == (2, 1, 1)
    (out,) = run_kernel(k, [x])
    want = np.zeros((16, 128), np.float32)
    for j in range(4):
        want = want * 0.5 + x[:, j * 128:(j + 1) * 128]
    np.testing.assert_allclose(out, want, rtol=1e-6)


def _without_exp():
    """The executor's rule table with no rule for ``math.exp``."""
    return OPS.overridden("math.exp", lambda rule: None)


def test_an_op_the_executor_does_not_know_is_unsupported_naming_it():
    with _without_exp(), pytest.raises(EmulationUnsupported, match="math.exp"):
        def body(x_ref, o_ref):
            o_ref[...] = jnp.exp(x_ref[...])

        x = np.zeros((8, 128), np.float32)
        run_kernel(_kernel(body, jax.ShapeDtypeStruct((8, 128), F32), x), [x])


def test_the_conformance_suite_reports_an_unknown_op_unsupported_not_failed():
    with _without_exp():
        r = _emulate("elementwise/exp_f32")
    assert r.status == "unsupported"
    assert "math.exp" in r.detail


def test_unsupported_at_emulate_is_the_core_level_unsupported_error():
    assert issubclass(EmulationUnsupported, pallas.plugins.LevelUnsupportedError)
