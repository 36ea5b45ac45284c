"""The ``mosaic_gpu`` backend object: what it claims and how it lowers."""

from __future__ import annotations

from pallas.plugins import Backend, LoweringRequest
from pallas_mosaic_gpu.__about__ import __version__
from pallas_mosaic_gpu._src.compiler_params import CompilerParams

# Conformance tags whose every case passes at each level this backend provides.
# Empty until the lowering to Mosaic GPU lands: the suite reports every case
# `unsupported`, never a pass it has not earned.
CAPABILITIES: frozenset = frozenset()


class MosaicGpuBackend(Backend):
    """Lowers ``pallas_call`` to the Mosaic GPU compiler library's custom call."""

    def lower(self, request: LoweringRequest):
        raise NotImplementedError(
            f"the mosaic_gpu backend (pallas-mosaic-gpu {__version__}) cannot lower "
            f"kernel {request.name!r} yet: its lowering to Mosaic GPU is not implemented in this "
            "release; use interpret=True, or backend='triton' for platform cuda")


def params(compiler_params) -> CompilerParams:
    """``compiler_params`` as a ``plgpu.CompilerParams`` (None means the defaults)."""
    if compiler_params is None:
        return CompilerParams()
    if isinstance(compiler_params, CompilerParams):
        return compiler_params
    if isinstance(compiler_params, dict):  # upstream's old dict form
        return CompilerParams(**compiler_params.get("mosaic_gpu", compiler_params))
    raise TypeError(
        "the mosaic_gpu backend takes plgpu.CompilerParams; got "
        f"{type(compiler_params).__name__}")


MOSAIC_GPU = MosaicGpuBackend(
    name="mosaic_gpu",
    version=__version__,
    platforms=("cuda",),
    compiler_params_type=CompilerParams,
    capabilities=CAPABILITIES,
    levels=("lower",),
    # Below pallas-triton (10) until the lowering lands: the default for cuda stays a
    # backend that lowers.
    priority=0,
    package="pallas-mosaic-gpu",
)
