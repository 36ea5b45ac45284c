"""Fuser rules of reductions, ``dot_general`` and the PRNG primitives.

A reduction or a contraction needs its whole reduced/contracted axis in one block. A
random-number primitive pulled into blocks folds the block indices into its key, so
each block draws its own numbers (as upstream: a fused draw is not the unfused one).
"""

from __future__ import annotations

import jax
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
from pallas._src.fuser.usage import Usage
from pallas._src.memory import MemorySpace

REDUCTIONS = {
    lax.reduce_sum_p: lax.reduce_sum_p, lax.reduce_max_p: lax.reduce_max_p,
    lax.reduce_min_p: lax.reduce_min_p, lax.reduce_prod_p: lax.reduce_prod_p,
    lax.reduce_and_p: lax.reduce_and_p, lax.reduce_or_p: lax.reduce_or_p,
}


def _reduce_pull_rule(ctx, transform, *, axes, **params):
    del params
    shape = ctx.avals_in[0].shape
    out_dims = iter(transform.block_shape)
    block = tuple(bs.Blocked(n) if d in axes else next(out_dims) for d, n in enumerate(shape))
    index_fn = transform.block_index_transform

    def new_index(*idx):
        out = iter(index_fn(*idx))
        return tuple(0 if d in axes else next(out) for d in range(len(shape)))

    return [transform.replace(block_shape=block, block_index_transform=new_index)]


def _reduce_eval(prim):
    def rule(ctx, x, *, axes, **params):
        shape = ctx.avals_in[0].shape
        block = ctx.in_block_specs[0].block_shape
        for d in axes:
            if tf.block_size(block[d]) != shape[d]:
                raise NotImplementedError(
                    f"{prim.name} on partial blocks not supported: the block "
                    f"{tf.describe_block_shape(block)} must span reduced axis {d} whole")
        kept = [d for d, dim in enumerate(block) if not tf.is_squeezed(dim)]
        local = tuple(kept.index(d) for d in axes)
        return prim.bind(x, axes=local, **params)

    return rule


def _reduce_push_rule(ctx, spec, *, axes, **params):
    del params
    shape = ctx.avals_in[0].shape
    if not all(tf.full_size(spec.block_shape[d]) == shape[d] for d in axes):
        raise NotImplementedError(
            f"reduce_sum over partial blocks not supported yet: shape {tuple(shape)}, "
            f"block shape {tf.describe_block_shape(spec.block_shape)}, axes {axes}")
    index_map = spec.index_map

    def new_index_map(*args):
        idx = tf.as_tuple(index_map(*args))
        return tuple(i for d, i in enumerate(idx) if d not in axes)

    return bs.BlockSpec(tuple(b for d, b in enumerate(spec.block_shape) if d not in axes),
                        new_index_map, pipeline_mode=spec.pipeline_mode,
                        memory_space=spec.memory_space)


for _prim in REDUCTIONS:
    register_pull_block_spec_rule(_prim)(_reduce_pull_rule)
    register_eval_rule(_prim)(_reduce_eval(_prim))
    register_push_block_spec_rule(_prim)(_reduce_push_rule)


# -- dot_general: 2-D, one contracting dim, no batch dims -------------------------------


@register_pull_block_spec_rule(lax.dot_general_p)
def _dot_general_pull_rule(ctx, transform, *, dimension_numbers, **params):
    del params
    if transform is tf.no_block_index_transform:
        return [transform, transform]
    lhs, rhs = ctx.avals_in
    (lc, rc), (lb, rb) = dimension_numbers
    why = None
    if lhs.ndim != 2 or rhs.ndim != 2:
        why = "Only 2D dot_general supported."
    elif lb or rb:
        why = "Batch dimensions not supported"
    elif len(lc) != 1 or len(rc) != 1:
        why = "Multiple contracting dimensions not supported"
    if why:
        raise NotImplementedError(
            f"{why} (pallas.fuser pulling {tf.describe(transform)} through dot_general "
            f"{lhs.str_short()} x {rhs.str_short()})")
    k = lhs.shape[lc[0]]

    def operand(contracting: int, out_dim: int):
        index_fn = transform.block_index_transform
        kept = 1 - contracting

        def new_index(*idx):
            out = [0, 0]
            out[kept] = index_fn(*idx)[out_dim]
            return tuple(out)

        block = [None, None]
        block[contracting] = k  # the whole contraction in one block
        block[kept] = transform.block_shape[out_dim]
        return tf.BlockIndexTransform(tuple(block), new_index,
                                      pipeline_mode=transform.pipeline_mode)

    return [operand(lc[0], 0), operand(rc[0], 1)]


@register_usage_rule(lax.dot_general_p)
def _dot_general_usage_rule(ctx, used_out, **params):
    del ctx, params
    return [{Usage.REGULAR}] * 2 if Usage.REGULAR in used_out else [set(), set()]


@register_eval_rule(lax.dot_general_p)
def _dot_general_eval_rule(ctx, x, y, **params):
    del ctx
    return lax.dot_general_p.bind(x, y, **params)


@register_push_block_spec_rule(lax.dot_general_p)
def _dot_general_push_rule(ctx, lhs_spec, rhs_spec, **params):
    del ctx, params
    raise NotImplementedError(
        "dot_general not supported yet: pallas.fuser cannot push block specs "
        f"({tf.describe(lhs_spec)}, {tf.describe(rhs_spec)}) through a contraction")


# -- PRNG ------------------------------------------------------------------------------------



def _key_transform():
    return tf.BlockIndexTransform(None, memory_space=MemorySpace.KEY)


@register_pull_block_spec_rule(jc.random_bits_p)
def _random_bits_pull_rule(ctx, transform, **params):
    del ctx, transform, params
    return [_key_transform()]


@register_eval_rule(jc.random_bits_p)
def _random_bits_eval_rule(ctx, key, *, bit_width, shape):
    del shape
    spec = ctx.out_block_specs[0]
    for i in ctx.get_out_block_indices()[0]:
        key = jax.random.fold_in(key, i)
    return jc.random_bits(key, bit_width=bit_width, shape=tf.kernel_shape(spec.block_shape))


@register_pull_block_spec_rule(jc.random_wrap_p)
def _random_wrap_pull_rule(ctx, transform, *, impl):
    del ctx, transform, impl
    return [tf.BlockIndexTransform(None)]


@register_eval_rule(jc.random_wrap_p)
def _random_wrap_eval_rule(ctx, data, *, impl):
    del ctx
    return jax.random.wrap_key_data(data, impl=impl)


@register_pull_block_spec_rule(jc.random_fold_in_p)
def _random_fold_in_pull_rule(ctx, transform, **params):
    del ctx, transform, params
    return [_key_transform(), tf.no_block_index_transform]


@register_eval_rule(jc.random_fold_in_p)
def _random_fold_in_eval_rule(ctx, key, msg):
    del ctx
    return jc.random_fold_in(key, msg)
