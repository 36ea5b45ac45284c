"""Value ops of upstream's ``tpu_pallas_test`` MiscellaneousTest on an emulated v5e (the
module our lowering generates, compiled by libtpu where it is installed and run by the
executor): strided rolls of packed types, ``jnp.stack``/``jnp.unstack`` and
``pltpu.bitcast`` between widths."""

from __future__ import annotations

import collections
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins
import pallas_tpu as pltpu
from pallas_tpu import compiler


def _emulated(f, *args):
    """``f(*args)`` on an emulated v5e, and the record of the kernel it ran last."""
    with pl.emulate_device("tpu:v5e"):
        out = f(*args)
    k = [k for k in pallas.plugins.emulated_kernels() if k.device.spec == "tpu:v5e"][-1]
    if compiler.libtpu_available():
        assert k.compiled is not None, k.compile_skipped
    return out, k


def _strided_roll(shape, dtype, shift, stride):
    def kernel(x_ref, o_ref):
        o_ref[...] = pltpu.roll(x_ref[...], shift=shift, axis=1, stride=stride,
                                stride_axis=0)

    return lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, dtype))(x)


def _strided_roll_reference(x, shift, stride):
    return np.concatenate([np.roll(x[i:i + 1], shift + i * stride, axis=1)
                           for i in range(x.shape[0])])


@pytest.mark.parametrize("shape, shift, stride", [((8, 128), 3, 1), ((16, 256), 129, 2),
                                                  ((2, 128), 0, 1)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.int8, jnp.float32])
def test_strided_roll_of_packed_types_runs_and_compiles(shape, shift, stride, dtype):
    # Regression: a strided rotation of bf16 (int8, ...) was emitted packed, which libtpu
    # 0.0.42.1 rejects on every chip ("unsupported packed type rotation"); it is now done
    # on the bits widened to i32 (upstream's test_roll_static_lane_shift_with_stride_...).
    x = np.arange(math.prod(shape)).reshape(shape).astype(dtype)
    out, _ = _emulated(_strided_roll(shape, dtype, shift, stride), x)
    np.testing.assert_array_equal(np.asarray(out), _strided_roll_reference(x, shift, stride))


def test_strided_roll_of_a_packed_type_rotates_its_bits_as_i32(lower_tpu, ops):
    shape = (8, 128)
    x = jnp.zeros(shape, jnp.bfloat16)
    _, (m,) = lower_tpu(_strided_roll(shape, jnp.bfloat16, 3, 1), x)
    names = collections.Counter(ops(m))
    assert names["tpu.dynamic_rotate"] == 1
    assert names["arith.bitcast"] == 2 and names["arith.extui"] == 1
    assert names["arith.trunci"] == 1
    assert "tpu.dynamic_rotate" in str(m) and "vector<8x128xi32>" in str(m)
    # Without a stride a packed rotation stays packed (libtpu rotates it natively).
    def kernel(x_ref, o_ref):
        o_ref[...] = pltpu.roll(x_ref[...], 3, 1)

    f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, x.dtype))(x)  # noqa: E731
    _, (m,) = lower_tpu(f, x)
    assert "arith.extui" not in ops(m)


def test_stack_of_blocks_and_of_scalars():
    # Regression: jnp.stack's primitive had no TPU lowering rule (upstream's
    # test_float32_stack, test_float32_stack_one_operand, test_scalar_stack).
    x = np.arange(128, dtype=np.float32).reshape(1, 128)
    y = x + 128

    def two(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.stack([x_ref[...], y_ref[...]], axis=1)

    out, _ = _emulated(lambda a, b: pl.pallas_call(
        two, out_shape=jax.ShapeDtypeStruct((1, 2, 128), jnp.float32))(a, b), x, y)
    np.testing.assert_array_equal(np.asarray(out), np.stack([x, y], axis=1))

    def one(x_ref, o_ref):
        o_ref[...] = jnp.stack([x_ref[...]], axis=1)

    out, _ = _emulated(lambda a: pl.pallas_call(
        one, out_shape=jax.ShapeDtypeStruct((1, 1, 128), jnp.float32))(a), x)
    np.testing.assert_array_equal(np.asarray(out), np.stack([x], axis=1))

    def scalars(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.stack([x_ref[...], y_ref[...]], axis=0)

    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    out, _ = _emulated(lambda a, b: pl.pallas_call(
        scalars, in_specs=[smem, smem],
        out_shape=jax.ShapeDtypeStruct((2,), jnp.float32))(a, b),
        np.float32(1.0), np.float32(2.0))
    np.testing.assert_array_equal(np.asarray(out), [1.0, 2.0])


def test_unstack_to_blocks_and_to_scalars():
    # Regression: jnp.unstack's primitive had no TPU lowering rule (upstream's
    # test_float32_unstack, test_scalar_unstack).
    def kernel(x_ref, a_ref, b_ref):
        a, b = jnp.unstack(x_ref[...], axis=0)
        a_ref[...] = a
        b_ref[...] = b

    x = np.arange(2 * 128, dtype=np.float32).reshape(2, 128)
    row = jax.ShapeDtypeStruct((128,), jnp.float32)
    (a, b), _ = _emulated(lambda v: pl.pallas_call(kernel, out_shape=(row, row))(v), x)
    np.testing.assert_array_equal(np.asarray(a), x[0])
    np.testing.assert_array_equal(np.asarray(b), x[1])

    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    x = np.array([1.0, 2.0], np.float32)
    (a, b), _ = _emulated(lambda v: pl.pallas_call(
        kernel, out_specs=(smem, smem), out_shape=(scalar, scalar))(v), x)
    assert (float(a), float(b)) == (1.0, 2.0)


def test_unstack_along_the_lane_dim():
    def kernel(x_ref, *o_refs):
        for o_ref, v in zip(o_refs, jnp.unstack(x_ref[...], axis=2), strict=True):
            o_ref[...] = v

    x = np.arange(2 * 8 * 3, dtype=np.float32).reshape(2, 8, 3)
    outs, _ = _emulated(lambda v: pl.pallas_call(
        kernel, out_shape=[jax.ShapeDtypeStruct((2, 8), jnp.float32)] * 3)(v), x)
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(np.asarray(o), x[..., i])


@pytest.mark.parametrize("src, dst, shape", [(jnp.bfloat16, jnp.uint32, (16, 2, 256)),
                                             (jnp.int32, jnp.int8, (2, 8, 128)),
                                             (jnp.float32, jnp.int32, (8, 128))])
def test_vector_bitcast_between_widths_runs(src, dst, shape):
    # Regression: the executor did not implement tpu.bitcast (upstream's
    # test_bfloat16_to_uint32_bitcast). Narrow rows pack into a wide one, the first in
    # the low bits, as the interpreter's pltpu.bitcast.
    def kernel(x_ref, o_ref):
        o_ref[...] = pltpu.bitcast(x_ref[...], dst)

    x = np.arange(math.prod(shape)).reshape(shape).astype(src)
    want = pltpu.bitcast(jnp.asarray(x), dst)
    out, _ = _emulated(lambda v: pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(want.shape, dst))(v), x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
