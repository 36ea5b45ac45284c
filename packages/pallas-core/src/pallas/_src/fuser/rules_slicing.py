"""Fuser rules of slicing and joining: slice, dynamic_slice, concatenate, stack, unstack.

Pulling a block through a slice offsets its index by the slice start, so the start
must be a whole number of blocks (checked at trace time when static). Dynamic-slice
starts are scalar-prefetch values, read inside the index map.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas._src import block_spec as bs
from pallas._src import jax_compat as jc
from pallas._src.fuser import transforms as tf
from pallas._src.fuser.registry import (
    register_eval_rule,
    register_pull_block_spec_rule,
    register_push_block_spec_rule,
    register_usage_rule,
)
from pallas._src.fuser.usage import Usage, forward_usage


def _check(pred, msg: str) -> None:
    """A trace-time check when ``pred`` is static. A dynamic start (scalar prefetch) is
    the caller's contract: a runtime check would be a primitive in every index map."""
    if isinstance(pred, (bool, np.bool_)) and not pred:
        raise ValueError(msg)


def offset_index(dim, index, start, size):
    """The block index of ``dim`` in the sliced-from array, given it in the slice."""
    if isinstance(start, int) and start == 0:
        return index
    if tf.is_squeezed(dim):
        return index + start
    if isinstance(dim, bs.Element):
        _check(start % dim.block_size == 0,
               f"slice_start is not a multiple of block_size {dim.block_size}")
        return index + start
    if isinstance(dim, bs.BoundedSlice):
        if not isinstance(index, jc.Slice):
            raise ValueError(f"a BoundedSlice block dim needs a pl.ds index, got {index}")
        return jc.ds(index.start + start, index.size)
    if tf.is_blocked(dim):
        size_b = tf.block_size(dim)
        _check(start % size_b == 0, f"slice_start is not a multiple of block_size {size_b}")
        _check(size % size_b == 0, f"slice_size is not a multiple of block_size {size_b}")
        return index + start // size_b
    raise ValueError(f"Unsupported block size {dim}")


@register_pull_block_spec_rule(lax.slice_p)
def _slice_pull_rule(ctx, transform, *, start_indices, limit_indices, strides):
    del ctx
    if strides is not None and any(s != 1 for s in strides):
        raise NotImplementedError(f"pallas.fuser: strided slices (strides={strides}) "
                                  "are not supported yet")
    sizes = [int(e - s) for s, e in zip(start_indices, limit_indices)]
    block = transform.block_shape
    for d, (dim, start, size) in enumerate(zip(block, start_indices, sizes)):
        if tf.is_squeezed(dim):
            continue
        n = tf.block_size(dim)
        if isinstance(dim, (bs.Element, bs.BoundedSlice)):
            if n > size:
                raise ValueError(f"Block size {n} is larger than the slice size {size}")
        elif start % n or size % n:
            raise ValueError(
                f"pallas.fuser: the slice [{start}:{start + size}] of dim {d} does not start "
                f"and end on a boundary of the block size {n} (block shape "
                f"{tf.describe_block_shape(block)})")
    index_fn = transform.block_index_transform

    def new_index(*idx):
        return tuple(offset_index(dim, i, start, size)
                     for dim, i, start, size in zip(block, index_fn(*idx), start_indices, sizes))

    return [transform.replace(block_index_transform=new_index)]


@register_eval_rule(lax.slice_p)
def _slice_eval_rule(ctx, x, **params):
    del ctx, params
    return x  # the block of the slice is a block of the operand


@register_usage_rule(lax.dynamic_slice_p)
def _dynamic_slice_usage_rule(ctx, used_out, **params):
    del params
    if used_out == {Usage.SCALAR_PREFETCH}:
        raise NotImplementedError("pallas.fuser: a dynamic_slice computing scalar-prefetch "
                                  "values is not supported yet")
    if Usage.REGULAR in used_out:
        return [set(used_out)] + [{Usage.SCALAR_PREFETCH}] * (len(ctx.avals_in) - 1)
    return [set()] * len(ctx.avals_in)


@register_pull_block_spec_rule(lax.dynamic_slice_p)
def _dynamic_slice_pull_rule(ctx, transform, *, slice_sizes):
    block, index_fn = transform.block_shape, transform.block_index_transform

    def new_index(*idx):
        starts = ctx.scalar_prefetch_fn()
        if len(starts) != len(block):
            raise ValueError(f"Expected {len(block)} slice starts, got {len(starts)}")
        return tuple(offset_index(dim, i, start, size) for dim, i, start, size
                     in zip(block, index_fn(*idx), starts, slice_sizes))

    return ([transform.replace(block_index_transform=new_index)]
            + [tf.no_block_index_transform] * (len(ctx.avals_in) - 1))


@register_eval_rule(lax.dynamic_slice_p)
def _dynamic_slice_eval_rule(ctx, x, *starts, slice_sizes):
    del ctx, starts, slice_sizes
    return x


# -- concatenate -------------------------------------------------------------------------


def _concat_block(transform, dimension: int, what: str) -> int:
    block = transform.block_shape
    if any(isinstance(d, bs.Element) for d in block):
        raise NotImplementedError(f"{what} with Element indexing is not yet supported.")
    dim = block[dimension]
    return 1 if tf.is_squeezed(dim) else tf.block_size(dim)


@register_pull_block_spec_rule(lax.concatenate_p)
def _concatenate_pull_rule(ctx, transform, *, dimension):
    size = _concat_block(transform, dimension, "Concatenation")
    lengths = [aval.shape[dimension] for aval in ctx.avals_in]
    if size == sum(lengths):  # one block holds the whole concatenation
        return [transform.replace(block_shape=tuple(
            n if d == dimension else b for d, b in enumerate(transform.block_shape)))
            for n in lengths]
    for aval in ctx.avals_in:
        if aval.shape[dimension] % size:
            raise ValueError(
                f"Shape along concat dimension {dimension} must be divisible by the block "
                f"shape {transform.block_shape[dimension]} for all children. Got shape "
                f"{aval.shape}.")
    counts = [n // size for n in lengths]
    ends = np.cumsum(counts)
    starts = ends - np.array(counts)
    index_fn = transform.block_index_transform

    def child(k):
        def new_index(*idx):
            out = list(index_fn(*idx))
            i = out[dimension]
            inside = (starts[k] <= i) & (i < ends[k])
            # Outside its range a child's index is clamped (its block is not selected).
            clamp = jnp.where(i < starts[k], 0, counts[k] - 1)
            out[dimension] = jnp.where(inside, i - starts[k], clamp)
            return tuple(out)

        return transform.replace(block_index_transform=new_index)

    return [child(k) for k in range(len(ctx.avals_in))]


@register_eval_rule(lax.concatenate_p)
def _concatenate_eval_rule(ctx, *blocks, dimension):
    spec = ctx.out_block_specs[0]
    size = _concat_block(spec, dimension, "Concatenation")
    lengths = [aval.shape[dimension] for aval in ctx.avals_in]
    if size == sum(lengths):
        return lax.concatenate(blocks, dimension)
    counts = [n // size for n in lengths]
    ends = np.cumsum(counts)
    i = ctx.get_out_block_indices()[0][dimension]
    # Each child's (clamped) block was read; keep the one that holds block i. An
    # elementwise select (not a scalar-predicated one) lowers on every backend.
    out = blocks[0]
    for end, b in zip(ends[:-1], blocks[1:]):
        out = jnp.where(jnp.full(out.shape, i >= end), b.astype(out.dtype), out)
    return out


def _common_index_map(specs, what: str, place):
    """The index map of an output pushed from several operands' specs (``concatenate``,
    ``stack``): their block index, which must be the same object for all of them, with
    ``place`` giving the output's (the joined dim's block index is 0)."""

    def new_index_map(*args):
        indices = [tf.as_tuple(s.index_map(*args)) for s in specs]
        if any(a is not b for idx in indices[1:] for a, b in zip(indices[0], idx)):
            raise ValueError(f"Cannot statically prove that all input blocks to {what} are "
                             "the same.")
        return place(indices[0])

    return new_index_map


@register_push_block_spec_rule(lax.concatenate_p)
def _concatenate_push_rule(ctx, *specs, dimension):
    for spec, aval in zip(specs, ctx.avals_in):
        dim = spec.block_shape[dimension]
        if not (tf.is_blocked(dim) and tf.block_size(dim) == aval.shape[dimension]):
            raise NotImplementedError(
                "concatenate not supported yet: pushing block specs through a concatenate "
                f"needs every operand's block to span dim {dimension} whole; got "
                f"{[tf.describe(s) for s in specs]} for operands "
                f"{[a.str_short() for a in ctx.avals_in]}")

    block = list(specs[0].block_shape)
    block[dimension] = sum(tf.block_size(s.block_shape[dimension]) for s in specs)
    return bs.BlockSpec(tuple(block), _common_index_map(
        specs, "concatenate", lambda idx: (*idx[:dimension], 0, *idx[dimension + 1:])))


# -- stack / unstack -----------------------------------------------------------------------


@register_pull_block_spec_rule(lax.stack_p)
def _stack_pull_rule(ctx, transform, *, axis):
    size = _concat_block(transform, axis, "Stack")
    n = len(ctx.avals_in)
    if size != n:
        raise NotImplementedError(
            "Stacking only supported when the block size along the stack axis equals the "
            f"number of inputs. Got block_dim={size}, expected {n}.")
    block = list(transform.block_shape)
    block.pop(axis)
    index_fn = transform.block_index_transform

    def new_index(*idx):
        out = list(index_fn(*idx))
        out.pop(axis)
        return tuple(out)

    return [transform.replace(block_shape=tuple(block), block_index_transform=new_index)] * n


@register_eval_rule(lax.stack_p)
def _stack_eval_rule(ctx, *blocks, axis):
    del ctx
    return lax.stack(blocks, axis=axis)


@register_push_block_spec_rule(lax.stack_p)
def _stack_push_rule(ctx, *specs, axis):
    del ctx
    block = list(specs[0].block_shape)
    block.insert(axis, len(specs))
    return bs.BlockSpec(tuple(block), _common_index_map(
        specs, "stack", lambda idx: (*idx[:axis], 0, *idx[axis:])))


@register_pull_block_spec_rule(lax.unstack_p)
def _unstack_pull_rule(ctx, transforms, *, axis):
    del ctx
    present = [t for t in transforms if t is not tf.no_block_index_transform]
    if not present:
        return [tf.no_block_index_transform]
    t = present[0]
    block = list(t.block_shape)
    block.insert(axis, bs.Blocked(len(transforms)))
    index_fn = t.block_index_transform

    def new_index(*idx):
        out = list(index_fn(*idx))
        out.insert(axis, 0)
        return tuple(out)

    return [t.replace(block_shape=tuple(block), block_index_transform=new_index)]


@register_eval_rule(lax.unstack_p)
def _unstack_eval_rule(ctx, x, *, axis):
    del ctx
    return lax.unstack(x, axis=axis)


@register_push_block_spec_rule(lax.unstack_p)
def _unstack_push_rule(ctx, spec, *, axis):
    n = ctx.avals_in[0].shape[axis]
    dim = spec.block_shape[axis]
    if not (tf.is_blocked(dim) and tf.block_size(dim) == n):
        raise NotImplementedError(
            f"unstack not supported yet: the block ({tf.describe(spec)}) must span the "
            f"unstacked axis {axis} whole")
    ndim = len(spec.block_shape)
    dims = [d for d in range(ndim) if d != axis % ndim]
    return [tf.spec_of_dims(spec, dims)] * n


for _prim in (lax.slice_p, lax.concatenate_p, lax.stack_p, lax.unstack_p):
    register_usage_rule(_prim)(forward_usage)

