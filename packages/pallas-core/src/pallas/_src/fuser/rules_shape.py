"""Fuser rules of shape primitives: squeeze, broadcast_in_dim, transpose, tile, iota."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from pallas._src import block_spec as bs
from pallas._src.fuser import transforms as tf
from pallas._src.fuser.registry import (
    register_eval_rule,
    register_pull_block_spec_rule,
    register_push_block_spec_rule,
    register_usage_rule,
)
from pallas._src.fuser.usage import Usage, forward_usage


def _require_blocked(transform, prim: str) -> None:
    if transform is tf.no_block_index_transform or transform.block_shape is None:
        raise NotImplementedError(
            f"pallas.fuser: `{prim}` needs a block shape to pull through; got "
            f"{tf.describe(transform)}")


# -- squeeze: the dropped dims are squeezed block dims of the operand -------------------


@register_pull_block_spec_rule(lax.squeeze_p)
def _squeeze_pull_rule(ctx, transform, *, dimensions):
    del ctx
    if transform is tf.no_block_index_transform:
        return [transform]
    index_fn = transform.block_index_transform
    dims = sorted(dimensions)

    def new_index(*idx):
        out = list(index_fn(*idx))
        for d in dims:
            out.insert(d, 0)
        return tuple(out)

    shape = list(transform.block_shape)
    for d in dims:
        shape.insert(d, None)
    return [transform.replace(block_shape=tuple(shape), block_index_transform=new_index)]


@register_eval_rule(lax.squeeze_p)
def _squeeze_eval_rule(ctx, x, *, dimensions):
    # The squeezed dims are squeezed block dims of the operand: the block lacks them.
    del dimensions
    return x.reshape(tf.kernel_shape(ctx.out_block_specs[0].block_shape))


@register_push_block_spec_rule(lax.squeeze_p)
def _squeeze_push_rule(ctx, spec, *, dimensions):
    del ctx
    return tf.spec_of_dims(
        spec, [i for i in range(len(spec.block_shape)) if i not in dimensions])


register_usage_rule(lax.squeeze_p)(forward_usage)


# -- broadcast_in_dim ------------------------------------------------------------------


@register_usage_rule(lax.broadcast_in_dim_p)
def _broadcast_in_dim_usage_rule(ctx, used_out, **params):
    del params
    if Usage.REGULAR in used_out and not ctx.avals_in[0].shape:
        # A scalar broadcast into a block is read from scalar prefetch.
        return [{Usage.SCALAR_PREFETCH}]
    return [set(used_out)]


@register_pull_block_spec_rule(lax.broadcast_in_dim_p)
def _broadcast_in_dim_pull_rule(ctx, transform, *, shape, broadcast_dimensions, sharding):
    del shape, sharding
    in_shape = ctx.avals_in[0].shape
    if not in_shape:
        return [tf.no_block_index_transform]
    _require_blocked(transform, "broadcast_in_dim")
    index_fn, out_block = transform.block_index_transform, transform.block_shape

    def new_index(*idx):
        out_idx = index_fn(*idx)
        return tuple(0 if d == 1 else out_idx[o] for o, d in zip(broadcast_dimensions, in_shape))

    block = tuple(
        out_block[o] if tf.is_squeezed(out_block[o]) or d != 1 else 1
        for o, d in zip(broadcast_dimensions, in_shape)
    )
    return [transform.replace(block_shape=block, block_index_transform=new_index)]


@register_eval_rule(lax.broadcast_in_dim_p)
def _broadcast_in_dim_eval_rule(ctx, x, *, shape, broadcast_dimensions, sharding):
    del sharding
    if tuple(ctx.avals_in[0].shape) == tuple(shape):
        return x
    out_block = ctx.out_block_specs[0].block_shape
    if out_block is None:
        return lax.broadcast_in_dim(x, shape, broadcast_dimensions)
    position, n = {}, 0
    for d, dim in enumerate(out_block):
        if not tf.is_squeezed(dim):
            position[d] = n
            n += 1
    dims = tuple(position[o] for o in broadcast_dimensions if o in position)
    return lax.broadcast_in_dim(x, tf.kernel_shape(out_block), dims)


@register_push_block_spec_rule(lax.broadcast_in_dim_p)
def _broadcast_in_dim_push_rule(ctx, spec, *, shape, broadcast_dimensions, sharding):
    del sharding
    in_shape = ctx.avals_in[0].shape
    source = {o: i for i, o in enumerate(broadcast_dimensions)}
    block = []
    for o, size in enumerate(shape):
        if o not in source:
            block.append(size)
        elif in_shape[source[o]] != size:
            if tf.full_size(spec.block_shape[source[o]]) != 1:
                raise ValueError(
                    f"pallas.fuser: cannot push block spec {tf.describe(spec)} through "
                    f"broadcast_in_dim: dim {source[o]} is broadcast but its block is not 1")
            block.append(size)
        else:
            block.append(spec.block_shape[source[o]])
    index_map = spec.index_map

    def new_index_map(*args):
        idx = tf.as_tuple(index_map(*args))
        return tuple(idx[source[o]] if o in source else 0 for o in range(len(shape)))

    return bs.BlockSpec(tuple(block), new_index_map)


# -- transpose -----------------------------------------------------------------------------


def _inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


@register_pull_block_spec_rule(lax.transpose_p)
def _transpose_pull_rule(ctx, transform, *, permutation):
    del ctx
    _require_blocked(transform, "transpose")
    inv = _inverse(permutation)
    index_fn, out_block = transform.block_index_transform, transform.block_shape

    def new_index(*idx):
        out_idx = index_fn(*idx)
        return tuple(out_idx[inv[d]] for d in range(len(inv)))

    block = tuple(out_block[inv[d]] for d in range(len(inv)))
    return [transform.replace(block_shape=block, block_index_transform=new_index)]


@register_eval_rule(lax.transpose_p)
def _transpose_eval_rule(ctx, x, *, permutation):
    out_block = ctx.out_block_specs[0].block_shape
    in_block = [out_block[i] for i in _inverse(permutation)]
    kept = [d for d, dim in enumerate(in_block) if not tf.is_squeezed(dim)]
    position = {d: k for k, d in enumerate(kept)}
    perm = [position[p] for p, dim in zip(permutation, out_block) if not tf.is_squeezed(dim)]
    return lax.transpose(x, perm)


@register_push_block_spec_rule(lax.transpose_p)
def _transpose_push_rule(ctx, spec, *, permutation):
    del ctx
    return tf.spec_of_dims(spec, permutation)


register_usage_rule(lax.transpose_p)(forward_usage)


# -- tile ----------------------------------------------------------------------------------


@register_pull_block_spec_rule(lax.tile_p)
def _tile_pull_rule(ctx, transform, *, reps):
    del reps
    _require_blocked(transform, "tile")
    in_shape = ctx.avals_in[0].shape
    out_block = transform.block_shape
    if not all(tf.is_blocked(d) or isinstance(d, bs.Squeezed) for d in out_block):
        raise NotImplementedError(
            f"tile with non-int block dimensions not supported yet: {tf.describe(transform)}")
    sizes = [tf.full_size(d) for d in out_block]
    if not all(b % n == 0 or n % b == 0 for b, n in zip(sizes, in_shape)):
        raise NotImplementedError(
            "Every block dimension must be either a multiple or factor of input. "
            f"Got block {tf.describe_block_shape(out_block)} for input {tuple(in_shape)}")
    block = tuple(d if isinstance(d, bs.Squeezed) else min(tf.block_size(d), n)
                  for d, n in zip(out_block, in_shape))
    index_fn = transform.block_index_transform

    def new_index(*idx):
        out_idx = index_fn(*idx)
        return tuple(0 if b >= n else i % (n // b) for i, b, n in zip(out_idx, sizes, in_shape))

    return [transform.replace(block_shape=block, block_index_transform=new_index)]


@register_eval_rule(lax.tile_p)
def _tile_eval_rule(ctx, x, *, reps):
    del reps
    out = tf.kernel_shape(ctx.out_block_specs[0].block_shape)
    if any(o % n for o, n in zip(out, x.shape)):
        raise NotImplementedError(
            f"Block size must be a multiple of the input size. Got block {out} but input "
            f"{x.shape}.")
    return lax.tile(x, [o // n if o >= n else 1 for o, n in zip(out, x.shape)])


# -- iota: computed per block from the block index -----------------------------------------


@register_pull_block_spec_rule(lax.iota_p)
def _iota_pull_rule(ctx, transform, *, dtype, shape, dimension, sharding):
    del ctx, dtype, shape, sharding
    _require_blocked(transform, "iota")
    if isinstance(transform.block_shape[dimension], bs.BoundedSlice):
        raise NotImplementedError("pallas.fuser: iota along a BoundedSlice block dim")
    return []


@register_eval_rule(lax.iota_p)
def _iota_eval_rule(ctx, *, dtype, shape, dimension, sharding):
    del shape, sharding
    block = ctx.out_block_specs[0].block_shape
    start = ctx.get_out_block_indices()[0][dimension]
    dim = block[dimension]
    local_shape = tf.kernel_shape(block)
    if tf.is_squeezed(dim):
        return jnp.full(local_shape, start, dtype)
    axis = sum(1 for d in block[:dimension] if not tf.is_squeezed(d))
    if isinstance(dim, bs.Element):
        offset = start - dim.padding[0]
    else:
        offset = start * tf.block_size(dim)
    return lax.broadcasted_iota(dtype, local_shape, axis) + jnp.asarray(offset, dtype)


