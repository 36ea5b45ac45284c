"""Triton lowering rules of shape primitives: broadcasts, reshapes, transposes, ``iota``,
two-way ``concatenate``, and ``jnp.stack``/``jnp.unstack`` of two (``tl.join``/``tl.split``)."""

from __future__ import annotations

from jax import lax

from pallas_triton._src import jax_compat as jc
from pallas_triton._src.codegen import (
    check_pow2,
    dtype_name,
    expand,
    tl_dtype,
    unsupported,
)
from pallas_triton._src.lowering.engine import value_rule
from pallas_triton._src.lowering.values import (
    _emit,
    _out,
    splat,
)


@value_rule(jc.broadcast_to_p)
def _broadcast_to(ctx, eqn, x):
    """``broadcast_to`` (index arrays broadcast against each other, e.g. in
    ``x_ref.at[rows[:, None], cols[None]]``): Triton's ``tl.broadcast_to``."""
    shape, dtype = _out(eqn)
    check_pow2(shape, "broadcast_to")
    if x.shape == ():
        return _emit(ctx, eqn, splat(ctx, x, shape, dtype))
    if len(x.shape) != len(shape):
        raise unsupported("broadcast_to that adds dimensions", "use jnp.expand_dims first")
    return _emit(ctx, eqn, f"tl.broadcast_to({x.expr}, {list(shape)})")


@value_rule(lax.broadcast_in_dim_p)
def _broadcast_in_dim(ctx, eqn, x, *dyn):
    if dyn:
        raise unsupported("broadcast_in_dim with dynamic shapes")
    shape, dtype = _out(eqn)
    check_pow2(shape, "broadcast_in_dim")
    if x.shape == ():
        return _emit(ctx, eqn, splat(ctx, x, shape, dtype))
    dims = tuple(eqn.params["broadcast_dimensions"])
    idx = []
    for i in range(len(shape)):
        idx.append(":" if i in dims else "None")
    expr = x.expr
    if len(dims) != len(shape):
        expr = f"{expr}[{', '.join(idx)}]"
    if tuple(shape) != tuple(x.shape):
        expr = f"tl.broadcast_to({expr}, {list(shape)})"
    return _emit(ctx, eqn, expr)


@value_rule(lax.reshape_p)
def _reshape(ctx, eqn, x, *dyn):
    shape, dtype = _out(eqn)
    if tuple(shape) == tuple(x.shape):
        return [x]
    if shape == ():
        return _emit(ctx, eqn, f"tl.sum(tl.reshape({x.expr}, [1]), axis=0)")
    if x.shape == ():
        return _emit(ctx, eqn, splat(ctx, x, shape, dtype))
    check_pow2(shape, "reshape")
    return _emit(ctx, eqn, f"tl.reshape({x.expr}, {list(shape)})")


@value_rule(lax.squeeze_p)
def _squeeze(ctx, eqn, x):
    return _reshape(ctx, eqn, x)


@value_rule(lax.transpose_p)
def _transpose(ctx, eqn, x):
    perm = tuple(eqn.params["permutation"])
    if perm == tuple(range(len(perm))):
        return [x]
    if len(perm) == 2:
        return _emit(ctx, eqn, f"tl.trans({x.expr})")
    return _emit(ctx, eqn, f"tl.permute({x.expr}, {perm})")


@value_rule(lax.iota_p)
def _iota(ctx, eqn):
    shape, dtype = _out(eqn)
    dim = int(eqn.params["dimension"])
    check_pow2(shape, "iota")
    ar = f"tl.arange(0, {shape[dim]})"
    expr = expand(ar, dim, len(shape))
    if len(shape) > 1:
        expr = f"tl.broadcast_to({expr}, {list(shape)})"
    if dtype_name(dtype) != "int32":
        expr = f"({expr}).to({tl_dtype(dtype)})"
    return _emit(ctx, eqn, expr)


@value_rule(lax.concatenate_p)
def _concatenate(ctx, eqn, *xs):
    """Two equal-shaped operands: ``tl.join`` then move the new axis into place."""
    dim = int(eqn.params["dimension"])
    shape, dtype = _out(eqn)
    if len(xs) != 2 or xs[0].shape != xs[1].shape or not xs[0].shape:
        raise unsupported(
            "concatenate of other than two equally shaped blocks",
            "write the pieces into an output ref with pl.ds")
    check_pow2(shape, "concatenate")
    rank = len(xs[0].shape)
    joined = f"tl.join({xs[0].expr}, {xs[1].expr})"
    perm = list(range(rank))
    perm.insert(dim, rank)
    if perm != list(range(rank + 1)):
        joined = f"tl.permute({joined}, {tuple(perm)})"
    return _emit(ctx, eqn, f"tl.reshape({joined}, {list(shape)})")


def _moved(expr: str, rank: int, src: int, dst: int) -> str:
    """``expr`` (of rank ``rank``) with its axis ``src`` moved to position ``dst``."""
    perm = list(range(rank))
    perm.insert(dst, perm.pop(src))
    return expr if perm == list(range(rank)) else f"tl.permute({expr}, {tuple(perm)})"


@value_rule(lax.stack_p)
def _stack(ctx, eqn, *xs):
    """``jnp.stack([a, b], axis)``: ``tl.join`` makes the new last axis; a permute puts it
    at ``axis``. Triton joins exactly two tensors."""
    shape, _ = _out(eqn)
    if len(xs) != 2:
        raise unsupported(
            f"jnp.stack of {len(xs)} arrays (lax.stack_p)",
            "Triton's tl.join stacks exactly two; stack pairs, or write each array into "
            "an output ref with pl.ds")
    check_pow2(shape, "stack")
    joined = f"tl.join({xs[0].expr}, {xs[1].expr})"
    rank = len(shape)
    return _emit(ctx, eqn, _moved(joined, rank, rank - 1, int(eqn.params["axis"])))


@value_rule(lax.unstack_p)
def _unstack(ctx, eqn, x):
    """``jnp.unstack(x, axis)`` of an axis of size two: a permute makes it the last axis,
    ``tl.split`` takes it apart."""
    axis = int(eqn.params["axis"])
    if x.shape[axis] != 2:
        raise unsupported(
            f"jnp.unstack along an axis of size {x.shape[axis]} (lax.unstack_p)",
            "Triton's tl.split splits an axis of size two; slice the pieces with "
            "lax.slice_in_dim or read them from a ref with pl.ds")
    check_pow2(x.shape, "unstack")
    rank = len(x.shape)
    last = ctx.em.assign(_moved(x.expr, rank, axis, rank - 1), x.shape[:axis] + x.shape[
        axis + 1:] + (2,), x.dtype)
    outs = []
    for k, var in enumerate(eqn.outvars):
        outs.append(ctx.em.assign(f"tl.split({last.expr})[{k}]", tuple(var.aval.shape),
                                  var.aval.dtype))
    return outs
