"""PRNG in Mosaic TPU kernels: typed keys lowered as their words (``lowering/keys.py``),
the threefry hash and counters (``rules_random.py``), the executor's model of the core's
hardware PRNG (``prng_model.py``, the same numbers as TPU interpret mode), and libtpu
accepting what is generated."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
import pallas_tpu as pltpu
from pallas_tpu import compiler
from pallas_tpu import random as plrandom

SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)
needs_libtpu = pytest.mark.skipif(not compiler.libtpu_available(),
                                  reason="libtpu is not installed (pallas-tpu[compile])")


def both(f, *args):
    """``f(interpret, *args)`` under TPU interpret mode and on an emulated v5e."""
    interpreted = f(True, *args)
    with pl.emulate_device("tpu:v5e"):
        emulated = f(False, *args)
    return np.asarray(interpreted), np.asarray(emulated)


def pallas_key(seed=0):
    return pltpu.to_pallas_key(jax.random.key(seed, impl="rbg"))


# -- the hardware PRNG: executor and interpreter agree --------------------------------------


def test_hardware_prng_draws_as_interpret_mode_across_draws_and_grid_steps():
    def f(interpret):
        def body(o_ref):
            pltpu.prng_seed(7, pl.program_id(0))
            o_ref[0] = pltpu.prng_random_bits(o_ref.shape[1:])
            o_ref[1] = pltpu.prng_random_bits(o_ref.shape[1:])
            o_ref[2] = lax.bitcast_convert_type(pltpu.stateful_uniform(o_ref.shape[1:]),
                                                jnp.int32)

        return pl.pallas_call(
            body, grid=(2,), out_specs=pl.BlockSpec((3, 8, 128), lambda i: (i, 0, 0)),
            out_shape=jax.ShapeDtypeStruct((6, 8, 128), jnp.int32), interpret=interpret)()

    a, b = both(f)
    np.testing.assert_array_equal(a, b)
    assert (a[0] != a[1]).mean() > 0.99 and (a[0] != a[3]).mean() > 0.99


def test_interpreted_draws_in_a_loop_are_fresh_each_iteration():
    # The PRNG state is threaded through the traced loop: each iteration draws anew, as
    # the executor (and the chip) does.
    def f(interpret):
        def body(o_ref):
            pltpu.prng_seed(0)

            def step(i, c):
                o_ref[pl.ds(i * 8, 8), :] = pltpu.prng_random_bits((8, 128))
                return c

            lax.fori_loop(0, 2, step, 0)

        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.int32),
                              interpret=interpret)()

    out, emulated = both(f)
    assert (out[:8] != out[8:]).mean() > 0.99
    np.testing.assert_array_equal(out, emulated)


def test_interpreted_seed_under_a_condition():
    def body(o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            pltpu.prng_seed(0)

        o_ref[...] = pltpu.prng_random_bits((8, 128))

    out = np.asarray(pl.pallas_call(
        body, grid=(2,), out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.int32), interpret=True)())
    assert (out[:8] != out[8:]).mean() > 0.99


@pytest.mark.parametrize("interpret", [True, "tpu"], ids=["core", "tpu_interpret_mode"])
def test_the_prng_state_carries_across_grid_steps(interpret):
    # Seeded once at program 0 (under pl.when), drawn at every step, twice in a step
    # under a condition: later steps continue the sequence, as the core keeps its PRNG.
    def f(interp):
        def body(o_ref):
            @pl.when(pl.program_id(0) == 0)
            def _():
                pltpu.prng_seed(5, 6)

            o_ref[0] = pltpu.prng_random_bits(o_ref.shape[1:])

            @pl.when(pl.program_id(0) % 2 == 1)
            def _():
                o_ref[1] = pltpu.prng_random_bits(o_ref.shape[1:])

            @pl.when(pl.program_id(0) % 2 == 0)
            def _():
                o_ref[1] = jnp.zeros(o_ref.shape[1:], jnp.int32)

        if interp and interpret == "tpu":
            interp = pltpu.InterpretParams()
        return pl.pallas_call(
            body, grid=(4,), out_specs=pl.BlockSpec((2, 8, 128), lambda i: (i, 0, 0)),
            out_shape=jax.ShapeDtypeStruct((8, 8, 128), jnp.int32), interpret=interp)()

    out, emulated = both(f)
    np.testing.assert_array_equal(out, emulated)
    firsts = out[0::2]
    assert all((firsts[i] != firsts[j]).mean() > 0.99
               for i in range(4) for j in range(i + 1, 4))
    assert (out[3] != out[2]).mean() > 0.99 and not out[5].any()


def test_executor_refuses_a_draw_before_the_seed():
    def body(o_ref):
        o_ref[...] = pltpu.prng_random_bits(o_ref.shape)

    with pl.emulate_device("tpu:v5e"), pytest.raises(Exception, match="prng_set_seed_32"):
        pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32))()


# -- typed keys -----------------------------------------------------------------------------


@pytest.mark.parametrize("sampler", [jax.random.uniform, jax.random.normal,
                                     jax.random.bits])
def test_pallas_keys_sample_as_interpret_mode(sampler):
    def f(interpret, key):
        def body(key_ref, o_ref):
            k = key_ref[...]
            o_ref[0] = sampler(k, shape=o_ref.shape[1:])
            o_ref[1] = sampler(jax.random.fold_in(k, jnp.uint32(2)), shape=o_ref.shape[1:])

        dt = jnp.uint32 if sampler is jax.random.bits else jnp.float32
        return pl.pallas_call(body, in_specs=[SMEM],
                              out_shape=jax.ShapeDtypeStruct((2, 8, 128), dt),
                              interpret=interpret)(key)

    a, b = both(f, pallas_key())
    np.testing.assert_array_equal(a, b)
    assert (a[0] != a[1]).mean() > 0.99


def test_a_pallas_key_lowers_to_scalar_loads_and_the_hardware_prng(lower_tpu, ops):
    def body(key_ref, o_ref):
        o_ref[...] = jax.random.uniform(key_ref[...], shape=o_ref.shape)

    def f(key):
        return pl.pallas_call(body, in_specs=[SMEM],
                              out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(key)

    _, (module,) = lower_tpu(f, pallas_key())
    names = ops(module)
    assert names.count("memref.load") == 2 and names.count("tpu.prng_set_seed_32") == 1
    assert "memref<1x2xi32, #tpu.memory_space<smem>>" in str(module)


def test_key_words_and_key_outputs_round_trip():
    key = pallas_key(3)

    def words(interpret, key):
        def body(key_ref, o_ref):
            x0, x1 = plrandom.unwrap_pallas_seed(key_ref[...])
            o_ref[0, 0] = x0
            o_ref[0, 1] = x1

        return pl.pallas_call(body, in_specs=[SMEM], out_specs=SMEM,
                              out_shape=jax.ShapeDtypeStruct((1, 2), jnp.uint32),
                              interpret=interpret)(key)

    a, b = both(words, key)
    np.testing.assert_array_equal(a, jax.random.key_data(key))
    np.testing.assert_array_equal(b, jax.random.key_data(key))

    def copy(key):  # a DMA of a key ref into a key output
        return pl.pallas_call(lambda x_ref, o_ref: pltpu.sync_copy(x_ref, o_ref),
                              in_specs=[SMEM], out_specs=SMEM,
                              out_shape=jax.ShapeDtypeStruct((), jax.typeof(key).dtype))(key)

    with pl.emulate_device("tpu:v5e"):
        out = jax.jit(copy)(key)
    np.testing.assert_array_equal(jax.random.key_data(out), jax.random.key_data(key))


def test_a_squeezed_key_block_reads_the_key():
    def f(interpret, keys):
        @functools.partial(
            pl.pallas_call, in_specs=[pl.BlockSpec((pl.squeezed,), lambda i: (i,),
                                                   memory_space=pltpu.SMEM)],
            grid=(2,), out_specs=pl.BlockSpec((None, 8, 128), lambda i: (i, 0, 0)),
            out_shape=jax.ShapeDtypeStruct((2, 8, 128), jnp.float32), interpret=interpret)
        def kernel(key_ref, o_ref):
            o_ref[...] = jax.random.uniform(key_ref[...], shape=o_ref.shape)

        return kernel(keys)

    keys = pltpu.to_pallas_key(jax.random.split(jax.random.key(1, impl="rbg"), 2))
    a, b = both(f, keys)
    np.testing.assert_array_equal(a, b)
    assert (a[0] != a[1]).all()


@pytest.mark.parametrize("shape", [(8, 128), (32, 256), (4, 16, 128)])
@pytest.mark.parametrize("sampler", [jax.random.bits, jax.random.uniform, jax.random.normal])
def test_threefry_keys_match_jax_outside_the_kernel(shape, sampler):
    def f(interpret, key):
        def body(key_ref, o_ref):
            o_ref[...] = sampler(key_ref[...], shape=o_ref.shape)

        dt = jnp.uint32 if sampler is jax.random.bits else jnp.float32
        return pl.pallas_call(body, in_specs=[VMEM], out_shape=jax.ShapeDtypeStruct(shape, dt),
                              interpret=interpret)(key)

    key = jax.random.key(0, impl="threefry2x32")
    with jax.threefry_partitionable(True):
        a, b = both(f, key)
        expected = sampler(key, shape=shape)
    np.testing.assert_array_equal(a, expected)
    np.testing.assert_array_equal(b, expected)


def test_threefry_fold_in_split_and_key_data_in_a_kernel_match_jax():
    def f(interpret, key):
        def body(key_ref, o_ref):
            k = key_ref[...]
            o_ref[0] = jax.random.bits(jax.random.fold_in(k, 5), shape=o_ref.shape[1:])
            k1, k2 = jax.random.split(k)
            o_ref[1] = jax.random.bits(k2, shape=o_ref.shape[1:])
            data = jax.random.key_data(jax.random.fold_in(k1, 9))
            o_ref[2] = jnp.broadcast_to(data[1], o_ref.shape[1:])

        return pl.pallas_call(body, in_specs=[VMEM],
                              out_shape=jax.ShapeDtypeStruct((3, 8, 128), jnp.uint32),
                              interpret=interpret)(key)

    key = jax.random.key(4, impl="threefry2x32")
    with jax.threefry_partitionable(True):
        a, b = both(f, key)
        k1, k2 = jax.random.split(key)
        expected = [jax.random.bits(jax.random.fold_in(key, 5), (8, 128)),
                    jax.random.bits(k2, (8, 128)),
                    jnp.full((8, 128), jax.random.key_data(jax.random.fold_in(k1, 9))[1])]
    np.testing.assert_array_equal(b, a)
    np.testing.assert_array_equal(b, np.stack(expected))


def test_sample_block_is_block_invariant_emulated():
    def f(interpret, key, block):
        def body(key_ref, o_ref):
            o_ref[...] = pltpu.sample_block(jax.random.uniform, key_ref[...], block, (16, 128),
                                            (64, 512))

        return pl.pallas_call(body, grid=(64 // block[0], 512 // block[1]), in_specs=[SMEM],
                              out_specs=pl.BlockSpec(block, lambda i, j: (i, j)),
                              out_shape=jax.ShapeDtypeStruct((64, 512), jnp.float32),
                              interpret=interpret)(key)

    key = jax.random.key(0, impl="pallas_tpu")
    a, b = both(f, key, (16, 128))
    c, d = both(f, key, (32, 256))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(b, d)
    np.testing.assert_array_equal(c, d)


# -- uint32 iota and erf_inv ----------------------------------------------------------------


@pytest.mark.parametrize("shape,dim", [((8, 128), 0), ((8, 128), 1), ((256,), 0)])
def test_uint32_iota(shape, dim):
    def body(o_ref):
        o_ref[...] = lax.broadcasted_iota(jnp.uint32, shape, dim) * jnp.uint32(3)

    with pl.emulate_device("tpu:v5e"):
        out = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(shape, jnp.uint32))()
    np.testing.assert_array_equal(out, lax.broadcasted_iota(jnp.uint32, shape, dim) * 3)


def test_erf_inv_agrees_with_xla_bit_for_bit():
    x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (8, 128)), jnp.float32)
    x = x.at[0, :3].set(jnp.asarray([-1.0, 1.0, 0.0], jnp.float32))

    def body(x_ref, o_ref):
        o_ref[...] = lax.erf_inv(x_ref[...])

    with pl.emulate_device("tpu:v5e"):
        out = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    np.testing.assert_array_equal(out, lax.erf_inv(x))


# -- libtpu accepts what is generated -------------------------------------------------------


def _uniform_from_pallas_key(key):
    def body(key_ref, o_ref):
        k = jax.random.fold_in(key_ref[...], pl.program_id(0))
        o_ref[...] = jax.random.normal(k, shape=o_ref.shape)

    return pl.pallas_call(body, grid=(2,), in_specs=[SMEM],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32))(key)


def _bits_from_threefry_key(key):
    def body(key_ref, o_ref):
        k = jax.random.fold_in(key_ref[...], 3)
        o_ref[...] = jax.random.bits(k, shape=o_ref.shape) ^ lax.broadcasted_iota(
            jnp.uint32, o_ref.shape, 1)

    return pl.pallas_call(body, in_specs=[VMEM],
                          out_shape=jax.ShapeDtypeStruct((16, 256), jnp.uint32))(key)


@needs_libtpu
@pytest.mark.parametrize("f,key", [
    (_uniform_from_pallas_key, jax.ShapeDtypeStruct((), jax.random.key(0, impl="pallas_tpu").dtype)),
    (_bits_from_threefry_key, jax.ShapeDtypeStruct((), jax.random.key(0).dtype)),
])
def test_libtpu_compiles_kernels_with_keys(f, key):
    (k,) = pltpu.compile(f, key, chip="v5e")
    assert k.op_mix()["total"] > 0
