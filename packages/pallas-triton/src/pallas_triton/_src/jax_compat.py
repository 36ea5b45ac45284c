"""Every private JAX import of pallas-triton, in one place.

JAX's private modules change between releases; porting pallas-triton to a new JAX is a
change to this file (and the pin in pallas-core), not a hunt through the package.
"""

from __future__ import annotations

from jax._src.interpreters import mlir as _mlir
from jax._src.state import indexing as _indexing
from jax._src.state import types as _state_types

NDIndexer = _indexing.NDIndexer
Slice = _indexing.Slice
AbstractRef = _state_types.AbstractRef
BitcastTransform = _state_types.BitcastTransform
ReshapeTransform = _state_types.ReshapeTransform
TransposeTransform = _state_types.TransposeTransform
TransformedRef = _state_types.TransformedRef
WriteEffect = _state_types.WriteEffect
transform_type = _state_types.transform_type

custom_call = _mlir.custom_call


def gpu_triton():
    """jaxlib's Triton kernel-call library, or None without a CUDA plugin."""
    try:
        from jax._src.lib import gpu_triton as lib
    except ImportError:  # pragma: no cover - depends on the installed jaxlib
        return None
    if not hasattr(lib, "TritonKernelCall"):
        return None
    return lib
