"""Small pallas_call programs and their references that several case modules share: the
vmap, grad, shard_map and export cases transform them, the scratch cases run one, the
indexing and broadcasting cases each a block transpose."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_conformance.registry import sds

C = 128
HI = jax.lax.Precision.HIGHEST


def scale_add(pallas_call, x, y):
    """x * 2 + y in one block (no grid)."""
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + y_ref[...]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x, y)


def tiled_sin(pallas_call, x):
    """sin(x) * x over a grid of (8, C) row blocks."""
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.sin(x_ref[...]) * x_ref[...]

    spec = pl.BlockSpec((8, C), lambda i: (i, 0))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                       in_specs=[spec], out_specs=spec)(x)


def matmul_rows(pallas_call, x, w):
    """(16, C) @ (C, C) in two row blocks; ``w`` is one whole block for every program."""
    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], precision=HI)

    return pallas_call(kernel, out_shape=sds((x.shape[0], w.shape[1]), x.dtype),
                       grid=(x.shape[0] // 8,),
                       in_specs=[pl.BlockSpec((8, C), lambda i: (i, 0)),
                                 pl.BlockSpec((C, C), lambda i: (0, 0))],
                       out_specs=pl.BlockSpec((8, C), lambda i: (i, 0)))(x, w)


def block_transpose(pallas_call, x, *, swapped: str):
    """x.T in (C, C) blocks, each program transposing one; the index map that swaps the
    grid axes is the input's (``swapped="in"``: the grid walks the output's blocks) or
    the output's (``swapped="out"``: the grid walks the input's)."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...].T

    rows, cols = x.shape
    same = pl.BlockSpec((C, C), lambda i, j: (i, j))
    swap = pl.BlockSpec((C, C), lambda i, j: (j, i))
    if swapped == "in":
        grid, in_spec, out_spec = (cols // C, rows // C), swap, same
    else:
        grid, in_spec, out_spec = (rows // C, cols // C), same, swap
    return pallas_call(kernel, out_shape=sds((cols, rows), x.dtype), grid=grid,
                       in_specs=[in_spec], out_specs=out_spec)(x)


def add_program_id(pallas_call, x):
    """x + 10 * program_id over a grid of (8, C) row blocks."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 10.0 * pl.program_id(0).astype(jnp.float32)

    spec = pl.BlockSpec((8, C), lambda i: (i, 0))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                       in_specs=[spec], out_specs=spec)(x)


def ref_add_program_id(x):
    """The reference of :func:`add_program_id`."""
    return x + 10.0 * jnp.repeat(jnp.arange(x.shape[-2] // 8, dtype=jnp.float32),
                                 8)[:, None]


def running_sum(pallas_call, x):
    """A running sum of row blocks in scratch that persists along the grid."""
    def kernel(x_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += x_ref[...]
        o_ref[...] = acc_ref[...]

    spec = pl.BlockSpec((8, C), lambda i: (i, 0))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                       in_specs=[spec], out_specs=spec,
                       scratch_shapes=[pl.ANY((8, C), jnp.float32)])(x)


def ref_running_sum(x):
    """The reference of :func:`running_sum`."""
    n = x.shape[0] // 8
    return jnp.cumsum(x.reshape(n, 8, C), axis=0).reshape(x.shape)


def matmul_loss(a, b):
    """sum((a @ b) ** 2), a scalar loss to differentiate."""
    return jnp.sum(jnp.dot(a, b, precision=HI) ** 2)
