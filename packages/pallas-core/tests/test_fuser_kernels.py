"""pallas.fuser end to end: a fusible matmul kernel whose producers and consumers are
fused into it by ``fuse``, run as an ordinary ``pallas_call`` in the interpreter."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
from pallas import fuser

SDS = jax.ShapeDtypeStruct


def _pull(fusion, block_spec, *args):
    """(kernel_fn, value block specs, values) of a fusion read in blocks of block_spec."""
    fn, values, prefetch = fuser.get_fusion_values(fusion, *args)
    assert not prefetch
    kernel_fn, (value_specs, *_), _ = fuser.pull_block_spec(
        fn, block_spec, grid_len=2,
        scalar_prefetch_handler=fuser.make_scalar_prefetch_handler())(values, *args)
    return kernel_fn, value_specs, values


@fuser.fusible
def fusible_matmul(x_fn, y_fn, z_fn):
    """out = z_fn(x_fn() @ y_fn()), tiled (bm, bn) with the whole K in each block."""
    (m, k), (_, n) = x_fn.shape, y_fn.shape
    bm, bn = min(m, 64), min(n, 128)
    x_kernel, x_specs, x_values = _pull(x_fn, pl.BlockSpec((bm, k), lambda i, j: (i, 0)))
    y_kernel, y_specs, y_values = _pull(y_fn, pl.BlockSpec((k, bn), lambda i, j: (0, j)))
    acc_type = SDS((m, n), jnp.float32)
    trivial = z_fn is None
    if trivial:
        z_fn = lambda acc: (acc.astype(x_fn.dtype),)  # noqa: E731
    acc_spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    out_spec = fuser.push_block_spec(z_fn, acc_spec)(acc_type)
    out_type = jax.eval_shape(z_fn, acc_type)
    z_fn2, z_values, _ = fuser.get_fusion_values(z_fn, acc_type)
    z_kernel, (z_specs, _), _ = fuser.pull_block_spec(
        z_fn2, out_spec, grid_len=2,
        scalar_prefetch_handler=fuser.make_scalar_prefetch_handler())(z_values, acc_type)

    def kernel(x_refs, y_refs, z_refs, *o_refs):
        pids = (pl.program_id(0), pl.program_id(1))
        load = lambda refs: jax.tree.map(lambda r: r[...], refs)  # noqa: E731
        x = x_kernel(pids, (), load(x_refs))
        y = y_kernel(pids, (), load(y_refs))
        acc = jnp.dot(x, y, preferred_element_type=jnp.float32)
        for o_ref, out in zip(o_refs, z_kernel(pids, (), load(z_refs), acc)):
            o_ref[...] = out

    out = pl.pallas_call(
        kernel, out_type, grid=(m // bm, n // bn),
        in_specs=[x_specs, y_specs, z_specs], out_specs=out_spec, interpret=True,
    )(x_values, y_values, z_values)
    return out[0] if trivial else out  # an output fusion returns a tuple


def _operands(rng, m=128, k=64, n=256):
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((k, n)), jnp.float32)
    return x, y


def test_without_fusions_the_kernel_is_a_plain_matmul(rng):
    x, y = _operands(rng)
    out = jax.jit(fusible_matmul)(x, y)
    np.testing.assert_allclose(out, x @ y, rtol=1e-5, atol=1e-4)


def test_prologue_and_epilogue_are_fused_into_the_kernel(rng):
    x, y = _operands(rng)
    bias = jnp.asarray(rng.standard_normal((256,)), jnp.float32)

    def f(x, y, bias):
        z = fusible_matmul(jax.nn.relu(x) * 2.0, y)
        return jnp.tanh(z + bias[None, :]).astype(jnp.bfloat16)

    fused = jax.jit(fuser.fuse(f))
    jaxpr = jax.make_jaxpr(fuser.fuse(f))(x, y, bias)
    prims = {e.primitive.name for e in jaxpr.jaxpr.eqns}
    # Everything happens inside the one pallas_call: no relu, tanh or cast outside it.
    assert prims == {"pallas_call"}, prims
    out = fused(x, y, bias)
    assert out.dtype == jnp.bfloat16 and out.shape == (128, 256)
    np.testing.assert_allclose(out.astype(jnp.float32), f(x, y, bias).astype(jnp.float32),
                               rtol=2e-2, atol=2e-2)


def test_fusion_through_transpose_and_reshape(rng):
    x = jnp.asarray(rng.standard_normal((64, 2, 64)), jnp.float32)  # -> (128, 64)
    yt = jnp.asarray(rng.standard_normal((256, 64)), jnp.float32)   # -> (64, 256)

    def f(x, yt):
        return fusible_matmul(x.reshape(128, 64), yt.T)

    out = jax.jit(fuser.fuse(f))(x, yt)
    np.testing.assert_allclose(out, x.reshape(128, 64) @ yt.T, rtol=1e-5, atol=1e-4)


def test_a_fused_function_under_vmap_of_size_one(rng):
    x, y = _operands(rng)
    out = jax.vmap(fuser.fuse(lambda x, y: fusible_matmul(x, y) * 3.0))(x[None], y[None])
    np.testing.assert_allclose(out[0], (x @ y) * 3.0, rtol=1e-5, atol=1e-4)


def test_unfusible_producer_names_the_primitive_and_block_spec(rng):
    x, y = _operands(rng)

    def f(x, y):
        return fusible_matmul(jnp.cumsum(x, axis=1), y)

    with pytest.raises(NotImplementedError, match=r"`cumsum`.*block_shape=\(64, 64\)"):
        fuser.fuse(f)(x, y)
