"""Elementwise cases: every unary and binary jnp/lax op that makes sense on blocks (with
NaN/inf operands, rounding ties, jax.nn activations, the gamma family), comparisons and
integer ops over every dtype (unsigned and wrap-around semantics), casts (float8
included) and bitcasts, ``where``/``select``/``select_n``/``clamp``/``clip``, over f32,
bf16, f16, int8, int32, uint32 and bool, int4/uint4 selected and widened, and a kernel
traced under a mesh.

Every case runs a (16, 128) array through a grid of two (8, 128) blocks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas as pl
from pallas_conformance.registry import (
    Case,
    case,
    dtype_tags,
    randn,
    register,
    sds,
    short,
    uniform,
)

SHAPE = (16, 128)
BLOCK = (8, 128)

F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16
I8, I32, U32, BOOL = jnp.int8, jnp.int32, jnp.uint32, jnp.bool_
FLOATS = (F32, BF16, F16)


def _spec():
    return pl.BlockSpec(BLOCK, lambda i: (i, 0))


def _gen(dtype, domain):
    """``domain``: None (randn), ``(lo, hi)``, or ``gen(rng, shape)``."""
    def gen(rng):
        if callable(domain):
            return domain(rng, SHAPE)
        if domain is None:
            return randn(rng, SHAPE, dtype)
        lo, hi = domain
        if jnp.issubdtype(dtype, jnp.integer):
            return jnp.asarray(rng.integers(lo, hi, size=SHAPE), dtype=dtype)
        return uniform(rng, SHAPE, lo, hi, dtype)

    return gen


def _fn(op, nargs):
    def fn(pallas_call, *args):
        out = jax.eval_shape(op, *args)

        def kernel(*refs):
            refs[nargs][...] = op(*(r[...] for r in refs[:nargs]))

        return pallas_call(kernel, out_shape=sds(out.shape, out.dtype),
                           grid=(SHAPE[0] // BLOCK[0],), in_specs=[_spec()] * nargs,
                           out_specs=_spec())(*args)

    return fn


def _op(name, op, dtypes, domains, tolerance=None, what=None, tags=(), tag_output=True):
    """One case per dtype: ``op`` mapped over blocks of operands drawn from ``domains``.
    The case needs the tags of the operand and output dtypes (the first cases written,
    with ``tag_output=False``, only the operand's: their bool/narrow outputs are not
    tagged, which the catalogue keeps as it is)."""
    for dt in dtypes:
        gens = [_gen(dt, d) for d in domains]
        out = jax.eval_shape(op, *(jax.ShapeDtypeStruct(SHAPE, dt) for _ in domains))
        dtags = dtype_tags(dt, out.dtype) if tag_output else dtype_tags(dt)
        register(Case(
            name=f"elementwise/{name}_{short(dt)}", fn=_fn(op, len(domains)),
            inputs=lambda rng, gens=gens: tuple(g(rng) for g in gens), reference=op,
            tags=frozenset({"elementwise", *tags} | dtags),
            tolerance=dict(tolerance or {}),
            description=f"{what or name} over {jnp.dtype(dt).name}",
        ))


def _unary(name, op, dtypes, domain=None, **kw):
    _op(name, op, dtypes, [domain], **kw)


def _binary(name, op, dtypes, domain=None, domain_b=None, **kw):
    _op(name, op, dtypes, [domain, domain_b if domain_b is not None else domain], **kw)


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
_unary("is_finite", jnp.isfinite, (F32,), tag_output=False)
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
    _binary(_cmp, getattr(jnp, _cmp), (F32, I32), domain=(-3, 3) if _cmp == "equal" else None,
            tag_output=False)
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
    _unary(f"cast_to_{short(_dst)}", lambda x, d=_dst: x.astype(d), (_src,), tag_output=False)


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


def _with_specials(rng, shape):
    """Normal samples with NaN, +inf and -inf sprinkled in."""
    x = rng.standard_normal(shape).astype(np.float32)
    pick = rng.random(shape)
    x[pick < 0.1] = np.nan
    x[(pick >= 0.1) & (pick < 0.2)] = np.inf
    x[(pick >= 0.2) & (pick < 0.3)] = -np.inf
    return jnp.asarray(x)


def _with_nans(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    x[rng.random(shape) < 0.2] = np.nan
    return jnp.asarray(x)


def _full_u32(rng, shape):
    """uint32 values over the whole range (half of them above 2**31)."""
    return jnp.asarray(rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32))


def _wide_i32(rng, shape):
    return jnp.asarray(rng.integers(-(2**31), 2**31, size=shape, dtype=np.int64), jnp.int32)


def _halves(rng, shape):
    """Values on and between the .5 boundaries, for rounding."""
    return jnp.asarray(rng.integers(-20, 21, size=shape) / 2.0 +
                       rng.choice([0.0, 0.25], size=shape), jnp.float32)


_TOL_SPECIAL = {"float32": (1e-5, 2e-5)}

# More unary ops: inverse hyperbolics, rounding, NaN/inf tests, activations, dtypes.
_unary("log2", jnp.log2, (F32, BF16), domain=(0.1, 10))
_unary("log10", jnp.log10, (F32,), domain=(0.1, 10))
_unary("arctanh", jnp.arctanh, (F32,), domain=(-0.9, 0.9), tolerance=_TOL_SPECIAL)
_unary("arccosh", jnp.arccosh, (F32,), domain=(1.1, 10), tolerance=_TOL_SPECIAL)
_unary("trunc", jnp.trunc, (F32,), domain=(-10, 10))
_unary("round_half_even", jnp.round, (F32, BF16), domain=_halves, what="jnp.round on .5 ties")
_unary("isnan", jnp.isnan, (F32,), domain=_with_specials)
_unary("isinf", jnp.isinf, (F32,), domain=_with_specials)
_unary("is_finite_specials", jnp.isfinite, (F32,), domain=_with_specials,
       what="isfinite with NaN and infinities")
_unary("exp_f16_to_f32", lambda x: jnp.exp(x.astype(F32)), (F16,), domain=(-4, 4))
_unary("sin", jnp.sin, (F16,), domain=(-3, 3))
_unary("logistic", lax.logistic, (F16,))
_unary("floor", jnp.floor, (F16,), domain=(-10, 10))
_unary("reciprocal", jnp.reciprocal, (BF16,), domain=(0.5, 4))
_unary("sign", jnp.sign, (I8, BF16, F16, U32))
_unary("square", jnp.square, (F16, I8))
_unary("integer_pow_neg2", lambda x: lax.integer_pow(x, -2), (F32,), domain=(0.5, 3),
       tolerance=_TOL_SPECIAL)
_unary("integer_pow5", lambda x: lax.integer_pow(x, 5), (I32,), domain=(-9, 10))
_unary("gelu_tanh", lambda x: jax.nn.gelu(x, approximate=True), (F32, BF16),
       tolerance=_TOL_SPECIAL)
_unary("silu", jax.nn.silu, (F32,), tolerance=_TOL_SPECIAL)
_unary("softplus", jax.nn.softplus, (F32,), tolerance=_TOL_SPECIAL)
_unary("relu", jax.nn.relu, (F32, BF16, I32))
_unary("abs_min_int", jnp.abs, (I32,), domain=_wide_i32, what="abs over the whole int32 range")
_unary("neg", jnp.negative, (U32,), domain=_full_u32, what="negation (mod 2**32)")

# More binary ops: floor and truncating division and remainders of negative and unsigned
# values, NaN propagation, wrap-around, int8 bitwise ops, wide shifts.
_binary("remainder", jnp.remainder, (F32,), domain=(-20, 20), domain_b=(0.5, 4),
        tolerance=_TOL_SPECIAL, what="jnp.remainder (floor mod) with negative dividends")
_binary("remainder", jnp.remainder, (I32,), domain=(-50, 50), domain_b=(1, 9),
        what="jnp.remainder (floor mod) with negative dividends")
_binary("floor_divide_negative", jnp.floor_divide, (I32, I8), domain=(-50, 50),
        domain_b=(1, 9), what="jnp.floor_divide of negative dividends")
_binary("lax_div_negative", lax.div, (I32,), domain=(-50, 50), domain_b=(1, 9),
        what="lax.div (rounds toward zero) of negative dividends")
_binary("rem_negative", lax.rem, (I32, I8), domain=(-50, 50), domain_b=(1, 9),
        what="lax.rem (sign of the dividend)")
_binary("rem", lax.rem, (U32,), domain=_full_u32, domain_b=(1, 1000))
_binary("lax_div_large", lax.div, (U32,), domain=_full_u32, domain_b=(1, 1000),
        what="unsigned division of values above 2**31")
_binary("hypot", jnp.hypot, (F32,), tolerance=_TOL_SPECIAL)
_binary("logaddexp", jnp.logaddexp, (F32,), tolerance=_TOL_SPECIAL)
_binary("maximum_nan", jnp.maximum, (F32,), domain=_with_nans,
        what="maximum propagates NaN")
_binary("minimum_nan", jnp.minimum, (F32,), domain=_with_nans,
        what="minimum propagates NaN")
_binary("maximum_large", jnp.maximum, (U32,), domain=_full_u32,
        what="unsigned maximum of values above 2**31")
_binary("minimum_large", jnp.minimum, (U32,), domain=_full_u32,
        what="unsigned minimum of values above 2**31")
_binary("add_wrap", jnp.add, (I8,), domain=(-128, 128),
        what="int8 addition that wraps around")
_binary("mul_wrap", jnp.multiply, (U32,), domain=_full_u32,
        what="uint32 multiplication mod 2**32")
_binary("and", jnp.bitwise_and, (I8,), domain=(-128, 128))
_binary("or", jnp.bitwise_or, (I8,), domain=(-128, 128))
_binary("xor", jnp.bitwise_xor, (I8,), domain=(-128, 128))
_binary("shift_right_arithmetic", lax.shift_right_arithmetic, (I8,), domain=(-128, 128),
        domain_b=(0, 8))
_binary("shift_right_arithmetic_wide", lax.shift_right_arithmetic, (I32,), domain=_wide_i32,
        domain_b=(0, 32), what="arithmetic shift of negative int32 values")
_binary("shift_right_logical_wide", lax.shift_right_logical, (I32,), domain=_wide_i32,
        domain_b=(0, 32), what="logical shift of negative int32 values")

# Comparisons over bf16, f16, int8, uint32 and bool (uint32 values above 2**31
# check that comparisons are unsigned).
for _cmp in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"):
    _op_fn = getattr(jnp, _cmp)
    _binary(_cmp, _op_fn, (BF16, F16), domain=(-3, 3))
    _binary(_cmp, _op_fn, (I8,), domain=(-4, 4))
    _binary(_cmp, _op_fn, (U32,), domain=_full_u32 if _cmp not in ("equal", "not_equal")
            else (0, 4))
_binary("equal", jnp.equal, (BOOL,))
_binary("less", jnp.less, (BOOL,))

# More casts, with domains (names: cast_to_<dst>_<src>).
_CASTS_WITH_DOMAINS = [
    (BF16, F16, None), (F16, BF16, None), (I8, F32, None), (F32, I8, (-100, 100)),
    (BOOL, F32, None), (I32, BOOL, (-2, 3)), (F16, I32, (-100, 100)), (BF16, I32, (-100, 100)),
    (F32, U32, (0, 1e6)), (U32, I32, _full_u32), (I8, U32, None),
]
for _src, _dst, _dom in _CASTS_WITH_DOMAINS:
    _unary(f"cast_to_{short(_dst)}", lambda x, d=_dst: x.astype(d), (_src,), domain=_dom,
           what=f"astype({jnp.dtype(_dst).name})")
_unary("cast_to_f32_u32_large", lambda x: x.astype(F32), (U32,), domain=_full_u32,
       what="uint32 values above 2**31 to float32")
_unary("cast_to_i8_wrap", lambda x: x.astype(I8), (I32,), domain=(-1000, 1000),
       what="int32 to int8 with wrap-around")
_unary("cast_to_u32_wide", lambda x: x.astype(U32), (I32,), domain=_wide_i32,
       what="negative int32 values to uint32 (mod 2**32)")
# float8: round trips through float8 inside the kernel, on values that include exact ties
# between neighbouring float8 values and values whose rounding carries into the exponent
# (1.9 -> 2.0 in e4m3fn), then a float8 output.
F8E4, F8E5 = jnp.float8_e4m3fn, jnp.float8_e5m2


def _float8_domain(f8):
    """Within ``f8``'s finite range: a third random, a third exact ties between
    neighbouring float8 values, a third just below a power of two (the carry)."""
    def gen(rng, shape):
        finite = np.asarray(jnp.arange(256, dtype=jnp.uint8).view(f8).astype(F32))
        grid = np.unique(finite[np.isfinite(finite)])
        top = float(grid.max())
        pick = rng.integers(0, len(grid) - 1, size=shape)
        ties = (grid[pick] + grid[pick + 1]) / 2
        powers = 2.0 ** rng.integers(-4, int(np.log2(top)), size=shape)
        carry = powers * (1 - 2.0 ** -6) * rng.choice([-1.0, 1.0], size=shape)
        rand = rng.uniform(-top, top, size=shape)
        which = rng.integers(0, 3, size=shape)
        return jnp.asarray(np.select([which == 0, which == 1], [rand, ties], carry), F32)

    return gen


for _f8 in (F8E4, F8E5):
    _unary(f"float8_round_trip_{short(_f8)}", lambda x, d=_f8: x.astype(d).astype(F32),
           (F32,), domain=_float8_domain(_f8), tags=("float8",),
           what=f"float32 -> {jnp.dtype(_f8).name} -> float32 inside the kernel")
    _unary(f"cast_to_{short(_f8)}", lambda x, d=_f8: x.astype(d), (F32,),
           domain=_float8_domain(_f8), what=f"astype({jnp.dtype(_f8).name}) as the output")
_unary("cast_to_i32_trunc", lambda x: x.astype(I32), (F32,), domain=(-100, 100),
       what="float32 to int32 truncates toward zero")


_unary("signbit", jnp.signbit, (F32,))
_binary("copysign", jnp.copysign, (F32,))
_binary("pow_int_exponent", lambda x, y: lax.pow(x, y.astype(jnp.int32)), (F32,),
        domain=(0.5, 2), domain_b=(-3, 4), tolerance=_TOL_SPECIAL,
        what="lax.pow with an int32 exponent")
_unary("bitcast_to_i32", lambda x: lax.bitcast_convert_type(x, I32), (F32,),
       what="lax.bitcast_convert_type float32 -> int32")
_unary("bitcast_to_f32", lambda x: lax.bitcast_convert_type(x, F32), (U32,),
       domain=lambda rng, s: jnp.asarray(rng.integers(0x3F000000, 0x40800000, size=s),
                                         jnp.uint32),
       what="lax.bitcast_convert_type uint32 -> float32")
_unary("bitcast_to_u32", lambda x: lax.bitcast_convert_type(x, U32), (I32,), domain=_wide_i32,
       what="lax.bitcast_convert_type int32 -> uint32")


def _select_n(which, a, b, c):
    return lax.select_n(which, a, b, c)


def _select_n_fn(pallas_call, which, a, b, c):
    def kernel(w_ref, a_ref, b_ref, c_ref, o_ref):
        o_ref[...] = lax.select_n(w_ref[...], a_ref[...], b_ref[...], c_ref[...])

    return pallas_call(kernel, out_shape=sds(a.shape, a.dtype), grid=(2,),
                       in_specs=[_spec()] * 4, out_specs=_spec())(which, a, b, c)


register(Case(
    name="elementwise/select_n_i32", fn=_select_n_fn,
    inputs=lambda rng: (jnp.asarray(rng.integers(0, 3, size=SHAPE), jnp.int32),
                        randn(rng, SHAPE), randn(rng, SHAPE), randn(rng, SHAPE)),
    reference=_select_n, tags=frozenset({"elementwise"}),
    description="lax.select_n with an int32 selector and three cases"))


def _where_scalar_fn(pallas_call, x):
    def kernel(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = jnp.where(v > 0, v, 0.25)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_spec()], out_specs=_spec())(x)


register(Case(
    name="elementwise/where_scalar_branch_f32", fn=_where_scalar_fn,
    inputs=lambda rng: (randn(rng, SHAPE),), reference=lambda x: jnp.where(x > 0, x, 0.25),
    tags=frozenset({"elementwise"}), description="jnp.where with a Python scalar branch"))


def _clamp_arrays_fn(pallas_call, lo, x, hi):
    def kernel(lo_ref, x_ref, hi_ref, o_ref):
        o_ref[...] = jnp.clip(x_ref[...], lo_ref[...], hi_ref[...])

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_spec()] * 3, out_specs=_spec())(lo, x, hi)


register(Case(
    name="elementwise/clip_array_bounds_i32", fn=_clamp_arrays_fn,
    inputs=lambda rng: (jnp.asarray(rng.integers(-50, 0, size=SHAPE), jnp.int32),
                        randn(rng, SHAPE, I32),
                        jnp.asarray(rng.integers(0, 50, size=SHAPE), jnp.int32)),
    reference=lambda lo, x, hi: jnp.clip(x, lo, hi), tags=frozenset({"elementwise"}),
    description="jnp.clip with per-element int32 bounds"))


# Special functions: erfc is everywhere; the gamma family is a capability of its own.
def _between_negative_poles(rng, shape):
    """Arguments in (-6, 0) at least 0.1 away from the poles (the non-positive integers)."""
    return jnp.asarray(rng.integers(-6, 0, size=shape) + rng.uniform(0.1, 0.9, size=shape), F32)


_unary("erfc", lax.erfc, (F32, BF16), domain=(-3.0, 3.0))
for _name, _gamma_fn in (("lgamma", lax.lgamma), ("digamma", lax.digamma)):
    _unary(_name, _gamma_fn, (F32,), domain=(0.05, 12.0), tags=("special_functions",),
           tolerance={"float32": (1e-5, 2e-5)})
    _unary(f"{_name}_negative", _gamma_fn, (F32,), domain=_between_negative_poles,
           tags=("special_functions",), tolerance={"float32": (1e-4, 1e-4)},
           what=f"{_name} between the poles of negative arguments")


# --- Kernels traced under a mesh ------------------------------------------------------


@case("elementwise/where_traced_under_a_mesh", tags={"elementwise"},
      inputs=lambda rng: (randn(rng, SHAPE),), reference=lambda x: jnp.where(x > 0, x, 0.0))
def where_under_a_mesh(pallas_call, x):
    """A kernel traced under a mesh (``jax.set_mesh``, as when compiling for a mesh of
    devices):
    ``jnp.where`` then inserts a ``reshard`` annotation into the kernel, which must lower
    as a no-op (upstream's GPU RMS norm has one)."""
    def kernel(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = jnp.where(v > 0, v, 0.0)

    mesh = jax.sharding.AbstractMesh((1,), ("x",))
    with jax.sharding.use_abstract_mesh(mesh):
        return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                           in_specs=[_spec()], out_specs=_spec())(x)


# int4/uint4 operands.

@case("operands/int4_select_and_widen", tags={"elementwise", "int4"},
      inputs=lambda rng: (randn(rng, SHAPE, jnp.bool_), randn(rng, SHAPE, jnp.int4),
                          randn(rng, SHAPE, jnp.uint4)),
      reference=lambda m, x, u: (jnp.where(m, x, 0), x.astype(jnp.int32),
                                 u.astype(jnp.int32)))
def int4_select_and_widen(pallas_call, m, x, u):
    """int4/uint4 blocks selected under a mask and widened to int32 (sign- and
    zero-extended): what TPUs do with 4-bit integers (no arithmetic in int4)."""
    def kernel(m_ref, x_ref, u_ref, o_ref, w_ref, v_ref):
        o_ref[...] = jnp.where(m_ref[...], x_ref[...], 0)
        w_ref[...] = x_ref[...].astype(jnp.int32)
        v_ref[...] = u_ref[...].astype(jnp.int32)

    return pallas_call(kernel, out_shape=(sds(x.shape, x.dtype), sds(x.shape, jnp.int32),
                                          sds(u.shape, jnp.int32)))(m, x, u)
