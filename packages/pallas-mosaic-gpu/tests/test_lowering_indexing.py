"""Strided ref windows (``pl.ds(start, size, stride)``) and masked ``pl.load``/
``pl.store``/``pl.swap``: accessed element by element, each access of a masked one
guarded by its mask bit (so masked-off elements are neither read nor written). The
numbers are checked by executing the generated module (the emulate level's executor)
against plain JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
import pallas.plugins
from pallas_mosaic_gpu._src.backend import params
from pallas_mosaic_gpu._src.lowering import build

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F32 = jnp.float32


def _emulate(kernel, out_shape, *args, **kw):
    """The outputs of ``pallas_call(kernel)`` from its generated module, executed on CPU."""
    from pallas_mosaic_gpu._src.executor import run_kernel

    f = pl.pallas_call(kernel, out_shape=out_shape, backend="mosaic_gpu", **kw)
    (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    k = build(req.jaxpr, req.grid_mapping, params(req.compiler_params), "k")
    return run_kernel(k, list(args))


def _x(shape, dtype=np.float32):
    x = np.random.default_rng(0).standard_normal(shape) * 10
    return x.astype(dtype)


def _iota(shape, dim):
    return lax.broadcasted_iota(jnp.int32, shape, dim)


# --- strided windows ------------------------------------------------------------------


def test_strided_rows_lanes_and_a_dynamic_start():
    x = _x((32, 256))

    def kernel(x_ref, a_ref, b_ref, c_ref):
        a_ref[...] = x_ref[pl.ds(1, 8, stride=3), :128]
        b_ref[...] = x_ref[:8, pl.ds(0, 128, stride=2)]
        start = pl.program_id(0) + 2  # dynamic
        c_ref[...] = x_ref[pl.ds(start, 4, stride=4), pl.ds(start, 32, stride=5)]

    outs = (jax.ShapeDtypeStruct((8, 128), F32), jax.ShapeDtypeStruct((8, 128), F32),
            jax.ShapeDtypeStruct((4, 32), F32))
    a, b, c = _emulate(kernel, outs, x, grid=(1,))
    np.testing.assert_array_equal(a, x[1:24:3, :128])
    np.testing.assert_array_equal(b, x[:8, 0:256:2])
    np.testing.assert_array_equal(c, x[2:18:4, 2:162:5])


def test_a_strided_store_leaves_the_other_rows():
    x = _x((8, 128))

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.full((16, 128), -1.0, F32)
        o_ref[pl.ds(1, 8, stride=2), :] = x_ref[...] * 2

    (out,) = _emulate(kernel, jax.ShapeDtypeStruct((16, 128), F32), x)
    want = np.full((16, 128), -1.0, np.float32)
    want[1::2] = x * 2
    np.testing.assert_array_equal(out, want)


def test_a_strided_window_of_a_small_array_and_of_int8_bools():
    x = _x((8, 16))

    def kernel(x_ref, o_ref, b_ref):
        o_ref[...] = x_ref[pl.ds(0, 4, stride=2), pl.ds(1, 4, stride=4)]
        b_ref[...] = (x_ref[pl.ds(0, 4, stride=2), :] > 0).astype(jnp.int32)

    outs = (jax.ShapeDtypeStruct((4, 4), F32), jax.ShapeDtypeStruct((4, 16), jnp.int32))
    o, b = _emulate(kernel, outs, x)
    np.testing.assert_array_equal(o, x[0:8:2, 1:16:4])
    np.testing.assert_array_equal(b, (x[0:8:2] > 0).astype(np.int32))


# --- masks ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_a_masked_load_reads_other_where_the_mask_is_off(dtype):
    x = _x((8, 128), dtype)

    def kernel(x_ref, o_ref, z_ref):
        m = (_iota((8, 128), 1) + _iota((8, 128), 0)) % 3 == 0
        o_ref[...] = pl.load(x_ref, (slice(None), slice(None)), mask=m, other=7)
        z_ref[...] = pl.load(x_ref, (slice(None), slice(None)), mask=m)  # zeros

    outs = (jax.ShapeDtypeStruct(x.shape, dtype),) * 2
    o, z = _emulate(kernel, outs, x)
    m = (np.arange(128)[None] + np.arange(8)[:, None]) % 3 == 0
    np.testing.assert_array_equal(o, np.where(m, x, 7).astype(dtype))
    np.testing.assert_array_equal(z, np.where(m, x, 0).astype(dtype))


def test_a_masked_load_past_the_end_of_a_ref_reads_only_what_the_mask_allows():
    # rows 8..23 of a 16-row block: the mask keeps rows < 16, the rest are never read.
    x = _x((16, 128))

    def kernel(x_ref, o_ref):
        start = pl.program_id(0) + 8
        rows = start + _iota((16, 128), 0)
        o_ref[...] = pl.load(x_ref, (pl.ds(start, 16), slice(None)), mask=rows < 16,
                             other=-1.0)

    (out,) = _emulate(kernel, jax.ShapeDtypeStruct((16, 128), F32), x, grid=(1,))
    np.testing.assert_array_equal(out[:8], x[8:])
    np.testing.assert_array_equal(out[8:], -1.0)


def test_masked_stores_write_only_where_the_mask_holds():
    x, k = _x((8, 128)), np.array([1, -1, 2, 3, -4, 5, -6, 0], np.float32)

    def kernel(x_ref, k_ref, o_ref, s_ref):
        o_ref[...] = jnp.full((8, 128), -1.0, F32)
        v = x_ref[...]
        pl.store(o_ref, (slice(None), slice(None)), v * 10, mask=v > 0)
        s_ref[...] = jnp.zeros((8,), F32)  # a small array: one thread writes it
        pl.store(s_ref, (slice(None),), jnp.full((8,), 3.0, F32), mask=k_ref[...] > 0)

    outs = (jax.ShapeDtypeStruct((8, 128), F32), jax.ShapeDtypeStruct((8,), F32))
    o, s = _emulate(kernel, outs, x, k)
    np.testing.assert_array_equal(o, np.where(x > 0, x * 10, -1.0))
    np.testing.assert_array_equal(s, np.where(k > 0, 3.0, 0.0))


def test_a_masked_swap_exchanges_only_where_the_mask_holds():
    x, y = _x((8, 128)), _x((8, 128)) + 100

    def kernel(x_ref, y_ref, o_ref, old_ref):
        o_ref[...] = y_ref[...]
        m = _iota((8, 128), 1) % 4 == 1
        old_ref[...] = pl.swap(o_ref, (slice(None), slice(None)), x_ref[...], mask=m)

    outs = (jax.ShapeDtypeStruct(x.shape, F32),) * 2
    o, old = _emulate(kernel, outs, x, y)
    m = np.arange(128)[None] % 4 == 1
    np.testing.assert_array_equal(o, np.where(m, x, y))
    np.testing.assert_array_equal(old, np.where(m, y, x))


def test_unmasked_pl_load_and_pl_store_are_ref_reads_and_writes():
    x = _x((16, 128))

    def kernel(x_ref, o_ref):
        top = pl.load(x_ref, (pl.ds(0, 8), slice(None)))
        pl.store(o_ref, (pl.ds(8, 8), slice(None)), top + 1)
        pl.store(o_ref, (pl.ds(0, 8), slice(None)), pl.load(x_ref, (pl.ds(8, 8),)))

    (out,) = _emulate(kernel, jax.ShapeDtypeStruct(x.shape, F32), x)
    np.testing.assert_array_equal(out, np.concatenate([x[8:], x[:8] + 1]))


def test_a_mask_on_a_tiled_smem_ref_is_refused_naming_it():
    import pallas_mosaic_gpu as plgpu

    x = _x((64, 64))

    def kernel(x_ref, o_ref):
        def body(buf):
            pl.store(buf, (slice(None), slice(None)), x_ref[...], mask=x_ref[...] > 0)

        pl.run_scoped(body, plgpu.SMEM((64, 64), F32, transforms=(
            plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))))
        o_ref[...] = x_ref[...]

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, F32),
                       backend="mosaic_gpu")
    with pytest.raises(NotImplementedError, match=r"masked_swap.*layout transforms"):
        jax.jit(f).trace(x)


# --- BoundedSlice block dims ----------------------------------------------------------


def test_a_bounded_slice_block_writes_back_only_its_valid_rows():
    # Blocks of at most 8 rows at 0, 8, 16 holding 5 valid rows each: the other rows of
    # the output keep the values of the input it aliases.
    x, y = _x((24, 128)), _x((24, 128)) + 100
    spec = pl.BlockSpec((pl.BoundedSlice(8), 128), lambda i: (pl.ds(i * 8, 5), 0))

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    (out,) = _emulate(kernel, jax.ShapeDtypeStruct(x.shape, F32), x, y, grid=(3,),
                      in_specs=[spec, pl.BlockSpec(memory_space=pl.ANY)], out_specs=spec,
                      input_output_aliases={1: 0})
    valid = (np.arange(24) % 8 < 5)[:, None]
    np.testing.assert_array_equal(out, np.where(valid, x * 2, y))


def test_a_bounded_slice_of_a_size_computed_from_the_program_id():
    # 20 rows in blocks of at most 8: the last block holds 4.
    x = _x((20, 128))
    spec = pl.BlockSpec((pl.BoundedSlice(8), 128),
                        lambda i: (pl.ds(i * 8, jnp.minimum(8, 20 - i * 8)), 0))

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + pl.program_id(0).astype(F32)

    (out,) = _emulate(kernel, jax.ShapeDtypeStruct(x.shape, F32), x, grid=(3,),
                      in_specs=[spec], out_specs=spec)
    np.testing.assert_array_equal(out, x + (np.arange(20) // 8)[:, None].astype(np.float32))
