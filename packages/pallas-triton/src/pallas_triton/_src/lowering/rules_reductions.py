"""Triton lowering rules of reductions (sum/max/min, combiner reductions, arg-reductions,
``cumsum``) and of ``dot_general`` (``tl.dot``, or multiply-and-sum when too small)."""

from __future__ import annotations

from jax import lax

from pallas_triton._src import targets
from pallas_triton._src.codegen import (
    check_pow2,
    dtype_name,
    is_bool,
    is_float,
    is_signed_int,
    tl_dtype,
    unsupported,
)
from pallas_triton._src.lowering.engine import value_rule
from pallas_triton._src.lowering.values import (
    _emit,
    _is_bf16,
    _out,
    _wide,
)


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


@value_rule(lax.reduce_sum_p)
def _reduce_sum(ctx, eqn, x):
    return _reduce(ctx, eqn, x, "tl.sum")


@value_rule(lax.reduce_max_p)
def _reduce_max(ctx, eqn, x):
    return _reduce(ctx, eqn, x, "tl.max")


@value_rule(lax.reduce_min_p)
def _reduce_min(ctx, eqn, x):
    return _reduce(ctx, eqn, x, "tl.min")


_COMBINERS = {
    lax.reduce_prod_p: ("_combine_mul", "def _combine_mul(a, b):\n    return a * b\n"),
    lax.reduce_and_p: ("_combine_and", "def _combine_and(a, b):\n    return a & b\n"),
    lax.reduce_or_p: ("_combine_or", "def _combine_or(a, b):\n    return a | b\n"),
    lax.reduce_xor_p: ("_combine_xor", "def _combine_xor(a, b):\n    return a ^ b\n"),
}


@value_rule(*_COMBINERS)
def _reduce_combine(ctx, eqn, x):
    name, src = _COMBINERS[eqn.primitive]
    fn = ctx.em.helper(name, src)
    axes = sorted((int(a) for a in eqn.params["axes"]), reverse=True)
    shape, dtype = _out(eqn)
    cur, cur_shape = _wide(x), list(x.shape)
    for a in axes:
        del cur_shape[a]
        cur = ctx.em.assign(f"tl.reduce({cur}, {a}, {fn})", tuple(cur_shape), dtype).expr
    return _emit(ctx, eqn, f"({cur}).to({tl_dtype(dtype)})")


@value_rule(lax.argmax_p, lax.argmin_p)
def _argmax(ctx, eqn, x):
    (axis,) = eqn.params["axes"]
    fn = "tl.argmax" if eqn.primitive is lax.argmax_p else "tl.argmin"
    shape, dtype = _out(eqn)
    return _emit(ctx, eqn, f"{fn}({_wide(x)}, axis={int(axis)}).to({tl_dtype(dtype)})")


@value_rule(lax.cumsum_p)
def _cumsum(ctx, eqn, x):
    axis = int(eqn.params["axis"])
    rev = bool(eqn.params.get("reverse", False))
    shape, dtype = _out(eqn)
    return _emit(ctx, eqn, f"tl.cumsum({_wide(x)}, axis={axis}, reverse={rev}).to({tl_dtype(dtype)})")


def _precision(ctx, eqn, dtype) -> str:
    if not is_float(dtype) or dtype_name(dtype) != "float32":
        return ""
    p = eqn.params.get("precision")
    names = []
    if p is not None:
        for q in (p if isinstance(p, tuple) else (p,)):
            names.append(str(getattr(q, "name", q)).upper())
    if any(n in ("HIGHEST", "FLOAT32", "HIGH") for n in names):
        return ', input_precision="ieee"'
    # DEFAULT precision is the fastest the target has: TF32 where it exists, else f32
    # (AMD's gfx90a, gfx950 and RDNA3 have no TF32; Triton rejects "tf32" for them).
    if not targets.allows_tf32(ctx.target):
        return ', input_precision="ieee"'
    return ', input_precision="tf32"'


@value_rule(lax.dot_general_p)
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
    expr = f"tl.dot({a_expr}, {b_expr}, out_dtype={out_t}{_precision(ctx, eqn, a.dtype)})"
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
