"""Interpreter rules of the TPU primitives: the numbers, compared with plain JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu

ANY = pltpu.MemorySpace.ANY


def _double_buffered(x, interpret=True):
    """Streams x (in HBM) through two VMEM slots with manual DMAs, one grid step a block."""

    def kernel(x_hbm, o_ref, buf, sem):
        i, n = pl.program_id(0), pl.num_programs(0)
        slot = i % 2

        def copy(j, s):
            return pltpu.make_async_copy(x_hbm.at[pl.ds(j * 8, 8)], buf.at[s], sem.at[s])

        @pl.when(i == 0)
        def _():
            copy(0, 0).start()

        @pl.when(i + 1 < n)
        def _():
            copy(i + 1, 1 - slot).start()

        copy(i, slot).wait()
        o_ref[...] = jnp.tanh(buf[slot]) * 2.0 + 1.0

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec(memory_space=ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=interpret,
    )(x)


def test_double_buffered_dma_matches_jax(rng):
    x = jnp.asarray(rng.standard_normal((64, 128)), jnp.float32)
    out = jax.jit(_double_buffered)(x)
    np.testing.assert_allclose(out, jnp.tanh(x) * 2 + 1, rtol=1e-6, atol=1e-6)


def test_dma_semaphore_counts_bytes():
    def kernel(x_hbm, o_ref, buf, sem, count):
        cp = pltpu.make_async_copy(x_hbm, buf, sem)
        cp.start()
        count[0] = pl.semaphore_read(sem)
        cp.wait()
        count[1] = pl.semaphore_read(sem)
        o_ref[...] = buf[...]

    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    out, counts = pl.pallas_call(
        lambda x, o, c, buf, sem: kernel(x, o, buf, sem, c),
        out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((2,), jnp.int32)),
        in_specs=[pl.BlockSpec(memory_space=ANY)],
        out_specs=(pl.BlockSpec((8, 128), lambda: (0, 0)),
                   pl.BlockSpec(memory_space=pltpu.MemorySpace.SMEM)),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=True,
    )(x)
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(counts, [8 * 128 * 4, 0])


def test_sync_copy_and_async_copy_add():
    def kernel(x_hbm, o_hbm, buf, sem):
        pltpu.sync_copy(x_hbm, buf)
        pltpu.async_copy(x_hbm, buf, sem, add=True).wait()  # buf = 2x
        pltpu.sync_copy(buf, o_hbm)

    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=ANY)], out_specs=pl.BlockSpec(memory_space=ANY),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA],
        interpret=True,
    )(x)
    np.testing.assert_array_equal(out, 2 * x)


def test_a_dma_between_mismatched_refs_is_traced_but_fails_when_it_runs():
    """As upstream, a descriptor (and a kernel jaxpr holding its start) may join refs of
    different shapes or dtypes; running or lowering that start is the error."""
    def kernel(x_hbm, o_ref, buf, sem):
        pltpu.make_async_copy(x_hbm, buf, sem).start()

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=ANY)],
        scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=True,
    )
    x = jnp.zeros((8, 128))
    assert jax.eval_shape(f, x).shape == (8, 128)  # traced: the kernel is well typed
    with pytest.raises(ValueError, match=r"source \(float32\[8,128\]\) and destination "
                                         r"\(float32\[16,128\]\).*same shape and dtype"):
        f(x)


def test_dma_wait_without_start_is_reported():
    def kernel(x_hbm, o_ref, buf, sem):
        pltpu.make_async_copy(x_hbm, buf, sem).wait()
        o_ref[...] = buf[...]

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=ANY)],
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        interpret=True,
    )
    with pl.enable_debug_checks(True), pytest.raises(Exception, match="block forever"):
        jax.block_until_ready(f(jnp.zeros((8, 128))))


def test_regular_semaphores_and_run_scoped():
    def kernel(o_ref):
        def body(sem, scratch):
            pl.semaphore_signal(sem, 3)
            pl.semaphore_wait(sem, 2)
            scratch[...] = jnp.full(scratch.shape, 5.0)
            o_ref[...] = scratch[...] + pl.semaphore_read(sem).astype(jnp.float32)

        pl.run_scoped(body, pltpu.SemaphoreType.REGULAR, pltpu.VMEM((8, 128), jnp.float32))

    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                         interpret=True)()
    np.testing.assert_array_equal(out, 6.0)


def test_scalar_prefetch_in_smem(rng):
    idx = jnp.array([3, 0, 2, 1], jnp.int32)
    x = jnp.asarray(rng.standard_normal((4 * 8, 128)), jnp.float32)

    def kernel(idx_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] * (idx_ref[pl.program_id(0)] + 1).astype(jnp.float32)

    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(4,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, idx: (idx[i], 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, idx: (i, 0))),
        interpret=True,
    )(idx, x)
    blocks = x.reshape(4, 8, 128)
    want = jnp.concatenate([blocks[int(j)] * (int(j) + 1) for j in idx])
    np.testing.assert_allclose(out, want, rtol=1e-6)


def _run(f, *args):
    """Runs value-level ``f`` inside a one-block kernel under the interpreter."""
    out_shape = jax.eval_shape(f, *args)

    def kernel(*refs):
        ins, out = refs[:-1], refs[-1]
        out[...] = f(*[r[...] for r in ins])

    return pl.pallas_call(kernel, out_shape=out_shape, interpret=True)(*args)


@pytest.mark.parametrize("shift,axis", [(3, 1), (5, 0), (0, 1), (130, 1)])
def test_roll(rng, shift, axis):
    x = jnp.asarray(rng.standard_normal((16, 256)), jnp.float32)
    out = _run(lambda v: pltpu.roll(v, shift, axis), x)
    np.testing.assert_array_equal(out, jnp.roll(x, shift, axis))


def test_roll_with_dynamic_shift_and_stride(rng):
    x = jnp.asarray(rng.standard_normal((8, 128)), jnp.float32)
    out = _run(lambda v, s: pltpu.roll(v, s[0, 0], 1, stride=1, stride_axis=0), x,
               jnp.full((8, 128), 2, jnp.int32))
    want = jnp.stack([jnp.roll(x[i], 2 + i) for i in range(8)])
    np.testing.assert_array_equal(out, want)


def test_bitcast_round_trip(rng):
    x = jnp.asarray(rng.standard_normal((16, 128)), jnp.float32)
    y = _run(lambda v: pltpu.bitcast(v, jnp.bfloat16), x)
    assert y.shape == (32, 128) and y.dtype == jnp.bfloat16
    back = _run(lambda v: pltpu.bitcast(v, jnp.float32), y)
    np.testing.assert_array_equal(back, x)
    same = _run(lambda v: pltpu.bitcast(v, jnp.int32), x)
    np.testing.assert_array_equal(same, jax.lax.bitcast_convert_type(x, jnp.int32))


def test_einshape(rng):
    x = jnp.asarray(rng.standard_normal((8, 256)), jnp.float32)
    out = _run(lambda v: pltpu.einshape("m(nk)->nmk", v, k=128), x)
    np.testing.assert_array_equal(out, x.reshape(8, 2, 128).transpose(1, 0, 2))
    out = _run(lambda v: pltpu.einshape("nmk->n(mk)", v), out)
    assert out.shape == (2, 8 * 128)


def test_pack_unpack_elementwise(rng):
    a = jnp.asarray(rng.standard_normal((8, 128)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((8, 128)), jnp.float32)
    packed = _run(lambda x, y: pltpu.pack_elementwise([x, y], packed_dtype=jnp.bfloat16), a, b)
    assert packed.dtype == jnp.uint32
    for i, v in enumerate((a, b)):
        out = _run(lambda p, i=i: pltpu.unpack_elementwise(
            p, index=i, packed_dtype=jnp.bfloat16, unpacked_dtype=jnp.float32), packed)
        np.testing.assert_array_equal(out, v.astype(jnp.bfloat16).astype(jnp.float32))


def test_stochastic_round_brackets_and_is_unbiased():
    x = jnp.full((64, 128), 1.0 + 2.0**-10, jnp.float32)  # between two bf16 neighbours
    bits = jax.random.bits(jax.random.key(1), x.shape, jnp.uint32)
    out = _run(lambda v, r: pltpu.stochastic_round(v, r, target_dtype=jnp.bfloat16), x, bits)
    assert out.dtype == jnp.bfloat16
    vals = set(np.unique(np.asarray(out, np.float32)).tolist())
    assert vals <= {1.0, 1.0 + 2.0**-7} and len(vals) == 2
    np.testing.assert_allclose(float(out.astype(jnp.float32).mean()), 1.0 + 2.0**-10, rtol=2e-4)


def test_prng_is_deterministic_in_the_seed():
    def kernel(o_ref):
        pltpu.prng_seed(7, pl.program_id(0))
        o_ref[...] = pltpu.prng_random_bits(o_ref.shape)

    def run():
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.int32),
                              grid=(2,), out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                              interpret=True)()

    a, b = run(), run()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a[:8], a[8:])  # different seeds per program
    assert len(np.unique(np.asarray(a))) > 1000


def test_stateful_samplers_ranges():
    def kernel(u_ref, n_ref, b_ref):
        pltpu.prng_seed(3)
        u_ref[...] = pltpu.stateful_uniform(u_ref.shape, minval=2.0, maxval=3.0)
        n_ref[...] = pltpu.stateful_normal(n_ref.shape)
        b_ref[...] = pltpu.stateful_bernoulli(b_ref.shape, 0.25).astype(jnp.int32)

    s = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    u, n, b = pl.pallas_call(kernel, out_shape=(s, s, jax.ShapeDtypeStruct((64, 128), jnp.int32)),
                             interpret=True)()
    assert 2.0 <= float(u.min()) and float(u.max()) < 3.0
    assert abs(float(n.mean())) < 0.05 and abs(float(n.std()) - 1) < 0.05
    assert abs(float(b.mean()) - 0.25) < 0.03


def test_trace_value_touch_and_memory_space_constraint():
    def kernel(x_ref, o_ref):
        pltpu.trace_value("x00", x_ref[0, 0])
        pltpu.touch(x_ref)
        o_ref[...] = x_ref[...]

    x = jnp.ones((8, 128))
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                         interpret=True)(pltpu.with_memory_space_constraint(x, pltpu.HBM))
    np.testing.assert_array_equal(out, x)


def test_to_pallas_key_makes_a_pallas_tpu_key():
    k = pltpu.to_pallas_key(jax.random.key(0))
    assert str(jax.random.key_impl(k)) == "pallas_tpu"
    assert k.shape == () and jax.random.key_data(k).shape == (1, 2)


def test_remote_dma_in_interpreter_is_not_silently_wrong():
    def kernel(x_hbm, o_hbm, send, recv):
        pltpu.make_async_remote_copy(x_hbm, o_hbm, send, recv, device_id=0,
                                     device_id_type=pl.DeviceIdType.LOGICAL).start()

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=ANY)], out_specs=pl.BlockSpec(memory_space=ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA], interpret=True)
    with pytest.raises(NotImplementedError, match="remote DMAs"):
        f(jnp.zeros((8, 128)))


def test_dma_between_reshaped_views_copies_in_row_major_order():
    """A DMA's source and destination may be ``ref.reshape`` views (of HBM or VMEM)."""
    def kernel(x_hbm, y_hbm):
        def body(sem, buf):
            pltpu.async_copy(x_hbm.reshape(16, 128).at[:8], buf.reshape(8, 128), sem).wait()
            pltpu.async_copy(buf.reshape(8, 128), y_hbm.reshape(8, 128), sem).wait()

        pl.run_scoped(body, pltpu.SemaphoreType.DMA, pltpu.VMEM((2, 4, 128), jnp.int32))

    x = jnp.arange(16 * 128, dtype=jnp.int32).reshape(16, 1, 128)
    y = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 1, 128), jnp.int32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY), interpret=True)(x)
    np.testing.assert_array_equal(y, x[:8])


def _copy_with(sem_type, use_sem):
    def kernel(x_hbm, y_hbm):
        pl.run_scoped(lambda sem: use_sem(x_hbm, y_hbm, sem), sem_type)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=ANY)], out_specs=pl.BlockSpec(memory_space=ANY),
        interpret=True)


def test_a_dma_signals_one_semaphore_not_an_array_of_them():
    f = _copy_with(pltpu.SemaphoreType.DMA((1,)),
                   lambda x, y, sem: pltpu.async_copy(x, y, sem).wait())
    with pytest.raises(ValueError, match=r"Cannot signal a DMA semaphore view of shape \(1,\)"):
        jax.eval_shape(f, jnp.zeros((8, 128)))
    g = _copy_with(pltpu.SemaphoreType.DMA((1,)),
                   lambda x, y, sem: pltpu.async_copy(x, y, sem.at[0]).wait())
    np.testing.assert_array_equal(g(jnp.ones((8, 128))), 1.0)


def test_a_dma_wait_on_a_regular_semaphore_points_to_semaphore_wait():
    f = _copy_with(pltpu.SemaphoreType.REGULAR,
                   lambda x, y, sem: pltpu.async_copy(x, y, sem).wait())
    with pytest.raises(ValueError, match="REGULAR semaphore.*pl.semaphore_wait"):
        jax.eval_shape(f, jnp.zeros((8, 128)))
