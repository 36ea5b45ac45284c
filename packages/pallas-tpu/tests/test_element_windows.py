"""``pl.Element`` and ``pl.BoundedSlice`` block dims: windows given in element offsets.

An operand with such a dim lowers with ``window_kind = #tpu.element_window<[pad_low],
[pad_high]>`` in its window params, and its ``transform_<k>`` function returns an element
offset for every dim: ``Element`` and ``Squeezed`` dims pass the index map's value
through, a ``Blocked(b)`` dim's block index is multiplied by ``b``, and a
``BoundedSlice(b)`` dim's ``pl.ds(start, b)`` gives ``start``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu

F32 = jnp.float32


def _func(module, name):
    for op in module.body.operations:
        if str(op.attributes["sym_name"]) == f'"{name}"':
            return op
    raise AssertionError(f"no @{name}")


def _window_params(module):
    return str(_func(module, "main").attributes["window_params"])


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _overlapping_windows(x, interpret=False):
    """Three 16-row windows of ``x`` starting every 8 rows, stacked."""
    return pl.pallas_call(
        _copy_kernel, out_shape=jax.ShapeDtypeStruct((3, 16, 128), x.dtype), grid=(3,),
        in_specs=[pl.BlockSpec((pl.Element(16), 128), lambda i: (i * 8, 0))],
        out_specs=pl.BlockSpec((None, 16, 128), lambda i: (i, 0, 0)),
        compiler_params=pltpu.CompilerParams(), interpret=interpret,
    )(x)


def test_an_element_dim_makes_the_whole_window_an_element_window(lower_tpu):
    x = jnp.zeros((32, 128), F32)
    _, (m,) = lower_tpu(_overlapping_windows, x)
    wp = _window_params(m)
    assert ("window_bounds = array<i64: 16, 128>, "
            "window_kind = #tpu.element_window<[0, 0], [0, 0]>") in wp
    # The output's Squeezed/Blocked window stays a block window.
    assert wp.count("window_kind") == 1
    # transform_0 returns the row offset i * 8 and the offset 0 of the full-width
    # Blocked(128) lane dim.
    t0 = str(_func(m, "transform_0"))
    assert "arith.muli %arg0, %c8_i32" in t0
    assert "return %0, %c0_i32 : i32, i32" in t0


def test_blocked_dims_beside_an_element_dim_become_element_offsets(lower_tpu):
    def f(x):
        return pl.pallas_call(
            _copy_kernel, out_shape=jax.ShapeDtypeStruct((16, 256), x.dtype), grid=(2,),
            in_specs=[pl.BlockSpec((pl.Element(16), 128), lambda j: (4, j))],
            out_specs=pl.BlockSpec((16, 128), lambda j: (0, j)),
            compiler_params=pltpu.CompilerParams(),
        )(x)

    x = jnp.zeros((32, 256), F32)
    _, (m,) = lower_tpu(f, x)
    t0 = str(_func(m, "transform_0"))
    # Row offset 4 as given; lane block index j scaled to the element offset j * 128.
    assert "arith.constant 4 : i32" in t0
    assert "arith.muli %arg0, %c128_i32" in t0
    # The output keeps block indices.
    assert "muli" not in str(_func(m, "transform_1"))


def test_element_padding_is_carried_by_the_window_kind(lower_tpu):
    def f(x):
        return pl.pallas_call(
            _copy_kernel, out_shape=jax.ShapeDtypeStruct((2, 16, 128), x.dtype), grid=(2,),
            in_specs=[pl.BlockSpec((pl.Element(16, padding=(8, 8)), 128),
                                   lambda i: (i * 8, 0))],
            out_specs=pl.BlockSpec((None, 16, 128), lambda i: (i, 0, 0)),
            compiler_params=pltpu.CompilerParams(),
        )(x)

    _, (m,) = lower_tpu(f, jnp.zeros((8, 128), F32))
    assert "window_kind = #tpu.element_window<[8, 0], [8, 0]>" in _window_params(m)


def test_element_windows_run_in_tpu_interpret_mode():
    x = jnp.arange(32 * 128, dtype=F32).reshape(32, 128)
    out = _overlapping_windows(x, interpret=True)
    np.testing.assert_array_equal(np.asarray(out),
                                  np.stack([np.asarray(x)[i * 8:i * 8 + 16] for i in range(3)]))


def _bounded(size):
    def f(x):
        spec = pl.BlockSpec((pl.BoundedSlice(8), 128), lambda i: (pl.ds(i * 8, size(i)), 0))
        return pl.pallas_call(
            _copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
            in_specs=[spec], out_specs=spec, compiler_params=pltpu.CompilerParams(),
        )(x)
    return f


def test_a_bounded_slice_of_static_full_size_lowers_as_an_element_window(lower_tpu):
    _, (m,) = lower_tpu(_bounded(lambda i: 8), jnp.zeros((32, 128), F32))
    wp = _window_params(m)
    assert wp.count("window_kind = #tpu.element_window<[0, 0], [0, 0]>") == 2
    assert "arith.muli %arg0, %c8_i32" in str(_func(m, "transform_0"))


def test_a_bounded_slice_of_dynamic_size_fails_with_a_clear_lowering_error(lower_tpu):
    with pytest.raises(pltpu.LoweringException,
                       match=r"BoundedSlice.*static block size.*dynamic.*interpret=True"):
        lower_tpu(_bounded(lambda i: 8 - i), jnp.zeros((32, 128), F32))


def test_an_overhanging_blocked_dim_beside_an_element_dim_is_rejected_at_trace_time():
    def f(x):
        return pl.pallas_call(
            _copy_kernel, out_shape=jax.ShapeDtypeStruct((16, 256), x.dtype), grid=(2,),
            in_specs=[pl.BlockSpec((pl.Element(16), 128), lambda j: (0, j))],
            out_specs=pl.BlockSpec((16, 128), lambda j: (0, j)),
            compiler_params=pltpu.CompilerParams(),
        )(x)

    with pytest.raises(NotImplementedError, match=r"Blocked dim 1 of size 128.*array dim 200"):
        jax.eval_shape(f, jnp.zeros((32, 200), F32))


def test_element_dims_follow_the_tiling_rule_over_the_padded_array():
    def f(block, padding):
        return lambda x: pl.pallas_call(
            _copy_kernel, out_shape=jax.ShapeDtypeStruct((block, 128), x.dtype), grid=(1,),
            in_specs=[pl.BlockSpec((pl.Element(block, padding=padding), 128),
                                   lambda i: (0, 0))],
            out_specs=pl.BlockSpec((block, 128), lambda i: (0, 0)),
            compiler_params=pltpu.CompilerParams(),
        )(x)

    jax.eval_shape(f(12, (2, 2)), jnp.zeros((8, 128), F32))  # the whole padded dim
    with pytest.raises(ValueError, match="second-to-last block dimension 12"):
        jax.eval_shape(f(12, (0, 0)), jnp.zeros((32, 128), F32))


# --------------------------------------------------------------------------------------
# pipeline_mode: how many VMEM buffers the compiler's grid pipeline keeps per operand.


def _copy_with_modes(x, in_mode=None, out_mode=None, grid=(2,)):
    return pl.pallas_call(
        _copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=grid,
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0), pipeline_mode=in_mode)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0), pipeline_mode=out_mode))(x)


def test_buffered_1_and_2_become_synchronous_and_double_buffered_windows(lower_tpu):
    x = jnp.zeros((16, 128), F32)
    _, (m,) = lower_tpu(lambda x: _copy_with_modes(x, None, pl.Buffered(1)), x)
    wp = _window_params(m)
    assert wp.count("pipeline_mode =") == 1 and "#tpu.pipeline_mode<synchronous>" in wp
    _, (m,) = lower_tpu(lambda x: _copy_with_modes(
        x, pl.Buffered(2), pl.Buffered(1, revisit=pl.RevisitMode.ANY)), x)
    wp = _window_params(m)
    assert "#tpu.pipeline_mode<double_buffered>" in wp
    assert "revisit_mode = #tpu.revisit_mode<any>" in wp


def test_a_whole_vmem_operand_at_index_0_is_single_buffered(lower_tpu):
    x = jnp.zeros((8, 128), F32)
    f = pl.pallas_call(
        _copy_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32), grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i * 0, 0)))
    _, (m,) = lower_tpu(f, x)
    # The input's index map returns literal zeros; the output's is computed (i * 0).
    assert _window_params(m).count("#tpu.pipeline_mode<synchronous>") == 1


def test_pipeline_modes_mosaic_tpu_has_not_are_refused_naming_the_operand(lower_tpu):
    x = jnp.zeros((16, 128), F32)
    with pytest.raises(Exception, match=r"args\[0\]: pipeline_mode=.*1 \(synchronous\) or 2"):
        lower_tpu(lambda x: _copy_with_modes(x, pl.Buffered(3)), x)
    with pytest.raises(Exception, match=r"outputs: .*RevisitMode.ANY needs a single buffer"):
        lower_tpu(lambda x: _copy_with_modes(
            x, None, pl.Buffered(2, revisit=pl.RevisitMode.ANY)), x)
