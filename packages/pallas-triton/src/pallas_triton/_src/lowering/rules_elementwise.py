"""Triton lowering rules of elementwise ``jax.lax`` primitives: arithmetic, comparisons,
bit operations, math functions (libdevice, with f16/bf16 computed in f32), selects,
clamps and casts."""

from __future__ import annotations

import numpy as np
from jax import lax
from jax.extend.core import primitives as core_prims

from pallas_triton._src import jax_compat as jc
from pallas_triton._src.codegen import (
    dtype_name,
    is_bool,
    is_float,
    is_unsigned_int,
    tl_dtype,
    unsupported,
)
from pallas_triton._src.lowering.engine import value_rule
from pallas_triton._src.lowering.values import (
    _cast,
    _emit,
    _f32_wrap,
    _is_bf16,
    _narrow,
    _op,
    _out,
    _wide,
)

_BINARY = {
    lax.add_p: "+", core_prims.add_jaxvals_p: "+", lax.sub_p: "-", lax.mul_p: "*",
    lax.and_p: "&", lax.or_p: "|", lax.xor_p: "^", lax.eq_p: "==", lax.ne_p: "!=",
    lax.lt_p: "<", lax.le_p: "<=", lax.gt_p: ">", lax.ge_p: ">=", lax.shift_left_p: "<<",
}


@value_rule(*_BINARY)
def _binary(ctx, eqn, x, y):
    expr = f"{_wide(x)} {_BINARY[eqn.primitive]} {_wide(y)}"
    return _emit(ctx, eqn, _narrow(expr, _out(eqn)[1]))


@value_rule(lax.div_p)
def _div(ctx, eqn, x, y):
    if is_float(x.dtype):
        return _emit(ctx, eqn, _narrow(f"{_wide(x)} / {_wide(y)}", x.dtype))
    # lax.div on integers truncates toward zero, as Triton's integer // does.
    return _emit(ctx, eqn, f"{_op(x)} // {_op(y)}")


@value_rule(lax.rem_p)
def _rem(ctx, eqn, x, y):
    if is_float(x.dtype):
        return _emit(ctx, eqn, _f32_wrap(x.dtype, "libdevice.fmod({0}, {1})", x, y))
    return _emit(ctx, eqn, f"{_op(x)} % {_op(y)}")


@value_rule(lax.max_p, lax.min_p)
def _maxmin(ctx, eqn, x, y):
    fn = "tl.maximum" if eqn.primitive is lax.max_p else "tl.minimum"
    if is_float(x.dtype):
        return _emit(ctx, eqn, _narrow(
            f"{fn}({_wide(x)}, {_wide(y)}, propagate_nan=tl.PropagateNan.ALL)", x.dtype))
    return _emit(ctx, eqn, f"{fn}({_op(x)}, {_op(y)})")


@value_rule(lax.shift_right_arithmetic_p)
def _shr_a(ctx, eqn, x, y):
    return _emit(ctx, eqn, f"{_op(x)} >> {_op(y)}")


@value_rule(lax.shift_right_logical_p)
def _shr_l(ctx, eqn, x, y):
    if is_unsigned_int(x.dtype):
        return _emit(ctx, eqn, f"{_op(x)} >> {_op(y)}")
    bits = np.dtype(x.dtype).itemsize * 8
    u, s = f"tl.uint{bits}", tl_dtype(x.dtype)
    return _emit(ctx, eqn, f"({_cast(x, u, bitcast=True)} >> {_cast(y, u, bitcast=True)})"
                           f".to({s}, bitcast=True)")


_UNARY_MATH = {
    lax.exp_p: "tl.exp({0})", lax.exp2_p: "tl.exp2({0})", lax.log_p: "tl.log({0})",
    lax.sin_p: "tl.sin({0})", lax.cos_p: "tl.cos({0})", lax.sqrt_p: "tl.sqrt_rn({0})",
    lax.rsqrt_p: "tl.rsqrt({0})", lax.erf_p: "tl.erf({0})", lax.logistic_p: "tl.sigmoid({0})",
    lax.floor_p: "tl.floor({0})", lax.ceil_p: "tl.ceil({0})",
    lax.tan_p: "libdevice.tan({0})", lax.tanh_p: "libdevice.tanh({0})",
    lax.log1p_p: "libdevice.log1p({0})", lax.expm1_p: "libdevice.expm1({0})",
    lax.asin_p: "libdevice.asin({0})", lax.acos_p: "libdevice.acos({0})",
    lax.atan_p: "libdevice.atan({0})", lax.sinh_p: "libdevice.sinh({0})",
    lax.cosh_p: "libdevice.cosh({0})", lax.asinh_p: "libdevice.asinh({0})",
    lax.acosh_p: "libdevice.acosh({0})", lax.atanh_p: "libdevice.atanh({0})",
    lax.cbrt_p: "libdevice.cbrt({0})", lax.erf_inv_p: "libdevice.erfinv({0})",
    lax.erfc_p: "libdevice.erfc({0})", lax.lgamma_p: "libdevice.lgamma({0})",
}


# Functions Triton's HIP ``libdevice`` lacks, called from AMD's device library (OCML,
# which the HIP backend links into every kernel) for AMD targets: the same routines
# XLA's ROCm backend calls for these ops.
_OCML = {lax.cbrt_p: "cbrt"}


def _ocml_extern(name: str) -> str:
    types = ", ".join(f"(tl.float{b},): (\"__ocml_{name}_f{b}\", tl.float{b})"
                      for b in (32, 64))
    return (f"@tl.core.extern\n"
            f"def ocml_{name}(x, _semantic=None):\n"
            f"    return tl.core.extern_elementwise(\"\", \"\", [x], {{{types}}}, "
            f"is_pure=True, _semantic=_semantic)\n")


@value_rule(*_UNARY_MATH)
def _unary(ctx, eqn, x):
    if not is_float(x.dtype):
        raise unsupported(f"{eqn.primitive.name} on {dtype_name(x.dtype)}")
    template = _UNARY_MATH[eqn.primitive]
    if ctx.target is not None and eqn.primitive in _OCML:
        name = _OCML[eqn.primitive]
        template = f"{ctx.em.extern(f'ocml_{name}', _ocml_extern(name))}({{0}})"
    return _emit(ctx, eqn, _f32_wrap(x.dtype, template, x))


@value_rule(lax.digamma_p)
def _digamma(ctx, eqn, x):
    """ψ(x) (libdevice has none): reflection below 1/2, six recurrence steps up, then the
    asymptotic series; NaN at the poles (non-positive integers), as XLA."""
    if not is_float(x.dtype):
        raise unsupported(f"digamma on {dtype_name(x.dtype)}")
    em, shape, f32 = ctx.em, x.shape, np.float32
    v = em.assign(_cast(x, "tl.float32") if dtype_name(x.dtype) != "float32" else _op(x),
                  shape, f32)
    refl = em.assign(f"{v.expr} < 0.5", shape, np.bool_)
    z = em.assign(f"tl.where({refl.expr}, 1.0 - {v.expr}, {v.expr})", shape, f32)
    steps = " + ".join(f"1.0 / ({z.expr} + {k}.0)" for k in range(6))
    w = em.assign(f"{z.expr} + 6.0", shape, f32)
    r = em.assign(f"1.0 / ({w.expr} * {w.expr})", shape, f32)
    series = (f"tl.log({w.expr}) - 0.5 / {w.expr} - {r.expr} * (1.0 / 12 - {r.expr} * "
              f"(1.0 / 120 - {r.expr} * (1.0 / 252 - {r.expr} * (1.0 / 240 - {r.expr} / 132))))")
    psi = em.assign(f"{series} - ({steps})", shape, f32)
    pi = "3.141592653589793"
    out = em.assign(
        f"tl.where({refl.expr}, {psi.expr} - {pi} / libdevice.tan({pi} * {v.expr}), {psi.expr})",
        shape, f32)
    pole = f"({v.expr} <= 0.0) & ({v.expr} == tl.floor({v.expr}))"
    expr = f"tl.where({pole}, float('nan'), {out.expr})"
    if dtype_name(x.dtype) != "float32":
        expr = f"({expr}).to({tl_dtype(x.dtype)})"
    return _emit(ctx, eqn, expr)


_BINARY_MATH = {lax.pow_p: "libdevice.pow({0}, {1})", lax.atan2_p: "libdevice.atan2({0}, {1})",
                lax.nextafter_p: "libdevice.nextafter({0}, {1})"}


@value_rule(*_BINARY_MATH)
def _binary_math(ctx, eqn, x, y):
    return _emit(ctx, eqn, _f32_wrap(x.dtype, _BINARY_MATH[eqn.primitive], x, y))


@value_rule(lax.round_p)
def _round(ctx, eqn, x):
    method = int(getattr(eqn.params.get("rounding_method"), "value",
                         eqn.params.get("rounding_method", 0)))
    fn = "libdevice.rint({0})" if method == 1 else "libdevice.round({0})"
    return _emit(ctx, eqn, _f32_wrap(x.dtype, fn, x))


@value_rule(lax.abs_p)
def _abs(ctx, eqn, x):
    return _emit(ctx, eqn, _narrow(f"tl.abs({_wide(x)})", x.dtype))


@value_rule(lax.neg_p)
def _neg(ctx, eqn, x):
    return _emit(ctx, eqn, _narrow(f"-{_wide(x)}", x.dtype))


@value_rule(lax.sign_p)
def _sign(ctx, eqn, x):
    t = tl_dtype(x.dtype)
    one = f"tl.full([], 1, {t})"
    zero = f"tl.full([], 0, {t})"
    if is_unsigned_int(x.dtype):
        return _emit(ctx, eqn, f"tl.where({_op(x)} > 0, {one}, {zero})")
    # -1 as its own constant: negating a bf16 constant is wrong under Triton's interpreter.
    minus_one = f"tl.full([], -1, {t})"
    w = _wide(x)
    return _emit(ctx, eqn,
                 f"tl.where({w} > 0, {one}, tl.where({w} < 0, {minus_one}, {_op(x)}))")


@value_rule(lax.not_p)
def _not(ctx, eqn, x):
    if is_bool(x.dtype):
        return _emit(ctx, eqn, f"{_op(x)} == 0")
    return _emit(ctx, eqn, f"~{_op(x)}")


@value_rule(lax.integer_pow_p)
def _integer_pow(ctx, eqn, x):
    y = int(eqn.params["y"])
    if y == 0:
        shape, dtype = _out(eqn)
        return _emit(ctx, eqn, f"tl.full({list(shape)}, 1, {tl_dtype(dtype)})")
    acc = None
    n = abs(y)
    # Square-and-multiply on named intermediates (bf16 in f32, rounded once at the end).
    cur = ctx.em.assign(_wide(x), x.shape, x.dtype)
    while n:
        if n & 1:
            acc = cur if acc is None else ctx.em.assign(f"{acc.expr} * {cur.expr}", x.shape,
                                                        x.dtype)
        n >>= 1
        if n:
            cur = ctx.em.assign(f"{cur.expr} * {cur.expr}", x.shape, x.dtype)
    if y < 0:
        return _emit(ctx, eqn, _narrow(f"1.0 / {acc.expr}", x.dtype))
    return _emit(ctx, eqn, _narrow(acc.expr, x.dtype))


@value_rule(lax.square_p)
def _square(ctx, eqn, x):
    return _emit(ctx, eqn, _narrow(f"{_wide(x)} * {_wide(x)}", x.dtype))


@value_rule(lax.is_finite_p)
def _is_finite(ctx, eqn, x):
    return _emit(ctx, eqn, f"tl.abs({_cast(x, 'tl.float32')}) < float(\"inf\")")


_BIT_COUNTS = {lax.population_count_p: "popc", lax.clz_p: "clz"}


@value_rule(*_BIT_COUNTS)
def _bit_count(ctx, eqn, x):
    """libdevice's bit-counting functions take signed integers: bitcast unsigned ones."""
    fn = _BIT_COUNTS[eqn.primitive]
    if is_unsigned_int(x.dtype):
        bits = np.dtype(x.dtype).itemsize * 8
        arg = _cast(x, f"tl.int{bits}", bitcast=True)
        return _emit(ctx, eqn, f"libdevice.{fn}({arg}).to({tl_dtype(x.dtype)}, bitcast=True)")
    return _emit(ctx, eqn, f"libdevice.{fn}({_op(x)}).to({tl_dtype(x.dtype)})")


@value_rule(lax.select_n_p)
def _select_n(ctx, eqn, pred, *cases):
    if len(cases) == 1:
        return _emit(ctx, eqn, _op(cases[0]))
    if is_bool(pred.dtype):
        return _emit(ctx, eqn, f"tl.where({_op(pred)}, {_op(cases[1])}, {_op(cases[0])})")
    expr = _op(cases[-1])
    for i in range(len(cases) - 2, -1, -1):
        expr = f"tl.where({_op(pred)} == {i}, {_op(cases[i])}, {expr})"
    return _emit(ctx, eqn, expr)


@value_rule(lax.clamp_p)
def _clamp(ctx, eqn, lo, x, hi):
    return _emit(ctx, eqn, _narrow(
        f"tl.minimum(tl.maximum({_wide(x)}, {_wide(lo)}), {_wide(hi)})", x.dtype))


@value_rule(lax.convert_element_type_p)
def _convert(ctx, eqn, x):
    new = eqn.params["new_dtype"]
    if np.dtype(new) == np.dtype(x.dtype):
        return _emit(ctx, eqn, _op(x))
    if is_bool(new):
        return _emit(ctx, eqn, f"{_wide(x)} != 0")
    if _is_bf16(x.dtype) and dtype_name(new) != "float32" and not x.literal:
        return _emit(ctx, eqn, f"{x.expr}.to(tl.float32).to({tl_dtype(new)})")
    if _is_bf16(new) and not is_float(x.dtype):
        return _emit(ctx, eqn, f"{_cast(x, 'tl.float32')}.to(tl.bfloat16)")
    return _emit(ctx, eqn, _cast(x, tl_dtype(new)))


@value_rule(lax.bitcast_convert_type_p)
def _bitcast(ctx, eqn, x):
    new = eqn.params["new_dtype"]
    if np.dtype(new).itemsize != np.dtype(x.dtype).itemsize:
        raise unsupported("bitcast_convert_type between different bit widths")
    return _emit(ctx, eqn, _cast(x, tl_dtype(new), bitcast=True))


@value_rule(lax.copy_p, lax.optimization_barrier_p, lax.reduce_precision_p, core_prims.stop_gradient_p,
            core_prims.sharding_constraint_p, jc.reshard_p)
def _identity(ctx, eqn, *xs):
    return list(xs)
