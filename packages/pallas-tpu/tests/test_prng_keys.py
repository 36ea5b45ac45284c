"""Pallas TPU PRNG keys (``pltpu.to_pallas_key``, ``impl="pallas_tpu"``), as upstream:
typed keys of two uint32 words that seed the core's PRNG inside a kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu
from pallas_tpu import random as plrandom

SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)


@pytest.mark.parametrize("legacy", [True, False])
def test_to_pallas_key_of_a_batch_equals_it_under_vmap(legacy):
    key = jax.random.PRNGKey(42) if legacy else jax.random.key(42, impl="rbg")
    keys = jax.random.split(key, 10)
    batched = jax.random.key_data(pltpu.to_pallas_key(keys))
    vmapped = jax.random.key_data(jax.vmap(pltpu.to_pallas_key)(keys))
    assert batched.shape == (10, 1, 2)
    np.testing.assert_array_equal(batched, vmapped)


def test_key_words_unwrap_and_wrap_in_a_kernel():
    key = pltpu.to_pallas_key(jax.random.key(0, impl="rbg"))

    def body(key_ref, o_ref):
        x0, x1 = plrandom.unwrap_pallas_seed(key_ref[...])
        again = plrandom.wrap_pallas_seed(x0, x1, impl="pallas_tpu")
        y0, y1 = plrandom.unwrap_pallas_seed(again)
        o_ref[0, 0] = y0
        o_ref[0, 1] = y1

    expected = jax.random.key_data(key)
    out = pl.pallas_call(body, in_specs=[SMEM], out_specs=SMEM,
                         out_shape=jax.ShapeDtypeStruct.like(expected))(key)
    np.testing.assert_array_equal(out, expected)


def test_samplers_draw_from_the_key_and_fold_in_changes_them():
    def body(key_ref, o_ref):
        key = key_ref[...]
        o_ref[0] = jax.random.uniform(key, shape=o_ref.shape[1:])
        o_ref[1] = jax.random.uniform(jax.random.fold_in(key, jnp.uint32(2)),
                                      shape=o_ref.shape[1:])
        o_ref[2] = jax.random.uniform(key, shape=o_ref.shape[1:])

    def run(key):
        return np.asarray(pl.pallas_call(
            body, in_specs=[SMEM],
            out_shape=jax.ShapeDtypeStruct((3, 8, 128), jnp.float32))(key))

    a = run(pltpu.to_pallas_key(jax.random.key(0, impl="rbg")))
    b = run(pltpu.to_pallas_key(jax.random.key(1, impl="rbg")))
    assert (a[0] != a[1]).all() and (a[0] != b[0]).any()
    np.testing.assert_array_equal(a[0], a[2])  # the same key seeds the same bits
    assert 0.0 <= a.min() and a.max() < 1.0


def test_a_key_from_a_seed_and_split_is_refused():
    key = jax.random.key(3, impl="pallas_tpu")
    np.testing.assert_array_equal(jax.random.key_data(key), [[3, 3]])
    assert plrandom.is_pallas_impl(plrandom.tpu_key_impl)

    def body(key_ref, o_ref):
        jax.random.split(key_ref[...])
        o_ref[...] = jnp.zeros_like(o_ref)

    with pytest.raises(NotImplementedError, match="Cannot split a Pallas key"):
        pl.pallas_call(body, in_specs=[SMEM],
                       out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(key)


def test_a_pallas_key_outside_a_kernel_has_no_lowering():
    key = pltpu.to_pallas_key(jax.random.key(0, impl="rbg"))
    with pytest.raises(NotImplementedError, match="MLIR translation rule .* not found"):
        jax.random.uniform(key, shape=(1,))


def test_keys_are_kernel_outputs_and_dma_operands():
    key = pltpu.to_pallas_key(jax.random.key(0, impl="threefry2x32"))

    def body(x_ref, o_ref):
        pltpu.sync_copy(x_ref, o_ref)

    out = jax.jit(lambda k: pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((), k.dtype), in_specs=[SMEM],
        out_specs=SMEM)(k))(key)
    assert out.dtype == key.dtype
    np.testing.assert_array_equal(jax.random.key_data(out), jax.random.key_data(key))


def test_a_key_seeds_the_stateful_samplers():
    def body(key_ref, o_ref):
        pltpu.prng_seed(key_ref[...])
        o_ref[...] = pltpu.stateful_uniform(shape=o_ref.shape)

    def run(seed):
        key = pltpu.to_pallas_key(jax.random.key(seed, impl="rbg"))
        return np.asarray(pl.pallas_call(
            body, in_specs=[SMEM], out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(key))

    np.testing.assert_array_equal(run(0), run(0))
    assert (run(0) != run(1)).any()


def test_a_key_in_a_core_map_scratch_buffer():
    """A core_map under pl.run_state (TPU interpret mode) copies a key into an SMEM
    scratch buffer and samples from it: the simulation holds keys as their key data
    (upstream's test_key_in_core_map; it failed allocating the key buffer)."""
    import functools

    def main(refs):
        key_hbm, o_ref = refs

        @pl.core_map(pltpu.create_tensorcore_mesh("core"))
        def _():
            @functools.partial(pl.run_scoped, key_smem=pltpu.SMEM((), key_hbm.dtype),
                               o_vmem=pltpu.VMEM(o_ref.shape, o_ref.dtype))
            def _scoped(key_smem, o_vmem):
                pltpu.sync_copy(key_hbm, key_smem)
                o_vmem[...] = jax.random.uniform(key_smem[...], shape=o_ref.shape)
                pltpu.sync_copy(o_vmem, o_ref)

    @jax.jit
    def f(key):
        key, y = pl.run_state(main)((key, jnp.zeros((8, 128), jnp.float32)))
        return key, y

    key = pltpu.to_pallas_key(jax.random.key(0, impl="rbg"))
    key_out, y = f(key)
    np.testing.assert_array_equal(jax.random.key_data(key_out), jax.random.key_data(key))

    def body(key_ref, o_ref):  # the same draws in a pallas_call
        o_ref[...] = jax.random.uniform(key_ref[...], shape=o_ref.shape)

    expected = pl.pallas_call(body, in_specs=[SMEM],
                              out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(key)
    np.testing.assert_array_equal(y, expected)


def test_tpu_interpret_mode_takes_key_operands():
    key = pltpu.to_pallas_key(jax.random.key(2, impl="rbg"))

    def body(key_ref, o_ref):
        o_ref[...] = jax.random.uniform(key_ref[...], shape=o_ref.shape)

    def run(interpret):
        return pl.pallas_call(body, in_specs=[SMEM],
                              out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                              interpret=interpret)(key)

    np.testing.assert_array_equal(run(pltpu.InterpretParams()), run(True))
