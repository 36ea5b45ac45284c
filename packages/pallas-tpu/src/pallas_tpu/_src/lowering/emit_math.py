"""Float32 math functions Mosaic cannot legalize, expanded into ops it has (``exp``,
``log``, ``log1p``, ``sqrt``, ``atan2``, ``erf``, arithmetic and selects). Each takes and
returns an f32 ``ir.Value`` (scalar or vector); accuracy is a few ulps except where
noted."""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, math

from pallas_tpu._src.lowering.common import cmpf


def _c(v: ir.Value, k: float) -> ir.Value:
    """An f32 constant shaped like ``v``."""
    t = v.type
    if isinstance(t, ir.VectorType):
        attr = ir.DenseElementsAttr.get_splat(t, ir.FloatAttr.get(t.element_type, float(k)))
    else:
        attr = ir.FloatAttr.get(t, float(k))
    return arith.ConstantOp(t, attr).result


def _poly(x: ir.Value, coeffs) -> ir.Value:
    """Horner: coeffs[0] + coeffs[1] x + ... ."""
    p = _c(x, coeffs[-1])
    for k in reversed(coeffs[:-1]):
        p = arith.addf(_c(x, k), arith.mulf(p, x))
    return p


def _copysign(mag: ir.Value, sign_of: ir.Value) -> ir.Value:
    return arith.select(cmpf("OLT", sign_of, _c(sign_of, 0.0)), arith.negf(mag), mag)


def expm1(x):
    """Kahan's ``(u - 1) * x / log(u)`` with ``u = exp(x)`` (exact where u rounds to 1)."""
    u = math.exp(x)
    um1 = arith.subf(u, _c(x, 1.0))
    one = cmpf("OEQ", u, _c(x, 1.0))
    big = cmpf("OEQ", um1, _c(x, -1.0))
    r = arith.mulf(um1, arith.divf(x, math.log(u)))
    r = arith.select(big, um1, r)
    # u = inf: log(u) = inf, x/inf = 0; keep inf
    r = arith.select(cmpf("OEQ", u, _c(x, np.inf)), u, r)
    return arith.select(one, x, r)


def sinh(x):
    """Taylor series for |x| < 0.5, ``(e - 1/e) / 2`` elsewhere."""
    x2 = arith.mulf(x, x)
    small = arith.mulf(x, _poly(x2, [1.0, 1 / 6, 1 / 120, 1 / 5040, 1 / 362880]))
    ax = math.absf(x)
    e = math.exp(arith.subf(ax, _c(x, np.log(2.0))))  # e^|x| / 2, no early overflow
    big = arith.subf(e, arith.divf(_c(x, 0.25), e))
    return arith.select(cmpf("OLT", ax, _c(x, 0.5)), small, _copysign(big, x))


def cosh(x):
    ax = math.absf(x)
    e = math.exp(arith.subf(ax, _c(x, np.log(2.0))))  # e^|x| / 2
    return arith.addf(e, arith.divf(_c(x, 0.25), e))


def asinh(x):
    """``sign(x) log1p(|x| + x^2 / (1 + sqrt(1 + x^2)))``; ``log(2|x|)`` when huge."""
    ax = math.absf(x)
    x2 = arith.mulf(ax, ax)
    r = math.log1p(arith.addf(ax, arith.divf(
        x2, arith.addf(_c(x, 1.0), math.sqrt(arith.addf(_c(x, 1.0), x2))))))
    huge = arith.addf(math.log(ax), _c(x, np.log(2.0)))
    r = arith.select(cmpf("OGT", ax, _c(x, 1e18)), huge, r)
    return _copysign(r, x)


def acosh(x):
    """``log1p(t + sqrt(t (t + 2)))`` with ``t = x - 1``; ``log(2x)`` when huge; NaN
    below 1 (sqrt of a negative)."""
    t = arith.subf(x, _c(x, 1.0))
    r = math.log1p(arith.addf(t, math.sqrt(arith.mulf(t, arith.addf(t, _c(x, 2.0))))))
    huge = arith.addf(math.log(x), _c(x, np.log(2.0)))
    return arith.select(cmpf("OGT", x, _c(x, 1e18)), huge, r)


def atanh(x):
    """``log1p(2x / (1 - x)) / 2`` (+-inf at +-1, NaN beyond)."""
    r = math.log1p(arith.divf(arith.mulf(_c(x, 2.0), x), arith.subf(_c(x, 1.0), x)))
    return arith.mulf(_c(x, 0.5), r)


def atan(x):
    return math.atan2(x, _c(x, 1.0))


def asin(x):
    """``atan2(x, sqrt((1 - x)(1 + x)))`` (NaN beyond [-1, 1])."""
    one = _c(x, 1.0)
    return math.atan2(x, math.sqrt(arith.mulf(arith.subf(one, x), arith.addf(one, x))))


def acos(x):
    one = _c(x, 1.0)
    return math.atan2(math.sqrt(arith.mulf(arith.subf(one, x), arith.addf(one, x))), x)


def cbrt(x):
    """``sign(x) exp(log|x| / 3)``, refined by one Newton step; 0, inf, NaN kept."""
    ax = math.absf(x)
    y = math.exp(arith.mulf(math.log(ax), _c(x, 1 / 3)))
    # y - (y^3 - a) / (3 y^2)
    y = arith.subf(y, arith.divf(arith.subf(arith.mulf(arith.mulf(y, y), y), ax),
                                 arith.mulf(_c(x, 3.0), arith.mulf(y, y))))
    special = arith.ori(cmpf("OEQ", ax, _c(x, 0.0)), cmpf("OEQ", ax, _c(x, np.inf)))
    y = arith.select(special, ax, y)
    return _copysign(y, x)


def erfc(x):
    """``1 - erf(x)`` (absolute error ~1e-7; small tails lose relative accuracy)."""
    return arith.subf(_c(x, 1.0), math.erf(x))
