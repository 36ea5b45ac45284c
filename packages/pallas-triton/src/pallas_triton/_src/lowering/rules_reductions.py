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

_REDUCTIONS = {lax.reduce_sum_p: "tl.sum", lax.reduce_max_p: "tl.max",
               lax.reduce_min_p: "tl.min"}


@value_rule(*_REDUCTIONS)
def _reduce(ctx, eqn, x):
    fn = _REDUCTIONS[eqn.primitive]
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
    if dtype_name(a.dtype) not in tensor_core_types or (
            dtype_name(a.dtype) != dtype_name(b.dtype)):
        return _dot_by_sum(ctx, eqn, a_expr, b_expr, a, b, nb, (m, k, n))
    if min(m, n, k) < 16:
        if not _pads_to_dot(nb, a.dtype, (m, k, n)):
            return _dot_by_sum(ctx, eqn, a_expr, b_expr, a, b, nb, (m, k, n))
        return _padded_dot(ctx, eqn, a_expr, b_expr, a, (m, k, n))
    acc = pref if is_float(pref) or is_signed_int(pref) else dtype
    out_t = "tl.float32" if is_float(acc) and dtype_name(acc) != "float16" else tl_dtype(acc)
    if is_signed_int(acc):
        out_t = "tl.int32"
    expr = f"tl.dot({a_expr}, {b_expr}, out_dtype={out_t}{_precision(ctx, eqn, a.dtype)})"
    if out_t != tl_dtype(dtype):
        expr = f"({expr}).to({tl_dtype(dtype)})"
    return _emit(ctx, eqn, expr)



# A small dimension's product of at least this many elements is padded to a tensor-core
# dot rather than formed as (M, K, N) and summed: an (8, 256) x (256, 128) int8 product
# as a 262144-element sum took AMD's LLVM backend over 15 minutes to compile.
_PAD_FROM = 1 << 16


def _pads_to_dot(nb, dtype, mkn) -> bool:
    """Whether a product with a dimension under 16 becomes ``tl.dot`` on zero-padded
    operands: large enough for the sum to cost (see ``_PAD_FROM``), 2-D, powers of two,
    and not f32 (``tl.dot`` would round f32 to TF32 where the exact sum does not)."""
    m, k, n = mkn
    return (nb == 0 and m * k * n >= _PAD_FROM and dtype_name(dtype) != "float32"
            and all(d & (d - 1) == 0 for d in mkn))


def _pad(ctx, expr: str, shape: tuple, axis: int, rows: int) -> str:
    """``expr`` of 2-D ``shape`` widened along ``axis`` to ``rows`` by interleaving zeros
    (Triton has no concatenation: join with zeros, then fold the pair into ``axis``);
    the original entries land on multiples of ``rows // shape[axis]``."""
    cur, other = shape[axis], shape[1 - axis]
    x = ctx.em.assign(expr, shape, None)
    while cur < rows:
        joined = f"tl.join({x.expr}, tl.zeros_like({x.expr}))"
        if axis == 0:
            joined = f"tl.permute({joined}, (0, 2, 1))"
        cur *= 2
        new = (cur, other) if axis == 0 else (other, cur)
        x = ctx.em.assign(f"tl.reshape({joined}, {list(new)})", new, None)
    return x.expr


def _padded_dot(ctx, eqn, a_expr, b_expr, a, mkn):
    """``tl.dot`` of operands zero-padded to 16 in each dimension under 16; the rows and
    columns of the padding are dropped from the result again (``tl.split``)."""
    shape, dtype = _out(eqn)
    m, k, n = mkn
    pm, pk, pn = max(m, 16), max(k, 16), max(n, 16)
    a_p = _pad(ctx, _pad(ctx, a_expr, (m, k), 1, pk), (m, pk), 0, pm)
    b_p = _pad(ctx, _pad(ctx, b_expr, (k, n), 0, pk), (pk, n), 1, pn)
    acc = "tl.int32" if not is_float(a.dtype) else "tl.float32"
    y = ctx.em.assign(f"tl.dot({a_p}, {b_p}, out_dtype={acc})", (pm, pn), None)
    rows, cols = pm, pn
    while cols > n:  # undo the column padding: the originals are the even columns
        cols //= 2
        y = ctx.em.assign(f"tl.split(tl.reshape({y.expr}, [{rows}, {cols}, 2]))[0]",
                          (rows, cols), None)
    while rows > m:  # and the row padding: the even rows
        rows //= 2
        y = ctx.em.assign(f"tl.split(tl.permute(tl.reshape({y.expr}, [{rows}, 2, {cols}]), "
                          f"(0, 2, 1)))[0]", (rows, cols), None)
    expr = y.expr
    if acc != tl_dtype(dtype):
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
