"""``math`` ops: :data:`pallas.executor.UPSTREAM`'s (NumPy, narrow floats computed in
float32 and rounded to the result type, as GPUs do), plus the error functions (SciPy's).
The libdevice functions ``llvm.call`` reaches are in ``ops_llvm``.

Integer division by zero (undefined in MLIR, "machine-specific" in PTX) gives what the
GPU computes: all bits set (``-1`` for ``divsi``, the largest value for ``divui``), which
is also XLA's defined result; the shared rules give the dividend."""

from __future__ import annotations

import numpy as np
import scipy.special

from pallas.executor import UPSTREAM, register_float_functions
from pallas_mosaic_gpu._src.executor.engine import OPS

register_float_functions(OPS, {"math.erf": scipy.special.erf, "math.erfc": scipy.special.erfc},
                         owner="pallas_mosaic_gpu")


def _all_ones_on_zero(name: str):
    """The shared rule of ``name``, with all bits set where the divisor is zero."""
    shared = UPSTREAM[name]

    def rule(o, cc):
        fn = shared(o, cc)

        def run(m, a, b):
            (q,) = fn(m, a, b)
            zero = np.asarray(b) == 0
            if not zero.any():
                return (q,)
            dt = np.asarray(q).dtype  # signless: all bits set is -1 read signed
            return (np.where(zero, np.asarray(-1, np.int64).astype(dt), q).astype(dt),)

        return run

    return rule


for _name in ("arith.divsi", "arith.divui"):
    OPS.register(_name, owner="pallas_mosaic_gpu")(_all_ones_on_zero(_name))
