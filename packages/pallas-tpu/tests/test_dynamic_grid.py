"""Dynamic grids on Mosaic TPU: grid sizes known only at run time.

As upstream emits them: the dynamic sizes are MLIR's dynamic size in ``@main``'s
``iteration_bounds``, the ``tpu_custom_call`` takes their values as i32 operands before
all others, and ``num_programs`` of a dynamic axis reads ``tpu.iteration_bound``. The
executor runs the emitted module with those operands (the ``emulate`` level).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import pallas as pl
import pallas_tpu as pltpu
from pallas.plugins import KernelRequest, get_backend

SDS = jax.ShapeDtypeStruct
DYN = -(2**63)


def _sum_first(n, x, aliases=None):
    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...] * pl.num_programs(1).astype(jnp.float32)

    return pl.pallas_call(
        kernel, SDS((8, 128), jnp.float32), grid=(1, n),
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (j, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        backend="mosaic_tpu")(x)


def _main(module):
    for op in module.body.operations:
        if op.operation.name == "func.func" and str(op.attributes["sym_name"]) == '"main"':
            return op
    raise AssertionError("no @main")


def test_dynamic_sizes_are_dynamic_iteration_bounds_and_leading_custom_call_operands(
        lower_tpu, ops):
    x = jnp.zeros((48, 128), jnp.float32)
    lowered, (m,) = lower_tpu(_sum_first, jnp.int32(3), x)
    assert str(_main(m).attributes["iteration_bounds"]) == f"array<i64: 1, {DYN}>"
    assert "tpu.iteration_bound" in ops(m)  # num_programs(1)
    call = re.search(r"tpu_custom_call\(([^)]*)\).*: \(([^)]*)\)", lowered.as_text())
    assert call.group(2).split(", ")[:2] == ["tensor<i32>", "tensor<48x128xf32>"]


def test_the_emitted_module_runs_to_the_run_time_trip_count():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(48, 128)), jnp.float32)
    closed = jax.make_jaxpr(_sum_first)(jnp.int32(3), x)
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive is pl.pallas_call_p]
    b = get_backend("mosaic_tpu")
    request = KernelRequest.from_params(eqn.params, pltpu.CompilerParams(
        dimension_semantics=("parallel", "arbitrary")))
    for n in (1, 3, 6):
        (got,) = b.emulate(request, jnp.int32(n), x)
        want = x[: 8 * n].reshape(n, 8, 128).sum(0) * n
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_aliases_count_the_dynamic_size_operands(lower_tpu):
    def f(n, x):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1),
                              SDS(x.shape, x.dtype), grid=(n,), in_specs=[spec],
                              out_specs=spec, input_output_aliases={0: 0},
                              backend="mosaic_tpu")(x)

    lowered, _ = lower_tpu(f, jnp.int32(2), jnp.zeros((16, 128), jnp.float32))
    assert "output_operand_alias<output_tuple_indices = [], operand_index = 1" in \
        lowered.as_text()


def test_a_symbolic_grid_exports_for_tpu(export_tpu):
    """Shape polymorphism: the grid ``cdiv(w, 8)`` is a dynamic size computed from ``w``."""
    def f(x):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                              SDS(x.shape, x.dtype), grid=(pl.cdiv(x.shape[0], 8),),
                              in_specs=[spec], out_specs=spec)(x)

    (w,) = export.symbolic_shape("w")
    exp = export_tpu(f, SDS((w, 128), jnp.float32))
    assert re.search(r"tpu_custom_call\(.*: \(tensor<i32>, tensor<\?x128xf32>",
                     exp.mlir_module())


def test_emit_pipeline_runs_a_grid_sized_by_a_value_read_in_the_kernel():
    def body(x, o):
        o[...] = x[...] * 2.0

    def kernel(n_ref, x_hbm, o_hbm):
        pltpu.emit_pipeline(body, grid=(n_ref[0],),
                            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                            out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))])(x_hbm, o_hbm)

    def f(n, x):
        return pl.pallas_call(
            kernel, SDS(x.shape, x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec(memory_space=pl.ANY)),
            input_output_aliases={1: 0})(n, x)

    x = jnp.arange(32 * 128.0).reshape(32, 128)
    out = jax.jit(f)(jnp.asarray([3], jnp.int32), x)
    np.testing.assert_array_equal(out[:24], x[:24] * 2)
    np.testing.assert_array_equal(out[24:], x[24:])  # the fourth block is not visited


def test_tpu_interpret_mode_runs_a_dynamic_arbitrary_axis_after_a_static_parallel_one():
    """The dynamic size reaches the simulated TPU with the operands; the static parallel
    axis is still visited in a seeded random order, split across the cores."""
    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...] * (pl.program_id(0) + pl.num_programs(1)).astype(
            jnp.float32)

    @jax.jit
    def f(n, x):
        return pl.pallas_call(
            kernel, SDS((16, 128), x.dtype), grid=(2, n),
            in_specs=[pl.BlockSpec((8, 128), lambda i, j: (j, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, 0)),
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "arbitrary")),
            interpret=pltpu.InterpretParams(random_seed=3, num_cores_or_threads=2))(x)

    x = jnp.ones((32, 128))
    out = f(jnp.int32(3), x)  # rows 0..23 of x summed, times (i + 3), per output block i
    np.testing.assert_array_equal(out[:8], np.full((8, 128), 3.0 * 3))
    np.testing.assert_array_equal(out[8:], np.full((8, 128), 3.0 * 4))


def test_tpu_interpret_mode_refuses_a_dynamic_size_on_a_parallel_axis():
    """As upstream: a parallel axis is visited in an order drawn at trace time, so its
    size must be static. JAX's ConcretizationTypeError names the axis and the way out."""
    def kernel(o_ref):
        o_ref[0] = 42.0

    @jax.jit
    def f(n):
        return pl.pallas_call(
            kernel, SDS((1,), jnp.float32), grid=(n,), in_specs=[],
            out_specs=pl.BlockSpec((1,), lambda _: (0,)),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
            interpret=pltpu.InterpretParams())()

    with pytest.raises(jax.errors.ConcretizationTypeError,
                       match=r"(?s)grid dimension 0 of pallas_call .*parallel semantics.*"
                             r"'arbitrary'"):
        f(jnp.int32(3))
