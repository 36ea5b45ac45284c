"""Reductions: sum, max, min, prod, argmax, argmin, mean, var, any/all, logsumexp,
cumsum, over each axis (and several at once) of 2-D and 3-D blocks, with keepdims, ties
in argmax/argmin, and unsigned, int8, f16 and bf16 operands. Max/min over NaN are left
out: XLA's CPU reductions do not propagate NaN, so the reference itself is unreliable.

The keepdims cases use a (16, 256) array: a lane reduction runs over (8, 256) row blocks
into (8, 1) blocks, a sublane reduction over (16, 128) column blocks into (1, 128)
blocks, so every block is (8, 128)-tiled; the 3-D cases reduce one whole (4, 8, 128)
block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import pallas as pl
from pallas_conformance.registry import Case, dtype_tags, randn, register, sds, short, uniform

R, C = 16, 128
SHAPE3 = (4, 8, 128)
F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16
I8, I32, U32, BOOL = jnp.int8, jnp.int32, jnp.uint32, jnp.bool_


def _arg(f):
    return lambda x, axis, keepdims=False: f(x, axis=axis, keepdims=keepdims).astype(I32)


_OPS = {
    "sum": jnp.sum, "max": jnp.max, "min": jnp.min, "prod": jnp.prod,
    "argmax": _arg(jnp.argmax), "argmin": _arg(jnp.argmin),
    "mean": jnp.mean, "any": jnp.any, "all": jnp.all, "var": jnp.var,
    "sum_to_i32": lambda x, axis, keepdims=False: jnp.sum(x, axis=axis, dtype=I32,
                                                          keepdims=keepdims),
}


def _gen(op, dtype, shape):
    def gen(rng):
        if op == "prod":  # keep products of 128 values finite and well conditioned
            return (uniform(rng, shape, 0.97, 1.03, dtype),)
        return (randn(rng, shape, dtype),)

    return gen


def _reduce_case(op, dtype, axis, shape=None):
    fn_op = _OPS[op]
    if shape is None:
        # The tiled 2-D cases use (8, 128)-aligned blocks and 128-element output blocks
        # (which every backend, TPU's tiling included, can hold): axis 1 splits 256 rows
        # into two (128, 128) blocks, axis 0 splits 256 columns into two (16, 128) blocks.
        # A 1-D array of a 16-bit dtype is tiled by 256 elements on a TPU (32 bits per
        # lane), so its output blocks are 256 long: 512 rows in two (256, 128) blocks.
        ob = C * max(1, 4 // jnp.dtype(dtype).itemsize)
        shape = {1: (2 * ob, C), 0: (R, 2 * C)}.get(axis, (R, C))
    rows, cols = shape[-2:]

    def reference(x):
        # A full reduction keeps its dims: a (1, 1) result, which tiled memories can hold
        return fn_op(x, axis=axis, keepdims=True) if axis is None else fn_op(x, axis=axis)

    def fn(pallas_call, x):
        out = jax.eval_shape(reference, x)

        def kernel(x_ref, o_ref):
            o_ref[...] = reference(x_ref[...])

        if axis == len(shape) - 1 and len(shape) == 2:
            # Tile over the rows: each program reduces its own rows.
            return pallas_call(kernel, out_shape=sds(out.shape, out.dtype), grid=(2,),
                               in_specs=[pl.BlockSpec((rows // 2, cols), lambda i: (i, 0))],
                               out_specs=pl.BlockSpec((rows // 2,), lambda i: (i,)))(x)
        if axis == 0 and len(shape) == 2:
            # Tile over the columns: each program reduces whole columns.
            return pallas_call(kernel, out_shape=sds(out.shape, out.dtype), grid=(2,),
                               in_specs=[pl.BlockSpec((rows, cols // 2), lambda i: (0, i))],
                               out_specs=pl.BlockSpec((cols // 2,), lambda i: (i,)))(x)
        return pallas_call(kernel, out_shape=sds(out.shape, out.dtype))(x)

    ax = "all" if axis is None else f"axis{axis}"  # "all": a (1, 1) output
    tol = {"float32": (1e-4, 1e-5)} if op in ("sum", "mean", "prod") else {}
    tol.update({"bfloat16": (6e-2, 2e-2)} if op in ("sum", "mean", "prod") else {})
    register(Case(
        name=f"reductions/{op}_{ax}_{len(shape)}d_{short(dtype)}", fn=fn,
        inputs=_gen(op, dtype, shape), reference=reference,
        tags=frozenset({"reductions"} | dtype_tags(dtype)), tolerance=tol,
        description=f"{op} over {ax} of a {shape} {jnp.dtype(dtype).name} block",
    ))


for _op in ("sum", "max", "min", "prod", "argmax", "argmin"):
    for _axis in (0, 1, None):
        if _op.startswith("arg") and _axis is None:
            continue
        _reduce_case(_op, jnp.float32, _axis)
    for _axis in (0, 1, 2):
        if _op in ("sum", "max", "argmax"):
            _reduce_case(_op, jnp.float32, _axis, shape=(4, 8, C))
for _op in ("sum", "max", "min"):
    _reduce_case(_op, jnp.int32, 1)
    _reduce_case(_op, jnp.bfloat16, 1)
_reduce_case("mean", jnp.float32, 1)
_reduce_case("argmax", jnp.int32, 1)


def _bool_case(name, op):
    def fn(pallas_call, x):
        def kernel(x_ref, o_ref):
            o_ref[...] = op(x_ref[...], axis=1)

        return pallas_call(kernel, out_shape=sds((R,), jnp.bool_))(x)

    register(Case(
        name=f"reductions/{name}_axis1_2d_bool", fn=fn,
        inputs=lambda rng: (jnp.asarray(rng.random((R, C)) < 0.97),),
        reference=lambda x: op(x, axis=1), tags=frozenset({"reductions", "bool"}),
        description=f"jnp.{name} over the lanes of a bool block",
    ))


_bool_case("any", jnp.any)
_bool_case("all", jnp.all)


def _lse_fn(pallas_call, x):
    def kernel(x_ref, o_ref):
        o_ref[...] = jax.nn.logsumexp(x_ref[...], axis=-1)

    return pallas_call(kernel, out_shape=sds((R,), x.dtype))(x)


register(Case(name="reductions/logsumexp_axis1_2d_f32", fn=_lse_fn,
              inputs=lambda rng: (randn(rng, (R, C), scale=3.0),),
              reference=lambda x: jax.nn.logsumexp(x, axis=-1),
              tags=frozenset({"reductions"}), tolerance={"float32": (1e-5, 1e-5)},
              description="logsumexp over the lanes"))


def _cumsum_fn(pallas_call, x):
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.cumsum(x_ref[...], axis=1)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


register(Case(name="reductions/cumsum_axis1_2d_f32", fn=_cumsum_fn,
              inputs=lambda rng: (randn(rng, (8, C)),),
              reference=lambda x: jnp.cumsum(x, axis=1), tags=frozenset({"reductions"}),
              tolerance={"float32": (1e-4, 1e-5)}, description="cumsum over the lanes"))


# The keepdims cases reduce a (16, 256) array in (8, 128)-tiled blocks.
WR, WC = 16, 256
def _gen_default(dtype, shape):
    def gen(rng):
        return randn(rng, shape, dtype)

    return gen


def _ties(dtype, shape):
    """Few distinct values, so the extremum occurs several times along every axis."""
    def gen(rng):
        return jnp.asarray(rng.integers(0, 3, size=shape), dtype)

    return gen


def _full_u32(dtype, shape):
    def gen(rng):
        return jnp.asarray(rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32))

    return gen


def _near_one(dtype, shape):
    def gen(rng):
        return uniform(rng, shape, 0.97, 1.03, dtype)

    return gen


def _signs(dtype, shape):
    def gen(rng):
        return jnp.asarray(rng.choice([-1, 1], size=shape), dtype)

    return gen


def _bools(dtype, shape):
    def gen(rng):
        return jnp.asarray(rng.random(shape) < 0.9)

    return gen


def _case2d(op, dtype, axis, gen=_gen_default, suffix="", tolerance=None):
    """A reduction over one axis of a (16, 256) array, tiled along the other axis."""
    fn_op = _OPS[op]

    def reference(x):
        return fn_op(x, axis=axis, keepdims=True)

    def fn(pallas_call, x):
        out = jax.eval_shape(reference, x)

        def kernel(x_ref, o_ref):
            o_ref[...] = fn_op(x_ref[...], axis=axis, keepdims=True)

        if axis == 1:
            in_spec = pl.BlockSpec((8, WC), lambda i: (i, 0))
            out_spec = pl.BlockSpec((8, 1), lambda i: (i, 0))
        else:
            in_spec = pl.BlockSpec((WR, 128), lambda i: (0, i))
            out_spec = pl.BlockSpec((1, 128), lambda i: (0, i))
        return pallas_call(kernel, out_shape=sds(out.shape, out.dtype), grid=(2,),
                           in_specs=[in_spec], out_specs=out_spec)(x)

    register(Case(
        name=f"reductions/{op}{suffix}_axis{axis}_keepdims_{short(dtype)}", fn=fn,
        inputs=lambda rng: (gen(dtype, (WR, WC))(rng),), reference=reference,
        tags=frozenset({"reductions"} | dtype_tags(dtype)), tolerance=dict(tolerance or {}),
        description=f"{op}{suffix.replace('_', ' ')} over axis {axis} of (16, 256) "
                    f"{jnp.dtype(dtype).name} in tiles, keepdims",
    ))


def _case3d(op, dtype, axis, gen=_gen_default, suffix="", tolerance=None):
    """A reduction over ``axis`` (an int or a tuple) of one whole (4, 8, 128) block."""
    fn_op = _OPS[op]

    def reference(x):
        return fn_op(x, axis=axis)

    def fn(pallas_call, x):
        out = jax.eval_shape(reference, x)

        def kernel(x_ref, o_ref):
            o_ref[...] = fn_op(x_ref[...], axis=axis)

        return pallas_call(kernel, out_shape=sds(out.shape, out.dtype))(x)

    ax = "".join(str(a) for a in axis) if isinstance(axis, tuple) else str(axis)
    register(Case(
        name=f"reductions/{op}{suffix}_axis{ax}_3d_{short(dtype)}", fn=fn,
        inputs=lambda rng: (gen(dtype, SHAPE3)(rng),), reference=reference,
        tags=frozenset({"reductions"} | dtype_tags(dtype)), tolerance=dict(tolerance or {}),
        description=f"{op}{suffix.replace('_', ' ')} over axis {axis} of a {SHAPE3} "
                    f"{jnp.dtype(dtype).name} block",
    ))


_SUM_TOL = {"float32": (1e-4, 1e-5), "float16": (5e-2, 1e-2)}

# Every axis of a 3-D block for argmin and min; prod, sum and max over one or several axes.
for _axis in (0, 1, 2):
    _case3d("argmin", F32, _axis)
    _case3d("min", F32, _axis)
_case3d("prod", F32, 1, gen=_near_one, tolerance=_SUM_TOL)
_case3d("sum", F32, (1, 2), tolerance=_SUM_TOL)
_case3d("max", F32, (0, 2))
_case3d("sum", I32, (0, 1, 2))

# Ties: argmax/argmin return the first index of the extremum.
for _axis in (0, 1):
    _case2d("argmax", I32, _axis, gen=_ties, suffix="_ties")
    _case2d("argmin", I32, _axis, gen=_ties, suffix="_ties")
_case3d("argmax", F32, 2, gen=_ties, suffix="_ties")

# Dtypes.
_case2d("argmax", BF16, 1)
_case2d("argmin", F16, 0)
_case2d("sum", F16, 1, tolerance=_SUM_TOL)
_case2d("max", F16, 0)
_case2d("max", I8, 0)
_case2d("min", I8, 1)
_case2d("sum_to_i32", I8, 1)
_case2d("max", U32, 1, gen=_full_u32, suffix="_large")
_case2d("min", U32, 0, gen=_full_u32, suffix="_large")
_case2d("sum", U32, 0, gen=_full_u32, suffix="_wrap")
_case2d("argmax", U32, 1, gen=_full_u32, suffix="_large")
_case2d("prod", I32, 1, gen=_signs, suffix="_signs")
_case2d("sum", BF16, 0, tolerance={"bfloat16": (6e-2, 2e-2)})
_case2d("any", BOOL, 0, gen=_bools)
_case2d("all", BOOL, 0, gen=_bools)

# Semantics.
_case2d("var", F32, 1, tolerance=_SUM_TOL)
_case2d("sum", F32, 0, tolerance=_SUM_TOL)
