"""``math`` ops: :data:`pallas.executor.UPSTREAM`'s (NumPy, narrow floats computed in
float32 and rounded to the result type, as GPUs do), plus the error functions (SciPy's).
The libdevice functions ``llvm.call`` reaches are in ``ops_llvm``."""

from __future__ import annotations

import scipy.special

from pallas.executor import register_float_functions
from pallas_mosaic_gpu._src.executor.engine import OPS

register_float_functions(OPS, {"math.erf": scipy.special.erf, "math.erfc": scipy.special.erfc},
                         owner="pallas_mosaic_gpu")
