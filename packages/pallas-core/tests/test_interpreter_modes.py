"""The vectorised interpreter gives exactly the point-by-point results.

Each kernel runs twice: as the interpreter chooses (lanes where provably safe) and with
``pl.InterpretParams(vectorize=False)`` (every grid point in order). Results must be
identical, and both must match a plain-JAX reference.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl

SEQUENTIAL = pl.InterpretParams(vectorize=False)


def both(make):
    fast = make(True)
    slow = make(SEQUENTIAL)
    return fast, slow


def _matmul(interpret, m=64, n=64, k=64, bm=16, bn=32, bk=16):
    def kernel(x_ref, y_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        interpret=interpret,
    )


def test_tiled_matmul_accumulating_over_k():
    x = jax.random.normal(jax.random.key(0), (64, 64))
    y = jax.random.normal(jax.random.key(1), (64, 64))
    fast, slow = both(_matmul)
    np.testing.assert_array_equal(fast(x, y), slow(x, y))
    np.testing.assert_allclose(fast(x, y), x @ y, rtol=1e-4, atol=1e-4)


def test_scratch_carried_across_the_whole_grid_is_not_vectorised():
    # A running sum over blocks: scratch flows from each grid point into the next.
    def make(interpret):
        def kernel(x_ref, o_ref, acc_ref):
            @pl.when(pl.program_id(0) == 0)
            def _():
                acc_ref[...] = jnp.zeros_like(acc_ref)

            acc_ref[...] += jnp.sum(x_ref[...])
            o_ref[...] = jnp.broadcast_to(acc_ref[...], o_ref.shape)

        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((32,), jnp.float32),
            grid=(4,),
            in_specs=[pl.BlockSpec((8,), lambda i: (i,))],
            out_specs=pl.BlockSpec((8,), lambda i: (i,)),
            scratch_shapes=[pl.ANY((1,), jnp.float32)],
            interpret=interpret,
        )

    x = jnp.arange(32, dtype=jnp.float32)
    fast, slow = both(make)
    expected = np.repeat(np.cumsum(np.asarray(x).reshape(4, 8).sum(1)), 8)
    np.testing.assert_array_equal(fast(x), expected)
    np.testing.assert_array_equal(slow(x), expected)


def test_scratch_initialised_per_lane_is_vectorised_and_exact():
    def make(interpret):
        def kernel(x_ref, o_ref, acc_ref):
            @pl.when(pl.program_id(1) == 0)
            def _():
                acc_ref[...] = jnp.zeros_like(acc_ref)

            acc_ref[...] += x_ref[...]

            @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
            def _():
                o_ref[...] = acc_ref[...]

        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((16, 8), jnp.float32),
            grid=(2, 4),
            in_specs=[pl.BlockSpec((8, 8), lambda i, k: (i, k))],
            out_specs=pl.BlockSpec((8, 8), lambda i, k: (i, 0)),
            scratch_shapes=[pl.ANY((8, 8), jnp.float32)],
            interpret=interpret,
        )

    x = jax.random.normal(jax.random.key(2), (16, 32))
    fast, slow = both(make)
    expected = x.reshape(16, 4, 8).sum(1)
    np.testing.assert_array_equal(fast(x), slow(x))
    np.testing.assert_allclose(fast(x), expected, rtol=1e-5, atol=1e-5)


def test_revisited_output_blocks_accumulate_in_grid_order():
    # Output block index cycles 0, 1, 0, 1: non-consecutive revisits.
    def make(interpret):
        def kernel(x_ref, o_ref):
            o_ref[...] = jnp.where(pl.program_id(0) < 2, 0.0, o_ref[...]) + x_ref[...]

        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
            grid=(4,),
            in_specs=[pl.BlockSpec((4,), lambda i: (i,))],
            out_specs=pl.BlockSpec((4,), lambda i: (i % 2,)),
            interpret=interpret,
        )

    x = jnp.arange(16, dtype=jnp.float32)
    fast, slow = both(make)
    expected = np.asarray(x[:8] + x[8:])
    np.testing.assert_array_equal(fast(x), expected)
    np.testing.assert_array_equal(slow(x), expected)


@pytest.mark.parametrize("n", [10, 13])
def test_edge_blocks_are_masked_on_write(n):
    def make(interpret):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2 + 1

        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((n, 3), jnp.float32),
            grid=(pl.cdiv(n, 4),),
            in_specs=[pl.BlockSpec((4, 3), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((4, 3), lambda i: (i, 0)),
            interpret=interpret,
        )

    x = jnp.arange(n * 3, dtype=jnp.float32).reshape(n, 3)
    fast, slow = both(make)
    np.testing.assert_array_equal(fast(x), x * 2 + 1)
    np.testing.assert_array_equal(slow(x), x * 2 + 1)


def test_aliased_input_is_updated_in_place():
    def make(interpret):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1

        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((4, 8), jnp.float32),
            grid=(4, 3),
            in_specs=[pl.BlockSpec((1, 8), lambda i, k: (i, 0))],
            out_specs=pl.BlockSpec((1, 8), lambda i, k: (i, 0)),
            input_output_aliases={0: 0},
            interpret=interpret,
        )

    x = jnp.arange(32, dtype=jnp.float32).reshape(4, 8)
    fast, slow = both(make)
    # The input block is re-read while the output block stays resident (it is written
    # back only when its index changes), so every step computes x + 1.
    np.testing.assert_array_equal(fast(x), x + 1)
    np.testing.assert_array_equal(slow(x), x + 1)


def test_loop_trip_count_depending_on_program_id():
    def make(interpret):
        def kernel(x_ref, o_ref):
            i = pl.program_id(0)

            def body(j, acc):
                return acc + x_ref[pl.ds(j, 1), :]

            o_ref[...] = lax.fori_loop(0, i + 1, body, jnp.zeros((1, 8), jnp.float32))

        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((4, 8), jnp.float32),
            grid=(4,),
            in_specs=[pl.BlockSpec((4, 8), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((1, 8), lambda i: (i, 0)),
            interpret=interpret,
        )

    x = jax.random.normal(jax.random.key(3), (4, 8))
    fast, slow = both(make)
    expected = np.cumsum(np.asarray(x), axis=0)
    np.testing.assert_allclose(fast(x), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(fast(x), slow(x))


def test_squeezed_and_element_dims():
    def make(interpret):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] + pl.program_id(0).astype(jnp.float32)

        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((3, 8), jnp.float32),
            grid=(3,),
            in_specs=[pl.BlockSpec((None, pl.Element(8, (2, 2))), lambda i: (i, 2))],
            out_specs=pl.BlockSpec((pl.Squeezed(), 8), lambda i: (i, 0)),
            interpret=interpret,
        )

    x = jnp.arange(24, dtype=jnp.float32).reshape(3, 8)
    fast, slow = both(make)
    np.testing.assert_array_equal(fast(x), x + jnp.arange(3.0)[:, None])
    np.testing.assert_array_equal(slow(x), fast(x))


def test_aliased_input_reads_see_original_values_after_write_back():
    # Output block 0 is written back before grid point 1 reads input block 0 again;
    # the input still reads as it was (upstream's interpreter behaves the same).
    def make(interpret):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1

        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((2, 4), jnp.float32),
            grid=(2,),
            in_specs=[pl.BlockSpec((1, 4), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((1, 4), lambda i: (i, 0)),
            input_output_aliases={0: 0},
            interpret=interpret,
        )

    x = jnp.arange(8, dtype=jnp.float32).reshape(2, 4)
    fast, slow = both(make)
    expected = np.broadcast_to(np.asarray(x[0]) + 1, (2, 4))
    np.testing.assert_array_equal(fast(x), expected)
    np.testing.assert_array_equal(slow(x), expected)
