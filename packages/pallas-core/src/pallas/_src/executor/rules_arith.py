"""``arith`` ops with MLIR semantics: two's-complement wraparound, signless integers read
as signed or unsigned by the op, ``i1`` arithmetic modulo 2 (true is -1 when extended
signed), IEEE NaN rules, round-to-nearest-even float casts, saturating float-to-int
casts. Division by zero (undefined in MLIR) gives the dividend (``divsi``/``divui``) and
0 (``remsi``/``remui``)."""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from pallas._src.executor.engine import UPSTREAM, cast, elementwise
from pallas._src.executor.errors import ExecutorUnsupported
from pallas._src.executor.types import as_unsigned, bits, dtype_of, unsigned, vshape

_u = as_unsigned


def _attr_value(a, dt: np.dtype, shape: tuple) -> np.ndarray:
    """The array of the constant attribute ``a`` as ``dt`` of ``shape``."""
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
        if dt.kind in "iuV":  # two's complement, whatever the width of the attribute
            return np.asarray(v & ((1 << 64) - 1), np.uint64).astype(np.int64).astype(dt)
        return np.asarray(v, dt)
    if isinstance(a, ir.FloatAttr):
        return np.asarray(a.value, np.float64).astype(dt)
    raise ExecutorUnsupported(f"the executor cannot read the constant {a}")


def constant_array(o) -> np.ndarray:
    """The array of the ``value`` attribute of the constant op ``o``."""
    t = o.results[0].type
    return _attr_value(o.attributes["value"], dtype_of(t), vshape(t))


@UPSTREAM.register("arith.constant")
def _constant(o, cc):
    val = cc.constant(constant_array(o))
    return lambda m: (val,)


def _mod2(f):
    """``f`` on integers; on ``i1`` (bools) computed modulo 2."""
    def g(a, b):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype == np.bool_:
            return (f(a.astype(np.uint8), b.astype(np.uint8)) & 1).astype(bool)
        return f(a, b)

    return g


_ELEMENTWISE = {
    "arith.addf": np.add, "arith.subf": np.subtract, "arith.mulf": np.multiply,
    "arith.addi": _mod2(np.add), "arith.subi": _mod2(np.subtract),
    "arith.muli": _mod2(np.multiply), "arith.divf": np.divide, "arith.remf": np.fmod,
    "arith.negf": np.negative, "arith.maximumf": np.maximum, "arith.minimumf": np.minimum,
    "arith.maxnumf": np.fmax, "arith.minnumf": np.fmin, "arith.maxsi": np.maximum,
    "arith.minsi": np.minimum, "arith.andi": np.bitwise_and, "arith.ori": np.bitwise_or,
    "arith.xori": np.bitwise_xor,
}
for _name, _f in _ELEMENTWISE.items():
    elementwise(UPSTREAM, _name)(_f)


@elementwise(UPSTREAM, "arith.maxui")
def _maxui(a, b):
    return np.maximum(_u(a), _u(b)).view(np.asarray(a).dtype)


@elementwise(UPSTREAM, "arith.minui")
def _minui(a, b):
    return np.minimum(_u(a), _u(b)).view(np.asarray(a).dtype)


@elementwise(UPSTREAM, "arith.divsi")
def _divsi(a, b):
    a, b = np.asarray(a), np.asarray(b)
    safe = np.where(b == 0, 1, b)
    q = np.abs(a.astype(np.int64)) // np.abs(safe.astype(np.int64))
    return np.where((a < 0) != (safe < 0), -q, q).astype(a.dtype)


@elementwise(UPSTREAM, "arith.remsi")
def _remsi(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.fmod(a, np.where(b == 0, 1, b))


@elementwise(UPSTREAM, "arith.ceildivsi")
def _ceildivsi(a, b):
    a, b = np.asarray(a), np.asarray(b)
    q = _divsi(a, b)
    return q + ((q * b != a) & ((a > 0) == (b > 0)))


@elementwise(UPSTREAM, "arith.floordivsi")
def _floordivsi(a, b):
    a, b = np.asarray(a), np.asarray(b)
    q = _divsi(a, b)
    return q - ((q * b != a) & ((a < 0) != (b < 0)))


@elementwise(UPSTREAM, "arith.divui")
def _divui(a, b):
    ua, ub = _u(a), _u(b)
    return (ua // np.where(ub == 0, 1, ub)).astype(ua.dtype).view(np.asarray(a).dtype)


@elementwise(UPSTREAM, "arith.remui")
def _remui(a, b):
    ua, ub = _u(a), _u(b)
    return (ua % np.where(ub == 0, 1, ub)).astype(ua.dtype).view(np.asarray(a).dtype)


def _shift(a, b, f, fill):
    a, b = np.asarray(a), np.asarray(b)
    n = bits(a.dtype)
    ok = (_u(b) < n)
    return np.where(ok, f(a, np.where(ok, b, 0).astype(a.dtype)), fill(a))


@elementwise(UPSTREAM, "arith.shli")
def _shli(a, b):
    return _shift(a, b, np.left_shift, np.zeros_like)


@elementwise(UPSTREAM, "arith.shrsi")
def _shrsi(a, b):
    return _shift(a, b, np.right_shift, lambda x: np.where(x < 0, -1, 0).astype(x.dtype))


@elementwise(UPSTREAM, "arith.shrui")
def _shrui(a, b):
    a = np.asarray(a)
    return _shift(_u(a), b, np.right_shift, np.zeros_like).view(a.dtype)


@UPSTREAM.register("arith.select")
def _select(o, cc):
    def run(m, c, a, b):
        c, a, b = np.asarray(c), np.asarray(a), np.asarray(b)
        while c.ndim < max(a.ndim, b.ndim):  # a scalar condition per lane of a vector
            c = c[..., None]
        return (np.where(c, a, b),)

    return run


_CMPI = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater,
         5: np.greater_equal}


@UPSTREAM.register("arith.cmpi")
def _cmpi(o, cc):
    p = ir.IntegerAttr(o.attributes["predicate"]).value
    if p in _CMPI:
        f = _CMPI[p]
        return lambda m, a, b: (f(a, b),)
    if p not in range(10):
        raise ExecutorUnsupported(f"arith.cmpi predicate {p}")
    f = _CMPI[p - 4]
    return lambda m, a, b: (f(_u(a), _u(b)),)


_CMPF = {1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less, 5: np.less_equal,
         6: np.not_equal}


@UPSTREAM.register("arith.cmpf")
def _cmpf(o, cc):
    p = ir.IntegerAttr(o.attributes["predicate"]).value

    def run(m, a, b):
        a, b = np.asarray(a), np.asarray(b)
        unord = np.isnan(a) | np.isnan(b)
        if p == 0:
            r = np.zeros(np.broadcast_shapes(a.shape, b.shape), bool)
        elif p == 15:
            r = np.ones(np.broadcast_shapes(a.shape, b.shape), bool)
        elif p == 7:
            r = ~unord
        elif p == 14:
            r = unord
        elif p <= 6:
            r = _CMPF[p](a, b) & ~unord
        else:  # unordered: 8..13 are ueq ugt uge ult ule une
            r = _CMPF[p - 7](a, b) | unord
        return (r,)

    return run


def _types(o) -> tuple[np.dtype, np.dtype]:
    return dtype_of(o.operands[0].type), dtype_of(o.results[0].type)


@UPSTREAM.register("arith.extf", "arith.truncf", "arith.extsi", "arith.trunci",
                   "arith.sitofp", "arith.index_cast")
def _convert(o, cc):
    src, dt = _types(o)
    if src == np.bool_ and dt != np.bool_:  # i1 true, extended signed, is -1
        return lambda m, x: (-(np.asarray(x).astype(dt)),)
    if dt == np.bool_ and src != np.bool_ and src.kind in "iu":  # truncation keeps bit 0
        return lambda m, x: ((np.asarray(x) & 1).astype(bool),)
    return lambda m, x: (cast(x, dt),)


@UPSTREAM.register("arith.extui", "arith.uitofp", "arith.index_castui")
def _convert_unsigned(o, cc):
    dt = dtype_of(o.results[0].type)
    return lambda m, x: (_u(x).astype(dt),)


def _float_to_int(x, lo, hi):
    x = np.asarray(x).astype(np.float64)
    return np.where(np.isnan(x), 0, np.clip(np.trunc(x), lo, hi))


@UPSTREAM.register("arith.fptosi")
def _fptosi(o, cc):
    dt = dtype_of(o.results[0].type)
    if dt == np.bool_:
        return lambda m, x: (_float_to_int(x, -1, 0).astype(bool),)
    info = np.iinfo(dt)
    return lambda m, x: (_float_to_int(x, info.min, info.max).astype(dt),)


@UPSTREAM.register("arith.fptoui")
def _fptoui(o, cc):
    dt = dtype_of(o.results[0].type)
    if dt == np.bool_:
        return lambda m, x: (_float_to_int(x, 0, 1).astype(bool),)
    u = unsigned(dt)
    info = np.iinfo(u)
    return lambda m, x: (_float_to_int(x, 0, info.max).astype(u).view(dt),)


@UPSTREAM.register("arith.bitcast")
def _bitcast(o, cc):
    dt = dtype_of(o.results[0].type)

    def run(m, x):
        x = np.asarray(x)
        return ((x if x.flags.c_contiguous else np.ascontiguousarray(x)).view(dt),)

    return run
