"""``arith`` ops with MLIR semantics: two's-complement wraparound, signless integers read
as signed or unsigned by the op, IEEE NaN rules, round-to-nearest-even float casts."""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from pallas_tpu._src.executor.engine import cast, elementwise, op
from pallas_tpu._src.executor.types import ExecutorError, bits, elem_and_shape, unsigned


def _u(x):
    x = np.asarray(x)
    return x if x.dtype == np.bool_ else x.view(unsigned(x.dtype))


def _attr_value(a, dt, shape):
    if isinstance(a, ir.DenseElementsAttr):
        if a.is_splat:
            return np.full(shape, _attr_value(a.get_splat_value(), dt, ()), dt)
        if isinstance(a, ir.DenseIntElementsAttr):
            return np.asarray(list(a), dtype=np.int64).astype(dt).reshape(shape)
        return np.asarray([float(v) for v in a], np.float64).astype(dt).reshape(shape)
    if isinstance(a, ir.BoolAttr):
        return np.asarray(a.value, dt)
    if isinstance(a, ir.IntegerAttr):
        v = a.value
        if dt == np.bool_:
            return np.asarray(v & 1, dt)
        return np.asarray(v, np.int64).astype(dt) if dt.kind in "iu" else np.asarray(v, dt)
    if isinstance(a, ir.FloatAttr):
        return np.asarray(a.value, np.float64).astype(dt)
    raise ExecutorError(f"the Mosaic executor cannot read the constant {a}")


@op("arith.constant")
def _constant(o, cc):
    dt, shape = elem_and_shape(o.result.type)
    val = _attr_value(o.attributes["value"], dt, shape)
    val.setflags(write=False)
    return lambda env: (val,)


elementwise("arith.addf", "arith.addi")(np.add)
elementwise("arith.subf", "arith.subi")(np.subtract)
elementwise("arith.mulf", "arith.muli")(np.multiply)
elementwise("arith.divf")(np.divide)
elementwise("arith.remf")(np.fmod)
elementwise("arith.negf")(np.negative)
elementwise("arith.maximumf")(np.maximum)
elementwise("arith.minimumf")(np.minimum)
elementwise("arith.maxnumf")(np.fmax)
elementwise("arith.minnumf")(np.fmin)
elementwise("arith.maxsi")(np.maximum)
elementwise("arith.minsi")(np.minimum)
elementwise("arith.andi")(np.bitwise_and)
elementwise("arith.ori")(np.bitwise_or)
elementwise("arith.xori")(np.bitwise_xor)
elementwise("arith.select")(np.where)


@elementwise("arith.maxui")
def _maxui(a, b):
    return np.maximum(_u(a), _u(b)).view(np.asarray(a).dtype)


@elementwise("arith.minui")
def _minui(a, b):
    return np.minimum(_u(a), _u(b)).view(np.asarray(a).dtype)


@elementwise("arith.divsi")
def _divsi(a, b):
    a, b = np.asarray(a), np.asarray(b)
    safe = np.where(b == 0, 1, b)
    q = np.abs(a.astype(np.int64)) // np.abs(safe.astype(np.int64))
    return np.where((a < 0) != (safe < 0), -q, q).astype(a.dtype)


@elementwise("arith.remsi")
def _remsi(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.fmod(a, np.where(b == 0, 1, b))


@elementwise("arith.divui")
def _divui(a, b):
    ua, ub = _u(a), _u(b)
    return (ua // np.where(ub == 0, 1, ub)).view(np.asarray(a).dtype)


@elementwise("arith.remui")
def _remui(a, b):
    ua, ub = _u(a), _u(b)
    return (ua % np.where(ub == 0, 1, ub)).view(np.asarray(a).dtype)


def _shift(a, b, f, fill):
    a, b = np.asarray(a), np.asarray(b)
    n = bits(a.dtype)
    ok = (_u(b) < n)
    return np.where(ok, f(a, np.where(ok, b, 0).astype(a.dtype)), fill(a))


@elementwise("arith.shli")
def _shli(a, b):
    return _shift(a, b, np.left_shift, np.zeros_like)


@elementwise("arith.shrsi")
def _shrsi(a, b):
    return _shift(a, b, np.right_shift, lambda x: np.where(x < 0, -1, 0).astype(x.dtype))


@elementwise("arith.shrui")
def _shrui(a, b):
    a = np.asarray(a)
    return _shift(_u(a), b, np.right_shift, np.zeros_like).view(a.dtype)


_CMPI = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater,
         5: np.greater_equal}


@op("arith.cmpi")
def _cmpi(o, cc):
    p = ir.IntegerAttr(o.attributes["predicate"]).value
    if p in _CMPI:
        f = _CMPI[p]
        return lambda env, a, b: (f(a, b),)
    f = {6: np.less, 7: np.less_equal, 8: np.greater, 9: np.greater_equal}[p]
    return lambda env, a, b: (f(_u(a), _u(b)),)


_CMPF = {1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less, 5: np.less_equal,
         6: np.not_equal}


@op("arith.cmpf")
def _cmpf(o, cc):
    p = ir.IntegerAttr(o.attributes["predicate"]).value

    def run(env, a, b):
        a, b = np.asarray(a), np.asarray(b)
        unord = np.isnan(a) | np.isnan(b)
        if p == 0:
            r = np.zeros(np.broadcast(a, b).shape, bool)
        elif p == 15:
            r = np.ones(np.broadcast(a, b).shape, bool)
        elif p == 7:
            r = ~unord
        elif p == 14:
            r = unord
        elif p <= 6:
            r = _CMPF[p](a, b) & ~unord
        else:
            r = _CMPF[p - 7](a, b) | unord
        return (r,)

    return run


def _to(o):
    return elem_and_shape(o.results[0].type)[0]


@op("arith.extf", "arith.truncf", "arith.extsi", "arith.trunci", "arith.sitofp",
    "arith.index_cast", "arith.index_castui")
def _convert(o, cc):
    dt = _to(o)
    return lambda env, x: (np.asarray(x).astype(dt),)


@op("arith.extui")
def _extui(o, cc):
    dt = _to(o)
    return lambda env, x: (_u(x).astype(dt),)


@op("arith.uitofp")
def _uitofp(o, cc):
    dt = _to(o)
    return lambda env, x: (_u(x).astype(dt),)


def _float_to_int(x, dt, lo, hi):
    x = np.asarray(x).astype(np.float64)
    x = np.where(np.isnan(x), 0, np.clip(np.trunc(x), lo, hi))
    return x


@op("arith.fptosi")
def _fptosi(o, cc):
    dt = _to(o)
    info = np.iinfo(dt)
    return lambda env, x: (_float_to_int(x, dt, info.min, info.max).astype(dt),)


@op("arith.fptoui")
def _fptoui(o, cc):
    dt = _to(o)
    u = unsigned(dt)
    info = np.iinfo(u)
    return lambda env, x: (_float_to_int(x, dt, 0, info.max).astype(u).view(dt),)


@op("arith.bitcast")
def _bitcast(o, cc):
    dt = _to(o)
    return lambda env, x: (np.asarray(x).view(dt),)


__all__ = ["cast"]
