"""Fuser rules of ``reshape``: block specs through merged and split dimensions.

The operand and result shapes are matched group by group: a result dim that merges
consecutive operand dims, an operand dim split into consecutive result dims, or one dim
on each side. A block maps through a group when it stays one contiguous run of
elements: across a merge, the block covers whole minor dims and then a part of one
more; across a split, every result dim but the first is covered whole.
"""

from __future__ import annotations

import math

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
from pallas._src.fuser.usage import forward_usage


def _groups(shape_in, shape_out):
    """Pairs of (operand dims, result dims) with equal products, or None if none exist."""
    groups, i, j = [], 0, 0
    while i < len(shape_in) or j < len(shape_out):
        if i < len(shape_in) and shape_in[i] == 1 and (j == len(shape_out) or shape_out[j] != 1):
            groups.append(([i], []))
            i += 1
            continue
        if j < len(shape_out) and shape_out[j] == 1 and (i == len(shape_in) or shape_in[i] != 1):
            groups.append(([], [j]))
            j += 1
            continue
        if i == len(shape_in) or j == len(shape_out):
            return None
        ins, outs = [i], [j]
        p_in, p_out = shape_in[i], shape_out[j]
        i, j = i + 1, j + 1
        while p_in != p_out:
            if p_in < p_out and i < len(shape_in):
                p_in *= shape_in[i]
                ins.append(i)
                i += 1
            elif p_out < p_in and j < len(shape_out):
                p_out *= shape_out[j]
                outs.append(j)
                j += 1
            else:
                return None
        groups.append((ins, outs))
    return groups


def _unsupported(aval_in, aval_out, block_shape, why: str) -> NotImplementedError:
    return NotImplementedError(
        f"reshape not supported yet: {aval_in.str_short()} -> {aval_out.str_short()} with "
        f"block shape {tf.describe_block_shape(block_shape)}: {why}")


@register_pull_block_spec_rule(lax.reshape_p)
def _reshape_pull_rule(ctx, transform, *, new_sizes, dimensions, sharding):
    del new_sizes, sharding
    aval_in, aval_out = ctx.avals_in[0], ctx.avals_out[0]
    if dimensions is not None:
        raise NotImplementedError("reshape with dimensions= is not supported by pallas.fuser")
    if transform is tf.no_block_index_transform or transform.block_shape is None:
        raise _unsupported(aval_in, aval_out, None, "the result has no block shape")
    out_block = transform.block_shape
    groups = _groups(aval_in.shape, aval_out.shape)
    if groups is None:
        raise _unsupported(aval_in, aval_out, out_block, "the dims do not group")
    block: list = [None] * len(aval_in.shape)
    plan = []  # per group: how operand block indices come from the result's
    for ins, outs in groups:
        if not outs:  # an operand dim of size 1
            block[ins[0]] = 1
            plan.append(("zero", ins, None))
        elif not ins:  # a result dim of size 1: its block index is dropped
            plan.append(("drop", None, outs))
        elif len(ins) == 1 and len(outs) == 1:
            dim = out_block[outs[0]]
            block[ins[0]] = 1 if dim is None else dim
            plan.append(("same", ins, outs))
        elif len(outs) == 1:  # a merge: block sizes spread from the minor operand dim
            dim = out_block[outs[0]]
            if not tf.is_blocked(dim):
                raise _unsupported(aval_in, aval_out, out_block,
                                   "reshape merge must use `Blocked` block size")
            size, sizes = tf.block_size(dim), []
            for d in reversed(ins):
                n = aval_in.shape[d]
                if size % n == 0:
                    sizes.append(n)
                    size //= n
                elif n % size == 0:
                    sizes.append(size)
                    size = 1
                else:
                    raise _unsupported(aval_in, aval_out, out_block, "unsupported reshape merge")
            sizes.reverse()
            grid = tuple(aval_in.shape[d] // s for d, s in zip(ins, sizes))
            if math.prod(grid) != -(-aval_out.shape[outs[0]] // tf.block_size(dim)):
                raise _unsupported(aval_in, aval_out, out_block,
                                   "reshape merge must maintain grid size")
            for d, s in zip(ins, sizes):
                block[d] = s
            plan.append(("merge", ins, (outs[0], grid)))
        elif len(ins) == 1:  # a split: all result dims but the first must be whole
            dims = [out_block[o] for o in outs]
            if not all(tf.is_blocked(d) for d in dims):
                raise _unsupported(aval_in, aval_out, out_block,
                                   "reshape must use Blocked block size on split dims")
            for o, d in zip(outs[1:], dims[1:]):
                if tf.block_size(d) != aval_out.shape[o]:
                    raise _unsupported(aval_in, aval_out, out_block,
                                       f"the block must cover result dim {o} whole")
            block[ins[0]] = math.prod(tf.block_size(d) for d in dims)
            plan.append(("split", ins, outs))
        else:
            raise _unsupported(aval_in, aval_out, out_block, "dims both merge and split")
    index_fn = transform.block_index_transform

    def new_index(*idx):
        out_idx = index_fn(*idx)
        result = [0] * len(block)
        for kind, ins, outs in plan:
            if kind == "zero":
                result[ins[0]] = 0
            elif kind in ("same", "split"):
                result[ins[0]] = out_idx[outs[0]]
            elif kind == "merge":
                o, grid = outs
                parts = jnp.unravel_index(out_idx[o], grid) if len(grid) > 1 else (out_idx[o],)
                for d, p in zip(ins, parts):
                    result[d] = p
        return tuple(result)

    return [transform.replace(block_shape=tuple(block), block_index_transform=new_index)]


@register_eval_rule(lax.reshape_p)
def _reshape_eval_rule(ctx, x, *, new_sizes, dimensions, sharding):
    del new_sizes, dimensions, sharding
    # The pull rule only allows blocks that stay contiguous: a plain reshape is right.
    return x.reshape(tf.kernel_shape(ctx.out_block_specs[0].block_shape))


@register_push_block_spec_rule(lax.reshape_p)
def _reshape_push_rule(ctx, spec, *, new_sizes, dimensions, sharding):
    del new_sizes, sharding
    aval_in, aval_out = ctx.avals_in[0], ctx.avals_out[0]
    in_block = spec.block_shape
    if dimensions is not None:
        raise NotImplementedError("reshape with dimensions= is not supported by pallas.fuser")
    groups = _groups(aval_in.shape, aval_out.shape)
    if groups is None:
        raise _unsupported(aval_in, aval_out, in_block, "the dims do not group")
    block: list = [None] * len(aval_out.shape)
    plan = []
    for ins, outs in groups:
        if not ins:
            block[outs[0]] = 1
            plan.append(("zero", outs, None))
        elif not outs:
            continue
        elif len(ins) == 1 and len(outs) == 1:
            block[outs[0]] = in_block[ins[0]]
            plan.append(("same", outs, ins[0]))
        elif len(ins) == 1:  # a split: the block's size fills minor result dims first
            dim = in_block[ins[0]]
            if not tf.is_blocked(dim):
                raise _unsupported(aval_in, aval_out, in_block,
                                   "reshape must use Blocked block size on lanes")
            minor = math.prod(aval_out.shape[o] for o in outs[1:])
            if tf.block_size(dim) % minor:
                raise _unsupported(aval_in, aval_out, in_block,
                                   "the block does not cover the minor result dims whole")
            block[outs[0]] = tf.block_size(dim) // minor
            for o in outs[1:]:
                block[o] = aval_out.shape[o]
            plan.append(("split", outs, ins[0]))
        elif len(outs) == 1:  # a merge: minor operand dims must be whole
            dims = [in_block[d] for d in ins]
            if not all(tf.is_blocked(d) for d in dims) or any(
                    tf.block_size(d) != aval_in.shape[i] for i, d in zip(ins[1:], dims[1:])):
                raise _unsupported(aval_in, aval_out, in_block,
                                   "the block must cover the minor operand dims whole")
            block[outs[0]] = math.prod(tf.block_size(d) for d in dims)
            plan.append(("same", outs, ins[0]))
        else:
            raise _unsupported(aval_in, aval_out, in_block, "dims both merge and split")
    index_map = spec.index_map

    def new_index_map(*args):
        idx = tf.as_tuple(index_map(*args))
        result = [0] * len(block)
        for kind, outs, i in plan:
            if kind in ("same", "split"):
                result[outs[0]] = idx[i]
        return tuple(result)

    return bs.BlockSpec(tuple(block), new_index_map)


register_usage_rule(lax.reshape_p)(forward_usage)
