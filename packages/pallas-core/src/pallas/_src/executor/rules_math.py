"""``math`` ops. Narrow floats (bf16, f16, the 8-bit floats) are computed in float32 and
rounded to the result type (nearest even), as compilers lower them on chips without
narrow units. The transcendental functions are NumPy's here; a backend whose numbers
must match another implementation registers its own (:func:`register_float_functions`
into its table), as the Mosaic TPU executor does with XLA's."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from pallas._src.executor.engine import UPSTREAM, OpRuleTable, elementwise
from pallas._src.executor.types import as_unsigned, bits


def widened(f: Callable) -> Callable:
    """``f`` on floats, narrow float operands widened to float32."""
    def g(*xs):
        xs = [np.asarray(x) for x in xs]
        if xs[0].dtype.itemsize < 4 and xs[0].dtype.kind not in "iub":
            return f(*[x.astype(np.float32) for x in xs])
        return f(*xs)

    return g


def register_float_functions(table: OpRuleTable, funcs: Mapping[str, Callable],
                             owner: str | None = None) -> None:
    """Registers ``{op name: f(*arrays) -> array}`` in ``table`` as elementwise float
    functions (narrow floats computed in float32); ``owner`` as for ``elementwise``."""
    for name, f in funcs.items():
        elementwise(table, name, owner=owner)(widened(f))


def _round(x):
    """Half away from zero."""
    return np.where(np.abs(x - np.trunc(x)) == 0.5, np.trunc(x) + np.sign(x), np.rint(x))


#: NumPy's transcendental functions, by op name.
TRANSCENDENTALS: dict[str, Callable] = {
    "math.acos": np.arccos, "math.acosh": np.arccosh, "math.asin": np.arcsin,
    "math.asinh": np.arcsinh, "math.atan": np.arctan, "math.atan2": np.arctan2,
    "math.atanh": np.arctanh, "math.cbrt": np.cbrt, "math.cos": np.cos,
    "math.cosh": np.cosh, "math.exp": np.exp, "math.exp2": np.exp2,
    "math.expm1": np.expm1, "math.log": np.log, "math.log1p": np.log1p,
    "math.log2": np.log2, "math.log10": np.log10, "math.powf": np.power,
    "math.rsqrt": lambda x: 1 / np.sqrt(x), "math.sin": np.sin, "math.sinh": np.sinh,
    "math.sqrt": np.sqrt, "math.tan": np.tan, "math.tanh": np.tanh,
}
register_float_functions(UPSTREAM, TRANSCENDENTALS)
register_float_functions(UPSTREAM, {
    "math.absf": np.abs, "math.ceil": np.ceil, "math.floor": np.floor,
    "math.roundeven": np.rint, "math.trunc": np.trunc, "math.copysign": np.copysign,
    "math.round": _round, "math.fma": lambda a, b, c: a * b + c,
})

elementwise(UPSTREAM, "math.absi")(np.abs)


@elementwise(UPSTREAM, "math.isfinite")
def _isfinite(x):
    return np.isfinite(np.asarray(x).astype(np.float32))


@elementwise(UPSTREAM, "math.isnan")
def _isnan(x):
    return np.isnan(np.asarray(x).astype(np.float32))


@elementwise(UPSTREAM, "math.isinf")
def _isinf(x):
    return np.isinf(np.asarray(x).astype(np.float32))


@elementwise(UPSTREAM, "math.fpowi")
def _fpowi(x, n):
    x = np.asarray(x)
    return np.power(x.astype(np.float64), np.asarray(n).astype(np.float64)).astype(x.dtype)


@elementwise(UPSTREAM, "math.ctpop")
def _ctpop(x):
    x = np.asarray(x)
    u = as_unsigned(x).astype(np.uint64)
    n = np.zeros(u.shape, np.int64)
    for _ in range(bits(x.dtype)):
        n += (u & 1).astype(np.int64)
        u = u >> np.uint64(1)
    return n


@elementwise(UPSTREAM, "math.ctlz")
def _ctlz(x):
    x = np.asarray(x)
    w = bits(x.dtype)
    u = as_unsigned(x).astype(np.uint64)
    n = np.full(u.shape, w, np.int64)
    for i in range(w):
        n = np.where((u >> np.uint64(i)) & np.uint64(1), w - 1 - i, n)
    return n
