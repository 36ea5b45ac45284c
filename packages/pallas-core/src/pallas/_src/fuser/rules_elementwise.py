"""Fuser rules of elementwise primitives: unary ops, binary ops with broadcasting, select.

An elementwise op maps a block to the same block. A binary op whose operand has a size-1
dimension where the result has more (``x + bias[None, :]``) reads block 0 of size 1 along
it; a scalar operand is passed whole.
"""

from __future__ import annotations

import functools

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
from pallas._src.fuser.usage import forward_usage
from pallas._src.primitives.hints import multiple_of_p


def _bind_eval(prim, ctx, *args, **params):
    del ctx
    return prim.bind(*args, **params)


def _same_pull(ctx, transform, **params):
    del params
    return [transform] * len(ctx.avals_in)


def _same_push(ctx, spec, **params):
    del ctx, params
    return spec


UNARY = [
    lax.exp_p, lax.exp2_p, lax.expm1_p, lax.log_p, lax.log1p_p, lax.tanh_p, lax.logistic_p,
    lax.sin_p, lax.cos_p, lax.tan_p, lax.asin_p, lax.acos_p, lax.atan_p, lax.sinh_p,
    lax.cosh_p, lax.asinh_p, lax.acosh_p, lax.atanh_p, lax.sqrt_p, lax.rsqrt_p, lax.cbrt_p,
    lax.square_p, lax.integer_pow_p, lax.neg_p, lax.abs_p, lax.sign_p, lax.floor_p,
    lax.ceil_p, lax.round_p, lax.is_finite_p, lax.not_p, lax.erf_p, lax.erfc_p,
    lax.erf_inv_p, lax.lgamma_p, lax.digamma_p, lax.population_count_p, lax.clz_p,
    lax.reduce_precision_p, lax.real_p, lax.imag_p, lax.conj_p, lax.copy_p,
    lax.convert_element_type_p, multiple_of_p,
]

for _prim in UNARY:
    register_pull_block_spec_rule(_prim)(_same_pull)
    register_push_block_spec_rule(_prim)(_same_push)
    register_usage_rule(_prim)(forward_usage)
    register_eval_rule(_prim)(functools.partial(_bind_eval, _prim))


# -- bitcast_convert_type: elementwise only between dtypes of one width -----------------


@register_pull_block_spec_rule(lax.bitcast_convert_type_p)
def _bitcast_convert_type_pull_rule(ctx, transform, *, new_dtype):
    old = ctx.avals_in[0].dtype
    if old.itemsize != new_dtype.itemsize:
        raise NotImplementedError(
            f"pallas.fuser: bitcast_convert_type from {old} to {new_dtype} changes the "
            f"element width; only same-width bitcasts can be fused (block spec "
            f"{tf.describe(transform)})")
    return [transform]


register_push_block_spec_rule(lax.bitcast_convert_type_p)(_same_push)
register_eval_rule(lax.bitcast_convert_type_p)(
    functools.partial(_bind_eval, lax.bitcast_convert_type_p))


# -- binary ops ----------------------------------------------------------------------------


def broadcast_dim_transform(transform, dim: int):
    """``transform`` for an operand of size 1 along ``dim``: block 0, of size 1."""
    index_fn = transform.block_index_transform

    def new_index(*idx):
        out = list(index_fn(*idx))
        out[dim] = 0
        return tuple(out)

    old = transform.block_shape[dim]
    if tf.is_squeezed(old):
        return transform.replace(block_index_transform=new_index)
    new_dim = bs.Element(1) if isinstance(old, bs.Element) else 1
    shape = list(transform.block_shape)
    shape[dim] = new_dim
    return transform.replace(block_shape=tuple(shape), block_index_transform=new_index)


def _binop_pull_rule(ctx, transform, **params):
    del params
    lhs, rhs = ctx.avals_in
    if not rhs.shape:
        return [transform, tf.no_block_index_transform]
    if not lhs.shape:
        return [tf.no_block_index_transform, transform]
    if transform is tf.no_block_index_transform or transform.block_shape is None:
        return [transform, transform]
    lt, rt = transform, transform
    for i, (l, r) in enumerate(zip(lhs.shape, rhs.shape, strict=True)):
        if l == 1 and r != 1:
            lt = broadcast_dim_transform(lt, i)
        if r == 1 and l != 1:
            rt = broadcast_dim_transform(rt, i)
    return [lt, rt]


def _binop_push_rule(ctx, lhs_spec, rhs_spec, **params):
    del params
    lhs, rhs = ctx.avals_in
    if not rhs.shape:
        return lhs_spec
    if not lhs.shape:
        return rhs_spec
    has_l, has_r = lhs_spec is not bs.no_block_spec, rhs_spec is not bs.no_block_spec
    if has_l and has_r:
        if lhs_spec is rhs_spec:
            return lhs_spec
        raise ValueError(
            "Illegal binary push. One of the block specs must be no_block_spec (pushing "
            f"two different block specs, {tf.describe(lhs_spec)} and "
            f"{tf.describe(rhs_spec)}, through one binary op).")
    for l, r in zip(lhs.shape, rhs.shape, strict=True):
        if l == 1 and r != 1 and has_l:
            raise ValueError(
                f"Cannot propagate block spec through LHS broadcast. The operand {lhs.str_short()} "
                f"is broadcast against {rhs.str_short()}; its block spec "
                f"({tf.describe(lhs_spec)}) does not determine the result's.")
        if r == 1 and l != 1 and has_r:
            raise ValueError(
                f"Cannot propagate block spec through RHS broadcast. The operand {rhs.str_short()} "
                f"is broadcast against {lhs.str_short()}; its block spec "
                f"({tf.describe(rhs_spec)}) does not determine the result's.")
    return lhs_spec if has_l else rhs_spec


BINARY = [
    lax.add_p, lax.sub_p, lax.mul_p, lax.div_p, lax.rem_p, lax.pow_p, lax.max_p, lax.min_p,
    lax.lt_p, lax.le_p, lax.gt_p, lax.ge_p, lax.eq_p, lax.ne_p, lax.and_p, lax.or_p,
    lax.xor_p, lax.shift_left_p, lax.shift_right_logical_p, lax.shift_right_arithmetic_p,
    lax.atan2_p, lax.nextafter_p, jc.add_any_p,
]

for _prim in BINARY:
    register_pull_block_spec_rule(_prim)(_binop_pull_rule)
    register_push_block_spec_rule(_prim)(_binop_push_rule)
    register_usage_rule(_prim)(forward_usage)
    register_eval_rule(_prim)(functools.partial(_bind_eval, _prim))


# -- select_n and clamp: operands of the result's shape, or scalars ----------------------


def _shaped_or_scalar_pull(ctx, transform, **params):
    del params
    return [transform if aval.shape else tf.no_block_index_transform for aval in ctx.avals_in]


def _shaped_or_scalar_push(ctx, *specs, **params):
    del params
    present = [s for s, aval in zip(specs, ctx.avals_in)
               if s is not bs.no_block_spec and aval.shape]
    if not present:
        return next(s for s in specs if s is not bs.no_block_spec)
    if any(s is not present[0] for s in present[1:]):
        raise NotImplementedError(
            "pallas.fuser: pushing different block specs "
            f"({', '.join(tf.describe(s) for s in present)}) through one "
            "select_n/clamp is not supported")
    return present[0]


for _prim in (lax.select_n_p, lax.clamp_p):
    register_pull_block_spec_rule(_prim)(_shaped_or_scalar_pull)
    register_push_block_spec_rule(_prim)(_shaped_or_scalar_push)
    register_usage_rule(_prim)(forward_usage)
    register_eval_rule(_prim)(functools.partial(_bind_eval, _prim))
