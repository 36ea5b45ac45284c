"""Fuser rules of Ref reads and writes (``ref[...]``, ``ref.get()``, ``ref.swap(x)``).

A fusion that reads a closed-over Ref reads only the block it needs, straight from the
Ref: the pulled block spec of the read's result becomes the Ref's, and the eval rule
indexes the Ref with the block's window. Integer indices squeeze their dimension.
"""

from __future__ import annotations

import jax

from pallas._src import block_spec as bs
from pallas._src import jax_compat as jc
from pallas._src.fuser import transforms as tf
from pallas._src.fuser.registry import (
    register_eval_rule,
    register_pull_block_spec_rule,
)


def _indexer(ref_aval, tree, leaves, prim: str):
    """The one NDIndexer of a get/swap whose slices are all whole (``ref[...]``, ``ref[3]``)."""
    indexers = jax.tree.unflatten(tree, leaves)
    if len(indexers) > 1:
        raise NotImplementedError(f"{prim} not supported yet: chained ref transforms")
    if not indexers:
        return jc.NDIndexer.make_trivial_indexer(ref_aval.shape)
    indexer = indexers[0]
    if not isinstance(indexer, jc.NDIndexer):
        raise NotImplementedError(f"{prim} not supported yet: the ref is transformed "
                                  f"({type(indexer).__name__})")
    return indexer


def _check_whole(idx, size, prim: str) -> None:
    if not (isinstance(idx.start, int) and isinstance(idx.size, int) and idx.stride == 1
            and idx.start == 0 and idx.size == size):
        raise NotImplementedError(
            f"{prim} not supported yet: pallas.fuser reads a Ref in blocks only through "
            f"whole slices and integer indices, got {idx} of a dim of size {size}")


@register_pull_block_spec_rule(jc.get_p)
def _get_pull_rule(ctx, transform, *, tree):
    rest = [tf.no_block_index_transform] * (len(ctx.avals_in) - 1)
    if transform.block_shape is None:  # e.g. a PRNG key ref: read whole
        return [transform] + rest
    ref_aval = ctx.avals_in[0]
    indexer = _indexer(ref_aval, tree, ctx.avals_in[1:], "get")
    if not all(d is None or tf.is_blocked(d) or isinstance(d, bs.Squeezed)
               for d in transform.block_shape):
        raise NotImplementedError(
            f"get not supported yet: block shape {tf.describe_block_shape(transform.block_shape)}")
    dims = iter(transform.block_shape)
    block = []
    for idx, size in zip(indexer.indices, ref_aval.shape, strict=True):
        if not isinstance(idx, jc.Slice):
            block.append(bs.Squeezed())
            continue
        _check_whole(idx, size, "get")
        block.append(tf.block_size(next(dims)))
    index_fn = transform.block_index_transform

    def new_index(*idx):
        out = iter(index_fn(*idx))
        return tuple(0 if tf.is_squeezed(d) else next(out) for d in block)

    return [transform.replace(block_shape=tuple(block), block_index_transform=new_index)] + rest


def _window(i, dim):
    if tf.is_squeezed(dim):
        return i
    if tf.is_blocked(dim):
        size = tf.block_size(dim)
        return jc.ds(i * size, size)
    raise NotImplementedError(f"get/swap not supported yet: block dim {dim}")


@register_eval_rule(jc.get_p)
def _get_eval_rule(ctx, ref, *leaves, tree):
    spec = ctx.in_block_specs[0]
    if spec is bs.no_block_spec or spec.block_shape is None:
        return jc.get_p.bind(ref, *leaves, tree=tree)
    ref_aval = ctx.avals_in[0]
    indexer = _indexer(ref_aval, tree, leaves, "get")
    aval_indexer = _indexer(ref_aval, tree, ctx.avals_in[1:], "get")
    block_idx = iter(ctx.get_out_block_indices()[0])
    window = []
    for idx, idx_aval, dim in zip(indexer.indices, aval_indexer.indices, spec.block_shape,
                                  strict=True):
        if not isinstance(idx_aval, jc.Slice):
            window.append(idx)  # an integer index: the dim is squeezed
        else:
            window.append(_window(next(block_idx), dim))
    return ref.get(idx=tuple(window))


@register_pull_block_spec_rule(jc.swap_p)
def _swap_pull_rule(ctx, transform, **params):
    del params
    # The value swapped in and the value swapped out have the same blocks.
    return [transform, transform] + [tf.no_block_index_transform] * (len(ctx.avals_in) - 2)


@register_eval_rule(jc.swap_p)
def _swap_eval_rule(ctx, ref, val, *leaves, tree):
    ref_aval = ctx.avals_in[0]
    indexer = _indexer(ref_aval, tree, ctx.avals_in[2:], "swap")
    for idx, size in zip(indexer.indices, ref_aval.shape, strict=True):
        if not isinstance(idx, jc.Slice):
            raise NotImplementedError("swap not supported yet: integer indices")
        _check_whole(idx, size, "swap")
    spec = ctx.out_block_specs[0]
    block_idx = ctx.get_out_block_indices()[0]
    window = tuple(_window(i, d) for i, d in zip(block_idx, spec.block_shape, strict=True))
    return ref.swap(val, idx=window)
