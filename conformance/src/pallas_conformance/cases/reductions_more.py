"""More reductions: the axes, dtypes and semantics that ``reductions`` leaves out
(argmin and min/prod over every axis of 3-D blocks, ties in argmax/argmin, unsigned and
int8 reductions, f16, several axes at once, keepdims, var). Max/min over NaN are left
out: XLA's CPU reductions do not propagate NaN, so the reference itself is unreliable.

2-D cases use a (16, 256) array: a lane reduction runs over (8, 256) row blocks into
(8, 1) blocks (keepdims), a sublane reduction over (16, 128) column blocks into (1, 128)
blocks, so every block is (8, 128)-tiled. 3-D cases reduce one whole (4, 8, 128) block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import pallas as pl
from pallas_conformance.registry import Case, dtype_tags, randn, register, sds, short, uniform

R, C = 16, 256
SHAPE3 = (4, 8, 128)
F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16
I8, I32, U32, BOOL = jnp.int8, jnp.int32, jnp.uint32, jnp.bool_


def _arg(f):
    return lambda x, axis, keepdims=False: f(x, axis=axis, keepdims=keepdims).astype(I32)


_OPS = {
    "sum": jnp.sum, "max": jnp.max, "min": jnp.min, "prod": jnp.prod,
    "argmax": _arg(jnp.argmax), "argmin": _arg(jnp.argmin),
    "any": jnp.any, "all": jnp.all, "var": jnp.var,
    "sum_to_i32": lambda x, axis, keepdims=False: jnp.sum(x, axis=axis, dtype=I32,
                                                          keepdims=keepdims),
}


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
            in_spec = pl.BlockSpec((8, C), lambda i: (i, 0))
            out_spec = pl.BlockSpec((8, 1), lambda i: (i, 0))
        else:
            in_spec = pl.BlockSpec((R, 128), lambda i: (0, i))
            out_spec = pl.BlockSpec((1, 128), lambda i: (0, i))
        return pallas_call(kernel, out_shape=sds(out.shape, out.dtype), grid=(2,),
                           in_specs=[in_spec], out_specs=out_spec)(x)

    register(Case(
        name=f"reductions/{op}{suffix}_axis{axis}_keepdims_{short(dtype)}", fn=fn,
        inputs=lambda rng: (gen(dtype, (R, C))(rng),), reference=reference,
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

# Every axis of a 3-D block for the ops the reductions module covers only in 2-D.
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
