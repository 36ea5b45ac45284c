"""The executor runs two pieces of inline PTX Mosaic GPU emits, as PTX specifies them:
``prmt.b32`` byte permutes (transposed register layouts, sub-byte upcast tables) and the
predicated non-tensor bulk copy GMEM -> SMEM that completes its bytes on an mbarrier
(``copy_gmem_to_smem`` of a contiguous slice that may run past the array's end)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.executor.ops_prmt import prmt

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")


# -- prmt.b32, default mode --------------------------------------------------------------


def test_prmt_numbers_the_bytes_of_a_then_b_from_the_least_significant():
    a, b = 0x33221100, 0x77665544
    assert prmt(a, b, 0x3210) == 0x33221100
    assert prmt(a, b, 0x7654) == 0x77665544
    assert prmt(a, b, 0x0415) == 0x00441155
    assert prmt(a, b, 0x5140) == 0x55114400


def test_prmt_selector_bit_3_replicates_the_selected_bytes_sign():
    a, b = 0x7F80FF01, 0x00000000
    # nibbles 8+k: byte k's sign bit over all eight bits
    assert prmt(a, b, 0x8888) == 0x00000000  # byte 0 is 0x01: positive
    assert prmt(a, b, 0x9999) == 0xFFFFFFFF  # byte 1 is 0xFF: negative
    assert prmt(a, b, 0xBA98) == 0x00FFFF00
    assert prmt(a, b, 0xB210) == 0x0080FF01


def test_prmt_works_lane_by_lane_on_signed_words():
    a = np.asarray([-1, 0x01020304], np.int32)
    got = prmt(a, np.int32(0), 0x0123)
    np.testing.assert_array_equal(got, np.asarray([0xFFFFFFFF, 0x04030201], np.uint32))


@pytest.mark.parametrize("layout,transposed", [
    (plgpu.Layout.WGMMA, plgpu.Layout.WGMMA_TRANSPOSED),
    (plgpu.Layout.TCGEN05, plgpu.Layout.TCGEN05_TRANSPOSED),
])
def test_a_16_bit_array_cast_to_a_transposed_layout_is_stored_transposed(
        emulate, layout, transposed):
    shape = (128, 64)

    def body(o_ref):
        iota = plgpu.broadcasted_iota(jnp.float16, shape, 0, layout=layout) * shape[1]
        iota += plgpu.broadcasted_iota(jnp.float16, shape, 1, layout=layout)
        plgpu.transpose_ref(o_ref, (1, 0))[...] = plgpu.layout_cast(iota, transposed)

    t = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    f = functools.partial(pl.pallas_call, out_shape=jax.ShapeDtypeStruct(shape[::-1], jnp.float16),
                          out_specs=plgpu.BlockSpec(transforms=t), backend="mosaic_gpu")(body)
    (got,) = emulate(f)
    want = np.arange(np.prod(shape), dtype=np.float16).reshape(shape).T
    np.testing.assert_array_equal(np.asarray(got), want)


# -- cp.async.bulk GMEM -> SMEM -------------------------------------------------------------


def _bulk_load(start: int, oob_mode):
    size = 128

    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((size,), jnp.int8),
                       scratch_types=[plgpu.SMEM((size,), jnp.int8), plgpu.Barrier()])
    def kernel(start_ref, x_ref, o_ref, smem, barrier):
        smem[...] = jnp.full(smem.shape, -1, jnp.int8)
        plgpu.commit_smem()
        plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(start_ref[...], size)], smem, barrier,
                                oob_mode=oob_mode)
        plgpu.barrier_wait(barrier)
        o_ref[...] = smem[...]

    return kernel, jnp.asarray(start, jnp.int32)


@pytest.mark.parametrize("start", [0, 80])
def test_a_bulk_copy_promised_in_bounds_copies_the_slice(emulate, start):
    x = jnp.arange(208, dtype=jnp.int8)
    f, s = _bulk_load(start, plgpu.OOBFillMode.PROMISE_IN_BOUNDS)
    (got,) = emulate(f, s, x)
    np.testing.assert_array_equal(np.asarray(got), np.arange(start, start + 128, dtype=np.int8))


@pytest.mark.parametrize("start", [0, 112, 192, 208])
def test_a_bulk_copy_past_the_end_copies_what_is_there_and_completes_the_barrier(
        emulate, start):
    """The copy is clamped to the bytes inside the array; the barrier still completes
    (the rest are completed as transaction bytes), and SMEM past them keeps its -1s."""
    x = jnp.arange(208, dtype=jnp.int8)
    f, s = _bulk_load(start, plgpu.OOBFillMode.UNDEFINED)
    (got,) = emulate(f, s, x)
    valid = np.arange(start, 208).astype(np.int8)[:128]
    np.testing.assert_array_equal(np.asarray(got)[:valid.size], valid)
    np.testing.assert_array_equal(np.asarray(got)[valid.size:], -1)
