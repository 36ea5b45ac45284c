"""``math`` ops. Narrow floats (bf16, f16) are computed in f32 and rounded to nearest even,
as Mosaic lowers them on chips without narrow transcendental units."""

from __future__ import annotations

import numpy as np

from pallas_tpu._src.executor import host_xla
from pallas_tpu._src.executor.engine import elementwise
from pallas_tpu._src.executor.types import bits


def _f32(f):
    def g(*xs):
        xs = [np.asarray(x) for x in xs]
        if xs[0].dtype.itemsize < 4 and xs[0].dtype.kind not in "iub":
            return f(*[x.astype(np.float32) for x in xs])
        return f(*xs)

    return g


# Transcendental functions as the host's XLA computes them (host_xla.py); the rest are
# exact in NumPy.
for _name in host_xla.FUNCTIONS:
    elementwise(_name)(_f32(host_xla.function(_name)))

for _name, _f in {
    "math.absf": np.abs, "math.ceil": np.ceil, "math.floor": np.floor,
    "math.roundeven": np.rint, "math.trunc": np.trunc, "math.copysign": np.copysign,
    "math.round": lambda x: np.where(np.abs(x - np.trunc(x)) == 0.5,
                                     np.trunc(x) + np.sign(x), np.rint(x)),
}.items():
    elementwise(_name)(_f32(_f))

elementwise("math.absi")(np.abs)


@elementwise("math.isfinite")
def _isfinite(x):
    return np.isfinite(np.asarray(x).astype(np.float32))


@elementwise("math.fpowi")
def _fpowi(x, n):
    x = np.asarray(x)
    return np.power(x.astype(np.float64), np.asarray(n).astype(np.float64)).astype(x.dtype)


@elementwise("math.ctpop")
def _ctpop(x):
    x = np.asarray(x)
    u = x.view(np.dtype(f"u{x.dtype.itemsize}")).astype(np.uint64)
    n = np.zeros(u.shape, np.int64)
    for _ in range(bits(x.dtype)):
        n += (u & 1).astype(np.int64)
        u = u >> np.uint64(1)
    return n


@elementwise("math.ctlz")
def _ctlz(x):
    x = np.asarray(x)
    w = bits(x.dtype)
    u = x.view(np.dtype(f"u{x.dtype.itemsize}")).astype(np.uint64)
    n = np.full(u.shape, w, np.int64)
    for i in range(w):
        n = np.where((u >> np.uint64(i)) & np.uint64(1), w - 1 - i, n)
    return n
