"""Kernels read and write through reshaped and bitcast ref views (``ref.reshape``,
``ref.bitcast``), alone or mixed with ``ref.at`` indexers, in the interpreter."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
from pallas._src import jax_compat as jc
from pallas._src.interpreter import views


def _call(kernel, out_shape, *args, **kw):
    return pl.pallas_call(kernel, out_shape=out_shape, interpret=True, **kw)(*args)


def test_store_through_a_reshaped_view_fills_the_ref_in_row_major_order():
    def kernel(x_ref, y_ref):
        y_ref.reshape(5, 128)[...] = x_ref[...]

    x = jnp.arange(5 * 128, dtype=jnp.int32).reshape(5, 128)
    y = _call(kernel, jax.ShapeDtypeStruct((5, 1, 128), jnp.int32), x)
    np.testing.assert_array_equal(y, x.reshape(5, 1, 128))


@pytest.mark.parametrize("slice_first", [True, False])
def test_store_through_a_bitcast_view_writes_the_bits(slice_first):
    def kernel(x_ref, y_ref):
        y_ref[...] = jnp.zeros_like(y_ref)
        ref = (y_ref.at[:8, :128].bitcast(jnp.bfloat16) if slice_first
               else y_ref.bitcast(jnp.bfloat16).at[:16, :128])
        ref[...] = x_ref[...]

    x = jnp.arange(16 * 128, dtype=jnp.bfloat16).reshape(16, 128)
    y = _call(kernel, jax.ShapeDtypeStruct((16, 256), jnp.int32), x)
    # The TPU layout: two bf16 rows pack into one int32 row (see ref.bitcast).
    expected = jax.lax.bitcast_convert_type(x.reshape(8, 2, 128).swapaxes(1, 2), jnp.int32)
    np.testing.assert_array_equal(y[:8, :128], expected)
    np.testing.assert_array_equal(y[8:], 0)
    np.testing.assert_array_equal(y[:, 128:], 0)


def test_add_through_a_reshaped_and_indexed_view():
    def kernel(x_ref, y_ref):
        y_ref[...] = jnp.ones_like(y_ref)
        y_ref.reshape(4, 8).at[1][...] += x_ref[...]

    x = jnp.arange(8, dtype=jnp.float32)
    y = _call(kernel, jax.ShapeDtypeStruct((32,), jnp.float32), x)
    np.testing.assert_array_equal(y, jnp.ones(32).at[8:16].add(x))


def test_views_swap_returns_the_old_contents_and_the_new_array():
    x = jnp.arange(16.0).reshape(4, 4)
    t = [jc.ReshapeTransform((2, 8)), jc.NDIndexer.from_indices_shape((1,), (2, 8))]
    old, new = views.swap(x, jnp.zeros(8), t)
    np.testing.assert_array_equal(old, jnp.arange(8.0, 16.0))
    np.testing.assert_array_equal(new, x.at[2:].set(0))


@pytest.mark.parametrize("rows, ok", [(16, True), (8, False)])
def test_uninitialised_reads_are_tracked_through_a_bitcast_view(rows, ok):
    def kernel(y_ref):
        # 16 int16 rows are the 8 int32 rows; 8 of them leave rows 4..7 unwritten.
        y_ref.bitcast(jnp.int16).at[:rows][...] = jnp.ones((rows, 128), jnp.int16)
        y_ref[...] = y_ref[...] + 1

    def run():
        with pl.enable_poison_buffers(True):
            return jax.block_until_ready(pl.pallas_call(
                kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32),
                interpret=True)())

    if ok:
        np.testing.assert_array_equal(run(), 0x00010001 + 1)
    else:
        with pytest.raises(Exception, match="uninitialised"):
            run()


# -- pl.select_ref ------------------------------------------------------------------------


def _write_selected(idx):
    """Writes 1 into the output ``pl.select_ref(idx, o0, o1, o2)`` picks, 0 elsewhere."""
    def kernel(i_ref, o0, o1, o2):
        for o in (o0, o1, o2):
            o[...] = jnp.zeros_like(o)
        sel = pl.select_ref(i_ref[0], o0, o1.at[0:8], o2)
        sel.dispatch(lambda r: r.__setitem__(..., jnp.ones(r.shape, r.dtype)))

    out = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    o0, o1, o2 = pl.pallas_call(
        kernel, out_shape=(out, jax.ShapeDtypeStruct((16, 128), jnp.float32), out),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)], interpret=True,
    )(jnp.array([idx], jnp.int32))
    return [int(o[:8].min()) for o in (o0, o1, o2)]


@pytest.mark.parametrize("idx, picked", [(0, 0), (1, 1), (2, 2), (7, 2), (-1, 2)])
def test_select_ref_picks_the_option_and_the_last_for_any_other_index(idx, picked):
    # pl.select_ref was a stub raising NotImplementedError (upstream's test_select_ref*).
    assert _write_selected(idx) == [int(k == picked) for k in range(3)]


def test_select_ref_errors():
    x = jnp.zeros((8, 128))
    with pytest.raises(ValueError, match="At least two refs"):
        pl.select_ref(0, x)
    with pytest.raises(ValueError, match="integer scalar"):
        pl.select_ref(jnp.zeros((2,), jnp.int32), x, x)
    sel = pl.select_ref(1, x, x)
    assert sel.shape == (8, 128) and len(sel.reshape(1024).options) == 2
    with pytest.raises(NotImplementedError, match="DMA operand only"):
        sel[...]
