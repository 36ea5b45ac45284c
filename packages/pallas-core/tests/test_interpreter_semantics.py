"""The interpreter's reference semantics.

- the grid runs in lexicographic (row-major) order;
- scratch buffers persist from one grid point to the next;
- each grid point sees the current contents of its output blocks, and an output block
  is written back when the block index changes (so revisits accumulate);
- edge blocks are padded with uninitialised values, and writes outside the array are
  dropped; output elements nobody writes are uninitialised (NaN for floats, the
  minimum for ints, as upstream's interpret mode);
- aliased outputs start as their inputs;
- the kernel's writes to its scalar-prefetch refs persist from one grid point to the
  next (SMEM on a TPU), and index maps see them one point late;
- the vectorised fast path never changes a result: every kernel below is also run
  point by point (``pl.InterpretParams(vectorize=False)``) and compared.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl

SDS = jax.ShapeDtypeStruct

# ``interpret=`` values: the default (may vectorise), the point-by-point path, and the
# point-by-point path with bounds checks on (which must not change results either).
DEFAULT = True
SEQUENTIAL = pl.InterpretParams(vectorize=False)
CHECKED = pl.InterpretParams(bounds_checks=True)
MODES = pytest.mark.parametrize("interpret", [DEFAULT, SEQUENTIAL, CHECKED],
                                ids=["default", "sequential", "checked"])


# --------------------------------------------------------------------------------------
# Grid order


@MODES
def test_grid_points_run_in_lexicographic_order(interpret):
    grid = (3, 4)

    def kernel(o_ref, count_ref):
        @pl.when((pl.program_id(0) == 0) & (pl.program_id(1) == 0))
        def _():
            count_ref[0] = 0

        o_ref[0, 0] = count_ref[0]
        count_ref[0] = count_ref[0] + 1

    out = pl.pallas_call(
        kernel, SDS(grid, jnp.int32), grid=grid, in_specs=[],
        out_specs=pl.BlockSpec((1, 1), lambda i, j: (i, j)),
        scratch_shapes=[pl.ANY((1,), jnp.int32)], interpret=interpret,
    )()
    np.testing.assert_array_equal(out, np.arange(12).reshape(grid))


@MODES
def test_program_ids_seen_in_order_by_a_whole_output(interpret):
    grid = (2, 3)

    def kernel(o_ref, t_ref):
        @pl.when((pl.program_id(0) == 0) & (pl.program_id(1) == 0))
        def _():
            t_ref[0] = 0

        t = t_ref[0]
        o_ref[pl.ds(t, 1)] = jnp.full((1,), pl.program_id(0) * 10 + pl.program_id(1))
        t_ref[0] = t + 1

    out = pl.pallas_call(
        kernel, SDS((6,), jnp.int32), grid=grid, in_specs=[],
        out_specs=pl.BlockSpec((6,), lambda i, j: (0,)),
        scratch_shapes=[pl.ANY((1,), jnp.int32)], interpret=interpret,
    )()
    np.testing.assert_array_equal(out, [0, 1, 2, 10, 11, 12])


@MODES
def test_num_programs_is_the_grid_size(interpret):
    def kernel(o_ref):
        o_ref[0] = pl.num_programs(0) * 100 + pl.num_programs(1) * 10 + pl.num_programs(2)

    out = pl.pallas_call(
        kernel, SDS((2 * 3 * 4,), jnp.int32), grid=(2, 3, 4), in_specs=[],
        out_specs=pl.BlockSpec((1,), lambda i, j, k: (i * 12 + j * 4 + k,)),
        interpret=interpret,
    )()
    np.testing.assert_array_equal(out, np.full(24, 234))


# --------------------------------------------------------------------------------------
# Scratch persistence


@MODES
def test_scratch_carry_makes_a_cumulative_sum_over_blocks(interpret):
    # Every output block is distinct, so only the scratch carry orders the grid: this
    # kernel must not be run with grid points in parallel.
    x = jnp.asarray(np.random.default_rng(0).integers(-5, 5, (24,)), jnp.float32)

    def kernel(x_ref, o_ref, carry_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            carry_ref[...] = jnp.zeros_like(carry_ref)

        c = jnp.cumsum(x_ref[...]) + carry_ref[0]
        o_ref[...] = c
        carry_ref[0] = c[-1]

    spec = pl.BlockSpec((4,), lambda i: (i,))
    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(6,), in_specs=[spec],
                         out_specs=spec, scratch_shapes=[pl.ANY((1,), jnp.float32)],
                         interpret=interpret)(x)
    np.testing.assert_array_equal(out, np.cumsum(np.asarray(x)))


@MODES
def test_scratch_carry_across_a_two_dimensional_grid(interpret):
    # The carry runs across rows too (it is reset only at the very first point).
    x = jnp.asarray(np.random.default_rng(1).integers(0, 9, (3, 8)), jnp.float32)

    def kernel(x_ref, o_ref, carry_ref):
        first = (pl.program_id(0) == 0) & (pl.program_id(1) == 0)

        @pl.when(first)
        def _():
            carry_ref[0] = 0.0

        c = jnp.cumsum(x_ref[0, :]) + carry_ref[0]
        o_ref[0, :] = c
        carry_ref[0] = c[-1]

    spec = pl.BlockSpec((1, 4), lambda i, j: (i, j))
    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(3, 2), in_specs=[spec],
                         out_specs=spec, scratch_shapes=[pl.ANY((1,), jnp.float32)],
                         interpret=interpret)(x)
    np.testing.assert_array_equal(out, np.cumsum(np.asarray(x)).reshape(3, 8))


@MODES
def test_scratch_carry_reset_per_row_gives_row_cumsums(interpret):
    x = jnp.asarray(np.random.default_rng(2).integers(0, 9, (4, 12)), jnp.float32)

    def kernel(x_ref, o_ref, carry_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            carry_ref[...] = jnp.zeros_like(carry_ref)

        c = jnp.cumsum(x_ref[...], axis=1) + carry_ref[...]
        o_ref[...] = c
        carry_ref[...] = c[:, -1:]

    spec = pl.BlockSpec((2, 4), lambda i, j: (i, j))
    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(2, 3), in_specs=[spec],
                         out_specs=spec, scratch_shapes=[pl.ANY((2, 1), jnp.float32)],
                         interpret=interpret)(x)
    np.testing.assert_array_equal(out, np.cumsum(np.asarray(x), axis=1))


@MODES
def test_scratch_written_before_read_at_every_point_is_private_per_point(interpret):
    x = jnp.arange(32, dtype=jnp.float32).reshape(4, 8)

    def kernel(x_ref, o_ref, s_ref):
        s_ref[...] = x_ref[...] * 2
        o_ref[...] = s_ref[...] + 1

    spec = pl.BlockSpec((1, 8), lambda i: (i, 0))
    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(4,), in_specs=[spec],
                         out_specs=spec, scratch_shapes=[pl.ANY((1, 8), jnp.float32)],
                         interpret=interpret)(x)
    np.testing.assert_array_equal(out, x * 2 + 1)


@MODES
def test_accumulating_in_scratch_and_writing_on_the_last_step(interpret):
    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.standard_normal((8, 16)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)

    def kernel(a_ref, b_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += a_ref[...] @ b_ref[...]

        @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
        def _():
            o_ref[...] = acc_ref[...]

    out = pl.pallas_call(
        kernel, SDS((8, 8), jnp.float32), grid=(2, 4),
        in_specs=[pl.BlockSpec((4, 4), lambda i, k: (i, k)),
                  pl.BlockSpec((4, 8), lambda i, k: (k, 0))],
        out_specs=pl.BlockSpec((4, 8), lambda i, k: (i, 0)),
        scratch_shapes=[pl.ANY((4, 8), jnp.float32)], interpret=interpret,
    )(a, b)
    np.testing.assert_allclose(out, np.asarray(a) @ np.asarray(b), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------
# Scalar prefetch written by the kernel


def _prefetch_counter_call(grid, out_index_map, interpret, *, in_loop=False):
    """A kernel that numbers the grid points it visits with a counter kept in its
    scalar-prefetch ref (starting at 10), and writes each number to its own block."""
    def kernel(c_ref, o_ref):
        o_ref[...] = jnp.full(o_ref.shape, c_ref[0], jnp.int32)
        if in_loop:  # the write nested in a loop and a branch, as a kernel's state update
            def step(k, carry):
                @pl.when(k == 0)
                def _():
                    c_ref[0] = c_ref[0] + 1
                return carry
            jax.lax.fori_loop(0, 2, step, 0)
        else:
            c_ref[0] = c_ref[0] + 1

    block = (1,) * len(grid)
    return pl.pallas_call(
        kernel, SDS(grid, jnp.int32),
        grid_spec=pl.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=grid, in_specs=[],
            out_specs=pl.BlockSpec(block, out_index_map)),
        interpret=interpret)(jnp.asarray([10], jnp.int32))


@MODES
@pytest.mark.parametrize("in_loop", [False, True], ids=["top", "in_loop"])
def test_kernel_writes_to_scalar_prefetch_persist_across_grid_points(interpret, in_loop):
    # Kernels keep state there from one grid point to the next (upstream's ragged paged
    # attention keeps its sequence and buffer indices so); the interpreter used to give
    # each point the original values.
    out = _prefetch_counter_call((4,), lambda i, c: (i,), interpret, in_loop=in_loop)
    np.testing.assert_array_equal(out, 10 + np.arange(4))


@MODES
def test_scalar_prefetch_writes_keep_a_two_dimensional_grid_sequential(interpret):
    # Both axes move the output block, which would make them vectorised lanes: a written
    # prefetch ref carries a value from each point to the next, so the grid runs in order.
    out = _prefetch_counter_call((2, 3), lambda i, j, c: (i, j), interpret)
    np.testing.assert_array_equal(out, 10 + np.arange(6).reshape(2, 3))


@MODES
def test_index_maps_see_scalar_prefetch_writes_one_point_late(interpret):
    # As on a TPU (and upstream's TPU interpret mode): the block indices of a point are
    # worked out when the point before it starts, before that point's body writes.
    x = jnp.repeat(jnp.arange(4, dtype=jnp.int32), 8).reshape(4, 8)

    def kernel(s_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]
        s_ref[0] = s_ref[0] + 1

    out = pl.pallas_call(
        kernel, SDS(x.shape, x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(4,),
            in_specs=[pl.BlockSpec((1, 8), lambda i, s: (s[0], 0))],
            out_specs=pl.BlockSpec((1, 8), lambda i, s: (i, 0))),
        interpret=interpret)(jnp.asarray([0], jnp.int32), x)
    np.testing.assert_array_equal(out[:, 0], [0, 0, 1, 2])


# --------------------------------------------------------------------------------------
# Output blocks: revisits and write-back


@MODES
def test_consecutive_revisits_of_an_output_block_accumulate(interpret):
    x = jnp.arange(4 * 8, dtype=jnp.float32).reshape(4, 8)

    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(0) % 2 == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...]

    out = pl.pallas_call(
        kernel, SDS((2, 8), jnp.float32), grid=(4,),
        in_specs=[pl.BlockSpec((1, 8), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((1, 8), lambda i: (i // 2, 0)), interpret=interpret,
    )(x)
    xn = np.asarray(x)
    np.testing.assert_array_equal(out, [xn[0] + xn[1], xn[2] + xn[3]])


@MODES
def test_non_consecutive_revisits_see_the_written_back_block(interpret):
    x = jnp.arange(6 * 4, dtype=jnp.float32).reshape(6, 4)

    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(0) < 2)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...]

    out = pl.pallas_call(
        kernel, SDS((2, 4), jnp.float32), grid=(6,),
        in_specs=[pl.BlockSpec((1, 4), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((1, 4), lambda i: (i % 2, 0)), interpret=interpret,
    )(x)
    xn = np.asarray(x)
    np.testing.assert_array_equal(out, [xn[0::2].sum(0), xn[1::2].sum(0)])


@MODES
def test_last_write_to_a_revisited_block_wins(interpret):
    def kernel(o_ref):
        o_ref[...] = jnp.full(o_ref.shape, pl.program_id(0), jnp.int32)

    out = pl.pallas_call(kernel, SDS((4,), jnp.int32), grid=(5,), in_specs=[],
                         out_specs=pl.BlockSpec((4,), lambda i: (0,)),
                         interpret=interpret)()
    np.testing.assert_array_equal(out, [4, 4, 4, 4])


@MODES
def test_reduction_axis_in_the_middle_of_the_grid(interpret):
    x = jnp.asarray(np.random.default_rng(4).integers(0, 5, (2, 3, 4, 8)), jnp.float32)

    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...]

    out = pl.pallas_call(
        kernel, SDS((2, 4, 8), jnp.float32), grid=(2, 3, 2),
        in_specs=[pl.BlockSpec((None, None, 2, 8), lambda b, r, j: (b, r, j, 0))],
        out_specs=pl.BlockSpec((None, 2, 8), lambda b, r, j: (b, j, 0)),
        interpret=interpret,
    )(x)
    np.testing.assert_array_equal(out, np.asarray(x).sum(axis=1))


@MODES
def test_overlapping_element_output_windows_keep_the_last_write(interpret):
    def kernel(o_ref):
        o_ref[...] = jnp.full((4,), pl.program_id(0), jnp.int32)

    out = pl.pallas_call(kernel, SDS((10,), jnp.int32), grid=(4,), in_specs=[],
                         out_specs=pl.BlockSpec((pl.Element(4),), lambda i: (2 * i,)),
                         interpret=interpret)()
    np.testing.assert_array_equal(out, [0, 0, 1, 1, 2, 2, 3, 3, 3, 3])


@MODES
def test_output_blocks_in_reverse_order(interpret):
    x = jnp.arange(10, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2 + pl.program_id(0).astype(jnp.float32)

    out = pl.pallas_call(kernel, SDS((10,), jnp.float32), grid=(5,),
                         in_specs=[pl.BlockSpec((2,), lambda i: (i,))],
                         out_specs=pl.BlockSpec((2,), lambda i: (4 - i,)),
                         interpret=interpret)(x)
    expected = np.concatenate([np.arange(2 * i, 2 * i + 2) * 2.0 + i for i in range(5)][::-1])
    np.testing.assert_array_equal(out, expected)


@MODES
def test_transpose_through_squeezed_blocks(interpret):
    y = jnp.arange(24, dtype=jnp.float32).reshape(4, 6)

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 100 * pl.program_id(1).astype(jnp.float32)

    out = pl.pallas_call(kernel, SDS((6, 4), jnp.float32), grid=(2, 4),
                         in_specs=[pl.BlockSpec((None, 3), lambda i, j: (j, i))],
                         out_specs=pl.BlockSpec((3, None), lambda i, j: (i, j)),
                         interpret=interpret)(y)
    np.testing.assert_array_equal(out, np.asarray(y).T + 100 * np.arange(4)[None, :])


@MODES
def test_a_block_larger_than_the_array_is_one_masked_block(interpret):
    x = jnp.arange(10, dtype=jnp.float32)
    spec = pl.BlockSpec((16,), lambda i: (i,))
    out = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                         SDS((10,), jnp.float32), grid=(1,), in_specs=[spec], out_specs=spec,
                         interpret=interpret)(x)
    np.testing.assert_array_equal(out, np.arange(10) * 2)


# --------------------------------------------------------------------------------------
# Edge blocks and uninitialised memory


@MODES
def test_edge_blocks_are_padded_and_writes_past_the_end_are_dropped(interpret):
    x = jnp.arange(10, dtype=jnp.float32)

    def kernel(x_ref, o_ref, n_ref):
        o_ref[...] = x_ref[...] * 2
        n_ref[0] = jnp.sum(jnp.isnan(x_ref[...])).astype(jnp.int32)

    out, nans = pl.pallas_call(
        kernel, (SDS((10,), jnp.float32), SDS((3,), jnp.int32)), grid=(3,),
        in_specs=[pl.BlockSpec((4,), lambda i: (i,))],
        out_specs=(pl.BlockSpec((4,), lambda i: (i,)), pl.BlockSpec((1,), lambda i: (i,))),
        interpret=interpret,
    )(x)
    np.testing.assert_array_equal(out, np.arange(10) * 2)
    # The last block covers elements 8..11; 10 and 11 are padding (uninitialised: NaN).
    np.testing.assert_array_equal(nans, [0, 0, 2])


@MODES
def test_two_dimensional_edge_blocks(interpret):
    x = jnp.asarray(np.random.default_rng(5).standard_normal((5, 7)), jnp.float32)
    spec = pl.BlockSpec((2, 4), lambda i, j: (i, j))
    out = pl.pallas_call(
        lambda x_ref, o_ref: o_ref.__setitem__(..., jnp.exp(x_ref[...])),
        SDS(x.shape, x.dtype), grid=(3, 2), in_specs=[spec], out_specs=spec,
        interpret=interpret,
    )(x)
    np.testing.assert_allclose(out, np.exp(np.asarray(x)), rtol=1e-6)


@MODES
def test_unwritten_float_outputs_are_nan(interpret):
    def kernel(o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = jnp.ones_like(o_ref)

    out = pl.pallas_call(kernel, SDS((4, 2), jnp.float32), grid=(2,), in_specs=[],
                         out_specs=pl.BlockSpec((2, 2), lambda i: (i, 0)),
                         interpret=interpret)()
    out = np.asarray(out)
    np.testing.assert_array_equal(out[:2], 1)
    assert np.isnan(out[2:]).all()


def test_unwritten_int_outputs_are_the_minimum_int():
    def kernel(o_ref):
        o_ref[0] = 7

    out = pl.pallas_call(kernel, SDS((3,), jnp.int32), interpret=True)()
    np.testing.assert_array_equal(out, [7, np.iinfo(np.int32).min, np.iinfo(np.int32).min])


def test_fresh_scratch_is_uninitialised():
    def kernel(o_ref, s_ref):
        o_ref[...] = s_ref[...]

    out = pl.pallas_call(kernel, SDS((4,), jnp.float32),
                         scratch_shapes=[pl.ANY((4,), jnp.float32)], interpret=True)()
    assert np.isnan(np.asarray(out)).all()


# --------------------------------------------------------------------------------------
# Aliasing


@MODES
def test_aliased_output_blocks_that_are_not_visited_keep_the_input(interpret):
    x = jnp.arange(8 * 2, dtype=jnp.float32).reshape(8, 2)

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * -1

    # Only blocks 0 and 2 (rows 0-1 and 4-5) are visited.
    spec = pl.BlockSpec((2, 2), lambda i: (2 * i, 0))
    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(2,), in_specs=[spec],
                         out_specs=spec, input_output_aliases={0: 0},
                         interpret=interpret)(x)
    expected = np.asarray(x).copy()
    expected[0:2] *= -1
    expected[4:6] *= -1
    np.testing.assert_array_equal(out, expected)


@MODES
def test_aliased_in_place_update_reads_what_earlier_points_wrote(interpret):
    # out = x aliased; each point adds the previous row into its own row, reading the
    # previous row through the *output* (which holds already-updated values).
    x = jnp.ones((4, 2), jnp.float32)

    def kernel(x_hbm, o_ref):
        i = pl.program_id(0)

        @pl.when(i > 0)
        def _():
            o_ref[pl.ds(i, 1), :] = o_ref[pl.ds(i, 1), :] + o_ref[pl.ds(i - 1, 1), :]

    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(4,),
                         in_specs=[pl.BlockSpec(memory_space=pl.MemorySpace.ANY)],
                         out_specs=pl.BlockSpec(memory_space=pl.MemorySpace.ANY),
                         input_output_aliases={0: 0}, interpret=interpret)(x)
    np.testing.assert_array_equal(out, [[1, 1], [2, 2], [3, 3], [4, 4]])


# --------------------------------------------------------------------------------------
# The vectorised path and the sequential path agree


def _elementwise(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.tanh(x_ref[...]) * y_ref[...] + pl.program_id(0).astype(jnp.float32)


def _rowwise_softmax(x_ref, y_ref, o_ref):
    x = x_ref[...] + y_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


@pytest.mark.parametrize("kernel", [_elementwise, _rowwise_softmax])
@pytest.mark.parametrize("grid,block,index_map", [
    ((4,), (2, 16), lambda i: (i, 0)),
    ((4, 2), (2, 8), lambda i, j: (i, j)),
    ((2, 4), (4, 4), lambda i, j: (i, j)),
    ((3, 2), (3, 8), lambda i, j: (i, j)),  # edge blocks along the first axis
])
def test_vectorised_and_sequential_results_are_identical(kernel, grid, block, index_map):
    rng = np.random.default_rng(6)
    x = jnp.asarray(rng.standard_normal((8, 16)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((8, 16)), jnp.float32)
    spec = pl.BlockSpec(block, index_map)
    results = [
        np.asarray(pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=grid,
                                  in_specs=[spec, spec], out_specs=spec,
                                  interpret=mode)(x, y))
        for mode in (DEFAULT, SEQUENTIAL)
    ]
    np.testing.assert_array_equal(results[0], results[1])
    # and both agree with a blockwise numpy reference
    ref = np.empty((8, 16), np.float32)
    for point in np.ndindex(*grid):
        idx = index_map(*point)
        sl = tuple(slice(b * s, b * s + s) for b, s in zip(idx, block))
        xb, yb = np.asarray(x)[sl], np.asarray(y)[sl]
        if kernel is _elementwise:
            ref[sl] = np.tanh(xb) * yb + point[0]
        else:
            z = xb + yb
            e = np.exp(z - z.max(-1, keepdims=True))
            ref[sl] = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(results[0], ref, rtol=1e-5, atol=1e-6)


def test_vectorised_kernel_with_a_per_point_scratch_matches_numpy():
    # A kernel where scratch is fully written before it is read at every point may be
    # vectorised; the result is the same.
    x = jnp.arange(64, dtype=jnp.float32).reshape(8, 8)

    def kernel(x_ref, o_ref, s_ref):
        s_ref[...] = x_ref[...]
        s_ref[...] = s_ref[...] * 3
        o_ref[...] = s_ref[...] - 1

    spec = pl.BlockSpec((2, 2), lambda i, j: (i, j))
    outs = [
        pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(4, 4), in_specs=[spec],
                       out_specs=spec, scratch_shapes=[pl.ANY((2, 2), jnp.float32)],
                       interpret=mode)(x)
        for mode in (DEFAULT, SEQUENTIAL)
    ]
    np.testing.assert_array_equal(outs[0], np.asarray(x) * 3 - 1)
    np.testing.assert_array_equal(outs[1], outs[0])


def test_scratch_read_in_a_branch_before_being_written_is_carried():
    # The scratch is written only at j == 0 and read at every point: lanes over i are
    # fine, but j must run in order and the value must flow from j == 0 onwards.
    x = jnp.arange(4 * 6, dtype=jnp.float32).reshape(4, 6)

    def kernel(x_ref, o_ref, s_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            s_ref[...] = x_ref[...]

        o_ref[...] = s_ref[...]

    spec = pl.BlockSpec((1, 2), lambda i, j: (i, j))
    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(4, 3), in_specs=[spec],
                         out_specs=spec, scratch_shapes=[pl.ANY((1, 2), jnp.float32)],
                         interpret=True)(x)
    first = np.asarray(x)[:, 0:2]
    np.testing.assert_array_equal(out, np.tile(first, (1, 3)))


def test_masked_window_past_the_end_is_not_clamped():
    """The Triton tutorial's add: the last ``ds(i * blk, blk)`` window runs past the
    array. Masked-off lanes are not accessed, so the window is not clamped into the
    array (which would shift the lanes that are read and written)."""
    n, blk = 1000, 128

    def kernel(x_ref, y_ref, o_ref):
        i = pl.program_id(0)
        mask = i * blk + jnp.arange(blk) < n
        window = pl.ds(i * blk, blk)
        a = pl.load(x_ref.at[window], mask=mask, other=0.0)
        pl.store(o_ref.at[window], a + pl.load(y_ref.at[window], mask=mask), mask=mask)

    x = jnp.arange(n, dtype=jnp.float32)
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((n,), jnp.float32),
                         grid=(pl.cdiv(n, blk),), interpret=True)(x, 2 * x)
    np.testing.assert_array_equal(out, 3 * x)


def test_masked_window_before_the_start_reads_other():
    """A window starting before the array: lanes left of it are masked off and read
    ``other``; the others keep their positions."""
    def kernel(x_ref, o_ref):
        offs = -4 + jnp.arange(16)
        o_ref[...] = pl.load(x_ref.at[pl.ds(pl.program_id(0) - 4, 16)], mask=offs >= 0,
                             other=-1.0)

    x = jnp.arange(16, dtype=jnp.float32)
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16,), jnp.float32),
                         grid=(1,), interpret=True)(x)
    np.testing.assert_array_equal(out, jnp.concatenate([-jnp.ones(4), x[:12]]))


@MODES
def test_masked_swap_is_a_partial_exchange(interpret):
    """A masked ``pl.swap`` writes ``val`` where the mask holds and returns the old
    contents there; where it does not, the ref keeps its contents and ``val`` itself is
    returned (upstream's discharge: ``where(mask, old, val)``)."""
    def kernel(x_ref, y_ref, o_ref, old_ref):
        o_ref[...] = y_ref[...]
        mask = jnp.arange(16) % 3 == 0
        old_ref[...] = pl.swap(o_ref, (slice(None),), x_ref[...], mask=mask)

    x = jnp.arange(16, dtype=jnp.float32)
    y = -x - 1
    out, old = pl.pallas_call(kernel, out_shape=(SDS((16,), jnp.float32),) * 2,
                              interpret=interpret)(x, y)
    mask = np.arange(16) % 3 == 0
    np.testing.assert_array_equal(out, np.where(mask, x, y))
    np.testing.assert_array_equal(old, np.where(mask, y, x))
