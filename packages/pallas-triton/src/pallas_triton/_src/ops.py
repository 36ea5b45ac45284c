"""Lowering rules for ``jax.lax`` primitives on blocks: elementwise, shapes, reductions, dot.

Each rule is ``rule(ctx, eqn, *invals) -> list[Value]`` and emits ``triton.language``
source through ``ctx.em``. Rules are looked up by primitive name in :data:`RULES`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pallas_triton._src.codegen import (
    Value,
    check_pow2,
    dtype_name,
    expand,
    is_bool,
    is_float,
    is_signed_int,
    is_unsigned_int,
    literal_operand,
    tl_dtype,
    unsupported,
)

RULES: dict[str, Callable] = {}


def rule(*names):
    def register(fn):
        for n in names:
            RULES[n] = fn
        return fn

    return register


def _out(eqn):
    aval = eqn.outvars[0].aval
    return tuple(aval.shape), aval.dtype


def _emit(ctx, eqn, expr: str) -> list[Value]:
    shape, dtype = _out(eqn)
    return [ctx.em.assign(expr, shape, dtype)]


def _op(v: Value) -> str:
    return literal_operand(v)


def _is_bf16(dtype) -> bool:
    return dtype_name(dtype) == "bfloat16"


def _wide(v: Value) -> str:
    """``v`` as an operand of arithmetic: bf16 computes in f32 (then rounds once).

    For one operation this is exactly the correctly rounded bf16 result, as on the GPU
    and in XLA; it also keeps Triton's interpreter (which stores bf16 as raw 16-bit
    integers) from doing integer arithmetic on the bits.
    """
    if _is_bf16(v.dtype) and not v.literal:
        return f"{v.expr}.to(tl.float32)"
    return _op(v)


def _narrow(expr: str, dtype) -> str:
    return f"({expr}).to(tl.bfloat16)" if _is_bf16(dtype) else expr


# -- elementwise -------------------------------------------------------------------------

_BINARY = {
    "add": "+", "add_any": "+", "sub": "-", "mul": "*", "and": "&", "or": "|", "xor": "^",
    "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
    "shift_left": "<<",
}

for _name, _sym in _BINARY.items():

    def _binary(ctx, eqn, x, y, _sym=_sym):
        expr = f"{_wide(x)} {_sym} {_wide(y)}"
        return _emit(ctx, eqn, _narrow(expr, _out(eqn)[1]))

    RULES[_name] = _binary


@rule("div")
def _div(ctx, eqn, x, y):
    if is_float(x.dtype):
        return _emit(ctx, eqn, _narrow(f"{_wide(x)} / {_wide(y)}", x.dtype))
    # lax.div on integers truncates toward zero, as Triton's integer // does.
    return _emit(ctx, eqn, f"{_op(x)} // {_op(y)}")


@rule("rem")
def _rem(ctx, eqn, x, y):
    if is_float(x.dtype):
        return _emit(ctx, eqn, _f32_wrap(x.dtype, "libdevice.fmod({0}, {1})", x, y))
    return _emit(ctx, eqn, f"{_op(x)} % {_op(y)}")


@rule("max", "min")
def _maxmin(ctx, eqn, x, y):
    fn = "tl.maximum" if eqn.primitive.name == "max" else "tl.minimum"
    if is_float(x.dtype):
        return _emit(ctx, eqn, _narrow(
            f"{fn}({_wide(x)}, {_wide(y)}, propagate_nan=tl.PropagateNan.ALL)", x.dtype))
    return _emit(ctx, eqn, f"{fn}({_op(x)}, {_op(y)})")


@rule("shift_right_arithmetic")
def _shr_a(ctx, eqn, x, y):
    return _emit(ctx, eqn, f"{_op(x)} >> {_op(y)}")


@rule("shift_right_logical")
def _shr_l(ctx, eqn, x, y):
    if is_unsigned_int(x.dtype):
        return _emit(ctx, eqn, f"{_op(x)} >> {_op(y)}")
    bits = np.dtype(x.dtype).itemsize * 8
    u, s = f"tl.uint{bits}", tl_dtype(x.dtype)
    return _emit(ctx, eqn, f"({_cast(x, u, bitcast=True)} >> {_cast(y, u, bitcast=True)})"
                           f".to({s}, bitcast=True)")


def _cast(v: Value, to: str, bitcast: bool = False) -> str:
    if v.literal:
        v_expr = f"tl.full([], {v.expr}, {tl_dtype(v.dtype)})"
    else:
        v_expr = v.expr
    return f"{v_expr}.to({to}{', bitcast=True' if bitcast else ''})"


def _f32_wrap(dtype, template: str, *args: Value) -> str:
    """Applies ``template`` in f32 for f16/bf16 inputs (Triton's math needs f32/f64)."""
    low = dtype_name(dtype) in ("float16", "bfloat16")
    ops = [_cast(a, "tl.float32") if low else _op(a) for a in args]
    expr = template.format(*ops)
    if low:
        expr = f"({expr}).to({tl_dtype(dtype)})"
    return expr


_UNARY_MATH = {
    "exp": "tl.exp({0})", "exp2": "tl.exp2({0})", "log": "tl.log({0})",
    "sin": "tl.sin({0})", "cos": "tl.cos({0})", "sqrt": "tl.sqrt_rn({0})",
    "rsqrt": "tl.rsqrt({0})", "erf": "tl.erf({0})", "logistic": "tl.sigmoid({0})",
    "floor": "tl.floor({0})", "ceil": "tl.ceil({0})",
    "tan": "libdevice.tan({0})", "tanh": "libdevice.tanh({0})",
    "log1p": "libdevice.log1p({0})", "expm1": "libdevice.expm1({0})",
    "asin": "libdevice.asin({0})", "acos": "libdevice.acos({0})",
    "atan": "libdevice.atan({0})", "sinh": "libdevice.sinh({0})",
    "cosh": "libdevice.cosh({0})", "asinh": "libdevice.asinh({0})",
    "acosh": "libdevice.acosh({0})", "atanh": "libdevice.atanh({0})",
    "cbrt": "libdevice.cbrt({0})", "erf_inv": "libdevice.erfinv({0})",
    "erfc": "libdevice.erfc({0})", "lgamma": "libdevice.lgamma({0})",
}

for _name, _tpl in _UNARY_MATH.items():

    def _unary(ctx, eqn, x, _tpl=_tpl):
        if not is_float(x.dtype):
            raise unsupported(f"{eqn.primitive.name} on {dtype_name(x.dtype)}")
        return _emit(ctx, eqn, _f32_wrap(x.dtype, _tpl, x))

    RULES[_name] = _unary

@rule("digamma")
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


_BINARY_MATH = {"pow": "libdevice.pow({0}, {1})", "atan2": "libdevice.atan2({0}, {1})",
                "nextafter": "libdevice.nextafter({0}, {1})"}

for _name, _tpl in _BINARY_MATH.items():

    def _binary_math(ctx, eqn, x, y, _tpl=_tpl):
        return _emit(ctx, eqn, _f32_wrap(x.dtype, _tpl, x, y))

    RULES[_name] = _binary_math


@rule("round")
def _round(ctx, eqn, x):
    method = int(getattr(eqn.params.get("rounding_method"), "value",
                         eqn.params.get("rounding_method", 0)))
    fn = "libdevice.rint({0})" if method == 1 else "libdevice.round({0})"
    return _emit(ctx, eqn, _f32_wrap(x.dtype, fn, x))


@rule("abs")
def _abs(ctx, eqn, x):
    return _emit(ctx, eqn, _narrow(f"tl.abs({_wide(x)})", x.dtype))


@rule("neg")
def _neg(ctx, eqn, x):
    return _emit(ctx, eqn, _narrow(f"-{_wide(x)}", x.dtype))


@rule("sign")
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


@rule("not")
def _not(ctx, eqn, x):
    if is_bool(x.dtype):
        return _emit(ctx, eqn, f"{_op(x)} == 0")
    return _emit(ctx, eqn, f"~{_op(x)}")


@rule("integer_pow")
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


@rule("square")
def _square(ctx, eqn, x):
    return _emit(ctx, eqn, _narrow(f"{_wide(x)} * {_wide(x)}", x.dtype))


@rule("is_finite")
def _is_finite(ctx, eqn, x):
    return _emit(ctx, eqn, f"tl.abs({_cast(x, 'tl.float32')}) < float(\"inf\")")


def _int_libdevice(ctx, eqn, x, fn: str):
    """libdevice's bit-counting functions take signed integers: bitcast unsigned ones."""
    if is_unsigned_int(x.dtype):
        bits = np.dtype(x.dtype).itemsize * 8
        arg = _cast(x, f"tl.int{bits}", bitcast=True)
        return _emit(ctx, eqn, f"libdevice.{fn}({arg}).to({tl_dtype(x.dtype)}, bitcast=True)")
    return _emit(ctx, eqn, f"libdevice.{fn}({_op(x)}).to({tl_dtype(x.dtype)})")


@rule("population_count")
def _popc(ctx, eqn, x):
    return _int_libdevice(ctx, eqn, x, "popc")


@rule("clz")
def _clz(ctx, eqn, x):
    return _int_libdevice(ctx, eqn, x, "clz")


@rule("select_n")
def _select_n(ctx, eqn, pred, *cases):
    if len(cases) == 1:
        return _emit(ctx, eqn, _op(cases[0]))
    if is_bool(pred.dtype):
        return _emit(ctx, eqn, f"tl.where({_op(pred)}, {_op(cases[1])}, {_op(cases[0])})")
    expr = _op(cases[-1])
    for i in range(len(cases) - 2, -1, -1):
        expr = f"tl.where({_op(pred)} == {i}, {_op(cases[i])}, {expr})"
    return _emit(ctx, eqn, expr)


@rule("clamp")
def _clamp(ctx, eqn, lo, x, hi):
    return _emit(ctx, eqn, _narrow(
        f"tl.minimum(tl.maximum({_wide(x)}, {_wide(lo)}), {_wide(hi)})", x.dtype))


@rule("convert_element_type")
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


@rule("bitcast_convert_type")
def _bitcast(ctx, eqn, x):
    new = eqn.params["new_dtype"]
    if np.dtype(new).itemsize != np.dtype(x.dtype).itemsize:
        raise unsupported("bitcast_convert_type between different bit widths")
    return _emit(ctx, eqn, _cast(x, tl_dtype(new), bitcast=True))


@rule("copy", "copy_p", "optimization_barrier", "reduce_precision", "stop_gradient")
def _identity(ctx, eqn, *xs):
    return list(xs)


# -- shapes ------------------------------------------------------------------------------


def splat(ctx, x: Value, shape, dtype) -> str:
    return f"tl.full({list(shape)}, {_op(x)}, {tl_dtype(dtype)})"


@rule("broadcast_to")
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


@rule("broadcast_in_dim")
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


@rule("reshape")
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


@rule("squeeze")
def _squeeze(ctx, eqn, x):
    return _reshape(ctx, eqn, x)


@rule("expand_dims")
def _expand_dims(ctx, eqn, x):
    return _reshape(ctx, eqn, x)


@rule("transpose")
def _transpose(ctx, eqn, x):
    perm = tuple(eqn.params["permutation"])
    if perm == tuple(range(len(perm))):
        return [x]
    if len(perm) == 2:
        return _emit(ctx, eqn, f"tl.trans({x.expr})")
    return _emit(ctx, eqn, f"tl.permute({x.expr}, {perm})")


@rule("iota")
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


# -- reductions --------------------------------------------------------------------------


def _reduce(ctx, eqn, x, fn: str):
    axes = sorted((int(a) for a in eqn.params["axes"]), reverse=True)
    shape, dtype = _out(eqn)
    cur = x
    cur_shape = list(x.shape)
    extra = ""
    src = cur.expr
    if _is_bf16(x.dtype):
        src = f"{src}.to(tl.float32)"
    if is_bool(x.dtype) and fn == "tl.sum":
        src = f"{src}.to(tl.int32)"
    for a in axes:
        del cur_shape[a]
        cur = ctx.em.assign(f"{fn}({src}, axis={a}{extra})", tuple(cur_shape), dtype)
        src = cur.expr
    return _emit(ctx, eqn, f"({cur.expr}).to({tl_dtype(dtype)})")


@rule("reduce_sum")
def _reduce_sum(ctx, eqn, x):
    return _reduce(ctx, eqn, x, "tl.sum")


@rule("reduce_max")
def _reduce_max(ctx, eqn, x):
    return _reduce(ctx, eqn, x, "tl.max")


@rule("reduce_min")
def _reduce_min(ctx, eqn, x):
    return _reduce(ctx, eqn, x, "tl.min")


_COMBINERS = {
    "reduce_prod": ("_combine_mul", "def _combine_mul(a, b):\n    return a * b\n"),
    "reduce_and": ("_combine_and", "def _combine_and(a, b):\n    return a & b\n"),
    "reduce_or": ("_combine_or", "def _combine_or(a, b):\n    return a | b\n"),
    "reduce_xor": ("_combine_xor", "def _combine_xor(a, b):\n    return a ^ b\n"),
}


@rule(*_COMBINERS)
def _reduce_combine(ctx, eqn, x):
    name, src = _COMBINERS[eqn.primitive.name]
    fn = ctx.em.helper(name, src)
    axes = sorted((int(a) for a in eqn.params["axes"]), reverse=True)
    shape, dtype = _out(eqn)
    cur, cur_shape = _wide(x), list(x.shape)
    for a in axes:
        del cur_shape[a]
        cur = ctx.em.assign(f"tl.reduce({cur}, {a}, {fn})", tuple(cur_shape), dtype).expr
    return _emit(ctx, eqn, f"({cur}).to({tl_dtype(dtype)})")


@rule("argmax", "argmin")
def _argmax(ctx, eqn, x):
    (axis,) = eqn.params["axes"]
    fn = "tl.argmax" if eqn.primitive.name == "argmax" else "tl.argmin"
    shape, dtype = _out(eqn)
    return _emit(ctx, eqn, f"{fn}({_wide(x)}, axis={int(axis)}).to({tl_dtype(dtype)})")


@rule("cumsum")
def _cumsum(ctx, eqn, x):
    axis = int(eqn.params["axis"])
    rev = bool(eqn.params.get("reverse", False))
    shape, dtype = _out(eqn)
    return _emit(ctx, eqn, f"tl.cumsum({_wide(x)}, axis={axis}, reverse={rev}).to({tl_dtype(dtype)})")


# -- dot -----------------------------------------------------------------------------------


def _precision(eqn, dtype) -> str:
    if not is_float(dtype) or dtype_name(dtype) != "float32":
        return ""
    p = eqn.params.get("precision")
    names = []
    if p is not None:
        for q in (p if isinstance(p, tuple) else (p,)):
            names.append(str(getattr(q, "name", q)).upper())
    if any(n in ("HIGHEST", "FLOAT32", "HIGH") for n in names):
        return ', input_precision="ieee"'
    return ', input_precision="tf32"'


@rule("dot_general")
def _dot_general(ctx, eqn, a, b):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lc, rc, lb, rb = tuple(lc), tuple(rc), tuple(lb), tuple(rb)
    shape, dtype = _out(eqn)
    pref = eqn.params.get("preferred_element_type") or dtype
    nb = len(lb)
    if nb > 1 or len(lc) != 1:
        raise unsupported("dot_general with more than one batch or contracting dimension")
    if len(a.shape) != nb + 2 or len(b.shape) != nb + 2:
        raise unsupported(
            f"dot_general of shapes {a.shape} x {b.shape}",
            "tl.dot takes 2-D operands (or 3-D with one leading batch dimension)")
    if nb and (lb != (0,) or rb != (0,)):
        raise unsupported("dot_general with a batch dimension other than the first")
    a_expr, b_expr = a.expr, b.expr
    if lc[0] != nb + 1:
        a_expr = f"tl.trans({a_expr})" if nb == 0 else f"tl.permute({a_expr}, (0, 2, 1))"
    if rc[0] != nb:
        b_expr = f"tl.trans({b_expr})" if nb == 0 else f"tl.permute({b_expr}, (0, 2, 1))"
    m, n = shape[-2], shape[-1]
    k = a.shape[lc[0]]
    tensor_core_types = ("float16", "bfloat16", "float32", "int8", "float8_e4m3fn",
                         "float8_e5m2")
    if min(m, n, k) < 16 or dtype_name(a.dtype) not in tensor_core_types or (
            dtype_name(a.dtype) != dtype_name(b.dtype)):
        return _dot_by_sum(ctx, eqn, a_expr, b_expr, a, b, nb, (m, k, n))
    acc = pref if is_float(pref) or is_signed_int(pref) else dtype
    out_t = "tl.float32" if is_float(acc) and dtype_name(acc) != "float16" else tl_dtype(acc)
    if is_signed_int(acc):
        out_t = "tl.int32"
    expr = f"tl.dot({a_expr}, {b_expr}, out_dtype={out_t}{_precision(eqn, a.dtype)})"
    if out_t != tl_dtype(dtype):
        expr = f"({expr}).to({tl_dtype(dtype)})"
    return _emit(ctx, eqn, expr)



def _dot_by_sum(ctx, eqn, a_expr, b_expr, a, b, nb, mkn):
    """A product too small (or of a type) for ``tl.dot``: multiply and sum over K.

    ``a`` is (..., M, K) and ``b`` (..., K, N) after the transposes above; the product
    is formed as (..., M, K, N) and reduced, in the accumulation type.
    """
    shape, dtype = _out(eqn)
    m, k, n = mkn
    check_pow2((m, k, n), "dot_general")
    acc = "tl.float32" if is_float(dtype) else tl_dtype(dtype)
    lead = ":, " * nb
    a3 = f"({a_expr}).to({acc})[{lead}:, :, None]"
    b3 = f"({b_expr}).to({acc})[{lead}None, :, :]"
    expr = f"tl.sum({a3} * {b3}, axis={nb + 1})"
    if acc != tl_dtype(dtype):
        expr = f"({expr}).to({tl_dtype(dtype)})"
    return _emit(ctx, eqn, expr)


@rule("concatenate")
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
