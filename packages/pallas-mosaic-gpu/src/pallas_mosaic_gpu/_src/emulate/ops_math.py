"""``math`` ops, and the libdevice functions (``__nv_*``) the module may call. Narrow
floats are computed in float32 and rounded to the result type, as GPUs do."""

from __future__ import annotations

import numpy as np
import scipy.special

from pallas_mosaic_gpu._src.emulate.ops_arith import elementwise


def _wide(f):
    """``f`` on floats, narrow types widened to float32."""

    def g(*xs, dtype):
        xs = [np.asarray(x) for x in xs]
        xs = [x.astype(np.float32) if x.dtype.itemsize < 4 and x.dtype.kind in "fV" or
              str(x.dtype) == "bfloat16" else x for x in xs]
        return f(*xs)

    return g


FLOAT_FUNCS = {
    "absf": np.abs, "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin,
    "asinh": np.arcsinh, "atan": np.arctan, "atan2": np.arctan2, "atanh": np.arctanh,
    "cbrt": np.cbrt, "ceil": np.ceil, "copysign": np.copysign, "cos": np.cos,
    "cosh": np.cosh, "erf": scipy.special.erf, "erfc": scipy.special.erfc, "exp": np.exp,
    "exp2": np.exp2, "expm1": np.expm1, "floor": np.floor, "log": np.log,
    "log10": np.log10, "log1p": np.log1p, "log2": np.log2, "powf": np.power,
    "roundeven": np.rint, "rsqrt": lambda x: 1 / np.sqrt(x), "sin": np.sin,
    "sinh": np.sinh, "sqrt": np.sqrt, "tan": np.tan, "tanh": np.tanh, "trunc": np.trunc,
    "round": lambda x: np.trunc(x + np.copysign(np.asarray(0.5, x.dtype), x)),
    "fma": lambda a, b, c: a * b + c,
}
for _name, _f in FLOAT_FUNCS.items():
    elementwise(f"math.{_name}", _wide(_f))

elementwise("math.isfinite", lambda x, dtype: np.isfinite(np.asarray(x, np.float32)))
elementwise("math.isnan", lambda x, dtype: np.isnan(np.asarray(x, np.float32)))
elementwise("math.isinf", lambda x, dtype: np.isinf(np.asarray(x, np.float32)))
elementwise("math.absi", lambda x, dtype: np.abs(x))


def _ctlz(x, dtype):
    bits = np.dtype(dtype).itemsize * 8
    u = np.asarray(x).astype(np.int64) & ((1 << bits) - 1)
    n = np.zeros(u.shape, np.int64)
    for k in range(bits - 1, -1, -1):
        n = np.where((u >> k) == 0, bits - k, n)
    return np.where(u == 0, bits, n)


def _ctpop(x, dtype):
    bits = np.dtype(dtype).itemsize * 8
    u = np.asarray(x).astype(np.int64) & ((1 << bits) - 1)
    return sum((u >> k) & 1 for k in range(bits))


elementwise("math.ctlz", _ctlz)
elementwise("math.ctpop", _ctpop)

# libdevice functions reached through ``llvm.call`` (name -> numpy function).
LIBDEVICE = {
    "__nv_lgammaf": scipy.special.gammaln,
    "__nv_fmodf": np.fmod,
    "__nv_expf": np.exp,
    "__nv_logf": np.log,
    "__nv_powf": np.power,
    "__nv_erfinvf": scipy.special.erfinv,
}
