"""Reductions: sum, max, min, prod, argmax, argmin, mean, any/all, logsumexp, cumsum,
over each axis of 2-D and 3-D blocks."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_conformance.registry import Case, dtype_tags, randn, register, sds, short, uniform

R, C = 16, 128

_OPS = {
    "sum": jnp.sum,
    "max": jnp.max,
    "min": jnp.min,
    "prod": jnp.prod,
    "argmax": lambda x, axis: jnp.argmax(x, axis=axis).astype(jnp.int32),
    "argmin": lambda x, axis: jnp.argmin(x, axis=axis).astype(jnp.int32),
    "mean": jnp.mean,
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
