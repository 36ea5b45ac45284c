"""Lowering rules of value operations: elementwise arithmetic, comparisons, casts and
shapes (reductions and matmuls are in ``rules_reduce``)."""

from __future__ import annotations

import jax.extend.core.primitives as P
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxlib.mlir.dialects import arith, math, vector
from jaxlib.mosaic.python import tpu

from pallas.mlir_math import erf_inv, integer_pow
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.lowering import emit_math as M
from pallas_tpu._src.lowering import types as T
from pallas_tpu._src.lowering.common import (
    aval_in,
    aval_out,
    broadcast_to,
    cmpf,
    cmpi,
    const,
    convert,
    iota,
    is_narrow_int,
    kind,
    materialize,
    narrow_int,
    operands,
    widen_int,
)
from pallas_tpu._src.lowering.engine import rule
from pallas_tpu._src.lowering.reshapes import check_reshape
from pallas_tpu._src.lowering.symbolic import static_dim

# ------------------------------------------------------------------------------------------
# Elementwise arithmetic.

_BINARY = {
    # primitive: (float op, signed op, unsigned op)
    P.add_p: (arith.addf, arith.addi, arith.addi),
    P.add_jaxvals_p: (arith.addf, arith.addi, arith.addi),  # add_any: JVP tangent sums
    P.sub_p: (arith.subf, arith.subi, arith.subi),
    P.mul_p: (arith.mulf, arith.muli, arith.muli),
    P.div_p: (arith.divf, arith.divsi, arith.divui),
    P.rem_p: (arith.remf, arith.remsi, arith.remui),
    P.max_p: (arith.maximumf, arith.maxsi, arith.maxui),
    P.min_p: (arith.minimumf, arith.minsi, arith.minui),
    P.and_p: (None, arith.andi, arith.andi),
    P.or_p: (None, arith.ori, arith.ori),
    P.xor_p: (None, arith.xori, arith.xori),
    P.shift_left_p: (None, arith.shli, arith.shli),
    P.shift_right_arithmetic_p: (None, arith.shrsi, arith.shrsi),
    P.shift_right_logical_p: (None, arith.shrui, arith.shrui),
}


def _binary(lctx, eqn, x, y):
    a, b = operands(eqn, [x, y])
    fop, sop, uop = _BINARY[eqn.primitive]
    dtype, shape = aval_in(eqn, 0).dtype, aval_out(eqn).shape
    k = kind(dtype)
    op = {"f": fop, "i": sop, "u": uop, "b": uop}[k]
    if op is None:
        raise NotImplementedError(f"{eqn.primitive.name} on {dtype}")
    if is_narrow_int(dtype, shape):
        # In i32: a zero-extended unsigned value is non-negative, so the signed op is
        # the unsigned one, except the logical shift, which reads the bits as unsigned.
        logical = eqn.primitive is P.shift_right_logical_p
        a32, b32 = (widen_int(v, shape, dtype, zero_extend=logical) for v in (a, b))
        return narrow_int((arith.shrui if logical else sop)(a32, b32), shape, dtype)
    if k == "u" and eqn.primitive in (P.max_p, P.min_p) and shape:
        # No unsigned max/min on the TPU VPU: compare unsigned and select. (Scalars keep
        # arith.maxui/minui, which Mosaic has in i32 and refuses, by name, narrower.)
        pred = "ugt" if eqn.primitive is P.max_p else "ult"
        return arith.select(cmpi(pred, a, b), a, b)
    return op(a, b)


rule(*_BINARY)(_binary)

_UNARY_FLOAT = {
    P.exp_p: math.exp, P.log_p: math.log, P.tanh_p: math.tanh, P.sqrt_p: math.sqrt,
    P.rsqrt_p: math.rsqrt, P.sin_p: math.sin, P.cos_p: math.cos, P.exp2_p: math.exp2,
    P.log1p_p: math.log1p, P.floor_p: math.floor, P.ceil_p: math.ceil, P.erf_p: math.erf,
    P.tan_p: math.tan,
    # Mosaic legalizes none of these ("failed to legalize operation 'math.acos'"): they
    # are expanded into ops it has (rules_math).
    P.expm1_p: M.expm1, P.atan_p: M.atan, P.cbrt_p: M.cbrt, P.acos_p: M.acos,
    P.asin_p: M.asin, P.asinh_p: M.asinh, P.acosh_p: M.acosh, P.atanh_p: M.atanh,
    P.sinh_p: M.sinh, P.cosh_p: M.cosh, P.erfc_p: M.erfc,
}


@rule(*_UNARY_FLOAT)
def _unary_float(lctx, eqn, x):
    a = aval_in(eqn, 0)
    if kind(a.dtype) != "f":
        raise NotImplementedError(f"{eqn.primitive.name} on {a.dtype}")
    (v,) = operands(eqn, [x])
    if jnp.dtype(a.dtype) != jnp.float32:
        # bf16: in f32 (v5e has no bf16 VPU/EUP; upcasting is exact), then rounded.
        v32 = convert(v, a.shape, a.dtype, jnp.float32)
        return convert(_UNARY_FLOAT[eqn.primitive](v32), a.shape, jnp.float32, a.dtype)
    return _UNARY_FLOAT[eqn.primitive](v)


@rule(P.atan2_p)
def _atan2(lctx, eqn, x, y):
    a, b = operands(eqn, [x, y])
    return math.atan2(a, b)


@rule(P.is_finite_p)
def _is_finite(lctx, eqn, x):
    """``|x| < inf`` (false for NaN); Mosaic has no ``math.isfinite``."""
    a = aval_in(eqn, 0)
    v = materialize(x, a)
    return cmpf("OLT", math.absf(v), const(a.shape, a.dtype, np.inf))


@rule(P.round_p)
def _round(lctx, eqn, x):
    (v,) = operands(eqn, [x])
    method = int(eqn.params.get("rounding_method", 0))
    return math.roundeven(v) if method == 1 else math.round(v)


@rule(P.population_count_p)
def _popcount(lctx, eqn, x):
    return math.ctpop(materialize(x, aval_in(eqn, 0)))


@rule(P.clz_p)
def _clz(lctx, eqn, x):
    return math.ctlz(materialize(x, aval_in(eqn, 0)))


@rule(P.erf_inv_p)
def _erf_inv(lctx, eqn, x):
    """Giles' single-precision approximation (``pallas.mlir_math.erf_inv``), evaluated
    as XLA evaluates it (``as_xla``: log1p, +-inf at +-1, contractible multiply-adds that
    the executor fuses as XLA:CPU does), so that a kernel's ``erf_inv`` (and
    ``jax.random.normal``) agrees with XLA's."""
    a = aval_in(eqn, 0)
    if jnp.dtype(a.dtype) != jnp.float32:
        raise NotImplementedError(f"erf_inv of {a.dtype} (float32 only)")
    (v,) = operands(eqn, [x])
    return erf_inv(v, lambda k: const(a.shape, a.dtype, k), as_xla=True)


@rule(P.nextafter_p)
def _nextafter(lctx, eqn, x, y):
    """The next float after x towards y, by stepping x's bit pattern."""
    a = aval_in(eqn, 0)
    if jnp.dtype(a.dtype) != jnp.float32:
        raise NotImplementedError(f"nextafter of {a.dtype} (float32 only)")
    xv, yv = operands(eqn, [x, y])
    shape = a.shape
    it = T.value_type(shape, jnp.int32)
    ci = lambda k: const(shape, jnp.int32, k)
    cf = lambda k: const(shape, a.dtype, k)
    xb = arith.bitcast(it, xv)
    yb = arith.bitcast(it, yv)
    up = arith.addi(xb, ci(1))
    down = arith.subi(xb, ci(1))
    towards_larger_magnitude = arith.xori(
        cmpf(arith.CmpFPredicate.OLT, xv, yv), cmpf(arith.CmpFPredicate.OLT, xv, cf(0.0)))
    stepped = arith.select(towards_larger_magnitude, up, down)
    sign_y = arith.andi(yb, ci(-(1 << 31)))
    from_zero = arith.ori(sign_y, ci(1))
    is_zero = cmpf(arith.CmpFPredicate.OEQ, xv, cf(0.0))
    out = arith.bitcast(T.value_type(shape, a.dtype), arith.select(is_zero, from_zero, stepped))
    out = arith.select(cmpf(arith.CmpFPredicate.OEQ, xv, yv), yv, out)
    unordered = cmpf(arith.CmpFPredicate.UNO, xv, yv)
    return arith.select(unordered, cf(np.nan), out)


def _in_i32(fn):
    """A unary integer rule ``fn(v, shape, dtype)`` run in i32 for narrow integers."""
    def rule_fn(lctx, eqn, x):
        (v,) = operands(eqn, [x])
        a = aval_in(eqn, 0)
        if is_narrow_int(a.dtype, a.shape):
            r = fn(widen_int(v, a.shape, a.dtype), a.shape, jnp.int32)
            return narrow_int(r, a.shape, a.dtype)
        return fn(v, a.shape, a.dtype)
    return rule_fn


@rule(P.neg_p)
@_in_i32
def _neg(v, shape, dtype):
    if kind(dtype) == "f":
        return arith.negf(v)
    return arith.subi(const(shape, dtype, 0), v)


@rule(P.not_p)
def _not(lctx, eqn, x):
    (v,) = operands(eqn, [x])
    a = aval_in(eqn, 0)
    return arith.xori(v, const(a.shape, a.dtype, True if a.dtype == jnp.bool_ else -1))


@rule(P.abs_p)
@_in_i32
def _abs(v, shape, dtype):
    return math.absf(v) if kind(dtype) == "f" else math.absi(v)


@rule(P.logistic_p)
def _logistic(lctx, eqn, x):
    (v,) = operands(eqn, [x])
    a = aval_in(eqn, 0)
    one = const(a.shape, a.dtype, 1.0)
    return arith.divf(one, arith.addf(one, math.exp(arith.negf(v))))


@rule(P.square_p)
@_in_i32
def _square(v, shape, dtype):
    return arith.mulf(v, v) if kind(dtype) == "f" else arith.muli(v, v)


@rule(P.integer_pow_p)
def _integer_pow(lctx, eqn, x):
    y = int(eqn.params["y"])
    return _in_i32(lambda v, shape, dtype: integer_pow(
        v, y, lambda k: const(shape, dtype, k), is_float=kind(dtype) == "f"))(lctx, eqn, x)


@rule(P.pow_p)
def _pow(lctx, eqn, x, y):
    a, b = operands(eqn, [x, y])
    if kind(aval_in(eqn, 1).dtype) in "iu":  # float base, integer exponents
        # |a|^n with the sign of a when n is odd (Mosaic has no math.fpowi).
        sh, dt, it = aval_out(eqn).shape, aval_out(eqn).dtype, aval_in(eqn, 1).dtype
        if is_narrow_int(it, sh):
            b, it = widen_int(b, sh, it), jnp.int32
        mag = math.powf(math.absf(a), convert(b, sh, it, dt))
        odd = cmpi("ne", arith.andi(b, const(sh, it, 1)), const(sh, it, 0))
        neg = arith.andi(odd, cmpf("OLT", a, const(sh, dt, 0.0)))
        return arith.select(neg, arith.negf(mag), mag)
    return math.powf(a, b)


@rule(P.bitcast_convert_type_p)
def _bitcast_convert_type(lctx, eqn, x):
    src, out = aval_in(eqn, 0), aval_out(eqn)
    if jnp.dtype(src.dtype).itemsize != jnp.dtype(out.dtype).itemsize:
        raise NotImplementedError(
            f"lax.bitcast_convert_type between dtypes of different widths "
            f"({jnp.dtype(src.dtype).name} -> {jnp.dtype(out.dtype).name}); use pltpu.bitcast"
        )
    if jnp.float16 in (jnp.dtype(src.dtype), jnp.dtype(out.dtype)):
        raise NotImplementedError(
            f"lax.bitcast_convert_type {jnp.dtype(src.dtype).name} -> "
            f"{jnp.dtype(out.dtype).name}: pallas-tpu computes float16 as float32 (Mosaic "
            f"has no float16 vectors on any TPU), so its bits are not there to bitcast")
    (v,) = operands(eqn, [x])
    if jnp.dtype(src.dtype) == jnp.dtype(out.dtype):
        return v
    return arith.bitcast(T.aval_type(out), v)


@rule(P.sign_p)
@_in_i32
def _sign(v, shape, dtype):
    a = jc.ShapedArray(shape, dtype)
    zero, one, minus = (const(a.shape, a.dtype, c) for c in (0, 1, -1))
    if kind(a.dtype) == "f":
        gt = cmpf(arith.CmpFPredicate.OGT, v, zero)
        lt = cmpf(arith.CmpFPredicate.OLT, v, zero)
    elif kind(a.dtype) == "i":
        gt = cmpi(arith.CmpIPredicate.sgt, v, zero)
        lt = cmpi(arith.CmpIPredicate.slt, v, zero)
    else:
        return arith.select(cmpi(arith.CmpIPredicate.ne, v, zero), one, zero)
    # sign(nan) is nan: x where neither comparison holds and x != 0
    pos = arith.select(gt, one, v if kind(a.dtype) == "f" else zero)
    return arith.select(lt, minus, pos)


_CMP = {
    P.eq_p: ("OEQ", "eq", "eq"), P.ne_p: ("UNE", "ne", "ne"),
    P.lt_p: ("OLT", "slt", "ult"), P.le_p: ("OLE", "sle", "ule"),
    P.gt_p: ("OGT", "sgt", "ugt"), P.ge_p: ("OGE", "sge", "uge"),
}


@rule(*_CMP)
def _compare(lctx, eqn, x, y):
    a_aval = aval_in(eqn, 0)
    shape = aval_out(eqn).shape
    a = materialize(x, a_aval)
    b = materialize(y, aval_in(eqn, 1))
    if shape:
        a = broadcast_to(a, shape, a_aval.dtype)
        b = broadcast_to(b, shape, aval_in(eqn, 1).dtype)
    f, s, u = _CMP[eqn.primitive]
    k = kind(a_aval.dtype)
    if k == "f":
        return cmpf(getattr(arith.CmpFPredicate, f), a, b)
    pred = s if k == "i" else u
    return cmpi(getattr(arith.CmpIPredicate, pred), a, b)


@rule(P.select_n_p)
def _select_n(lctx, eqn, which, *cases):
    shape, dtype = aval_out(eqn).shape, aval_out(eqn).dtype
    w_aval = aval_in(eqn, 0)
    w = materialize(which, w_aval)
    vals = [broadcast_to(materialize(c, aval_in(eqn, i + 1)), shape, dtype)
            for i, c in enumerate(cases)]
    if shape and not w_aval.shape:
        w = broadcast_to(w, shape, w_aval.dtype)
    if len(vals) == 1:
        return vals[0]
    if w_aval.dtype == jnp.bool_:
        return arith.select(w, vals[1], vals[0])
    out = vals[-1]
    for i in range(len(vals) - 2, -1, -1):
        is_i = cmpi(arith.CmpIPredicate.eq, w, const(w_aval.shape if shape else (),
                                                          w_aval.dtype, i))
        out = arith.select(is_i, vals[i], out)
    return out


@rule(P.clamp_p)
def _clamp(lctx, eqn, lo, x, hi):
    shape, dtype = aval_out(eqn).shape, aval_out(eqn).dtype
    vals = [broadcast_to(materialize(v, aval_in(eqn, i)), shape, dtype)
            for i, v in enumerate((lo, x, hi))]
    mx, mn = ((arith.maximumf, arith.minimumf) if kind(dtype) == "f"
              else (arith.maxsi, arith.minsi))
    return mn(mx(vals[1], vals[0]), vals[2])


@rule(P.convert_element_type_p)
def _convert(lctx, eqn, x):
    src, dst = aval_in(eqn, 0), aval_out(eqn)
    v = materialize(x, src)
    return convert(v, src.shape, src.dtype, dst.dtype)


@rule(P.cumsum_p, P.cumprod_p, P.cummax_p, P.cummin_p)
def _cumulative(lctx, eqn, x):
    """An inclusive scan along one axis in log2(n) steps: each step rotates the running
    value by ``2**k`` along the axis (``tpu.dynamic_rotate``, as ``jnp.roll``) and combines
    it into the elements at least ``2**k`` from the start (the others get the identity)."""
    a = aval_in(eqn, 0)
    axis, reverse = eqn.params["axis"], eqn.params["reverse"]
    name = eqn.primitive.name
    if reverse:
        raise NotImplementedError(f"{name}(reverse=True) in Mosaic TPU kernels")
    k = kind(a.dtype)
    if k == "b" or jnp.dtype(a.dtype).itemsize != 4:
        raise NotImplementedError(f"{name} of {jnp.dtype(a.dtype).name} (32-bit types only)")
    if not a.shape:
        return materialize(x, a)
    (v,) = operands(eqn, [x])
    combine = {
        "cumsum": arith.addf if k == "f" else arith.addi,
        "cumprod": arith.mulf if k == "f" else arith.muli,
        "cummax": arith.maximumf if k == "f" else (arith.maxsi if k == "i" else arith.maxui),
        "cummin": arith.minimumf if k == "f" else (arith.minsi if k == "i" else arith.minui),
    }[name]
    if name in ("cumsum", "cumprod"):
        identity = const(a.shape, a.dtype, 0 if name == "cumsum" else 1)
    else:
        identity = v  # max/min with itself changes nothing
    pos = tpu.iota(T.value_type(a.shape, jnp.int32), [axis])
    shift = 1
    while shift < a.shape[axis]:
        rolled = tpu.dynamic_rotate(v, const((), jnp.int32, shift), axis)
        inside = cmpi(arith.CmpIPredicate.sge, pos, const(a.shape, jnp.int32, shift))
        v = combine(v, arith.select(inside, rolled, identity))
        shift *= 2
    return v


@rule(jc.dim_as_value_p)
def _dim_as_value(lctx, eqn):
    """A dimension used as a value (``x.shape[0] * 2``): its size, or its placeholder
    under dynamic-shape export (see ``symbolic``)."""
    return const((), aval_out(eqn).dtype, static_dim(eqn.params["dim"]))


@rule(P.iota_p)
def _iota(lctx, eqn):
    out = aval_out(eqn)
    if kind(out.dtype) not in "iu" or jnp.dtype(out.dtype).itemsize != 4:
        raise NotImplementedError(f"iota of dtype {out.dtype} (Mosaic TPU has 32-bit "
                                  f"integer iota)")
    if len(out.shape) < 1:
        raise NotImplementedError("iota of rank 0")
    return iota(out.shape, eqn.params["dimension"], out.dtype)



# ------------------------------------------------------------------------------------------
# Shapes.


@rule(P.broadcast_in_dim_p)
def _broadcast_in_dim(lctx, eqn, x):
    src, out = aval_in(eqn, 0), aval_out(eqn)
    v = materialize(x, src)
    if not src.shape:
        return broadcast_to(v, out.shape, out.dtype)
    dims = eqn.params["broadcast_dimensions"]
    inter = [1] * len(out.shape)
    for i, d in enumerate(dims):
        inter[d] = src.shape[i]
    if tuple(inter) != tuple(src.shape):
        v = vector.shape_cast(T.value_type(tuple(inter), src.dtype), v)
    if tuple(inter) == tuple(out.shape):
        return v
    return vector.broadcast(T.aval_type(out), v)


@rule(P.reshape_p, P.squeeze_p)
def _reshape(lctx, eqn, x):
    src, out = aval_in(eqn, 0), aval_out(eqn)
    v = materialize(x, src)
    if tuple(src.shape) == tuple(out.shape):
        return v
    if not out.shape:
        return vector.extract(v, [], [0] * len(src.shape))
    if not src.shape:
        return broadcast_to(v, out.shape, out.dtype)
    check_reshape(src.shape, out.shape, src.dtype, lctx.chip, eqn.primitive.name)
    return vector.shape_cast(T.aval_type(out), v)


# Element types for which libtpu compiles ``tpu.transpose`` with any permutation of up to
# four dims (140 measured on v5e and v6e: major, sublane and lane dims in any order, odd
# sizes; one was over the scoped VMEM limit, the rest compiled).
_TRANSPOSE_DTYPES = frozenset({"float32", "int32", "uint32", "bfloat16", "float16", "int8"})


@rule(P.transpose_p)
def _transpose(lctx, eqn, x):
    src, out = aval_in(eqn, 0), aval_out(eqn)
    perm = tuple(eqn.params["permutation"])
    n = len(perm)
    if perm == tuple(range(n)):
        return materialize(x, src)
    last_two = perm == tuple(range(n - 2)) + (n - 1, n - 2)
    if not last_two and (n > 4 or jnp.dtype(src.dtype).name not in _TRANSPOSE_DTYPES):
        raise NotImplementedError(
            f"transpose with permutation {perm} of a {jnp.dtype(src.dtype).name} "
            f"{tuple(src.shape)} value: Mosaic TPU transposes any dims of values of up to "
            f"4 dims of {', '.join(sorted(_TRANSPOSE_DTYPES))}, and the last two dims of "
            f"others (use pltpu.einshape, or transpose a 32-bit value)"
        )
    return tpu.transpose(T.aval_type(out), materialize(x, src), list(perm))


@rule(P.slice_p)
def _slice(lctx, eqn, x):
    src, out = aval_in(eqn, 0), aval_out(eqn)
    strides = eqn.params["strides"]
    if strides is not None and any(s != 1 for s in strides):
        raise NotImplementedError(f"strided slices of values (strides={strides})")
    start = [int(s) for s in eqn.params["start_indices"]]
    sizes = list(out.shape)
    v = materialize(x, src)
    if not sizes:
        return v
    return vector.extract_strided_slice(T.aval_type(out), v, start, sizes, [1] * len(sizes))


@rule(P.concatenate_p)
def _concatenate(lctx, eqn, *xs):
    vals = [materialize(x, aval_in(eqn, i)) for i, x in enumerate(xs)]
    return tpu.concatenate(vals, eqn.params["dimension"], results=[T.aval_type(aval_out(eqn))])


def _insert_unit_dim(lctx, v, shape, dtype, axis, prim):
    """``v`` (of ``shape``; a scalar when ``shape`` is ``()``) with a dim of size 1 inserted
    at ``axis``."""
    out = (*shape[:axis], 1, *shape[axis:])
    if not shape:
        return broadcast_to(v, out, dtype)
    check_reshape(shape, out, dtype, lctx.chip, prim)
    return vector.shape_cast(T.value_type(out, dtype), v)


@rule(jc.stack_p)
def _stack(lctx, eqn, *xs):
    """``jnp.stack``: each operand gets a unit dim at ``axis`` (a shape cast; a scalar is
    broadcast to a 1-vector), then they are concatenated along it."""
    axis, src = eqn.params["axis"], aval_in(eqn, 0)
    vals = [_insert_unit_dim(lctx, materialize(x, aval_in(eqn, i)), tuple(src.shape),
                             src.dtype, axis, "stack") for i, x in enumerate(xs)]
    if len(vals) == 1:
        return vals[0]
    return tpu.concatenate(vals, axis, results=[T.aval_type(aval_out(eqn))])


@rule(jc.unstack_p)
def _unstack(lctx, eqn, x):
    """``jnp.unstack``: one unit-wide slice along ``axis`` per result, with that dim
    dropped (a shape cast; a scalar is extracted from a 1-vector)."""
    src, axis = aval_in(eqn, 0), eqn.params["axis"]
    v = materialize(x, src)
    shape = tuple(src.shape)
    piece = (*shape[:axis], 1, *shape[axis + 1:])
    out_shape = tuple(aval_out(eqn).shape)
    if out_shape:
        check_reshape(piece, out_shape, src.dtype, lctx.chip, "unstack")
    outs = []
    for i in range(shape[axis]):
        start = [0] * len(shape)
        start[axis] = i
        s = vector.extract_strided_slice(T.value_type(piece, src.dtype), v, start,
                                         list(piece), [1] * len(piece))
        if out_shape:
            outs.append(vector.shape_cast(T.value_type(out_shape, src.dtype), s))
        else:
            outs.append(vector.extract(s, [], [0] * len(piece)))
    return outs


@rule(jc.tile_p)
def _tile(lctx, eqn, x):
    """``jnp.tile``: the value concatenated with itself ``reps[i]`` times along each axis."""
    src = aval_in(eqn, 0)
    cur, shape = materialize(x, src), list(src.shape)
    for axis, reps in enumerate(eqn.params["reps"]):
        if reps > 1:
            shape[axis] *= reps
            cur = tpu.concatenate([cur] * reps, axis,
                                  results=[T.value_type(tuple(shape), src.dtype)])
    return cur


@rule(P.gather_p)
def _gather(lctx, eqn, x, indices):
    """The gathers ``jnp.take_along_axis`` makes (one index per output element, along
    one axis, the other axes paired element for element): ``tpu.dynamic_gather``, whose
    source spans at most one vreg along that axis (Mosaic checks). Its modes: ``fill``
    (the default) gives ``fill_value`` where an index is outside ``[0, n)``, ``clip``
    clamps the index, ``promise_in_bounds`` trusts it."""
    src, idx_aval, out = aval_in(eqn, 0), aval_in(eqn, 1), aval_out(eqn)
    dn = eqn.params["dimension_numbers"]
    rank = len(out.shape)
    mode = lax.GatherScatterMode.from_any(eqn.params["mode"])
    take_along_axis = (
        len(src.shape) == rank >= 1
        and tuple(idx_aval.shape) == tuple(out.shape) + (1,)
        and tuple(eqn.params["slice_sizes"]) == (1,) * rank
        and not dn.offset_dims
        and len(dn.collapsed_slice_dims) == 1
        and tuple(dn.collapsed_slice_dims) == tuple(dn.start_index_map)
        and tuple(dn.operand_batching_dims) == tuple(dn.start_indices_batching_dims)
        and len(dn.operand_batching_dims) == rank - 1
    )
    if not take_along_axis:
        raise NotImplementedError(
            f"gather with {dn} and slice sizes {eqn.params['slice_sizes']}: Mosaic TPU "
            "kernels gather only as jnp.take_along_axis does (tpu.dynamic_gather)")
    (axis,) = dn.collapsed_slice_dims
    if rank >= 2 and axis < rank - 2:
        raise NotImplementedError(
            f"gather along axis {axis} of a rank-{rank} array: Mosaic TPU gathers along "
            "the two minormost axes only")
    if kind(idx_aval.dtype) != "i" or jnp.dtype(idx_aval.dtype).itemsize != 4:
        raise NotImplementedError(f"gather with {idx_aval.dtype} indices (int32 only)")
    i32 = jnp.int32
    idx = vector.shape_cast(T.value_type(out.shape, i32), materialize(indices, idx_aval))
    n = src.shape[axis]
    if mode == lax.GatherScatterMode.CLIP:
        idx = arith.maxsi(arith.minsi(idx, const(out.shape, i32, n - 1)),
                          const(out.shape, i32, 0))
    res = tpu.dynamic_gather(materialize(x, src), idx, [axis])
    if mode == lax.GatherScatterMode.FILL_OR_DROP:
        fill = eqn.params["fill_value"]
        if fill is None:
            dt = jnp.dtype(out.dtype)
            fill = (np.nan if kind(dt) == "f" else np.iinfo(dt).min if kind(dt) == "i"
                    else np.iinfo(dt).max if kind(dt) == "u" else True)
        inside = arith.andi(cmpi(arith.CmpIPredicate.sge, idx, const(out.shape, i32, 0)),
                            cmpi(arith.CmpIPredicate.slt, idx, const(out.shape, i32, n)))
        res = arith.select(inside, res, const(out.shape, out.dtype, fill))
    return res
