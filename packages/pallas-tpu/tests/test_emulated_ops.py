"""Kernels of upstream's ``tpu_ops_test`` shapes on an emulated TPU v5e: the Mosaic TPU
lowering (checked by libtpu where installed) and the executor of the generated module
agree with numpy. Each case was a gap: a lowering rule, an executor op, or an
interpreter rule that disagreed with the device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu


def _emulated(f, *args):
    with pl.emulate_device("tpu:v5e"):
        return f(*args)


@pytest.mark.parametrize("fn", [jnp.argmax, jnp.argmin])
def test_argmax_of_a_1d_block_keeps_its_dims(fn):
    # Mosaic has no 1-D iota ("iota rank below 2D unsupported"): the index is computed
    # in (1, n) and reduced to the scalar.
    x = jax.random.permutation(jax.random.key(22), jnp.arange(12, dtype=jnp.float32))

    def kernel(x_ref, o_ref):
        o_ref[...] = fn(x_ref[...], 0, keepdims=True)

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32))
    np.testing.assert_array_equal(_emulated(call, x), fn(x, 0, keepdims=True))


@pytest.mark.parametrize("mode", [None, "clip", "promise_in_bounds"])
@pytest.mark.parametrize("idx_shape,axis", [((8, 128), -1), ((8, 128), -2),
                                            ((2, 32, 256), -1), ((2, 32, 256), -2)])
def test_take_along_axis_lowers_to_dynamic_gather(idx_shape, axis, mode):
    x_shape = list(idx_shape)
    x_shape[axis] = (8, 128)[axis]  # one vreg along the gathered axis
    x = np.arange(np.prod(x_shape), dtype=np.int32).reshape(x_shape)
    n = x_shape[axis]
    lo, hi = (0, n) if mode == "promise_in_bounds" else (-n - 3, n + 3)  # out of range too
    idx = jax.random.randint(jax.random.key(1234), idx_shape, lo, hi, jnp.int32)

    def kernel(x_ref, i_ref, o_ref):
        o_ref[...] = jnp.take_along_axis(x_ref[...], i_ref[...], axis, mode=mode)

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(idx_shape, jnp.int32))
    np.testing.assert_array_equal(_emulated(call, x, idx),
                                  jnp.take_along_axis(x, idx, axis, mode=mode))


def test_take_along_axis_is_a_dynamic_gather(lower_tpu, ops):
    def kernel(x_ref, i_ref, o_ref):
        o_ref[...] = jnp.take_along_axis(x_ref[...], i_ref[...], -1,
                                         mode="promise_in_bounds")

    x = jnp.zeros((8, 128), jnp.int32)
    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32))
    _, (module,) = lower_tpu(f, x, x)
    assert ops(module).count("tpu.dynamic_gather") == 1


def test_matrix_vector_and_vector_matrix_products():
    k = jax.random.split(jax.random.key(42), 3)
    a = jax.random.normal(k[0], (8, 8))
    b = jax.random.normal(k[1], (8,))
    c = jax.random.normal(k[2], (8, 16))

    def kernel(a_ref, b_ref, c_ref, o_ref, p_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...])
        p_ref[...] = jnp.dot(b_ref[...], c_ref[...])

    call = pl.pallas_call(kernel, out_shape=(jax.ShapeDtypeStruct((8,), jnp.float32),
                                             jax.ShapeDtypeStruct((16,), jnp.float32)))
    mv, vm = _emulated(call, a, b, c)
    hi = jax.lax.Precision.HIGHEST
    np.testing.assert_allclose(mv, jnp.dot(a, b, precision=hi), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(vm, jnp.dot(b, c, precision=hi), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.uint8, jnp.uint32])
def test_unsigned_dot_is_refused_as_upstream(dtype):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] @ y_ref[...]

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), dtype))
    with pytest.raises(NotImplementedError, match="Unsigned integer dtype.*dot_general.*matmul"):
        _emulated(call, jnp.zeros((8, 256), dtype), jnp.zeros((256, 128), dtype))


def test_fuse_transposed_lhs_in_matmul(lower_tpu, ops):
    k1, k2 = jax.random.split(jax.random.key(42))
    lhs = jax.random.normal(k1, (512, 128)).astype(jnp.bfloat16).astype(jnp.float32)
    rhs = jax.random.normal(k2, (512, 256)).astype(jnp.bfloat16).astype(jnp.float32)

    def kernel(l_ref, r_ref, o_ref):
        o_ref[...] = jnp.einsum("km,kn->mn", l_ref[...], r_ref[...])

    params = pltpu.CompilerParams(fuse_transposed_lhs_in_matmul=True)
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 256), jnp.float32),
                          compiler_params=params)
    # The hint needs Mosaic serialization version 12; without a TPU, JAX writes 11, so
    # the hint (only a hint) is left out and the kernel still compiles and computes.
    np.testing.assert_allclose(_emulated(call, lhs, rhs),
                               jnp.einsum("km,kn->mn", lhs, rhs, precision="highest"),
                               atol=1e-4)
    _, (module,) = lower_tpu(call, lhs, rhs)
    assert "tpu.matmul" in ops(module) and "transpose_lhs_hint = true" not in str(module)


def test_stochastic_round_to_bf16_runs_in_the_executor():
    k1, k2 = jax.random.split(jax.random.key(4242))
    x = jax.random.normal(k1, (8, 128), jnp.float32)
    bits = jax.random.bits(k2, (8, 128), jnp.uint32)

    def kernel(x_ref, b_ref, o_ref):
        o_ref[...] = pltpu.stochastic_round(x_ref[...], b_ref[...], target_dtype=jnp.bfloat16)

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.bfloat16))
    got = np.asarray(_emulated(call, x, bits)).astype(np.float32)
    want = np.asarray(call_interpret(kernel, x, bits)).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    # Each result is one of the two bf16 neighbours of x.
    down = np.asarray(x).view(np.uint32) & np.uint32(0xFFFF0000)
    up = down + np.uint32(0x10000)
    assert np.all((got.view(np.uint32) == down) | (got.view(np.uint32) == up))


def call_interpret(kernel, x, bits):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.bfloat16),
                          interpret=True)(x, bits)


def test_stochastic_round_to_f16_drops_13_bits():
    # In the interpreter, f32 -> f16 drops 13 mantissa bits (not 16): noise below them
    # changes nothing. Mosaic has no f16 stochastic convert: the lowering says so.
    x = jnp.full((8, 128), 1.0 + 2.0 ** -12, jnp.float32)  # between 1 and 1 + 2**-10
    bits = jnp.full((8, 128), (1 << 13) - (1 << 11) - 1, jnp.uint32)

    def kernel(x_ref, b_ref, o_ref):
        o_ref[...] = pltpu.stochastic_round(x_ref[...], b_ref[...], target_dtype=jnp.float16)

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float16))
    # 2**-12 is 2**11 of the 13 dropped bits; adding 2**13 - 2**11 - 1 stays below the
    # next f16 (1 + 2**-10), adding 2**13 - 2**11 reaches it.
    for b, want in ((bits, 1.0), (bits + 1, 1.0 + 2.0 ** -10)):
        interpreted = pl.pallas_call(kernel, interpret=True,
                                     out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float16))
        np.testing.assert_array_equal(np.asarray(interpreted(x, b), np.float32), want)
    with pytest.raises(pltpu.LoweringException, match="stochastic_round to float16"):
        _emulated(call, x, bits)


_PACK = [(jnp.float32, jnp.bfloat16), (jnp.int32, jnp.int16), (jnp.int32, jnp.int8),
         (jnp.int32, jnp.int4), (jnp.int16, jnp.int8), (jnp.int16, jnp.int4),
         (jnp.int8, jnp.int4), (jnp.int4, jnp.int2)]


@pytest.mark.parametrize("unpacked,packed", _PACK)
def test_pack_and_unpack_elementwise(unpacked, packed):
    ub, pb = jax.dtypes.itemsize_bits(unpacked), jax.dtypes.itemsize_bits(packed)
    # int2 sub-elements need whole (8 * 16, 128) tiles.
    n, shape = ub // pb, ((128, 128) if pb == 2 else (16, 256))
    rng = np.random.default_rng(0)
    if jnp.issubdtype(unpacked, jnp.floating):
        src = jnp.asarray(rng.normal(size=(n, *shape)), unpacked)
    else:
        lim = min(100, 2 ** (ub - 1))
        src = jnp.asarray(rng.integers(-lim, lim, size=(n, *shape)), unpacked)
    # Expected words: source i's low pb bits at bit i * pb (upstream's construction).
    parts = src.astype(packed).view(getattr(jnp, f"uint{pb}")).astype(jnp.uint32)
    shifts = (jnp.arange(n, dtype=jnp.uint32) * pb)[:, None, None]
    word_t = getattr(jnp, f"uint{ub}")
    words = jnp.bitwise_or.reduce(parts << shifts, axis=0).astype(word_t)

    def pack(xs_ref, o_ref):
        o_ref[...] = pltpu.pack_elementwise([xs_ref[i] for i in range(n)], packed_dtype=packed)

    pcall = pl.pallas_call(pack, out_shape=jax.ShapeDtypeStruct(shape, word_t))
    np.testing.assert_array_equal(_emulated(pcall, src), words)
    np.testing.assert_array_equal(
        pl.pallas_call(pack, out_shape=jax.ShapeDtypeStruct(shape, word_t),
                       interpret=True)(src), words)
    for index in range(n):
        def unpack(x_ref, o_ref, index=index):
            o_ref[...] = pltpu.unpack_elementwise(x_ref[...], index=index,
                                                  packed_dtype=packed, unpacked_dtype=unpacked)

        want = src[index].astype(packed).astype(unpacked)
        ucall = pl.pallas_call(unpack, out_shape=jax.ShapeDtypeStruct(shape, unpacked))
        np.testing.assert_array_equal(_emulated(ucall, words), want)
        np.testing.assert_array_equal(
            pl.pallas_call(unpack, out_shape=jax.ShapeDtypeStruct(shape, unpacked),
                           interpret=True)(words), want)


def test_ops_above_are_in_the_executor():
    from pallas_tpu._src.executor import ops_tpu  # noqa: F401 - registers the tpu ops
    from pallas_tpu.executor import OPS

    for name in ("tpu.dynamic_gather", "tpu.stochastic_convert", "tpu.pack_elementwise",
                 "tpu.unpack_elementwise"):
        assert name in OPS


@pytest.mark.parametrize("axis", [0, 1])
def test_bitcast_under_vmap_keeps_the_batch_axis(axis):
    # As upstream's batching rule: the batched array is bitcast whole.
    import functools

    def kernel(x_ref, o_ref):
        o_ref[...] = jax.vmap(functools.partial(pltpu.bitcast, ty=jnp.uint8),
                              in_axes=axis, out_axes=axis)(x_ref[...])

    want = np.random.default_rng(0).integers(0, 255, (2, 16, 4, 128), dtype=np.uint8)
    x = np.ascontiguousarray(want.swapaxes(-1, -2)).view(np.uint32)[..., 0]
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((2, 64, 128), jnp.uint8),
                         interpret=True)(x)
    np.testing.assert_array_equal(out, want.reshape(2, 64, 128))


@pytest.mark.parametrize("src,dst", [(jnp.int8, jnp.int4), (jnp.int4, jnp.float32),
                                     (jnp.int4, jnp.int16), (jnp.bfloat16, jnp.int4),
                                     (jnp.float8_e5m2, jnp.int32)])
@pytest.mark.parametrize("of_ref", [True, False])
def test_bitcast_of_sub_byte_types(src, dst, of_ref):
    # The executor's memref bitcast counts int4 as 4 bits (two to a byte): an (m, n) i8
    # memref read as i4 is (2m, n), row 2r + j holding nibble j of row r.
    def rows(dt):
        return 32 // jax.dtypes.itemsize_bits(dt)

    def kernel(x_ref, y_ref):
        if of_ref:
            y_ref[...] = x_ref.bitcast(dst)[...]
        else:  # a vector bitcast (tpu.bitcast)
            y_ref[...] = pltpu.bitcast(x_ref[...], dst)

    x = np.arange(rows(src) * 256).astype(src).reshape(rows(src), 256)
    shape = jax.ShapeDtypeStruct((rows(dst), 256), dst)
    want = pl.pallas_call(kernel, out_shape=shape, interpret=True)(x)
    got = _emulated(pl.pallas_call(kernel, out_shape=shape), x)
    np.testing.assert_array_equal(np.asarray(got).astype(np.float32),
                                  np.asarray(want).astype(np.float32))


def test_trace_value_runs_emulated_and_leaves_the_result_alone():
    # upstream's tpu_trace_value_test: the chip records the values in its profiler
    # trace; the executor has nothing to compute (it refused the op before).
    def kernel(x_ref, s_ref, o_ref):
        pltpu.trace_value("constant_value", jnp.float32(42.42))
        scale = s_ref[0]
        pltpu.trace_value("scale_value", scale)
        o_ref[...] = x_ref[...] + scale.astype(jnp.float32)

    x = jnp.ones((8, 128), jnp.float32)
    s = jnp.array([7], jnp.int32)
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pltpu.SMEM)],
        compiler_params=pltpu.CompilerParams(has_side_effects=True))
    np.testing.assert_array_equal(_emulated(call, x, s), x + 7.0)
