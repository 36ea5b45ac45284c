"""Every private JAX import of pallas-mosaic-gpu's primitives and interpret mode.

JAX's ``jax._src`` modules change between releases; porting to the next JAX is a change
to this file (and the pin in ``pyproject.toml``). What is taken here is not Pallas: the
state (Ref) types and their discharge rules, effects, the MLIR lowering helper and
source locations.
"""

from __future__ import annotations

from jax._src import core, effects, source_info_util
from jax._src.interpreters import mlir
from jax._src.state import discharge as state_discharge
from jax._src.state import indexing as state_indexing
from jax._src.state import primitives as state_primitives
from jax._src.state import types as state_types

__all__ = [
    "AbstractRef", "GpuEffect", "Literal", "NDIndexer", "Primitive", "ReadEffect",
    "ShapedArray", "Slice", "TransformedRef", "WriteEffect", "addupdate_p", "core",
    "get_p", "get_view", "gpu_effect", "mlir", "set_view", "source_site", "swap_p",
    "transform_type",
]

# -- state (Refs) ------------------------------------------------------------------------
AbstractRef = state_types.AbstractRef
TransformedRef = state_types.TransformedRef
ReadEffect = state_types.ReadEffect
WriteEffect = state_types.WriteEffect
NDIndexer = state_indexing.NDIndexer
Slice = state_indexing.Slice
transform_type = state_types.transform_type
RefTransposer = getattr(state_types, "RefTransposer", None)
get_p = state_primitives.get_p
swap_p = state_primitives.swap_p
addupdate_p = state_primitives.addupdate_p


def get_view(value, flat_transforms, tree):
    """The part of array ``value`` that a ref with these (flattened) transforms sees."""
    return state_discharge._get_discharge(value, flat_transforms, tree)


def set_view(value, new, flat_transforms, tree):
    """``value`` with the part seen through the transforms replaced by ``new``."""
    _, out = state_discharge._swap_discharge(value, new, flat_transforms, tree)
    return out


# -- core -------------------------------------------------------------------------------
Primitive = core.Primitive
ShapedArray = core.ShapedArray
Literal = core.Literal


class GpuEffect(effects.Effect):
    """An effect of Mosaic GPU primitives that touch no ref operand (fences, waits on
    asynchronous copies, register hints), so that they are never dropped or hoisted."""

    def __str__(self) -> str:
        return "MosaicGpu"


gpu_effect = GpuEffect()
for _allowed in (effects.control_flow_allowed_effects, effects.lowerable_effects,
                 effects.remat_allowed_effects, effects.custom_derivatives_allowed_effects):
    _allowed.add_type(GpuEffect)


def source_site(eqn) -> str:
    """``file:line (function)`` of the user code an equation comes from."""
    return source_info_util.summarize(eqn.source_info)


# The lowering's name for the same thing.
source_info_summary = source_site
