"""Pallas on Mosaic GPU (Hopper, Blackwell): ``import pallas_mosaic_gpu as plgpu``.

Mirrors upstream's ``jax.experimental.pallas.mosaic_gpu`` (JAX 0.10.2).
"""

from pallas_mosaic_gpu.__about__ import __version__
from pallas_mosaic_gpu._src.compiler_params import (
    CompilerParams,
    DimensionSemantics,
    LoweringSemantics,
    TraceScope,
)

__all__ = [
    "CompilerParams",
    "DimensionSemantics",
    "LoweringSemantics",
    "TraceScope",
    "__version__",
]
