"""``arith`` ops with MLIR semantics on numpy arrays (signless integers are stored
signed; the unsigned ops view them as unsigned; ``i1`` is bool)."""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from pallas_mosaic_gpu._src.emulate.engine import op
from pallas_mosaic_gpu._src.emulate.types import (
    EmulationUnsupported,
    dtype_of,
    is_unsigned_view,
    vshape,
)


def _errstate(f):
    def g(*xs, **kw):
        with np.errstate(all="ignore"):
            return f(*xs, **kw)

    return g


def elementwise(names: str | tuple, f):
    """Registers ``f(*operands, dtype=result dtype)`` for ops whose result depends on
    their operands alone."""
    names = (names,) if isinstance(names, str) else names

    def builder(o, cc):
        dt = dtype_of(o.results[0].type)
        g = _errstate(f)

        def run(m, *xs):
            r = np.asarray(g(*xs, dtype=dt))
            return (r if r.dtype == dt else r.astype(dt),)

        return run

    op(*names)(builder)


def _bool_int(f):
    """``f`` on integers, with bools computed as uint8 and reduced mod 2."""

    def g(*xs, dtype):
        if dtype == np.bool_:
            return (f(*[np.asarray(x, np.uint8) for x in xs]) & 1).astype(bool)
        return f(*xs)

    return g


elementwise("arith.addf", lambda a, b, dtype: a + b)
elementwise("arith.subf", lambda a, b, dtype: a - b)
elementwise("arith.mulf", lambda a, b, dtype: a * b)
elementwise("arith.divf", lambda a, b, dtype: a / b)
elementwise("arith.remf", lambda a, b, dtype: np.fmod(a, b))
elementwise("arith.negf", lambda a, dtype: -a)
elementwise("arith.maximumf", lambda a, b, dtype: np.maximum(a, b))
elementwise("arith.minimumf", lambda a, b, dtype: np.minimum(a, b))
elementwise("arith.maxnumf", lambda a, b, dtype: np.fmax(a, b))
elementwise("arith.minnumf", lambda a, b, dtype: np.fmin(a, b))
elementwise("arith.addi", _bool_int(lambda a, b: a + b))
elementwise("arith.subi", _bool_int(lambda a, b: a - b))
elementwise("arith.muli", _bool_int(lambda a, b: a * b))
elementwise("arith.andi", lambda a, b, dtype: a & b)
elementwise("arith.ori", lambda a, b, dtype: a | b)
elementwise("arith.xori", lambda a, b, dtype: a ^ b)
elementwise("arith.maxsi", lambda a, b, dtype: np.maximum(a, b))
elementwise("arith.minsi", lambda a, b, dtype: np.minimum(a, b))
elementwise("arith.maxui", lambda a, b, dtype: np.maximum(
    is_unsigned_view(a), is_unsigned_view(b)).view(dtype))
elementwise("arith.minui", lambda a, b, dtype: np.minimum(
    is_unsigned_view(a), is_unsigned_view(b)).view(dtype))


def _divsi(a, b, dtype):
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    safe = np.where(b64 == 0, 1, b64)
    q = np.abs(a64) // np.abs(safe) * np.sign(a64) * np.sign(safe)
    return np.where(b64 == 0, 0, q)


def _remsi(a, b, dtype):
    safe = np.where(b == 0, 1, b)
    return np.where(b == 0, 0, np.fmod(a, safe))


def _divui(a, b, dtype):
    ua, ub = is_unsigned_view(np.asarray(a)), is_unsigned_view(np.asarray(b))
    safe = np.where(ub == 0, 1, ub).astype(ub.dtype)
    return np.where(ub == 0, 0, ua // safe).astype(ua.dtype).view(dtype)


def _remui(a, b, dtype):
    ua, ub = is_unsigned_view(np.asarray(a)), is_unsigned_view(np.asarray(b))
    safe = np.where(ub == 0, 1, ub).astype(ub.dtype)
    return np.where(ub == 0, 0, ua % safe).astype(ua.dtype).view(dtype)


def _ceildivsi(a, b, dtype):
    q = _divsi(a, b, dtype)
    return q + ((q * b != a) & ((a > 0) == (b > 0)))


def _floordivsi(a, b, dtype):
    q = _divsi(a, b, dtype)
    return q - ((q * b != a) & ((a < 0) != (b < 0)))


elementwise("arith.divsi", _divsi)
elementwise("arith.remsi", _remsi)
elementwise("arith.divui", _divui)
elementwise("arith.remui", _remui)
elementwise("arith.ceildivsi", _ceildivsi)
elementwise("arith.floordivsi", _floordivsi)


def _bits(dtype) -> int:
    return 1 if dtype == np.bool_ else np.dtype(dtype).itemsize * 8


def _shli(a, b, dtype):
    ua = is_unsigned_view(np.asarray(a))
    s = is_unsigned_view(np.asarray(b)).astype(np.uint64)
    big = s >= _bits(dtype)
    r = ua << np.where(big, 0, s).astype(ua.dtype)
    return np.where(big, 0, r).astype(ua.dtype).view(dtype)


def _shrui(a, b, dtype):
    ua = is_unsigned_view(np.asarray(a))
    s = is_unsigned_view(np.asarray(b)).astype(np.uint64)
    big = s >= _bits(dtype)
    r = ua >> np.where(big, 0, s).astype(ua.dtype)
    return np.where(big, 0, r).astype(ua.dtype).view(dtype)


def _shrsi(a, b, dtype):
    s = is_unsigned_view(np.asarray(b)).astype(np.uint64)
    s = np.minimum(s, _bits(dtype) - 1).astype(np.asarray(a).dtype)
    return np.asarray(a) >> s


elementwise("arith.shli", _shli)
elementwise("arith.shrui", _shrui)
elementwise("arith.shrsi", _shrsi)


def _cast_builder(kind):
    def builder(o, cc):
        src = dtype_of(o.operands[0].type)
        dt = dtype_of(o.results[0].type)

        def run(m, x):
            x = np.asarray(x)
            with np.errstate(all="ignore"):
                if kind == "signed" and src == np.bool_ and dt != np.bool_:
                    r = -(x.astype(dt))  # i1 true is -1
                elif kind == "unsigned":
                    r = is_unsigned_view(x).astype(dt)
                elif dt == np.bool_ and src != np.bool_:
                    r = (x & 1).astype(bool) if src.kind in "iu" else x.astype(bool)
                else:
                    r = x.astype(dt)
            return (r,)

        return run

    return builder


for _name in ("arith.extsi", "arith.index_cast", "arith.sitofp", "arith.trunci",
              "arith.fptosi", "arith.extf", "arith.truncf"):
    op(_name)(_cast_builder("signed"))
for _name in ("arith.extui", "arith.index_castui", "arith.uitofp"):
    op(_name)(_cast_builder("unsigned"))


@op("arith.fptoui")
def _fptoui(o, cc):
    dt = dtype_of(o.results[0].type)

    def run(m, x):
        with np.errstate(all="ignore"):
            return (np.asarray(x).astype(np.float64).astype(np.uint64).astype(dt),)

    return run


@op("arith.bitcast")
def _bitcast(o, cc):
    dt = dtype_of(o.results[0].type)

    def run(m, x):
        return (np.ascontiguousarray(x).view(dt),)

    return run


_CMPI = {
    0: lambda a, b: a == b, 1: lambda a, b: a != b, 2: lambda a, b: a < b,
    3: lambda a, b: a <= b, 4: lambda a, b: a > b, 5: lambda a, b: a >= b,
}
_CMPF_ORDERED = {1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less,
                 5: np.less_equal, 6: np.not_equal}


@op("arith.cmpi")
def _cmpi(o, cc):
    p = ir.IntegerAttr(o.attributes["predicate"]).value
    if p not in range(10):
        raise EmulationUnsupported(f"arith.cmpi predicate {p}")
    f = _CMPI[p if p < 6 else p - 4]

    def run(m, a, b):
        if p >= 6:
            a, b = is_unsigned_view(np.asarray(a)), is_unsigned_view(np.asarray(b))
        return (f(a, b),)

    return run


@op("arith.cmpf")
def _cmpf(o, cc):
    p = ir.IntegerAttr(o.attributes["predicate"]).value

    def run(m, a, b):
        a, b = np.asarray(a), np.asarray(b)
        nan = np.isnan(a) | np.isnan(b)
        with np.errstate(all="ignore"):
            if p == 0:
                r = np.zeros(np.broadcast_shapes(a.shape, b.shape), bool)
            elif p == 15:
                r = np.ones(np.broadcast_shapes(a.shape, b.shape), bool)
            elif p == 7:
                r = ~nan
            elif p == 14:
                r = nan
            elif p in _CMPF_ORDERED:
                r = _CMPF_ORDERED[p](a, b) & ~nan
            else:  # unordered: 8..13 are ueq ugt uge ult ule une
                r = _CMPF_ORDERED[p - 7](a, b) | nan
        return (r,)

    return run


@op("arith.select")
def _select(o, cc):
    def run(m, c, a, b):
        c = np.asarray(c)
        a, b = np.asarray(a), np.asarray(b)
        while c.ndim < max(a.ndim, b.ndim):
            c = c[..., None]
        return (np.where(c, a, b),)

    return run


def constant_value(a, t) -> np.ndarray:
    """The value of a constant attribute of type ``t``, with a leading thread axis of 1."""
    dt = dtype_of(t)
    shape = vshape(t)
    if isinstance(a, ir.DenseElementsAttr):
        if a.is_splat:
            v = np.full(shape, _scalar(a.get_splat_value(), dt), dt)
        else:
            try:
                v = np.asarray(a).astype(dt).reshape(shape)
            except Exception as e:  # noqa: BLE001 - e.g. bf16 has no buffer protocol
                raise EmulationUnsupported(f"dense constant {a}") from e
        return v[None]
    return np.asarray([_scalar(a, dt)], dt)


def _scalar(a, dt):
    if isinstance(a, ir.BoolAttr):
        return bool(a.value)
    if isinstance(a, ir.IntegerAttr):
        v = a.value
        if dt == np.bool_:
            return bool(v & 1)
        return np.array(v & ((1 << (8 * dt.itemsize)) - 1), np.uint64).astype(
            dt.str.replace("i", "u")).view(dt) if dt.kind == "i" else v
    if isinstance(a, ir.FloatAttr):
        return a.value
    raise EmulationUnsupported(f"constant attribute {a}")


@op("arith.constant", "llvm.mlir.constant")
def _constant(o, cc):
    t = o.results[0].type
    v = constant_value(o.attributes["value"], t)

    def run(m):
        return (v,)

    return run
