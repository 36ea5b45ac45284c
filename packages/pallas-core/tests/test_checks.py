"""The interpreter's opt-in checks, one switch each.

- ``pl.enable_bounds_checks(True)``: a block index outside the array is an error naming
  the operand, the grid iteration and the block; data-independent index maps fail at
  trace time with ``IndexError``, scalar-prefetch-dependent ones when the call runs.
- ``pl.enable_poison_buffers(True)``: reading output or scratch memory that nobody
  wrote is an error naming the operand and the grid iteration.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl

SDS = jax.ShapeDtypeStruct


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


# --------------------------------------------------------------------------------------
# Bounds checks


def _out_of_bounds_call(x):
    # Block 4 of an array with 4 row blocks (0..3) is out of bounds at i = 3.
    return pl.pallas_call(
        _copy_kernel, SDS(x.shape, x.dtype), grid=(4,),
        in_specs=[pl.BlockSpec((2, 8), lambda i: (i + 1, 0))],
        out_specs=pl.BlockSpec((2, 8), lambda i: (i, 0)), interpret=True,
    )(x)


def test_out_of_bounds_block_index_is_an_index_error_before_anything_runs():
    x = jnp.zeros((8, 8), jnp.float32)
    with pl.enable_bounds_checks(True):
        with pytest.raises(IndexError) as info:
            jax.jit(_out_of_bounds_call).lower(x)  # found statically, nothing executes
    msg = str(info.value)
    assert "args[0]" in msg  # the operand
    assert "(8, 8)" in msg  # its array shape
    assert "(2, 8)" in msg  # the block shape
    assert "grid iteration (3,)" in msg
    assert "(4, 0)" in msg  # the block index the index map returned


def test_out_of_bounds_output_block_names_the_output():
    x = jnp.zeros((4,), jnp.float32)
    with pl.enable_bounds_checks(True):
        with pytest.raises(IndexError, match=r"outputs.*grid iteration \(1, 1\)"):
            pl.pallas_call(
                lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                SDS((4,), jnp.float32), grid=(2, 2),
                in_specs=[pl.BlockSpec((2,), lambda i, j: (i,))],
                out_specs=pl.BlockSpec((2,), lambda i, j: (i + j,)), interpret=True,
            )(x)


def test_negative_block_index_is_out_of_bounds():
    x = jnp.zeros((4, 8), jnp.float32)
    with pl.enable_bounds_checks(True):
        with pytest.raises(IndexError, match=r"args\[0\].*grid iteration \(0,\)"):
            pl.pallas_call(
                _copy_kernel, SDS(x.shape, x.dtype), grid=(2,),
                in_specs=[pl.BlockSpec((2, 8), lambda i: (i - 1, 0))],
                out_specs=pl.BlockSpec((2, 8), lambda i: (i, 0)), interpret=True,
            )(x)


def test_element_windows_may_reach_into_their_padding_but_not_beyond():
    x = jnp.arange(8, dtype=jnp.float32)
    out_spec = pl.BlockSpec((1,), lambda i: (i,))

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(1, 1)]

    def run(offset):
        spec = pl.BlockSpec((pl.Element(3, padding=(1, 1)),), lambda i: (i + offset,))
        return pl.pallas_call(kernel, SDS((8,), jnp.float32), grid=(8,), in_specs=[spec],
                              out_specs=out_spec, interpret=True)(x)

    # Offsets are into the padded array (length 10): windows 0..2 through 7..9 fit.
    with pl.enable_bounds_checks(True):
        np.testing.assert_array_equal(run(0), x)
        with pytest.raises(IndexError, match=r"grid iteration \(7,\)"):
            run(1)  # window 8..10 ends past the high padding
        with pytest.raises(IndexError, match=r"grid iteration \(0,\)"):
            run(-1)  # window -1..1 starts before the low padding


@pytest.mark.parametrize("index_map,point", [
    (lambda i: (pl.ds(i * 3, 2), 0), "(1,)"),  # rows 3..4: past the end
    (lambda i: (pl.ds(i, 3), 0), "(0,)"),  # size 3 > BoundedSlice(2)
])
def test_bounded_slices_must_stay_inside_the_array_and_the_bound(index_map, point):
    x = jnp.arange(8, dtype=jnp.float32).reshape(4, 2)
    with pl.enable_bounds_checks(True):
        with pytest.raises(IndexError, match=re.escape(f"grid iteration {point}")):
            pl.pallas_call(
                _copy_kernel, SDS((4, 2), jnp.float32), grid=(2,),
                in_specs=[pl.BlockSpec((pl.BoundedSlice(2), 2), index_map)],
                out_specs=pl.BlockSpec((2, 2), lambda i: (i, 0)), interpret=True,
            )(x)


def test_ragged_edge_blocks_are_in_bounds():
    x = jnp.arange(10, dtype=jnp.float32)
    spec = pl.BlockSpec((4,), lambda i: (i,))
    with pl.enable_bounds_checks(True):
        out = pl.pallas_call(_copy_kernel, SDS(x.shape, x.dtype), grid=(3,), in_specs=[spec],
                             out_specs=spec, interpret=True)(x)
    np.testing.assert_array_equal(out, x)


def test_bounds_checks_are_off_by_default():
    x = jnp.zeros((8, 8), jnp.float32)
    jax.block_until_ready(_out_of_bounds_call(x))  # no error: index clamped or dropped


def test_bounds_check_for_a_scalar_prefetch_index_map_fails_at_run_time():
    x = jnp.arange(4 * 8, dtype=jnp.float32).reshape(4, 8)
    rows = jnp.array([0, 3, 4, 1], jnp.int32)  # 4 is past the last row block (3)

    def kernel(rows_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    gs = pl.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(4,),
        in_specs=[pl.BlockSpec((1, 8), lambda i, rows: (rows[i], 0))],
        out_specs=pl.BlockSpec((1, 8), lambda i, rows: (i, 0)),
    )
    f = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid_spec=gs, interpret=True)
    with pl.enable_bounds_checks(True):
        traced = jax.jit(f).trace(rows, x)  # tracing cannot know the data: no error
        assert traced is not None
        with pytest.raises(Exception) as info:
            jax.block_until_ready(f(rows, x))
        msg = str(info.value)
        assert "out of bounds" in msg
        assert "args[1]" in msg
        assert "grid iteration (2,)" in msg
        assert "block index (4, 0)" in msg
        # valid data passes
        ok = f(jnp.array([3, 2, 1, 0], jnp.int32), x)
    np.testing.assert_array_equal(ok, np.asarray(x)[::-1])


def test_bounds_checks_via_interpret_params():
    x = jnp.zeros((8, 8), jnp.float32)
    with pytest.raises(IndexError, match="out of bounds"):
        pl.pallas_call(
            _copy_kernel, SDS(x.shape, x.dtype), grid=(4,),
            in_specs=[pl.BlockSpec((2, 8), lambda i: (i + 1, 0))],
            out_specs=pl.BlockSpec((2, 8), lambda i: (i, 0)),
            interpret=pl.InterpretParams(bounds_checks=True),
        )(x)


# --------------------------------------------------------------------------------------
# Poisoned buffers (reads of uninitialised memory)


def test_reading_an_output_before_writing_it_is_reported():
    x = jnp.ones((4, 8), jnp.float32)

    def kernel(x_ref, o_ref):
        o_ref[...] += x_ref[...]  # forgot to zero the accumulator first

    spec = pl.BlockSpec((2, 8), lambda i: (i, 0))
    with pl.enable_poison_buffers(True):
        with pytest.raises(Exception) as info:
            jax.block_until_ready(pl.pallas_call(
                kernel, SDS(x.shape, x.dtype), grid=(2,), in_specs=[spec], out_specs=spec,
                interpret=True)(x))
    msg = str(info.value)
    assert "uninitialised" in msg
    assert "outputs" in msg
    assert "grid iteration (0,)" in msg


def test_reading_scratch_before_writing_it_is_reported_with_the_scratch_name():
    def kernel(o_ref, acc_ref):
        @pl.when(pl.program_id(0) == 1)  # initialised too late
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += 1.0
        o_ref[...] = acc_ref[...]

    with pl.enable_poison_buffers(True):
        with pytest.raises(pl.InterpreterError,
                           match=r"uninitialised.*scratch_shapes\[0\].*grid iteration \(0,\)"):
            jax.block_until_ready(pl.pallas_call(
                kernel, SDS((2, 4), jnp.float32), grid=(2,), in_specs=[],
                out_specs=pl.BlockSpec((None, 4), lambda i: (i, 0)),
                scratch_shapes=[pl.ANY((4,), jnp.float32)], interpret=True)())


def test_a_partially_written_buffer_is_reported_only_where_it_is_read_unwritten():
    def kernel(o_ref):
        o_ref[pl.ds(0, 2)] = jnp.ones((2,), jnp.float32)
        o_ref[pl.ds(2, 2)] = o_ref[pl.ds(0, 2)] * 2  # fine: reads written elements
        o_ref[pl.ds(3, 1)] = o_ref[pl.ds(3, 1)] + o_ref[pl.ds(4, 1)]  # 4 was never written

    with pl.enable_poison_buffers(True):
        with pytest.raises(pl.InterpreterError, match="uninitialised.*outputs"):
            jax.block_until_ready(
                pl.pallas_call(kernel, SDS((5,), jnp.float32), interpret=True)())


def test_reading_a_run_scoped_buffer_before_writing_it_is_reported():
    def kernel(o_ref):
        def body(t_ref):
            o_ref[...] = t_ref[...]

        pl.run_scoped(body, pl.ANY((4,), jnp.float32))

    with pl.enable_poison_buffers(True):
        with pytest.raises(pl.InterpreterError, match="uninitialised.*run_scoped"):
            jax.block_until_ready(
                pl.pallas_call(kernel, SDS((4,), jnp.float32), interpret=True)())


def test_initialise_then_accumulate_is_not_reported():
    x = jnp.arange(4 * 8, dtype=jnp.float32).reshape(4, 8)

    def kernel(x_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)
            o_ref[...] = jnp.zeros_like(o_ref)

        acc_ref[...] += x_ref[...]
        o_ref[...] += acc_ref[...]

    with pl.enable_poison_buffers(True):
        out = pl.pallas_call(
            kernel, SDS((1, 8), jnp.float32), grid=(4,),
            in_specs=[pl.BlockSpec((1, 8), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((1, 8), lambda i: (0, 0)),
            scratch_shapes=[pl.ANY((1, 8), jnp.float32)], interpret=True,
        )(x)
    np.testing.assert_array_equal(out[0], np.cumsum(np.asarray(x), axis=0).sum(0))


def test_aliased_outputs_and_inputs_count_as_initialised():
    x = jnp.arange(4, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        o_ref[...] = o_ref[...] + x_ref[...]

    with pl.enable_poison_buffers(True):
        out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), input_output_aliases={0: 0},
                             interpret=True)(x)
    np.testing.assert_array_equal(out, 2 * np.arange(4))


def test_masked_loads_only_check_the_selected_elements():
    def kernel(o_ref):
        o_ref[pl.ds(0, 2)] = jnp.ones((2,), jnp.float32)
        v = pl.load(o_ref, (pl.ds(0, 4),), mask=jnp.arange(4) < 2, other=0.0)
        o_ref[pl.ds(2, 2)] = v[:2] + 1

    with pl.enable_poison_buffers(True):
        out = pl.pallas_call(kernel, SDS((4,), jnp.float32), interpret=True)()
    np.testing.assert_array_equal(out, [1, 1, 2, 2])


def test_poison_checks_via_interpret_params():
    def kernel(o_ref):
        o_ref[...] = o_ref[...] * 2

    with pytest.raises(pl.InterpreterError, match="uninitialised"):
        jax.block_until_ready(pl.pallas_call(
            kernel, SDS((2,), jnp.float32),
            interpret=pl.InterpretParams(uninitialized_checks=True))())


def test_poison_errors_name_the_grid_iteration_where_they_happen():
    # Only the first row block is initialised; point (1, 0) is the first to read unwritten
    # memory (its output block 1 was never written).
    def kernel(o_ref):
        @pl.when((pl.program_id(0) == 0) & (pl.program_id(1) == 0))
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += 1.0

    with pl.enable_poison_buffers(True):
        with pytest.raises(pl.InterpreterError) as info:
            jax.block_until_ready(pl.pallas_call(
                kernel, SDS((2, 1), jnp.float32), grid=(2, 2), in_specs=[],
                out_specs=pl.BlockSpec((1, 1), lambda i, j: (i, 0)), interpret=True)())
    assert re.search(r"uninitialised memory in outputs, at grid iteration \(1, 0\)",
                     str(info.value))


def test_switches_work_as_setters_and_context_managers():
    assert not pl.enable_bounds_checks.value and not pl.enable_poison_buffers.value
    with pl.enable_bounds_checks(True), pl.enable_poison_buffers(True):
        assert pl.enable_bounds_checks.value and pl.enable_poison_buffers.value
    assert not pl.enable_bounds_checks.value and not pl.enable_poison_buffers.value


def test_checks_turned_on_after_a_jit_cache_entry_still_apply():
    x = jnp.zeros((8, 8), jnp.float32)
    f = jax.jit(_out_of_bounds_call)
    jax.block_until_ready(f(x))  # compiled without checks
    with pl.enable_bounds_checks(True):
        with pytest.raises(IndexError, match="out of bounds"):
            f(x)


def test_checks_turned_on_between_two_calls_of_the_same_pallas_call_apply():
    x = jnp.zeros((8, 8), jnp.float32)
    f = pl.pallas_call(
        _copy_kernel, SDS(x.shape, x.dtype), grid=(4,),
        in_specs=[pl.BlockSpec((2, 8), lambda i: (i + 1, 0))],
        out_specs=pl.BlockSpec((2, 8), lambda i: (i, 0)), interpret=True,
    )
    jax.block_until_ready(f(x))  # no checks: runs
    with pl.enable_bounds_checks(True):
        with pytest.raises(IndexError, match="out of bounds"):
            f(x)
    jax.block_until_ready(f(x))  # and off again


def test_poison_checks_turned_on_between_two_calls_apply():
    f = pl.pallas_call(lambda o_ref: o_ref.__setitem__(..., o_ref[...] + 1),
                       SDS((2,), jnp.float32), interpret=True)
    jax.block_until_ready(f())
    with pl.enable_poison_buffers(True):
        with pytest.raises(pl.InterpreterError, match="uninitialised"):
            jax.block_until_ready(f())
