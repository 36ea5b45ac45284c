"""jax.vmap of pallas_call: batch axes in and out (mixed, last, nested), gridded kernels
and scratch, program_id under vmap, unbatched operands, several outputs, pytrees, vmap
of jit, scalar prefetch with batched and unbatched indices, aliased inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_conformance.cases import _programs as shared
from pallas_conformance.registry import case, randn, sds

C = shared.C


@case("vmap/batch_axis0", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (3, 8, C)), randn(rng, (3, 8, C))),
      reference=lambda x, y: x * 2.0 + y)
def vmap0(pallas_call, x, y):
    """jax.vmap over a leading batch axis."""
    return jax.vmap(lambda a, b: shared.scale_add(pallas_call, a, b))(x, y)


@case("vmap/in_axes_mixed", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (8, 3, C)), randn(rng, (8, C))),
      reference=lambda x, y: jnp.moveaxis(x, 1, 0) * 2.0 + y)
def vmap_mixed(pallas_call, x, y):
    """in_axes=(1, None): a batched operand on axis 1 and an unbatched one."""
    return jax.vmap(lambda a, b: shared.scale_add(pallas_call, a, b), in_axes=(1, None))(x, y)


@case("vmap/gridded_kernel", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (2, 16, C)),),
      reference=lambda x: jnp.sin(x) * x)
def vmap_grid(pallas_call, x):
    """vmap of a kernel that already has a grid."""
    return jax.vmap(lambda a: shared.tiled_sin(pallas_call, a))(x)


@case("vmap/in_axes1_out_axes1", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (16, 3, C)),),
      reference=lambda x: jnp.sin(x) * x)
def vmap_axes1(pallas_call, x):
    """in_axes=1 and out_axes=1: the batch axis in the middle of operand and result."""
    return jax.vmap(lambda a: shared.tiled_sin(pallas_call, a), in_axes=1, out_axes=1)(x)


@case("vmap/in_axes_last", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (8, C, 2)), randn(rng, (8, C, 2))),
      reference=lambda x, y: jnp.moveaxis(x * 2.0 + y, -1, 0))
def vmap_last(pallas_call, x, y):
    """in_axes=-1: the batch axis is the (minor-most) lane axis of the operands."""
    return jax.vmap(lambda a, b: shared.scale_add(pallas_call, a, b), in_axes=-1)(x, y)


@case("vmap/nested", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (2, 3, 16, C)),), reference=lambda x: jnp.sin(x) * x)
def vmap_nested(pallas_call, x):
    """vmap of vmap of a grid kernel (two added grid axes)."""
    return jax.vmap(jax.vmap(lambda a: shared.tiled_sin(pallas_call, a)))(x)


@case("vmap/nested_mixed_axes", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (8, 2, C)), randn(rng, (3, 8, C))),
      reference=lambda x, y: (jnp.moveaxis(x, 1, 0)[:, None] * 2.0 + y[None]))
def vmap_nested_mixed(pallas_call, x, y):
    """Nested vmap where each level batches a different operand (the other unbatched)."""
    inner = jax.vmap(lambda a, b: shared.scale_add(pallas_call, a, b), in_axes=(None, 0))
    return jax.vmap(inner, in_axes=(1, None))(x, y)


@case("vmap/program_id", tags={"vmap", "control_flow"},
      inputs=lambda rng: (randn(rng, (3, 16, C)),), reference=jax.vmap(shared.ref_add_program_id))
def vmap_program_id(pallas_call, x):
    """A kernel that reads program_id keeps its per-block values under vmap."""
    return jax.vmap(lambda a: shared.add_program_id(pallas_call, a))(x)


@case("vmap/nested_program_id", tags={"vmap", "control_flow"},
      inputs=lambda rng: (randn(rng, (2, 2, 16, C)),),
      reference=jax.vmap(jax.vmap(shared.ref_add_program_id)))
def vmap_nested_program_id(pallas_call, x):
    """program_id under two nested vmaps."""
    return jax.vmap(jax.vmap(lambda a: shared.add_program_id(pallas_call, a)))(x)


@case("vmap/unbatched_weight_dot", tags={"vmap", "dot"},
      inputs=lambda rng: (randn(rng, (3, 16, C)), randn(rng, (C, C), scale=0.1)),
      reference=lambda x, w: jnp.einsum("bmk,kn->bmn", x, w, precision=shared.HI),
      tolerance={"float32": (1e-4, 1e-4)})
def vmap_unbatched_weight(pallas_call, x, w):
    """in_axes=(0, None) on a grid kernel: a batched activation and a shared weight."""
    return jax.vmap(lambda a, b: shared.matmul_rows(pallas_call, a, b), in_axes=(0, None))(x, w)


@case("vmap/grid_scratch_accumulate",
      tags={"vmap", "scratch", "sequential_grid", "carry_across_blocks"},
      inputs=lambda rng: (randn(rng, (3, 32, C)),), reference=jax.vmap(shared.ref_running_sum),
      tolerance={"float32": (1e-5, 1e-5)})
def vmap_grid_scratch(pallas_call, x):
    """vmap of a grid kernel whose scratch, reset at program_id 0, persists along the grid."""
    return jax.vmap(lambda a: shared.running_sum(pallas_call, a))(x)


@case("vmap/multiple_outputs", tags={"vmap", "multiple_outputs", "reductions"},
      inputs=lambda rng: (randn(rng, (3, 16, C)),),
      reference=lambda x: (x * 2.0, jnp.sum(x, axis=-1, keepdims=True)),
      tolerance={"float32": (1e-5, 1e-5)})
def vmap_multi(pallas_call, x):
    """vmap of a kernel with two outputs of different shapes (a block and its row sums)."""
    def f(a):
        def kernel(x_ref, o_ref, s_ref):
            o_ref[...] = x_ref[...] * 2.0
            s_ref[...] = jnp.sum(x_ref[...], axis=-1, keepdims=True)

        return pallas_call(kernel, out_shape=(sds(a.shape, a.dtype), sds((16, 1), a.dtype)),
                           grid=(2,), in_specs=[pl.BlockSpec((8, C), lambda i: (i, 0))],
                           out_specs=(pl.BlockSpec((8, C), lambda i: (i, 0)),
                                      pl.BlockSpec((8, 1), lambda i: (i, 0))))(a)

    return jax.vmap(f)(x)


@case("vmap/pytree_operands", tags={"vmap", "pytrees"},
      inputs=lambda rng: (randn(rng, (2, 8, C)), randn(rng, (8, C))),
      reference=lambda x, y: {"s": x + y, "d": x - y})
def vmap_pytree(pallas_call, x, y):
    """vmap with a dict operand (one leaf batched, one not) and a dict result."""
    def f(d):
        def kernel(r, o):
            o["s"][...] = r["a"][...] + r["b"][...]
            o["d"][...] = r["a"][...] - r["b"][...]

        shape = sds(d["a"].shape, d["a"].dtype)
        return pallas_call(kernel, out_shape={"s": shape, "d": shape})(d)

    return jax.vmap(f, in_axes=({"a": 0, "b": None},))({"a": x, "b": y})


@case("vmap/of_jit", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (4, 16, C)),), reference=lambda x: jnp.sin(x) * x)
def vmap_of_jit(pallas_call, x):
    """vmap of a jitted function that calls the kernel (batching through pjit)."""
    return jax.vmap(jax.jit(lambda a: shared.tiled_sin(pallas_call, a)))(x)


def _gather_blocks(pallas_call, idx, x):
    """Row blocks of ``x`` gathered by prefetched block indices."""
    def kernel(idx_ref, x_ref, o_ref):
        del idx_ref
        o_ref[...] = x_ref[...] * 2.0

    return pallas_call(
        kernel, out_shape=sds((idx.shape[0] * 8, C), x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(idx.shape[0],),
            in_specs=[pl.BlockSpec((8, C), lambda i, idx: (idx[i], 0))],
            out_specs=pl.BlockSpec((8, C), lambda i, idx: (i, 0))))(idx, x)


def _ref_gather_blocks(idx, x):
    return jnp.concatenate([x[8 * int(i):8 * int(i) + 8] for i in idx]) * 2.0


@case("vmap/scalar_prefetch_unbatched_indices", tags={"vmap", "scalar_prefetch"},
      inputs=lambda rng: (jnp.asarray([2, 0, 3], jnp.int32), randn(rng, (2, 32, C))),
      reference=lambda idx, x: jnp.stack([_ref_gather_blocks(idx, b) for b in x]))
def vmap_prefetch_unbatched(pallas_call, idx, x):
    """vmap over the data of a scalar-prefetch gather whose indices are shared."""
    return jax.vmap(lambda a: _gather_blocks(pallas_call, idx, a))(x)


@case("vmap/scalar_prefetch_batched_indices", tags={"vmap", "scalar_prefetch"},
      inputs=lambda rng: (jnp.asarray([[2, 0, 3], [1, 1, 0]], jnp.int32),
                          randn(rng, (2, 32, C))),
      reference=lambda idx, x: jnp.stack([_ref_gather_blocks(i, b) for i, b in zip(idx, x)]))
def vmap_prefetch_batched(pallas_call, idx, x):
    """vmap over batched prefetched indices and data (one gather per batch element)."""
    return jax.vmap(lambda i, a: _gather_blocks(pallas_call, i, a))(idx, x)


@case("vmap/aliased_unbatched_input", tags={"vmap", "aliasing"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (3, 8, C))),
      reference=lambda acc, x: acc[None] * 0.5 + x)
def vmap_aliased(pallas_call, acc, x):
    """vmap where the aliased input is unbatched (it is broadcast to the batched output)."""
    def f(a, b):
        def kernel(a_ref, b_ref, o_ref):
            del a_ref
            o_ref[...] = o_ref[...] * 0.5 + b_ref[...]

        return pallas_call(kernel, out_shape=sds(a.shape, a.dtype),
                           input_output_aliases={0: 0})(a, b)

    return jax.vmap(f, in_axes=(None, 0))(acc, x)
