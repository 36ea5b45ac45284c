"""Every private JAX import of pallas-triton, in one place.

JAX's private modules change between releases; porting pallas-triton to a new JAX is a
change to this file (and the pin in pallas-core), not a hunt through the package.
"""

from __future__ import annotations

from jax._src import pjit as _pjit
from jax._src import source_info_util as _source_info_util
from jax._src.interpreters import mlir as _mlir
from jax._src.state import indexing as _indexing
from jax._src.state import primitives as _state_primitives
from jax._src.state import types as _state_types
from jax.extend.core import Literal
from jax.extend.core import primitives as _core_primitives

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

# The state primitives a kernel's ref reads and writes become (get/swap are public).
get_p = _core_primitives.get_p
swap_p = _core_primitives.swap_p
addupdate_p = _state_primitives.addupdate_p
# A sharding annotation JAX inserts under a mesh (jax.set_mesh); a no-op on a kernel's values.
reshard_p = _pjit.reshard_p
broadcast_to_p = _state_primitives.broadcast_to_p

__all__ = ["Literal", "addupdate_p", "broadcast_to_p", "get_p", "reshard_p", "source_info_summary",
           "swap_p"]


def source_info_summary(eqn) -> str:
    """``file:line (function)`` of the user code that produced ``eqn``."""
    return _source_info_util.summarize(eqn.source_info)


def gpu_triton():
    """jaxlib's Triton kernel-call library, or None without a CUDA plugin."""
    try:
        from jax._src.lib import gpu_triton as lib
    except ImportError:  # pragma: no cover - depends on the installed jaxlib
        return None
    if not hasattr(lib, "TritonKernelCall"):
        return None
    return lib
