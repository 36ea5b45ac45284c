"""``math`` ops: :data:`pallas.executor.UPSTREAM`'s (NumPy, narrow floats computed in
float32 and rounded to the result type, as GPUs do), plus the error functions (SciPy's)
and the libdevice functions (``__nv_*``) the module may call through ``llvm.call``."""

from __future__ import annotations

import numpy as np
import scipy.special

from pallas.executor import register_float_functions
from pallas_mosaic_gpu._src.executor.engine import OPS

register_float_functions(OPS, {"math.erf": scipy.special.erf, "math.erfc": scipy.special.erfc},
                         owner="pallas_mosaic_gpu")

# libdevice functions reached through ``llvm.call`` (name -> numpy function).
LIBDEVICE = {
    "__nv_lgammaf": scipy.special.gammaln,
    "__nv_fmodf": np.fmod,
    "__nv_expf": np.exp,
    "__nv_logf": np.log,
    "__nv_powf": np.power,
    "__nv_erfinvf": scipy.special.erfinv,
}
