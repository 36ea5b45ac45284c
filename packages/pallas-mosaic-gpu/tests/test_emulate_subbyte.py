"""The executor holds 4-bit integers (``i4``) two to a byte in memory, element ``2k`` in
the low nibble of byte ``k`` (LLVM's order within a ``vector<Nxi4>`` and XLA's packing of
int4 buffers); in registers a value holds one element per item. So kernels that upcast
int4/uint4 arrays run at emulate and match ``astype``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.executor import subbyte

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")


def test_two_4_bit_elements_share_a_byte_the_first_in_the_low_nibble():
    v = np.asarray([[1, -2, 7, -8]], jnp.int4)
    np.testing.assert_array_equal(subbyte.pack(v), [[0xE1, 0x87]])
    np.testing.assert_array_equal(subbyte.unpack(np.asarray([[0xE1, 0x87]], np.uint8)), v)
    np.testing.assert_array_equal(
        subbyte.unpack(np.asarray([[0xE1]], np.uint8), jnp.uint4).astype(int), [[1, 14]])


def test_a_bitcast_of_eight_4_bit_elements_is_one_32_bit_word():
    v = np.arange(-4, 4, dtype=np.int8).astype(jnp.int4)[None]  # -4 .. 3
    word = subbyte.from_bytes(subbyte.to_bytes(v), np.dtype(np.uint32), ())
    assert int(word[0]) == 0x3210FEDC
    np.testing.assert_array_equal(
        subbyte.from_bytes(subbyte.to_bytes(word), jnp.int4, (8,)), v)


@pytest.mark.parametrize("small", [jnp.int4, jnp.uint4])
@pytest.mark.parametrize("large", [jnp.float8_e4m3fn, jnp.float16, jnp.bfloat16, jnp.float32,
                                   jnp.int8, jnp.int32])
def test_a_4_bit_array_upcasts_at_emulate(emulate, small, large):
    shape = (64, 256)

    def body(x_gmem, o_gmem):
        o_gmem[...] = plgpu.load(x_gmem, (), layout=plgpu.Layout.WGMMA,
                                 optimized=False).astype(large)

    f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(shape, large))
    info = jnp.iinfo(small)
    x = jax.random.randint(jax.random.key(1), shape, int(info.min), int(info.max) + 1,
                           jnp.int32).astype(small)
    (got,) = emulate(f, x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x.astype(large)))


@pytest.mark.parametrize("col", [0, 1])  # the low and the high nibble of byte 0
@pytest.mark.parametrize("value", [0, -3])
def test_a_scalar_read_of_a_4_bit_element_reads_its_nibble(emulate, col, value):
    shape = (64, 256)

    def body(x_gmem, o_gmem):
        x = plgpu.load(x_gmem, (), layout=plgpu.Layout.WGMMA, optimized=False)
        o_gmem[...] = x.astype(jnp.float32) + x_gmem[0, col].astype(jnp.float32)

    f = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(shape, jnp.float32))
    x = jnp.full(shape, 5, jnp.int4).at[0, col].set(value)
    (got,) = emulate(f, x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x, np.float32) + value)
