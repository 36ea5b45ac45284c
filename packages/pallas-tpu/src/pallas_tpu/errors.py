"""The errors a TPU kernel meets on its way to the chip, to catch by type.

- :class:`MosaicError`: Mosaic TPU (its verifier or compiler, libtpu) rejected the
  kernel, with Mosaic's message (upstream's ``error_handling.MosaicError``). A kernel
  compiled for a chip (``pallas_tpu.compile``, or any call under an emulated TPU,
  ``PALLAS_EMULATE_DEVICE=tpu:v5e``) raises it where Mosaic would on a TPU host.
- :class:`TpuCompileError` (a ``MosaicError``): the same, naming the kernel and the chip;
  :class:`TpuCompilerCrashedError` when the compiler aborted instead of answering.
- :class:`LoweringException`: the kernel could not be lowered to Mosaic at all;
  :class:`MosaicUnsupported` when it uses a form Mosaic does not implement on a TPU
  (refused while lowering, before the compiler sees it).
- :class:`LibtpuMissingError`: the compiler is not installed
  (``pip install 'pallas-tpu[compile]'``).
- :class:`VmemOomError`: the kernel's VMEM buffers exceed the chip's scoped VMEM limit,
  found at trace time when the chip is known (a ``ValueError``, and a
  ``jax.errors.JaxRuntimeError`` as the compiler's VMEM OOM is on a TPU).
"""

from pallas_tpu._src.compiler.results import (
    LibtpuMissingError,
    MosaicError,
    TpuCompileError,
    TpuCompilerCrashedError,
)
from pallas_tpu._src.enums import LoweringException, MosaicUnsupported
from pallas_tpu._src.vmem import VmemOomError

__all__ = [
    "LibtpuMissingError", "LoweringException", "MosaicError", "MosaicUnsupported",
    "TpuCompileError", "TpuCompilerCrashedError", "VmemOomError",
]
