"""Elementwise cases: every unary and binary jnp/lax op that makes sense on blocks, casts,
``where``/``select``/``clamp``, over f32, bf16, f16, int8, int32, uint32 and bool.

Every case runs a (16, 128) array through a grid of two (8, 128) blocks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

import pallas as pl
from pallas_conformance.registry import Case, dtype_tags, randn, register, sds, short, uniform

SHAPE = (16, 128)
BLOCK = (8, 128)

F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16
I8, I32, U32, BOOL = jnp.int8, jnp.int32, jnp.uint32, jnp.bool_
FLOATS = (F32, BF16, F16)


def _spec():
    return pl.BlockSpec(BLOCK, lambda i: (i, 0))


def _gen(dtype, domain):
    def gen(rng, shape=SHAPE):
        if domain is None:
            return randn(rng, shape, dtype)
        lo, hi = domain
        if jnp.issubdtype(dtype, jnp.integer):
            return jnp.asarray(rng.integers(lo, hi, size=shape), dtype=dtype)
        return uniform(rng, shape, lo, hi, dtype)

    return gen


def _map_kernel(op, nargs):
    def kernel(*refs):
        ins, o_ref = refs[:nargs], refs[nargs]
        o_ref[...] = op(*(r[...] for r in ins))

    return kernel


def _elementwise_fn(op, nargs):
    def fn(pallas_call, *args):
        out = jax.eval_shape(op, *args)
        return pallas_call(
            _map_kernel(op, nargs), out_shape=sds(out.shape, out.dtype), grid=(SHAPE[0] // BLOCK[0],),
            in_specs=[_spec()] * nargs, out_specs=_spec(),
        )(*args)

    return fn


def _unary(name, op, dtypes, domain=None, tolerance=None):
    for dt in dtypes:
        gen = _gen(dt, domain)
        register(Case(
            name=f"elementwise/{name}_{short(dt)}",
            fn=_elementwise_fn(op, 1),
            inputs=lambda rng, gen=gen: (gen(rng),),
            reference=op,
            tags=frozenset({"elementwise"} | dtype_tags(dt)),
            tolerance=dict(tolerance or {}),
            description=f"{name} over {jnp.dtype(dt).name}",
        ))


def _binary(name, op, dtypes, domain=None, domain_b=None, tolerance=None):
    for dt in dtypes:
        ga, gb = _gen(dt, domain), _gen(dt, domain_b or domain)
        register(Case(
            name=f"elementwise/{name}_{short(dt)}",
            fn=_elementwise_fn(op, 2),
            inputs=lambda rng, ga=ga, gb=gb: (ga(rng), gb(rng)),
            reference=op,
            tags=frozenset({"elementwise"} | dtype_tags(dt)),
            tolerance=dict(tolerance or {}),
            description=f"{name} over {jnp.dtype(dt).name}",
        ))


# Unary float ops.
_unary("neg", jnp.negative, (F32, BF16, F16, I8, I32))
_unary("abs", jnp.abs, (F32, BF16, F16, I8, I32))
_unary("exp", jnp.exp, (F32, BF16, F16), domain=(-4, 4))
_unary("exp2", jnp.exp2, (F32,), domain=(-4, 4))
_unary("expm1", jnp.expm1, (F32,), domain=(-2, 2))
_unary("log", jnp.log, (F32, BF16, F16), domain=(0.1, 10))
_unary("log1p", jnp.log1p, (F32,), domain=(-0.5, 4))
_unary("sqrt", jnp.sqrt, (F32, BF16, F16), domain=(0.01, 10))
_unary("rsqrt", lax.rsqrt, (F32, BF16), domain=(0.1, 10))
_unary("cbrt", jnp.cbrt, (F32,), domain=(-8, 8))
_unary("sin", jnp.sin, (F32, BF16), domain=(-3, 3))
_unary("cos", jnp.cos, (F32, BF16), domain=(-3, 3))
_unary("tan", jnp.tan, (F32,), domain=(-1.2, 1.2), tolerance={"float32": (1e-5, 2e-5)})
_unary("tanh", jnp.tanh, (F32, BF16, F16))
_unary("sinh", jnp.sinh, (F32,), domain=(-3, 3))
_unary("cosh", jnp.cosh, (F32,), domain=(-3, 3))
_unary("arcsin", jnp.arcsin, (F32,), domain=(-0.95, 0.95))
_unary("arccos", jnp.arccos, (F32,), domain=(-0.95, 0.95))
_unary("arctan", jnp.arctan, (F32,))
_unary("arcsinh", jnp.arcsinh, (F32,))
_unary("logistic", lax.logistic, (F32, BF16))
_unary("erf", lax.erf, (F32,))
_unary("erf_inv", lax.erf_inv, (F32,), domain=(-0.9, 0.9), tolerance={"float32": (1e-5, 2e-5)})
_unary("floor", jnp.floor, (F32, BF16), domain=(-10, 10))
_unary("ceil", jnp.ceil, (F32, BF16), domain=(-10, 10))
_unary("round", lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN), (F32,), domain=(-10, 10))
_unary("sign", jnp.sign, (F32, I32))
_unary("square", jnp.square, (F32, BF16, I32))
_unary("reciprocal", jnp.reciprocal, (F32,), domain=(0.5, 4))
_unary("integer_pow3", lambda x: lax.integer_pow(x, 3), (F32,))
_unary("is_finite", jnp.isfinite, (F32,))
_unary("not", jnp.logical_not, (BOOL,))
_unary("bitwise_not", jnp.bitwise_not, (I32, U32, I8))
_unary("population_count", lax.population_count, (I32, U32))
_unary("clz", lax.clz, (I32, U32))

# Binary ops.
_binary("add", jnp.add, (F32, BF16, F16, I8, I32, U32))
_binary("sub", jnp.subtract, (F32, BF16, F16, I8, I32, U32))
_binary("mul", jnp.multiply, (F32, BF16, F16, I8, I32, U32))
_binary("div", jnp.divide, (F32, BF16, F16), domain=(0.5, 4))
_binary("floor_divide", jnp.floor_divide, (I32,), domain=(1, 50))
_binary("lax_div", lax.div, (I32, U32), domain=(1, 50))
_binary("rem", lax.rem, (F32, I32), domain=(1, 50))
_binary("pow", jnp.power, (F32,), domain=(0.5, 2), tolerance={"float32": (1e-5, 2e-5)})
_binary("atan2", jnp.arctan2, (F32,))
_binary("maximum", jnp.maximum, (F32, BF16, F16, I8, I32, U32))
_binary("minimum", jnp.minimum, (F32, BF16, F16, I8, I32, U32))
_binary("nextafter", jnp.nextafter, (F32,))
for _cmp in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"):
    _binary(_cmp, getattr(jnp, _cmp), (F32, I32), domain=(-3, 3) if _cmp == "equal" else None)
_binary("and", jnp.bitwise_and, (I32, U32, BOOL))
_binary("or", jnp.bitwise_or, (I32, U32, BOOL))
_binary("xor", jnp.bitwise_xor, (I32, U32, BOOL))
_binary("shift_left", lax.shift_left, (I32, U32), domain=(0, 31))
_binary("shift_right_logical", lax.shift_right_logical, (I32, U32), domain=(0, 31))
_binary("shift_right_arithmetic", lax.shift_right_arithmetic, (I32,), domain=(0, 31))


# Ternary ops and casts.
def _where(c, x, y):
    return jnp.where(c, x, y)


def _where_fn(pallas_call, c, x, y):
    def kernel(c_ref, x_ref, y_ref, o_ref):
        o_ref[...] = jnp.where(c_ref[...], x_ref[...], y_ref[...])

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_spec()] * 3, out_specs=_spec())(c, x, y)


for _dt in (F32, BF16, I32):
    register(Case(
        name=f"elementwise/where_{short(_dt)}", fn=_where_fn,
        inputs=lambda rng, dt=_dt: (randn(rng, SHAPE, BOOL), randn(rng, SHAPE, dt),
                                    randn(rng, SHAPE, dt)),
        reference=_where, tags=frozenset({"elementwise", "bool"} | dtype_tags(_dt)),
        description=f"jnp.where over {jnp.dtype(_dt).name}",
    ))


def _clamp_fn(pallas_call, x):
    def kernel(x_ref, o_ref):
        o_ref[...] = lax.clamp(-0.5, x_ref[...], 0.5)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_spec()], out_specs=_spec())(x)


register(Case(name="elementwise/clamp_f32", fn=_clamp_fn,
              inputs=lambda rng: (randn(rng, SHAPE),),
              reference=lambda x: lax.clamp(-0.5, x, 0.5), tags=frozenset({"elementwise"}),
              description="lax.clamp with scalar bounds"))

_CASTS = [(F32, BF16), (BF16, F32), (F32, F16), (F16, F32), (F32, I32), (I32, F32),
          (I8, I32), (I32, I8), (U32, F32), (F32, BOOL), (BOOL, I32), (I32, U32)]
for _src, _dst in _CASTS:
    # Named "cast_to_<dst>_<src>": elementwise/cast_to_bf16_f32 casts f32 to bf16.
    _unary(f"cast_to_{short(_dst)}", lambda x, d=_dst: x.astype(d), (_src,))


def _scalar_fn(pallas_call, x):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.5 + 1.0

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_spec()], out_specs=_spec())(x)


register(Case(name="elementwise/scalar_literals_f32", fn=_scalar_fn,
              inputs=lambda rng: (randn(rng, SHAPE),), reference=lambda x: x * 2.5 + 1.0,
              tags=frozenset({"elementwise"}), description="Python scalars in a kernel"))


def _lambda_kernel_fn(pallas_call, x):
    # The kernel's name is "<lambda>": a backend that names generated code after the
    # kernel must make it an identifier (pallas-triton emitted `def lambda(...)`).
    return pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 3.0),
                       out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_spec()], out_specs=_spec())(x)


register(Case(name="elementwise/lambda_kernel_f32", fn=_lambda_kernel_fn,
              inputs=lambda rng: (randn(rng, SHAPE),), reference=lambda x: x * 3.0,
              tags=frozenset({"elementwise"}),
              description="a kernel written as a lambda (named '<lambda>')"))
