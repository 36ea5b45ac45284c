"""Dynamic grids: grid sizes that are traced int32 scalars (computed inside ``jit``).

The sizes are operands of ``pallas_call_p`` (before all others); the interpreter runs
the grid to its run-time trip count, point by point, with ``program_id``,
``num_programs`` and index maps meaning what they mean for a static grid.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl

SDS = jax.ShapeDtypeStruct
SHAPE = (8, 128)


def _count_programs(y_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        y_ref[...] = jnp.zeros_like(y_ref)

    y_ref[...] += 1


def _counting_call(grid):
    return pl.pallas_call(_count_programs, SDS(SHAPE, jnp.float32), grid=grid,
                          out_specs=pl.BlockSpec(SHAPE, lambda *_: (0, 0)), interpret=True)


def test_a_traced_grid_size_runs_that_many_programs():
    f = jax.jit(lambda steps: _counting_call((steps * 2,))())
    np.testing.assert_array_equal(f(jnp.int32(4)), np.full(SHAPE, 8.0))
    np.testing.assert_array_equal(f(jnp.int32(3)), np.full(SHAPE, 6.0))


def test_static_and_dynamic_axes_mix_in_lexicographic_order():
    def kernel(y_ref):
        first = (pl.program_id(0) == 0) & (pl.program_id(1) == 0) & (pl.program_id(2) == 0)

        @pl.when(first)
        def _():
            y_ref[...] = jnp.zeros_like(y_ref)

        # the running count times 1000 plus the point, so order matters
        y_ref[0, 0] += 1
        y_ref[0, 1] = (pl.program_id(0) * 100 + pl.program_id(1) * 10
                       + pl.program_id(2)).astype(jnp.float32)

    @jax.jit
    def f(steps):
        return pl.pallas_call(kernel, SDS(SHAPE, jnp.float32), grid=(steps * 2, steps + 1, 3),
                              out_specs=pl.BlockSpec(SHAPE, lambda *_: (0, 0)),
                              interpret=True)()

    out = f(jnp.int32(4))
    assert out[0, 0] == 8 * 5 * 3
    assert out[0, 1] == 7 * 100 + 4 * 10 + 2  # the last point ran last


def test_num_programs_is_a_python_int_for_static_axes_and_traced_for_dynamic_ones():
    seen = {}

    def kernel(o_ref):
        seen["static"] = pl.num_programs(0)
        seen["dynamic"] = pl.num_programs(1)
        o_ref[0, 0] = pl.num_programs(1)

    @jax.jit
    def f(n):
        return pl.pallas_call(kernel, SDS((1, 1), jnp.int32), grid=(2, n), interpret=True)()

    assert f(np.int32(5))[0, 0] == 5
    assert seen["static"] == 2 and isinstance(seen["static"], int)
    assert isinstance(seen["dynamic"], jax.Array)


def test_index_maps_read_the_dynamic_num_programs():
    @jax.jit
    def f(steps, x):
        return pl.pallas_call(
            lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
            SDS(SHAPE, jnp.int32), grid=(steps * 2,),
            in_specs=[pl.BlockSpec(SHAPE, lambda i: (1 + 8 - pl.num_programs(0), 0))],
            out_specs=pl.BlockSpec(SHAPE, lambda i: (0, 0)), interpret=True)(x)

    x = np.arange(32 * 128, dtype=np.int32).reshape(32, 128)
    np.testing.assert_array_equal(f(np.int32(4), x), x[8:16])


def test_an_empty_dynamic_grid_writes_nothing():
    """Zero programs: the aliased output keeps its input, no block is written back."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 0

    @jax.jit
    def f(n, x):
        spec = pl.BlockSpec(SHAPE, lambda i: (i, 0))
        return pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(n,), in_specs=[spec],
                              out_specs=spec, input_output_aliases={0: 0},
                              interpret=True)(x)

    x = jnp.ones((16, 128))
    np.testing.assert_array_equal(f(jnp.int32(0), x), x)
    np.testing.assert_array_equal(f(jnp.int32(1), x)[:8], 0 * x[:8])
    np.testing.assert_array_equal(f(jnp.int32(1), x)[8:], x[8:])


def test_dynamic_grid_with_scalar_prefetch_and_scratch():
    def kernel(idx_ref, x_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += x_ref[...]
        o_ref[...] = acc_ref[...] + idx_ref[0].astype(jnp.float32)

    @jax.jit
    def f(n, idx, x):
        return pl.pallas_call(
            kernel, SDS(SHAPE, jnp.float32),
            grid_spec=pl.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(n,),
                in_specs=[pl.BlockSpec(SHAPE, lambda i, idx: (idx[i], 0))],
                out_specs=pl.BlockSpec(SHAPE, lambda i, idx: (0, 0)),
                scratch_shapes=[pl.ANY(SHAPE, jnp.float32)]),
            interpret=True)(idx, x)

    x = jnp.arange(4 * 8 * 128.0).reshape(32, 128)
    idx = jnp.asarray([3, 1, 0, 2], jnp.int32)
    want = x[24:32] + x[8:16] + 3
    np.testing.assert_array_equal(f(jnp.int32(2), idx, x), want)


def test_vmap_of_an_operand_keeps_the_dynamic_size_unbatched():
    def kernel(x_ref, y_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            y_ref[...] = x_ref[...]

        y_ref[...] += 1.0

    def f(x, steps):
        spec = pl.BlockSpec(SHAPE, lambda i: (0, 0))
        return pl.pallas_call(kernel, SDS(SHAPE, jnp.float32), grid=(steps * 2,),
                              in_specs=[spec], out_specs=spec, interpret=True)(x)

    x = jnp.arange(4 * 8 * 128.0).reshape(4, *SHAPE)
    out = jax.jit(jax.vmap(f, in_axes=(0, None)))(x, jnp.int32(4))
    np.testing.assert_array_equal(out, x + 8)
    jaxpr = jax.make_jaxpr(jax.vmap(f, in_axes=(0, None)))(x, jnp.int32(4))
    (eqn,) = [e for e in jaxpr.jaxpr.eqns if e.primitive is pl.pallas_call_p]
    assert len(eqn.params["grid_mapping"].grid) == 2  # one call, a batch axis added


def test_vmap_of_the_grid_size_runs_one_call_per_element():
    f = jax.jit(jax.vmap(lambda steps: _counting_call((steps * 2,))()))
    out = f(jnp.asarray([4, 8, 1], jnp.int32))
    np.testing.assert_array_equal(out[:, 0, 0], [8.0, 16.0, 2.0])


def test_a_traced_grid_size_may_be_an_array_of_one_integer():
    f = jax.jit(lambda steps: _counting_call((steps,))())
    np.testing.assert_array_equal(f(jnp.asarray([5], jnp.int32)), np.full(SHAPE, 5.0))


def test_a_traced_grid_size_must_be_an_integer_scalar():
    with pytest.raises(TypeError, match=r"grid\[0\] is a traced value of type float32\[\]"):
        jax.jit(lambda s: _counting_call((s,))())(jnp.float32(2))
    with pytest.raises(TypeError, match=r"grid\[1\] is a traced value of type int32\[2\]"):
        jax.jit(lambda s: _counting_call((2, s))())(jnp.arange(2, dtype=jnp.int32))


def test_differentiating_a_dynamic_grid_call_is_a_clear_error():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def f(x, n):
        spec = pl.BlockSpec(SHAPE, lambda i: (i, 0))
        return pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(n,), in_specs=[spec],
                              out_specs=spec, interpret=True)(x).sum()

    x = jnp.ones((16, 128))
    with pytest.raises(NotImplementedError, match=r"with a dynamic grid .* not supported"):
        jax.jit(jax.grad(f))(x, jnp.int32(2))


def test_a_named_grid_with_a_dynamic_size_is_a_clear_error():
    with pytest.raises(NotImplementedError, match=r"named grid with dynamic sizes"):
        jax.jit(lambda n: _counting_call((("i", n),))())(jnp.int32(2))


def test_the_interpret_backend_runs_a_dynamic_grid_without_interpret_true():
    f = jax.jit(lambda steps: pl.pallas_call(
        _count_programs, SDS(SHAPE, jnp.float32), grid=(steps,),
        out_specs=pl.BlockSpec(SHAPE, lambda i: (0, 0)), backend="interpret")())
    np.testing.assert_array_equal(f(jnp.int32(5)), np.full(SHAPE, 5.0))
